"""The one place that says where things live in a run's model_dir.

  <model_dir>/
    params.yaml                      the run's whole ExperimentConfig (read by the builder)
    corpus/                          blocks made from a JSON lines index.blocks, if given
    block_texts/                     the corpus's block text store (an import writes it;
                                     evaluation and export build one from index.blocks:
                                     block_texts/<hash of the blocks pattern>/)
    checkpoints/ckpt-<step>          tf.train.CheckpointManager
    train/, validation/              TensorBoard summaries (tf-models' runner layout)
    metrics.jsonl                    one JSON line per train loop / evaluation
    export/query_encoder/<step>/     retriever snapshots handed to the index builder
    export/block_encoder/<step>/
    index/<step>/                    index exports built from those snapshots
    index/_claims/<step>.<gen>.json  which index builder is building <step>, until when
                                     (realm_tf.io.versioned.Claim; several builders)
    eval/<name>-<step>.{json,jsonl}  evaluation metrics and per-question predictions
    eval/<name>.jsonl                a side-car evaluator's JSON lines, one per checkpoint
    eval/<name>/                     its TensorBoard summaries (realm_tf.training.continuous_eval)
    index_builder.log                the child index builder's log (when the trainer owns it)
    TRAINING_DONE                    written once train_steps is reached: stops the builder
    INDEX_BUILDER_FAILED             an index builder gave up (its last error): ends the
                                     trainer's wait for an index (realm_tf.io.builder_failure)

Every path is built with os.path.join and read through tf.io.gfile, so model_dir may be on
GCS (gs://...) as well as on local disk.
"""
import hashlib
import json
import os
import socket
import time
from typing import Optional

import tensorflow as tf

from realm_tf.io import storage

PARAMS = "params.yaml"
TRAINING_DONE = "TRAINING_DONE"
INDEX_BUILDER_FAILED = "INDEX_BUILDER_FAILED"
METRICS = "metrics.jsonl"


def params_path(model_dir: str) -> str:
  """<model_dir>/params.yaml: the run's whole ExperimentConfig."""
  return os.path.join(model_dir, PARAMS)


def corpus_dir(model_dir: str) -> str:
  """Blocks made from a JSON lines corpus given to the run (index.blocks: x.jsonl)."""
  return os.path.join(model_dir, "corpus")


def block_texts_dir(model_dir: str, blocks: str = "") -> str:
  """<model_dir>/block_texts: the run's block text store (realm_tf.data.block_texts); with
  `blocks`, the store made from that corpus, <model_dir>/block_texts/<hash>."""
  if not blocks:
    return os.path.join(model_dir, "block_texts")
  digest = hashlib.sha1(blocks.encode("utf-8")).hexdigest()[:12]
  return os.path.join(model_dir, "block_texts", digest)


def checkpoint_dir(model_dir: str) -> str:
  """<model_dir>/checkpoints: the CheckpointManager's directory (ckpt-<step>)."""
  return os.path.join(model_dir, "checkpoints")


def metrics_path(model_dir: str) -> str:
  """<model_dir>/metrics.jsonl: one JSON line per train loop and evaluation."""
  return os.path.join(model_dir, METRICS)


def query_encoder_dir(model_dir: str) -> str:
  """<model_dir>/export/query_encoder: versioned query-tower snapshots."""
  return os.path.join(model_dir, "export", "query_encoder")


def block_encoder_dir(model_dir: str) -> str:
  """<model_dir>/export/block_encoder: versioned document-tower snapshots (what the index builder embeds with)."""
  return os.path.join(model_dir, "export", "block_encoder")


def is_inside(path: str, model_dir: str) -> bool:
  """Whether `path` lies under `model_dir` (local paths compared as absolute paths)."""
  if not path or not model_dir:
    return False
  if not storage.scheme(path) and not storage.scheme(model_dir):
    path, model_dir = os.path.abspath(path), os.path.abspath(model_dir)
  return path.startswith(model_dir.rstrip("/") + "/")


def index_dir(model_dir: str, configured: str = "") -> str:
  """The run's index directory: index.index_dir when set, else <model_dir>/index."""
  return configured or os.path.join(model_dir, "index")


def eval_dir(model_dir: str) -> str:
  """<model_dir>/eval: evaluation metrics and per-question predictions."""
  return os.path.join(model_dir, "eval")


def evaluator_log_path(model_dir: str, name: str) -> str:
  """A side-car evaluator's own JSON lines (one per checkpoint it evaluated): never
  metrics.jsonl, which the trainer appends to (two writers of one object on a store race)."""
  return os.path.join(eval_dir(model_dir), f"{name}.jsonl")


def evaluator_summary_subdir(name: str) -> str:
  """A side-car evaluator's TensorBoard directory, relative to model_dir (tf-models'
  trainer.validation_summary_subdir): beside the trainer's validation/, not in it."""
  return os.path.join("eval", name)


def builder_log_path(model_dir: str) -> str:
  """<model_dir>/index_builder.log: the child index builder's output."""
  return os.path.join(model_dir, "index_builder.log")


def builder_failure_path(model_dir: str) -> str:
  """<model_dir>/INDEX_BUILDER_FAILED: the last error of an index builder that gave up
  (realm_tf.io.builder_failure writes, reads and clears it)."""
  return os.path.join(model_dir, INDEX_BUILDER_FAILED)


def training_done_path(model_dir: str) -> str:
  """<model_dir>/TRAINING_DONE (see mark_training_done)."""
  return os.path.join(model_dir, TRAINING_DONE)


def mark_training_done(model_dir: str, step: int):
  """Tells index builders (on any machine sharing model_dir) that training has finished.

  Only a job's chief writes it; the marker names the writer (host and pid).

  Args:
    model_dir: the run's directory.
    step: the step training reached (training_done_step reads it back).
  """
  with tf.io.gfile.GFile(training_done_path(model_dir), "w") as f:
    json.dump(dict(step=int(step), time=time.time(), host=socket.gethostname(),
                   pid=os.getpid()), f)


def training_done(model_dir: str) -> bool:
  """Whether the run's TRAINING_DONE marker exists (its schedule was completed)."""
  return tf.io.gfile.exists(training_done_path(model_dir))


def training_done_step(model_dir: str) -> Optional[int]:
  """The step TRAINING_DONE records (None: no marker, or one still being written)."""
  try:
    with tf.io.gfile.GFile(training_done_path(model_dir)) as f:
      return int(json.load(f)["step"])
  except (tf.errors.NotFoundError, ValueError, KeyError, TypeError):
    return None


def clear_training_done(model_dir: str):
  """Removes TRAINING_DONE (a new training slice starts: builders must follow it again)."""
  path = training_done_path(model_dir)
  if tf.io.gfile.exists(path):
    tf.io.gfile.remove(path)


def append_metrics(model_dir: str, record: dict):
  """One JSON line per train loop: the run's history, for tests and benchmarks."""
  append_json_line(metrics_path(model_dir), record)


def read_metrics(model_dir: str) -> list[dict]:
  """The run's metrics.jsonl as a list of records ([] if it does not exist)."""
  return read_json_lines(metrics_path(model_dir))


def append_json_line(path: str, record: dict):
  """Appends `record` to a JSON lines log (metrics.jsonl, an evaluator's eval/<name>.jsonl).

  Object stores have no append: storage.open_for_append writes each record as its own
  object there (read back in order by read_json_lines); local disk appends to the file.
  """
  with storage.open_for_append(path) as f:
    f.write(json.dumps(record, sort_keys=True) + "\n")


def read_json_lines(path: str) -> list[dict]:
  """A JSON lines log written with append_json_line, its object-store sessions included.

  Args:
    path: the log's path.

  Returns:
    One dict per non-empty line, in order ([] if there is no log).
  """
  text = storage.read_log(path)
  return [json.loads(line) for line in text.splitlines() if line.strip()]


def latest_checkpoint(path: str) -> str:
  """The checkpoint `path` names.

  Args:
    path: a checkpoint prefix (.../ckpt-1200), or a run's model_dir or checkpoints/ dir.

  Returns:
    `path` itself if it is a checkpoint prefix, else the newest checkpoint of the run.

  Raises:
    FileNotFoundError: naming `path`, if there is no checkpoint.
  """
  found: Optional[str] = None
  if tf.io.gfile.isdir(path):
    found = (tf.train.latest_checkpoint(checkpoint_dir(path))
             or tf.train.latest_checkpoint(path))
  elif tf.io.gfile.exists(path + ".index"):
    found = path
  if not found:
    raise FileNotFoundError(f"{path}: no checkpoint")
  return found


def checkpoint_step(model_dir: str) -> int:
  """The global step of a run's newest checkpoint (0 when there is none).

  Read before the input pipeline is built, so that a resumed run can skip exactly the
  batches it already consumed.
  """
  latest = tf.train.latest_checkpoint(checkpoint_dir(model_dir))
  if not latest:
    return 0
  # The reader takes the prefix as is: tf.train.load_variable first asks whether the path
  # is a directory, which some file systems (ram://) answer yes for a prefix of objects.
  reader = tf.compat.v1.train.NewCheckpointReader(latest)
  return int(reader.get_tensor("global_step/.ATTRIBUTES/VARIABLE_VALUE"))
