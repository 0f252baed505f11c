"""Where the corpus pipeline's TFRecords are, from the `data` config section."""
import os

import tensorflow as tf

from realm_tf.configs.experiment import DataConfig

# File prefixes written by `python -m beam.preprocess` (beam/preprocess.py).
BLOCKS, PRETRAINING, ICT = "blocks", "pretraining", "ict"


def pattern(config: DataConfig, kind: str) -> str:
  """The files of one kind: an explicit pattern, else `<corpus_dir>/<kind>-*`."""
  explicit = {BLOCKS: config.blocks, PRETRAINING: config.pretraining_examples,
              ICT: config.ict_examples}[kind]
  if explicit:
    return explicit
  if not config.corpus_dir:
    raise ValueError(f"data.corpus_dir (or an explicit pattern) is needed for {kind} files")
  return os.path.join(config.corpus_dir, f"{kind}-*")


def files(file_pattern: str) -> list[str]:
  """Files matching one pattern or several joined by commas (e.g. Wikipedia and news
  examples), sorted for determinism; an error naming any pattern that matches nothing."""
  matched = []
  for part in (p.strip() for p in file_pattern.split(",") if p.strip()):
    found = sorted(tf.io.gfile.glob(part))
    if not found:
      raise FileNotFoundError(f"no files match {part}")
    matched.extend(found)
  if not matched:
    raise FileNotFoundError(f"no files match {file_pattern!r}")
  return matched
