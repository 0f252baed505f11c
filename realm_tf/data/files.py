"""Where the corpus pipeline's TFRecords are, from the `data` config section."""
import os

import tensorflow as tf

from realm_tf.configs.experiment import DataConfig

# File prefixes written by `python -m beam.preprocess` (beam/preprocess.py).
BLOCKS, PRETRAINING, ICT = "blocks", "pretraining", "ict"


def pattern(config: DataConfig, kind: str) -> str:
  """The files of one kind: an explicit pattern, else `<corpus_dir>/<kind>-*`."""
  explicit = {BLOCKS: config.blocks}.get(kind, "")
  if explicit:
    return explicit
  if not config.corpus_dir:
    raise ValueError(f"data.corpus_dir (or an explicit pattern) is needed for {kind} files")
  return os.path.join(config.corpus_dir, f"{kind}-*")


def train_pattern(config: DataConfig, kind: str) -> str:
  return config.train_examples or pattern(config, kind)


def files(file_pattern: str) -> list[str]:
  """Matching files, sorted for determinism; an error naming the pattern if none."""
  matched = sorted(tf.io.gfile.glob(file_pattern))
  if not matched:
    raise FileNotFoundError(f"no files match {file_pattern}")
  return matched
