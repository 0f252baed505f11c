"""The side-car evaluator (`python -m realm_tf.train --mode continuous_eval`) beside a
training process on the same model_dir, as real processes: REALM pre-training (tiny config,
the child index builder) with --mode train, and an evaluator started at the same moment.

It must evaluate each checkpoint it sees, the final one included, with the task's held-out
metrics (masked-span accuracy, retrieval utility) and the index it searched, write its own
JSON lines and TensorBoard summaries, stop by itself after the final checkpoint, and leave
the trainer's files (metrics.jsonl, snapshots, TRAINING_DONE) to the trainer. The stop rule,
the wait for a checkpoint and the read-only index refresher are checked without processes.
"""
import glob
import json
import os
import subprocess
import sys
import time
import types

import numpy as np
import pytest
import tensorflow as tf

from realm_tf.data.block_store import BlockStore
from realm_tf.io import layout, versioned
from realm_tf.retrieval import snapshots
from realm_tf.retrieval.refresh import IndexRefresher, RefreshSettings
from realm_tf.training import continuous_eval
from tests import task_fixtures as tf_

RUN_TIMEOUT = 300.0  # both processes, generous for a loaded 2-core machine
METRICS = ("loss", "mlm_accuracy", "span_accuracy", "retrieval_utility")


def _command(repo_dir, model_dir, corpus, *extra):
  pretraining = os.path.join(corpus, "pretraining-*")
  overrides = [f"index.blocks={corpus}", f"task.pretrain.train_data.input_path={pretraining}",
               f"task.pretrain.validation_data.input_path={pretraining}",
               "task.pretrain.start_index_builder=true", "trainer.train_steps=10",
               "trainer.checkpoint_interval=5", "trainer.steps_per_loop=5",
               "trainer.summary_interval=5", "trainer.validation_interval=5"]
  return [sys.executable, "-m", "realm_tf.train", "--experiment", "realm/pretrain",
          "--config", str(repo_dir / "configs" / "tiny.yaml"), "--model_dir", model_dir,
          "--override", ",".join(overrides), *extra]


def _summaries(directory: str) -> dict[str, dict[int, float]]:
  """tag → {step: value} of every event file under `directory`."""
  out: dict[str, dict[int, float]] = {}
  for path in glob.glob(os.path.join(directory, "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        out.setdefault(value.tag, {})[event.step] = float(
            tf.make_ndarray(value.tensor) if value.HasField("tensor") else value.simple_value)
  return out


def test_side_car_evaluates_each_checkpoint_beside_the_trainer(tmp_path, repo_dir, corpus):
  model_dir = str(tmp_path / "realm")
  logs = {name: str(tmp_path / f"{name}.log") for name in ("trainer", "evaluator")}
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="1")
  env.pop("TF_CONFIG", None)
  commands = dict(trainer=_command(repo_dir, model_dir, corpus, "--mode", "train"),
                  evaluator=_command(repo_dir, model_dir, corpus, "--mode", "continuous_eval",
                                     "--eval_timeout", "240"))
  start = time.time()
  processes = {}
  for name, command in commands.items():
    with open(logs[name], "w") as log:
      processes[name] = subprocess.Popen(  # pylint: disable=consider-using-with
          command, cwd=repo_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
  once = None
  try:
    codes = {"trainer": processes["trainer"].wait(max(1.0, start + RUN_TIMEOUT - time.time()))}
    if codes["trainer"] == 0:
      # --mode eval with the run's own params.yaml, started as soon as the final checkpoint
      # exists: it starts up while the side-car evaluates that checkpoint.
      once = subprocess.Popen(  # pylint: disable=consider-using-with
          [sys.executable, "-m", "realm_tf.train", "--mode", "eval", "--model_dir", model_dir],
          cwd=repo_dir, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    codes["evaluator"] = processes["evaluator"].wait(
        max(1.0, start + RUN_TIMEOUT - time.time()))
    once_output = once.communicate(timeout=RUN_TIMEOUT)[0] if once else ""
  finally:
    for p in [*processes.values(), *([once] if once else [])]:
      if p.poll() is None:
        p.kill()
        p.wait()
  texts = {name: open(path).read() for name, path in logs.items()}
  assert codes == dict(trainer=0, evaluator=0), "\n\n".join(t[-4000:] for t in texts.values())

  # One line per checkpoint the evaluator saw, in order, the final one (step 10) last.
  lines = layout.read_json_lines(layout.evaluator_log_path(model_dir, "continuous_eval"))
  steps = [line["step"] for line in lines]
  assert steps and steps[-1] == 10 and set(steps) <= {5, 10}, lines
  assert steps == sorted(set(steps))
  committed = {v.version for v in versioned.list_versions(layout.index_dir(model_dir))}
  for line in lines:
    assert all(np.isfinite(line[m]) for m in METRICS), line
    assert 0 <= line["span_accuracy"] <= 1 and 0 <= line["mlm_accuracy"] <= 1
    assert line["index_version"] in committed  # a committed index of the run, read-only
  result = json.JSONDecoder().raw_decode(
      texts["evaluator"][texts["evaluator"].rindex("\n{") + 1:])[0]
  assert result["finished"] and not result["timed_out"] and result["evaluated_steps"] == steps

  # Its own TensorBoard summaries, at the steps it evaluated; nothing in validation/.
  summaries = _summaries(os.path.join(model_dir, layout.evaluator_summary_subdir(
      "continuous_eval")))
  for metric in METRICS:
    assert sorted(summaries[metric]) == steps, summaries.keys()
  assert not glob.glob(os.path.join(model_dir, "validation", "events.*"))

  # The trainer's files are the trainer's alone: train lines only in metrics.jsonl (with
  # --mode train it evaluated nothing itself), its snapshots, its TRAINING_DONE.
  history = layout.read_metrics(model_dir)
  assert [(r["mode"], r["step"]) for r in history] == [("pretrain", 5), ("pretrain", 10)]
  assert snapshots.latest_snapshot_step(model_dir) == 5
  assert sorted(v.version for v in versioned.list_versions(
      layout.query_encoder_dir(model_dir))) == [0, 5]
  with open(layout.training_done_path(model_dir)) as f:
    assert json.load(f)["pid"] == processes["trainer"].pid

  # --mode eval: the newest checkpoint (the final one), once, in eval/eval.*; nothing of
  # the trainer's changed.
  assert once.returncode == 0, once_output[-6000:]
  assert [line["step"] for line in layout.read_json_lines(
      layout.evaluator_log_path(model_dir, "eval"))] == [10]
  assert layout.read_metrics(model_dir) == history


def test_the_side_car_follows_the_runs_newest_index_read_only(tmp_path, repo_dir, corpus):
  """In one process: each evaluation searches the run's newest committed index (7 once it
  is published), and the evaluator exports no snapshot, writes no TRAINING_DONE and no
  metrics.jsonl line."""
  model_dir = str(tmp_path / "realm")
  index_dir = layout.index_dir(model_dir)
  config = tf_.tiny_config(
      repo_dir, corpus, "pretrain", task__pretrain__validation_data__input_path=os.path.join(
          corpus, "pretraining-*"), index__first_index_timeout_seconds=5,
      runtime__progress_stall_seconds=0.3)
  store = BlockStore.from_tfrecords(os.path.join(corpus, "blocks-*"))
  rng = np.random.default_rng(0)
  tf_.publish_index(index_dir, 0, store.block_ids, rng.normal(size=[len(store), 16]))
  evaluator = continuous_eval.SideCarEvaluator(config, model_dir, name="side")
  step = tf.Variable(5, dtype=tf.int64)
  saved = tf.train.CheckpointManager(
      tf.train.Checkpoint(model=evaluator.run.model, global_step=step),
      layout.checkpoint_dir(model_dir), 3, step_counter=step)
  first = evaluator.evaluate(saved.save(checkpoint_number=5))
  tf_.publish_index(index_dir, 7, store.block_ids, rng.normal(size=[len(store), 16]))
  step.assign(10)
  second = evaluator.evaluate(saved.save(checkpoint_number=10))
  assert (first["step"], second["step"]) == (5, 10)
  lines = layout.read_json_lines(layout.evaluator_log_path(model_dir, "side"))
  assert [(line["step"], line["index_version"]) for line in lines] == [(5, 0), (10, 7)]
  assert snapshots.latest_snapshot_step(model_dir) is None
  assert not layout.training_done(model_dir)
  assert not os.path.exists(layout.metrics_path(model_dir))

  # The loop: train_steps is 20 and no checkpoint comes after step 10, so it reports the
  # trainer stalled after progress_stall_seconds (0.3 s), waits on and gives up after its
  # timeout; once the trainer marks TRAINING_DONE at 10, step 10 is the final one.
  waited = continuous_eval.evaluate_continuously(config, model_dir, name="stalled", timeout=1,
                                                 poll_seconds=0.1)
  assert waited["evaluated_steps"] == [10] and waited["timed_out"] and not waited["finished"]
  assert waited["trainer"]["trainer_stalled"]
  assert waited["trainer"]["newest_checkpoint"] == "ckpt-10"
  layout.mark_training_done(model_dir, 10)
  done = continuous_eval.evaluate_continuously(config, model_dir, name="done", timeout=60,
                                               poll_seconds=0.1)
  assert done["evaluated_steps"] == [10] and done["finished"] and not done["timed_out"]
  assert not done["trainer"]["trainer_stalled"]


def test_an_open_qa_side_car_writes_em_and_recall_of_each_checkpoint(tmp_path, repo_dir,
                                                                     corpus):
  """Open-QA through the same loop: EM and recall@k of the checkpoint at train_steps in
  eval/<name>-<step>.json (with the predictions) and in eval/<name>.jsonl, not in
  metrics.jsonl; then it stops by itself."""
  model_dir = str(tmp_path / "nq")
  questions = tf_.write_questions(str(tmp_path / "questions.jsonl"))
  config = tf_.tiny_config(repo_dir, corpus, "openqa", questions, trainer__train_steps=3,
                           task__openqa__validation_data__input_path=questions)
  store = BlockStore.from_tfrecords(os.path.join(corpus, "blocks-*"))
  tf_.publish_index(layout.index_dir(model_dir), 1, store.block_ids,
                    np.random.default_rng(0).normal(size=[len(store), 16]))
  # The checkpoint at train_steps, of the model the task builds (a trainer's is the same
  # model; evaluate_continuously builds its own evaluator to read it).
  _, model = tf_.build(config)
  step = tf.Variable(3, dtype=tf.int64)
  tf.train.CheckpointManager(tf.train.Checkpoint(model=model, global_step=step),
                             layout.checkpoint_dir(model_dir), 3).save(checkpoint_number=3)
  result = continuous_eval.evaluate_continuously(config, model_dir, name="side", timeout=60,
                                                 poll_seconds=0.1)
  assert result["evaluated_steps"] == [3] and result["finished"]
  [line] = layout.read_json_lines(layout.evaluator_log_path(model_dir, "side"))
  with open(os.path.join(layout.eval_dir(model_dir), "side-3.json")) as f:
    saved = json.load(f)
  for metric in ("exact_match", "recall@1", "recall@5"):
    assert 0 <= line[metric] <= 1 and saved[metric] == line[metric]
  assert line["mode"] == "eval:side" and line["step"] == 3
  assert os.path.exists(os.path.join(layout.eval_dir(model_dir), "side-3.predictions.jsonl"))
  assert not os.path.exists(layout.metrics_path(model_dir))


# ----------------------------------------------------------------------- without processes


def test_stop_rule():
  assert not continuous_eval.finished(None, 10, None)
  assert not continuous_eval.finished(None, 10, 10)  # nothing evaluated yet
  assert not continuous_eval.finished(5, 10, None)
  assert continuous_eval.finished(10, 10, None)  # the checkpoint at train_steps
  assert not continuous_eval.finished(5, 10, 8)
  assert continuous_eval.finished(8, 10, 8)  # the trainer finished at 8 (TRAINING_DONE)


def test_waiting_for_a_checkpoint_ends_on_one_on_stop_or_on_the_timeout(tmp_path):
  directory = str(tmp_path / "checkpoints")
  now = [0.0]
  clock, sleep = (lambda: now[0]), (lambda s: now.__setitem__(0, now[0] + s))
  with pytest.raises(continuous_eval.NoNewCheckpoint):
    continuous_eval.next_checkpoint(directory, None, 30, lambda: False, 1.0, clock, sleep)
  assert now[0] == 30.0  # polled until the timeout, no longer
  assert continuous_eval.next_checkpoint(directory, None, 30, lambda: True, 1.0, clock,
                                         sleep) is None
  step = tf.Variable(5, dtype=tf.int64)
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(step=step), directory, 3,
                                       step_counter=step)
  first = manager.save(checkpoint_number=5)
  assert continuous_eval.next_checkpoint(directory, None, 30, lambda: False, 1.0, clock,
                                         sleep) == first
  # The same checkpoint again is not new: the wait goes on until a newer one or the end.
  assert continuous_eval.next_checkpoint(directory, first, 30, lambda: True, 1.0, clock,
                                         sleep) is None
  second = manager.save(checkpoint_number=10)
  assert continuous_eval.next_checkpoint(directory, first, 30, lambda: False, 1.0, clock,
                                         sleep) == second


def test_a_read_only_refresher_writes_nothing_and_only_waits(tmp_path):
  """A side-car evaluator's refresher, asked (as Open-QA evaluation asks) to build a missing
  index: no snapshot, no builder, TRAINING_DONE left alone; it waits, then gives up."""
  model_dir = str(tmp_path / "run")
  os.makedirs(model_dir)
  layout.mark_training_done(model_dir, 10)
  marker = os.stat(layout.training_done_path(model_dir)).st_mtime_ns

  class Index:  # never gets an index
    version, export, storage_error = None, None, None

    def maybe_swap(self, index_dir):
      del index_dir
      return False

  settings = RefreshSettings(index_dir=layout.index_dir(model_dir), refresh_every_steps=5,
                             train_steps=10, first_index_timeout_seconds=0.5,
                             poll_seconds=0.1, start_builder=True, read_only=True)
  refresher = IndexRefresher(model_dir, Index(), settings, retriever=types.SimpleNamespace())
  assert refresher.exporter is None and not refresher.writes
  with pytest.raises(TimeoutError):
    refresher.start(5, training=True)
  refresher.after_loop(5)
  refresher.stop(10, reached_train_steps=True)
  assert refresher.builder is None
  assert os.stat(layout.training_done_path(model_dir)).st_mtime_ns == marker
  assert sorted(os.listdir(model_dir)) == [layout.TRAINING_DONE]


def test_an_evaluation_of_a_run_with_its_index_builds_no_shadow_retriever(tmp_path,
                                                                          monkeypatch):
  """The snapshot exporter's shadow retriever is two more towers (0.9 GB at BERT-base):
  built only by a refresher that may export a snapshot (it refreshes, or no index is
  committed yet), never by an evaluation of a run that has its index."""
  model_dir = str(tmp_path / "run")
  index_dir = layout.index_dir(model_dir)
  built = []
  monkeypatch.setattr(snapshots, "SnapshotExporter",
                      lambda *args: built.append(args) or types.SimpleNamespace())

  def refresher(every):
    settings = RefreshSettings(index_dir=index_dir, refresh_every_steps=every,
                               train_steps=10, first_index_timeout_seconds=0.5,
                               poll_seconds=0.1, start_builder=False)
    return IndexRefresher(model_dir, types.SimpleNamespace(), settings,
                          retriever=types.SimpleNamespace(), build_shadow=lambda: None)

  assert refresher(0).exporter is not None  # no index yet: the first is built from one
  tf_.publish_index(index_dir, 1, np.arange(4, dtype=np.int64),
                    np.ones([4, 8], np.float32))
  assert refresher(0).exporter is None and len(built) == 1
  assert refresher(5).exporter is not None and len(built) == 2  # training refreshes
