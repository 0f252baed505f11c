"""Where the corpus pipeline's TFRecords are: a `beam.preprocess` output dir or patterns.

Every reader of a published output opens it through its manifest
(realm_tf.io.versioned.published_files): a corpus whose writer died half-way, or that an
`--overwrite` re-run is replacing, is refused with one line, never read as if complete.
Files made by another tool (no manifest) are read only when the caller says so
(`unpublished=True`, from a config field or flag that says the input is not a published
output).
"""
import logging
import os
from typing import Optional, Sequence, Union

import tensorflow as tf

from realm_tf.io import storage, versioned

# File prefixes written by `python -m beam.preprocess`.
BLOCKS, PRETRAINING, ICT = "blocks", "pretraining", "ict"


def corpus_files(path: str, kind: str, store: storage.Storage = storage.GFILE) -> str:
  """The files of one kind: `path` itself when it is a file pattern (or several joined by
  commas), else `<path>/<kind>-*` for a corpus directory.

  Raises:
    ValueError: no path.
    storage.StorageError: the store could not be asked whether `path` is a directory.
  """
  if not path:
    raise ValueError(f"no path given for the {kind} files (a beam.preprocess output dir or "
                     f"a file pattern)")
  if "," not in path and not _is_pattern(path) and store.is_dir_like(path):
    return os.path.join(path.rstrip("/"), f"{kind}-*")
  return path


def _is_pattern(path: str) -> bool:
  return any(c in path for c in versioned.GLOB_CHARS)


def files(file_pattern: str, unpublished: bool = False,
          store: storage.Storage = storage.GFILE) -> list[str]:
  """Files named by one pattern or several joined by commas (e.g. Wikipedia and news
  examples), sorted for determinism.

  Args:
    file_pattern: file patterns inside published outputs (`<corpus>/pretraining-*`),
      joined by commas.
    unpublished: the files were made by another tool and have no manifest: read what the
      patterns match, unchecked. Never the default: only a config field or flag that says
      so sets it.
    store: the Storage to read through (Beam's FileSystems on a pipeline's launcher).

  Returns:
    The files, each pattern's sorted, in the order of the patterns.

  Raises:
    FileNotFoundError: a pattern names a directory, or matches nothing.
    versioned.UnpublishedError: (unless `unpublished`) a pattern's directory is not a
      published output, or its manifest does not match the files found.
  """
  matched = []
  for part in (p.strip() for p in file_pattern.split(",") if p.strip()):
    if not _is_pattern(part) and store.is_dir_like(part):
      raise FileNotFoundError(f"{part} is a directory: give a file pattern such as "
                              f"{os.path.join(part, 'blocks-*')}")
    if not unpublished:
      matched.extend(versioned.published_files(part, store))
      continue
    found = store.match_files(part)
    if not found:
      raise FileNotFoundError(f"no files match {part}{storage.why_nothing_matches(part)}")
    matched.extend(found)
  if not matched:
    raise FileNotFoundError(f"no files match {file_pattern!r}")
  return matched


# Files read at once by one input pipeline (each TFRecord reader holds a read buffer).
MAX_OPEN_FILES = 64


def pipeline_records(file_pattern: Union[str, Sequence[str]],
                     input_context: Optional[tf.distribute.InputContext] = None,
                     unpublished: bool = False) -> tf.data.Dataset:
  """Serialized records of this input pipeline's share of the files (one epoch).

  With several input pipelines (one per worker of a multi-worker job) and at least as many
  files, pipeline i reads files i, i+n, ... only (tf.data's FILE auto-sharding, done here
  because the datasets are built per pipeline): disjoint shares, no file read twice. With
  fewer files than pipelines every pipeline reads all files and keeps every n-th record.
  The files of a share are interleaved record by record, so one pipeline reading files A
  and B yields A0 B0 A1 B1 ..., and two pipelines yield A0 A1 ... and B0 B1 ...: without
  shuffling, a global batch holds the same records whatever the number of workers.

  Args:
    file_pattern: see `files`; or the files themselves, as `files` returned them.
    input_context: this input pipeline's place among the job's (None: the only one).
    unpublished: see `files`.

  Returns:
    A dataset of serialized records.
  """
  paths = (files(file_pattern, unpublished) if isinstance(file_pattern, str)
           else list(file_pattern))
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
