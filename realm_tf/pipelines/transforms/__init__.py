"""Composite PTransforms, one per pipeline step."""
