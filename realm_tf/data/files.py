"""Where the corpus pipeline's TFRecords are: a `beam.preprocess` output dir or patterns."""
import os

import tensorflow as tf

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
      raise FileNotFoundError(f"no files match {part}")
    matched.extend(found)
  if not matched:
    raise FileNotFoundError(f"no files match {file_pattern!r}")
  return matched
