"""Training and evaluation with model_dir on a non-local file system (TF's ram://).

TF 2.20's gs:// client reaches an emulator only from a child process inside
benchmarks/gcs_emulator.py's namespace (test_tf_gcs.py); ram:// is a file system that is not
local disk, in this process, so anything that used `open`/`os.path` on a run directory
fails here.
(ram:// is per process: the child index builder cannot see it, so the index is published
in this process, as `beam.embed_corpus` would on GCS.)
"""
import gc
import logging
import uuid

import numpy as np
import tensorflow as tf

from realm_tf.configs import load_config
from realm_tf.data.block_store import BlockStore
from realm_tf.io import layout
from realm_tf.training import train_lib
from tests import task_fixtures as tf_
from tests.synthetic_corpus import write_corpus


def test_openqa_trains_resumes_and_evaluates_on_ram_fs(tmp_path, repo_dir):
  corpus = str(tmp_path / "corpus")
  write_corpus(corpus)
  questions = tf_.write_questions(str(tmp_path / "questions.jsonl"))
  model_dir = f"ram://runs/{uuid.uuid4().hex}/openqa"
  config = tf_.tiny_config(
      repo_dir, corpus, "openqa", questions, trainer__train_steps=6,
      trainer__checkpoint_interval=3, trainer__steps_per_loop=3,
      trainer__summary_interval=3, trainer__validation_interval=6,
      task__openqa__validation_data__input_path=questions)
  store = BlockStore.from_tfrecords(f"{corpus}/blocks-*")
  tf_.publish_index(layout.index_dir(model_dir), 0, store.block_ids,
                    np.random.default_rng(0).normal(size=[len(store), 16]))
  first = train_lib.run_experiment(config, model_dir, stop_at_step=3)
  assert first["step"] == 3 and not layout.training_done(model_dir)
  second = train_lib.run_experiment(config, model_dir)
  assert second["start_step"] == 3 and second["step"] == 6
  assert layout.training_done(model_dir)
  assert tf.io.gfile.exists(layout.params_path(model_dir))
  assert layout.latest_checkpoint(model_dir).endswith("ckpt-6")
  history = layout.read_metrics(model_dir)
  assert [r["step"] for r in history if r.get("mode") == "openqa"] == [3, 6]
  evaluated = [r for r in history if r.get("mode") == "eval:validation"]
  assert evaluated and evaluated[-1]["num_questions"] == 24
  # The run's params.yaml (on ram://) is all evaluation needs.
  params = load_config(layout.params_path(model_dir))
  warnings = _TensorFlowWarnings()
  metrics, run = train_lib.evaluate_checkpoint(params, model_dir)
  assert metrics["step"] == 6 and metrics["num_questions"] == 24
  np.testing.assert_allclose(metrics["exact_match"], evaluated[-1]["exact_match"])
  assert len(run.task.predictions) == 24
  assert tf.io.gfile.glob(f"{layout.eval_dir(model_dir)}/evaluation-6.*")
  # The checkpoint's optimizer slots are not an evaluation's concern: no warning per slot.
  del run
  gc.collect()
  assert not warnings.unrestored(), warnings.unrestored()[:3]


class _TensorFlowWarnings(logging.Handler):
  """Collects what TF logs about checkpoint values left unrestored."""

  def __init__(self):
    super().__init__(logging.WARNING)
    self.messages = []
    tf.get_logger().addHandler(self)

  def emit(self, record):
    self.messages.append(record.getMessage())

  def unrestored(self):
    tf.get_logger().removeHandler(self)
    return [m for m in self.messages if "unrestored" in m or "could not be found" in m]
