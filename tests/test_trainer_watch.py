"""The trainer's watchers (realm_tf.io.trainer_watch): the index builder and the side-car
evaluator notice a trainer that publishes nothing for runtime.progress_stall_seconds, say so
in their logs and status, and keep waiting; a new checkpoint or snapshot is progress again,
TRAINING_DONE ends the watch. A fake clock, real files."""
import logging
import threading

import pytest
import tensorflow as tf

from realm_tf.io import layout
from realm_tf.io.trainer_watch import TrainerWatch
from realm_tf.pipelines import index_builder
from realm_tf.training import train_lib
from tests import task_fixtures as tf_


class Clock:
  def __init__(self):
    self.now = 1000.0

  def __call__(self) -> float:
    return self.now


def _checkpoint(model_dir: str, step: int):
  counter = tf.Variable(step, dtype=tf.int64)
  tf.train.CheckpointManager(tf.train.Checkpoint(step=counter), layout.checkpoint_dir(model_dir),
                             3).save(checkpoint_number=step)


def _stall_warnings(caplog) -> list:
  return [r for r in caplog.records
          if r.levelno == logging.WARNING and "it is stalled" in r.getMessage()]


def test_a_silent_trainer_is_reported_stalled_and_a_new_checkpoint_clears_it(tmp_path, caplog):
  model_dir = str(tmp_path / "run")
  clock = Clock()
  watch = TrainerWatch(model_dir, 100, "test watcher", clock=clock)
  _checkpoint(model_dir, 5)
  caplog.set_level(logging.INFO)
  assert not watch.check()
  clock.now += 99
  assert not watch.check() and not _stall_warnings(caplog)
  clock.now += 2  # 101 s without a new checkpoint, but the last look was 2 s ago
  assert not watch.check()
  clock.now += 9  # the next look (every stall_seconds / 10) sees it
  assert watch.check()
  [warning] = _stall_warnings(caplog)
  assert "test watcher" in warning.getMessage() and "ckpt-5" in warning.getMessage()
  status = watch.status()
  assert status["trainer_stalled"] and status["newest_checkpoint"] == "ckpt-5"
  assert status["seconds_without_progress"] == pytest.approx(110)
  # Still stalled: the warning is repeated once per stall_seconds, not at every look.
  clock.now += 50
  assert watch.check() and len(_stall_warnings(caplog)) == 1
  clock.now += 60
  assert watch.check() and len(_stall_warnings(caplog)) == 2
  # A slow trainer's next checkpoint: progress again.
  _checkpoint(model_dir, 10)
  clock.now += 30
  assert not watch.check()
  assert not watch.status()["trainer_stalled"]
  assert watch.status()["newest_checkpoint"] == "ckpt-10"
  assert any("making progress again" in r.getMessage() for r in caplog.records)


def test_a_finished_run_is_not_stalled_and_reads_are_spaced(tmp_path, monkeypatch):
  model_dir = str(tmp_path / "run")
  clock = Clock()
  watch = TrainerWatch(model_dir, 100, "test watcher", clock=clock)
  looks = []
  real = TrainerWatch._progress_mark
  monkeypatch.setattr(TrainerWatch, "_progress_mark", lambda self: looks.append(1) or real(self))
  watch.check()
  watch.check()
  assert len(looks) == 1  # a second look within stall_seconds / 10 reads nothing
  clock.now += 10
  watch.check()
  assert len(looks) == 2
  tf.io.gfile.makedirs(model_dir)
  layout.mark_training_done(model_dir, 20)
  clock.now += 500
  assert not watch.check(force=True)
  assert watch.status()["training_done"] and not watch.status()["trainer_stalled"]
  with pytest.raises(ValueError, match="stall_seconds"):
    TrainerWatch(model_dir, 0, "test watcher")


def test_the_index_builder_reports_a_stalled_trainer_and_keeps_waiting(
    tmp_path, repo_dir, corpus, caplog):
  """No snapshot and no checkpoint for progress_stall_seconds: the builder logs the stall
  and goes on polling; it stops on TRAINING_DONE, and its last line carries the status."""
  model_dir = str(tmp_path / "run")
  train_lib.save_params(tf_.tiny_config(repo_dir, corpus, "pretrain",
                                        runtime__progress_stall_seconds=0.3), model_dir)
  caplog.set_level(logging.INFO)
  result = []
  builder = threading.Thread(target=lambda: result.append(index_builder.run_index_builder(
      index_builder.IndexBuilderConfig(model_dir, poll_seconds=0.05))))
  builder.start()
  try:
    deadline = threading.Event()
    for _ in range(200):
      if _stall_warnings(caplog):
        break
      deadline.wait(0.05)
    assert _stall_warnings(caplog), "no stall warning within 10 s"
    assert builder.is_alive()  # a stalled trainer is reported, not given up on
  finally:
    layout.mark_training_done(model_dir, 0)
    builder.join(30)
  assert not builder.is_alive() and result == [0]
  [done] = [r.getMessage() for r in caplog.records if "Index builder done" in r.getMessage()]
  assert "'training_done': True" in done and "'trainer_stalled': False" in done
