"""The release as files: where each part is (ReleasedFiles), the Open-QA checkpoint the
authors' code would find, the settings its params.json gives, and the progress line of
reading it (13M records and a 6.8 GB block_emb are read a slice at a time)."""
import dataclasses
import json
import logging
import os
import re
import time

import tensorflow as tf

BLOCK_EMB = "block_emb"
# The authors' Open-QA settings (orqa_experiment.py's flag defaults; REALM section 4.4),
# used where the model directory has no params.json.
QUERY_SEQ_LENGTH = 64
BLOCK_SEQ_LENGTH = 288
READER_SEQ_LENGTH = 288 + 32
READER_BEAM = 5
MAX_SPAN_WIDTH = 10
PARAMS_FILE = "params.json"


@dataclasses.dataclass(frozen=True)
class OrqaSettings:
  """The Open-QA model's sequence lengths and beams, as its params.json gives them.

  ORQA's experiment writes every flag to <model_dir>/params.json (language/common/utils/
  experiment_utils.py), and the authors' predictor reads them back from there.
  """
  query_seq_length: int = QUERY_SEQ_LENGTH
  block_seq_length: int = BLOCK_SEQ_LENGTH
  reader_seq_length: int = READER_SEQ_LENGTH
  reader_beam: int = READER_BEAM
  max_span_width: int = MAX_SPAN_WIDTH
  span_hidden_size: int = 0  # 0: not given (the checkpoint's reader/dense gives it)
  num_block_records: int = 0  # 0: not given
  source: str = ""  # the params.json read ('' : the defaults)


def read_orqa_settings(model_dir: str) -> OrqaSettings:
  """The settings in <model_dir>/params.json, the authors' defaults where it has none.

  Args:
    model_dir: the released Open-QA model's directory ('' or a checkpoint prefix: defaults).
  Returns:
    The OrqaSettings.
  Raises:
    ValueError: params.json is not a JSON object of integer settings.
  """
  path = os.path.join(model_dir, PARAMS_FILE) if model_dir else ""
  if not path or not tf.io.gfile.exists(path):
    return OrqaSettings()
  with tf.io.gfile.GFile(path) as f:
    try:
      params = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}: not JSON ({e})") from e
  if not isinstance(params, dict):
    raise ValueError(f"{path}: not a JSON object")
  names = dict(query_seq_length="query_seq_len", block_seq_length="block_seq_len",
               reader_seq_length="reader_seq_len", reader_beam="reader_beam_size",
               max_span_width="max_span_width", span_hidden_size="span_hidden_size",
               num_block_records="num_block_records")
  values = {}
  for field, key in names.items():
    if key in params:
      if not isinstance(params[key], int) or params[key] < 1:
        raise ValueError(f"{path}: {key} must be a positive integer, got {params[key]!r}")
      values[field] = params[key]
  return OrqaSettings(**values, source=path)


PROGRESS_SECONDS = 10.0


class Progress:
  """One log line every PROGRESS_SECONDS: done / total, rate and time left."""

  def __init__(self, what: str, total: int):
    self.what, self.total = what, total
    self.start = self.last = time.time()

  def update(self, done: int, force: bool = False):
    now = time.time()
    if not force and now - self.last < PROGRESS_SECONDS:
      return
    self.last = now
    rate = done / max(now - self.start, 1e-9)
    left = (self.total - done) / rate if rate > 0 else float("inf")
    logging.info("%s: %d / %d (%.1f%%), %.0f/s, %.0f s left", self.what, done, self.total,
                 100.0 * done / max(self.total, 1), rate, left)


@dataclasses.dataclass(frozen=True)
class ReleasedFiles:
  """Where the released files are (realm_tf.import_released.importer's docstring names
  them)."""
  embedder: str
  blocks: str
  titles: str
  orqa_model: str = ""
  bert: str = ""
  block_emb: str = ""

  @property
  def embedder_variables(self) -> str:
    return os.path.join(self.embedder, "variables", "variables")

  @property
  def bert_variables(self) -> str:
    return os.path.join(self.bert, "variables", "variables")

  @property
  def vocab_file(self) -> str:
    return os.path.join(self.embedder, "assets", "vocab.txt")

  @property
  def block_emb_checkpoint(self) -> str:
    return self.block_emb or os.path.join(self.embedder, "encoded", "encoded.ckpt")


def orqa_checkpoint(path: str) -> str:
  """The checkpoint of a released Open-QA model, found as the authors' code finds it.

  The release's model directory holds the exporter's copy of the best checkpoint:
  language/common/utils/exporters.py (BestSavedModelAndCheckpointExporter) copies the
  files `model.ckpt-N.*` alone into export/best_default/checkpoint/, with no TF
  `checkpoint` state file, and ORQA's predictor globs `*.index` there. So a state file is
  not needed (tf.train.latest_checkpoint would find nothing); the highest step wins.

  Args:
    path: the model directory (orqa_nq_model_from_realm) or a checkpoint prefix.
  Returns:
    `path` if it is a checkpoint prefix, else the newest `model.ckpt-N` in
    <path>/export/best_default/checkpoint, else in <path> (a training directory).
  Raises:
    FileNotFoundError: there is none.
  """
  if tf.io.gfile.exists(path + ".index"):
    return path
  for directory in (os.path.join(path, "export", "best_default", "checkpoint"), path):
    if not tf.io.gfile.isdir(directory):
      continue
    steps = {}
    for name in tf.io.gfile.glob(os.path.join(directory, "*.index")):
      prefix = name[:-len(".index")]
      match = re.search(r"-(\d+)$", prefix)
      steps[int(match.group(1)) if match else -1] = prefix
    if steps:
      return steps[max(steps)]
  raise FileNotFoundError(f"{path}: no Open-QA checkpoint (looked for "
                          f"export/best_default/checkpoint/*.index and {path}/*.index)")
