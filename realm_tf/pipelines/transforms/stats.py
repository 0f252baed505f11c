"""Counts and input fingerprints, gathered in the pipeline into one JSON file.

Counting in the pipeline (rather than reading runner metrics afterwards) gives exact
numbers on every runner; the Metrics counters in the steps are for live monitoring.
"""
import json
from typing import Callable, Optional

import apache_beam as beam

from realm_tf.corpus import manifest


class CountAs(beam.PTransform):
  """PCollection → one ('count/<name>', n) pair; n is 0 for an empty input."""

  def __init__(self, name: str, where: Optional[Callable] = None):
    super().__init__()
    self._name = name
    self._where = where

  def expand(self, pcoll):
    if self._where is not None:
      pcoll = pcoll | "Where" >> beam.Filter(self._where)
    key = manifest.COUNT_PREFIX + self._name
    return (pcoll
            | "Count" >> beam.combiners.Count.Globally()
            | "Key" >> beam.Map(lambda n: (key, n)))


class CountSetAsideByReason(beam.PTransform):
  """SetAside records → ('set_aside/<reason>', n) pairs."""

  def expand(self, set_aside):
    return (set_aside
            | "KeyByReason" >> beam.Map(lambda r: (manifest.SET_ASIDE_PREFIX + r.reason, 1))
            | "Sum" >> beam.CombinePerKey(sum))


class WriteStats(beam.PTransform):
  """(key, value) pairs → one JSON object in the file `path`."""

  def __init__(self, path: str):
    super().__init__()
    self._path = path

  def expand(self, pairs):
    return (pairs
            | "ToDict" >> beam.combiners.ToDict()
            | "ToJson" >> beam.Map(lambda stats: json.dumps(stats, sort_keys=True))
            | "Write" >> beam.io.WriteToText(self._path, num_shards=1, shard_name_template=""))
