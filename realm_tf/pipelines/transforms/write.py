"""Outputs: TFRecords of a schema, and the dead-letter JSON lines."""
import json

import apache_beam as beam

from realm_tf.corpus.schema import RecordSchema


class WriteExamples(beam.PTransform):
  """Feature dicts → `<prefix>-SSSSS-of-NNNNN.tfrecord` of serialized tf.train.Examples."""

  def __init__(self, schema: RecordSchema, file_path_prefix: str, num_shards: int = 0):
    super().__init__()
    self._schema = schema
    self._prefix = file_path_prefix
    self._num_shards = num_shards

  def expand(self, features):
    return (features
            | "Serialize" >> beam.Map(self._schema.serialize)
            | "Write" >> beam.io.WriteToTFRecord(self._prefix, file_name_suffix=".tfrecord",
                                                 num_shards=self._num_shards))


class WriteDeadLetters(beam.PTransform):
  """SetAside records of bad input → `<prefix>-*.jsonl`, one JSON object per line.

  Records dropped by rule (redirects, duplicates, ...) are only counted: they are not
  errors, and on a full dump they number in the millions.
  """

  def __init__(self, file_path_prefix: str, num_shards: int = 0):
    super().__init__()
    self._prefix = file_path_prefix
    self._num_shards = num_shards

  def expand(self, set_aside):
    return (set_aside
            | "OnlyBadInput" >> beam.Filter(lambda record: record.is_bad_input)
            | "ToJson" >> beam.Map(lambda record: json.dumps(record.as_json_dict(),
                                                             ensure_ascii=False))
            | "Write" >> beam.io.WriteToText(self._prefix, file_name_suffix=".jsonl",
                                             num_shards=self._num_shards))
