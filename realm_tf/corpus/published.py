"""Small record outputs published the way `beam.preprocess` publishes a corpus.

A reader opens a corpus only through its manifest.json (realm_tf.io.versioned.
published_files), so every writer of corpus-layout files (a generated world, the demo's
splits, an imported corpus's blocks) publishes them: data files first, the manifest last,
through realm_tf.io.versioned.OutputWriter. This is the in-process writer for outputs
small enough to write from one process; the corpus pipeline writes through Beam.
"""
import os
from typing import Iterable, Mapping, Optional, Tuple

import tensorflow as tf

from realm_tf.corpus import schema
from realm_tf.io import storage, versioned


def shard_name(name: str, shard: int = 0, num_shards: int = 1) -> str:
  """`<name>-00000-of-00001.tfrecord`: the corpus pipeline's file names."""
  return f"{name}-{shard:05d}-of-{num_shards:05d}.tfrecord"


def publish_records(directory: str,
                    outputs: Mapping[str, Tuple[Iterable, Optional[schema.RecordSchema]]],
                    manifest: Optional[dict] = None,
                    texts: Optional[Mapping[str, str]] = None,
                    overwrite: bool = False, num_shards: int = 1) -> dict:
  """Writes each output as one TFRecord file and each text file, then publishes them.

  Args:
    directory: the output directory (local or an object store): new or empty, or any
      with `overwrite`.
    outputs: name → (rows, record schema): written to `<directory>/<name>-<shard>-of-
      <num_shards>.tfrecord`, row i into shard i mod num_shards (read back with the
      pattern `<directory>/<name>-*`). With no schema the rows are serialized records,
      written as they are.
    manifest: what the output holds, stored in its manifest.json beside `files`; the
      counts of `outputs` are added as `counts`.
    texts: file name → text, written beside the records (e.g. JSON lines of questions).
    overwrite: replace what `directory` holds (its manifest goes first, so no reader sees
      the old output as published while it is replaced).
    num_shards: files per output.

  Returns:
    The manifest written.

  Raises:
    FileExistsError: `directory` holds files and `overwrite` is False.
  """
  # An existing directory that holds nothing (made for this output) has nothing to lose.
  empty = storage.GFILE.is_dir_like(directory) and not storage.GFILE.list_files(directory)
  with versioned.OutputWriter(directory, overwrite or empty) as writer:
    tf.io.gfile.makedirs(writer.path)
    counts = {}
    for name, (rows, record_schema) in outputs.items():
      writers = [tf.io.TFRecordWriter(os.path.join(writer.path,
                                                   shard_name(name, shard, num_shards)))
                 for shard in range(num_shards)]
      count = 0
      try:
        for row in rows:
          writers[count % num_shards].write(
              record_schema.serialize(row) if record_schema is not None else row)
          count += 1
      finally:
        for records in writers:
          records.close()
      counts[name] = count
    for name, text in (texts or {}).items():
      with tf.io.gfile.GFile(os.path.join(writer.path, name), "w") as f:
        f.write(text)
    return writer.commit(dict(manifest or {}, counts=counts))


__all__ = ["publish_records", "shard_name"]
