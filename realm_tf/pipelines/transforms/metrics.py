"""Beam metrics of the corpus pipeline, for live monitoring (the manifest counts exactly)."""
import apache_beam as beam

NAMESPACE = "realm_preprocess"


def counter(name: str):
  return beam.metrics.Metrics.counter(NAMESPACE, name)


def set_aside_counter(reason: str):
  return counter(f"set_aside_{reason}")
