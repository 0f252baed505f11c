"""Where the corpus pipeline's TFRecords are: a `beam.preprocess` output dir or patterns."""
import logging
import os
from typing import Optional

import tensorflow as tf

from realm_tf.io import storage

# File prefixes written by `python -m beam.preprocess`.
BLOCKS, PRETRAINING, ICT = "blocks", "pretraining", "ict"


def corpus_files(path: str, kind: str) -> str:
  """The files of one kind: `path` itself when it is a file pattern (or several joined by
  commas), else `<path>/<kind>-*` for a corpus directory."""
  if not path:
    raise ValueError(f"no path given for the {kind} files (a beam.preprocess output dir or "
                     f"a file pattern)")
  if "," not in path and tf.io.gfile.isdir(path):
    return os.path.join(path, f"{kind}-*")
  return path


def files(file_pattern: str) -> list[str]:
  """Files matching one pattern or several joined by commas (e.g. Wikipedia and news
  examples), sorted for determinism; an error naming any pattern that matches nothing."""
  matched = []
  for part in (p.strip() for p in file_pattern.split(",") if p.strip()):
    if tf.io.gfile.isdir(part):
      raise FileNotFoundError(f"{part} is a directory: give a file pattern such as "
                              f"{os.path.join(part, 'blocks-*')}")
    found = sorted(tf.io.gfile.glob(part))
    if not found:
      raise FileNotFoundError(f"no files match {part}{storage.why_nothing_matches(part)}")
    matched.extend(found)
  if not matched:
    raise FileNotFoundError(f"no files match {file_pattern!r}")
  return matched


# Files read at once by one input pipeline (each TFRecord reader holds a read buffer).
MAX_OPEN_FILES = 64


def pipeline_records(file_pattern: str,
                     input_context: Optional[tf.distribute.InputContext] = None
                     ) -> tf.data.Dataset:
  """Serialized records of this input pipeline's share of the files (one epoch).

  With several input pipelines (one per worker of a multi-worker job) and at least as many
  files, pipeline i reads files i, i+n, ... only (tf.data's FILE auto-sharding, done here
  because the datasets are built per pipeline): disjoint shares, no file read twice. With
  fewer files than pipelines every pipeline reads all files and keeps every n-th record.
  The files of a share are interleaved record by record, so one pipeline reading files A
  and B yields A0 B0 A1 B1 ..., and two pipelines yield A0 A1 ... and B0 B1 ...: without
  shuffling, a global batch holds the same records whatever the number of workers.
  """
  paths = files(file_pattern)
  shards, index = 1, 0
  if input_context is not None:
    shards, index = input_context.num_input_pipelines, input_context.input_pipeline_id
  record_shard = shards > 1 and len(paths) < shards
  if shards > 1 and not record_shard:
    paths = paths[index::shards]
  logging.info("Input pipeline %d of %d reads %d file(s)%s: %s", index, shards, len(paths),
               f" (every {shards}th record)" if record_shard else "", ",".join(paths))
  dataset = tf.data.Dataset.from_tensor_slices(paths).interleave(
      tf.data.TFRecordDataset, cycle_length=min(len(paths), MAX_OPEN_FILES), block_length=1)
  if record_shard:
    dataset = dataset.shard(shards, index)
  return dataset
