"""The TFRecord layouts the corpus pipelines write, defined once for writers and readers.

Each `RecordSchema` gives both sides of the format: `serialize` (used by the Beam
pipeline, pure protobuf, no TF ops) and `feature_spec` / `parse` (used in tf.data by the
trainer and the index builder). Scalars parse to [batch] tensors, lists to
[batch, (n)] ragged tensors.
"""
import dataclasses
from typing import Any, Dict, Mapping, Tuple

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Feature:
  name: str
  dtype: tf.dtypes.DType  # tf.int64 or tf.string
  is_list: bool = False
  doc: str = ""


@dataclasses.dataclass(frozen=True)
class RecordSchema:
  name: str
  features: Tuple[Feature, ...]

  @property
  def names(self) -> Tuple[str, ...]:
    return tuple(f.name for f in self.features)

  def feature_spec(self) -> Dict[str, Any]:
    """For tf.io.parse_example: scalars are required, lists may be empty."""
    return {f.name: (tf.io.RaggedFeature(f.dtype, row_splits_dtype=tf.int64) if f.is_list
                     else tf.io.FixedLenFeature([], f.dtype)) for f in self.features}

  def parse(self, serialized: tf.Tensor) -> Dict[str, tf.Tensor]:
    """[batch] serialized tf.train.Example → {name: [batch] or [batch, (n)]}."""
    return tf.io.parse_example(serialized, self.feature_spec())

  def serialize(self, values: Mapping[str, Any]) -> bytes:
    """{name: python value} → serialized tf.train.Example; names must match exactly."""
    if set(values) != set(self.names):
      raise ValueError(f"{self.name} record has fields {sorted(values)}, "
                       f"the schema needs {sorted(self.names)}")
    example = tf.train.Example()
    for f in self.features:
      value = values[f.name]
      items = list(value) if f.is_list else [value]
      feature = example.features.feature[f.name]
      if f.dtype == tf.int64:
        feature.int64_list.value.extend(int(v) for v in items)
      else:
        feature.bytes_list.value.extend(
            v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in items)
    return example.SerializeToString()

  def describe(self) -> Dict[str, str]:
    """For the manifest: name → 'int64' / 'bytes' / 'int64 list' ..."""
    return {f.name: ("int64" if f.dtype == tf.int64 else "bytes") + (" list" if f.is_list else "")
            for f in self.features}


BLOCK = RecordSchema("block", (
    Feature("block_id", tf.int64, doc="stable id: hash of doc_uid and block index"),
    Feature("doc_uid", tf.string, doc="hex hash of the source document's title and text"),
    Feature("title", tf.string),
    Feature("text", tf.string, doc="body: whole sentences joined by one space"),
))

PRETRAINING = RecordSchema("pretraining", (
    Feature("text", tf.string, doc="x: one or more consecutive sentences of a block"),
    Feature("block_id", tf.int64, doc="the block x was taken from (trivial retrieval)"),
    Feature("doc_uid", tf.string, doc="the document x was taken from"),
    Feature("salient_span_starts", tf.int64, is_list=True,
            doc="UTF-8 byte offsets into text, as Tokenizer.tokenize_with_offsets gives"),
    Feature("salient_span_ends", tf.int64, is_list=True, doc="exclusive byte offsets"),
    Feature("salient_span_labels", tf.string, is_list=True,
            doc="PER, LOC, ORG, MISC (tagger), TITLE (title gazetteer), DATE"),
))

ICT = RecordSchema("ict", (
    Feature("query", tf.string, doc="a sentence of the block: the pseudo-query"),
    Feature("query_removed", tf.int64, doc="1 if the query was cut out of text, else 0"),
    Feature("block_id", tf.int64),
    Feature("doc_uid", tf.string),
    Feature("title", tf.string),
    Feature("text", tf.string, doc="the evidence: the block's body"),
))

SCHEMAS = {schema.name: schema for schema in (BLOCK, PRETRAINING, ICT)}
