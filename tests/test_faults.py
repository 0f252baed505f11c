"""Faults on purpose: processes killed with SIGKILL or stopped with SIGTERM mid-work, and
artifacts damaged on disk. Marked `fault` (run them alone with `pytest -m fault`); every
child process runs under a timeout and is killed at teardown, so none can hang.

  index builder  SIGKILL while it writes an export: no reader lists or loads the partial
                 export, the trainer's index stays on the previous version, a restarted
                 builder commits the version, garbage collection removes the partial one
  trainer        SIGKILL mid-run: the restart resumes at the newest checkpoint and every
                 checkpoint reads back whole; SIGTERM: a checkpoint of the step reached,
                 then exit 42; a damaged newest checkpoint: refused with a log line, the
                 run resumes from the one before
  damaged files  index export (truncated, a flipped byte, a missing file, a garbled
                 manifest), encoder snapshot, served model: refused by file name, and the
                 reader (trainer index, index builder, server) keeps what it had
  server         SIGKILL and restart: the same models, versions and answers
"""
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import get_model_status_pb2
from tensorflow_serving.apis import model_service_pb2_grpc
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

from realm_tf.data.block_store import BlockStore, blocks_pattern
from realm_tf.export import exporter
from realm_tf.io import layout, storage, versioned
from realm_tf.pipelines import index_builder
from realm_tf.retrieval import index_loading
from realm_tf.retrieval.index_export import shard_name
from realm_tf.retrieval.knowledge_index import KnowledgeIndex
from realm_tf.retrieval import snapshots
from realm_tf.training import checkpoints, preemption, train_lib
from realm_tf.training.preemption import RESTART_EXIT_CODE
from realm_tf.retrieval.refresh import IndexRefresher, RefreshSettings
from serving.server import ModelServer, ServerOptions
from tests import serving_models
from tests import task_fixtures as tf_

pytestmark = pytest.mark.fault

AVAILABLE = get_model_status_pb2.ModelVersionStatus.AVAILABLE
END = get_model_status_pb2.ModelVersionStatus.END
DIMENSION = 16  # configs/tiny.yaml: model.retriever.projection_size
STEP_TIMEOUT = 600.0  # seconds a child may take to reach what a test waits for (a loaded
# machine: on an idle 2-core one the slowest step takes well under a minute)


# ------------------------------------------------------------------------------ helpers


class Child:
  """`python ARGS` in its own session (so a signal reaches all of it), output in a file."""

  def __init__(self, args, log_path: str, repo_dir):
    self.log_path = log_path
    self._log = open(log_path, "w")  # pylint: disable=consider-using-with
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(repo_dir),
               PYTHONUNBUFFERED="1")
    self.process = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, *map(str, args)], cwd=str(repo_dir), env=env, stdout=self._log,
        stderr=subprocess.STDOUT, start_new_session=True)

  def log(self) -> str:
    with open(self.log_path, errors="replace") as f:
      return f.read()

  def alive(self) -> bool:
    return self.process.poll() is None

  def send(self, signum: int) -> None:
    os.killpg(self.process.pid, signum)

  def wait(self, timeout: float = STEP_TIMEOUT) -> int:
    try:
      return self.process.wait(timeout)
    except subprocess.TimeoutExpired:
      self.close()
      raise AssertionError(f"the child did not exit within {timeout:.0f}s; its log ends:\n"
                           f"{self.log()[-3000:]}") from None

  def close(self) -> None:
    if self.alive():
      self.send(signal.SIGKILL)
      self.process.wait(30)
    self._log.close()


@pytest.fixture
def children():
  started = []
  yield lambda *args: started.append(Child(*args)) or started[-1]
  for child in started:
    child.close()


def wait_for(condition, what: str, child: Child = None, timeout: float = STEP_TIMEOUT,
             interval: float = 0.05):
  """condition()'s first truthy value; fails naming `what` (with the child's log tail if
  it exited or the time ran out)."""
  end = time.monotonic() + timeout
  while time.monotonic() < end:
    value = condition()
    if value:
      return value
    if child is not None and not child.alive():
      raise AssertionError(f"the child exited ({child.process.returncode}) before {what}; "
                           f"its log ends:\n{child.log()[-3000:]}")
    time.sleep(interval)
  raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}" + (
      f"; the child's log ends:\n{child.log()[-3000:]}" if child is not None else ""))


def flip_byte(path: str, offset: int = -1) -> None:
  """Same size, one bit changed: only a checksum can tell."""
  data = bytearray(storage.read_bytes(path))
  data[offset] ^= 0x01
  with open(path, "wb") as f:
    f.write(bytes(data))


def truncate(path: str) -> None:
  with open(path, "r+b") as f:
    f.truncate(max(os.path.getsize(path) // 2, 1))


@pytest.fixture(scope="module")
def store(corpus):
  return BlockStore.from_tfrecords(blocks_pattern(corpus))


def _one_hot_index(store) -> np.ndarray:
  """[N, DIMENSION]: block row i points along axis i, so row i is its own top hit."""
  return np.eye(len(store), DIMENSION, dtype=np.float32) * 10.0


def _knowledge_index(store, tokenizer) -> KnowledgeIndex:
  return KnowledgeIndex(store, tokenizer, block_seq_length=48, body_length=32,
                        dimension=DIMENSION)


def _top_row(index: KnowledgeIndex, query: np.ndarray) -> int:
  retrieved = tf.distribute.get_strategy().run(
      lambda: index.search(tf.constant(query[None, :]), k=1))
  return int(retrieved.rows.numpy()[0, 0])


# ------------------------------------------------------------------------------ index builder


def _partial_export(index_dir: str, version: int):
  """A data directory of `version` holding index files and no manifest naming it."""
  pattern = re.compile(rf"^{versioned.version_name(version)}\.[0-9a-f]{{32}}$")
  if not os.path.isdir(index_dir):
    return None
  for name in os.listdir(index_dir):
    path = os.path.join(index_dir, name)
    if pattern.match(name) and any(f != versioned.WRITER_MARKER
                                   for f in storage.list_files(path)):
      return path
  return None


def test_index_builder_killed_mid_export_never_publishes_a_partial_index(
    tmp_path, repo_dir, corpus, store, tokenizer, children):
  model_dir = str(tmp_path / "run")
  config = tf_.tiny_config(repo_dir, corpus, "ict")
  train_lib.save_params(config, model_dir)
  index_dir = layout.index_dir(model_dir)
  tf_.publish_index(index_dir, 5, store.block_ids, _one_hot_index(store))
  _, retriever = tf_.build(config)
  snapshots.export_retriever(model_dir, 10, retriever, tokenizer, config)

  # The trainer's side: the index it trains on, refreshed between train loops.
  index = _knowledge_index(store, tokenizer)
  refresher = IndexRefresher(model_dir, index, RefreshSettings(
      index_dir=index_dir, refresh_every_steps=0, train_steps=100,
      first_index_timeout_seconds=30, poll_seconds=0))
  refresher.start(global_step=10, training=False)
  assert index.version == 5

  builder_args = ["-m", "beam.index_builder", "--model_dir", model_dir, "--max_builds", "1",
                  "--poll_seconds", "0.2"]
  builder = children(builder_args, str(tmp_path / "builder1.log"), repo_dir)
  partial = wait_for(lambda: _partial_export(index_dir, 10), "index files being written",
                     builder, interval=0.005)
  builder.send(signal.SIGKILL)
  builder.wait(30)
  assert not os.path.exists(versioned.manifest_path(index_dir, 10)), (
      "the build committed before it was killed; the kill came too late to test anything")

  # Nothing lists, resolves or loads the partial export.
  assert [v.version for v in versioned.list_versions(index_dir)] == [5]
  assert index_loading.resolve_export(index_dir).version == 5
  with pytest.raises(versioned.VersionError, match="not a committed version|not committed"):
    versioned.read_version(partial)
  # The trainer keeps training on version 5.
  refresher.after_loop(11)
  assert index.version == 5
  assert _top_row(index, _one_hot_index(store)[3]) == 3

  builder = children(builder_args, str(tmp_path / "builder2.log"), repo_dir)
  assert builder.wait() == 0, builder.log()[-3000:]
  assert [v.version for v in versioned.list_versions(index_dir)] == [5, 10]
  refresher.after_loop(12)
  assert index.version == 10
  assert versioned.read_version(index.export.path).path != partial
  # The crashed writer's directory is unreferenced: garbage collection takes it (here at
  # once; by default only once nothing in it is younger than six hours).
  assert versioned.garbage_collect(index_dir, keep=3, stale_seconds=0) == [partial]
  assert [v.version for v in versioned.list_versions(index_dir)] == [5, 10]


def _running(pid: int) -> bool:
  """Whether `pid` is a live process (not gone, not a zombie awaiting its reaper)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
  except FileNotFoundError:
    return False


_TRAINER_STANDIN = """
import sys, time
from realm_tf.retrieval.refresh import IndexBuilderProcess
builder = IndexBuilderProcess(sys.argv[1], ["--poll_seconds", "0.2"])
print("builder pid", builder.process.pid, flush=True)
time.sleep(600)
"""


def test_an_index_builder_stops_when_the_trainer_that_started_it_is_killed(
    tmp_path, repo_dir, corpus, children):
  """A trainer SIGKILLed mid-run never writes TRAINING_DONE: its builder child sees its
  parent gone and exits instead of waiting (and publishing) for ever."""
  model_dir = str(tmp_path / "run")
  train_lib.save_params(tf_.tiny_config(repo_dir, corpus, "ict"), model_dir)
  trainer = children(["-c", _TRAINER_STANDIN, model_dir], str(tmp_path / "trainer.log"),
                     repo_dir)
  pid = int(wait_for(lambda: re.search(r"builder pid (\d+)", trainer.log()),
                     "the builder to start", trainer).group(1))
  wait_for(lambda: "watching" in storage.read_text(layout.builder_log_path(model_dir))
           if os.path.exists(layout.builder_log_path(model_dir)) else None,
           "the builder to watch the run", trainer)
  os.kill(trainer.process.pid, signal.SIGKILL)  # the trainer alone, not its process group
  trainer.wait(30)
  try:
    wait_for(lambda: not _running(pid), "the orphaned builder to exit", timeout=60)
  finally:
    if _running(pid):
      os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------------------ trainer


def _checkpoint_steps(model_dir: str) -> list:
  state = tf.train.get_checkpoint_state(layout.checkpoint_dir(model_dir))
  if state is None:
    return []
  return [int(p.rsplit("-", 1)[1]) for p in state.all_model_checkpoint_paths]


def _metric_steps(model_dir: str) -> list:
  if not os.path.exists(layout.metrics_path(model_dir)):
    return []
  return [r["step"] for r in layout.read_metrics(model_dir) if r.get("mode") == "ict"]


def test_trainer_survives_sigkill_sigterm_and_a_damaged_checkpoint(
    tmp_path, repo_dir, corpus, children):
  model_dir = str(tmp_path / "run")
  checkpoint_dir = layout.checkpoint_dir(model_dir)

  def trainer(log_name, checkpoint_interval, *extra):
    overrides = ",".join([
        "task.type=ict", f"index.blocks={corpus}",
        f"task.ict.train_data.input_path={os.path.join(corpus, 'ict-*')}",
        "trainer.train_steps=100000", "trainer.steps_per_loop=5",
        "trainer.summary_interval=5", "trainer.max_to_keep=20",
        f"trainer.checkpoint_interval={checkpoint_interval}"])
    return children(["-m", "realm_tf.train", "--config", "configs/tiny.yaml", "--model_dir",
                     model_dir, "--override", overrides, *extra],
                    str(tmp_path / log_name), repo_dir)

  # 1. SIGKILL once a few checkpoints exist (one every 10 steps).
  first = trainer("train1.log", 10)
  wait_for(lambda: len(_checkpoint_steps(model_dir)) >= 3, "three checkpoints", first)
  first.send(signal.SIGKILL)
  first.wait(30)
  saved = _checkpoint_steps(model_dir)
  last = saved[-1]
  for step in saved:  # every checkpoint the state names reads back whole
    prefix = os.path.join(checkpoint_dir, f"ckpt-{step}")
    assert checkpoints.verify_checkpoint(prefix) > 0
    assert tf.train.load_variable(prefix, "global_step/.ATTRIBUTES/VARIABLE_VALUE") == step
  logged_before = len(_metric_steps(model_dir))
  assert _metric_steps(model_dir)[-1] >= last

  # 2. The restart resumes at `last` exactly; no periodic checkpoints this time, so the one
  # SIGTERM makes is the only new one.
  second = trainer("train2.log", 100_000)
  wait_for(lambda: len(_metric_steps(model_dir)) >= logged_before + 3,
           "three train loops after the restart", second)
  assert _metric_steps(model_dir)[logged_before] == last + 5  # loops of 5 steps from `last`
  assert f"ckpt-{last}" in second.log()
  second.send(signal.SIGTERM)
  assert second.wait() == RESTART_EXIT_CODE, second.log()[-3000:]
  after_sigterm = _checkpoint_steps(model_dir)
  preempted = after_sigterm[-1]
  assert after_sigterm[:-1] == saved and preempted >= last + 15
  assert preempted == _metric_steps(model_dir)[-1]  # the step reached, nothing after it
  checkpoints.verify_checkpoint(os.path.join(checkpoint_dir, f"ckpt-{preempted}"))

  # 3. The newest checkpoint damaged on disk: refused with a log line naming it, the run
  # resumes from the one before and trains on.
  data_file, = tf.io.gfile.glob(os.path.join(checkpoint_dir, f"ckpt-{preempted}.data-*"))
  truncate(data_file)
  third = trainer("train3.log", 100_000, "--stop_at_step", last + 10)
  assert third.wait() == 0, third.log()[-3000:]
  log = third.log()
  assert re.search(rf"Checkpoint \S*ckpt-{preempted} is damaged and is refused", log), log[-3000:]
  assert os.path.exists(os.path.join(checkpoint_dir, checkpoints.DAMAGED_DIR,
                                     os.path.basename(data_file)))
  assert _metric_steps(model_dir)[-2:] == [last + 5, last + 10]
  assert _checkpoint_steps(model_dir)[-1] == last + 10


def test_sigterm_is_a_preemption_notice_only_while_training(tmp_path):
  """The watch arms TF's handler for the train loops only: building a run (in a test
  session, a notebook, an evaluation) leaves the process's SIGTERM handling as it was."""
  step = tf.Variable(0, dtype=tf.int64)
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(step=step), str(tmp_path), 3)
  before = signal.getsignal(signal.SIGTERM)
  watch = preemption.PreemptionWatch(tf.distribute.get_strategy(), manager, step)
  assert watch.action is not None and signal.getsignal(signal.SIGTERM) is before
  with watch.armed():
    assert signal.getsignal(signal.SIGTERM) is not before
  assert signal.getsignal(signal.SIGTERM) is before
  off = preemption.PreemptionWatch(tf.distribute.get_strategy(), manager, step, enabled=False)
  assert off.action is None
  with off.armed():
    assert signal.getsignal(signal.SIGTERM) is before


def test_damaged_checkpoints_are_set_aside_newest_first(tmp_path, caplog):
  """refuse_damaged on its own: flipped byte, truncation, a missing data file; and no
  silent fresh start when every checkpoint is damaged."""
  variable = tf.Variable(np.arange(1000, dtype=np.float32))
  step = tf.Variable(0, dtype=tf.int64)
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=variable, step=step),
                                       str(tmp_path), max_to_keep=10)
  for value in range(1, 5):
    step.assign(value)
    manager.save(checkpoint_number=value)
  flip_byte(tf.io.gfile.glob(str(tmp_path / "ckpt-4.data-*"))[0], offset=100)
  truncate(tf.io.gfile.glob(str(tmp_path / "ckpt-3.data-*"))[0])
  os.remove(tf.io.gfile.glob(str(tmp_path / "ckpt-2.data-*"))[0])
  caplog.set_level(logging.ERROR)
  assert checkpoints.refuse_damaged(str(tmp_path)) == str(tmp_path / "ckpt-1")
  assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt-1")
  refused = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
  assert len(refused) == 3 and "ckpt-4" in refused[0] and "ckpt-2" in refused[2]
  # The manager now resumes from ckpt-1 and saves on top of it.
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=variable, step=step),
                                       str(tmp_path), max_to_keep=10)
  manager.restore_or_initialize()
  assert int(step.numpy()) == 1
  truncate(str(tmp_path / "ckpt-1.index"))
  with pytest.raises(checkpoints.DamagedCheckpointsError, match="every checkpoint"):
    checkpoints.refuse_damaged(str(tmp_path))


# ------------------------------------------------------------------------------ damaged files


def _damage_index(export_path: str, how: str) -> str:
  """Damages one export; returns the text the refusal must contain."""
  shard = os.path.join(export_path, shard_name(0, 1))
  if how == "truncated":
    truncate(os.path.join(shard, "embeddings.npy"))
    return "embeddings.npy: "
  if how == "flipped byte":
    flip_byte(os.path.join(shard, "embeddings.npy"))
    return "embeddings.npy: CRC32C does not match"
  if how == "missing":
    os.remove(os.path.join(shard, "block_ids.npy"))
    return "block_ids.npy: missing"
  raise ValueError(how)


def test_damaged_index_exports_are_refused_and_the_trainer_keeps_its_index(
    tmp_path, store, tokenizer, caplog):
  index_dir = str(tmp_path / "index")
  tf_.publish_index(index_dir, 1, store.block_ids, _one_hot_index(store))
  index = _knowledge_index(store, tokenizer)
  assert index.maybe_swap(index_dir) and index.version == 1
  caplog.set_level(logging.WARNING)
  rng = np.random.default_rng(0)
  for version, how in enumerate(["truncated", "flipped byte", "missing"], 2):
    path = tf_.publish_index(index_dir, version, store.block_ids,
                             rng.normal(size=[len(store), DIMENSION]).astype(np.float32))
    expected = _damage_index(path, how)
    caplog.clear()
    assert not index.maybe_swap(index_dir), how
    assert index.version == 1 and _top_row(index, _one_hot_index(store)[5]) == 5
    assert [r for r in caplog.records if "is refused" in r.getMessage()
            and expected in r.getMessage()], (how, [r.getMessage() for r in caplog.records])
    caplog.clear()
    assert not index.maybe_swap(index_dir)  # logged once, not re-read at every poll
    assert not caplog.records
    with pytest.raises(versioned.VerificationError, match=re.escape(expected)):
      index_loading.load_searcher(index_dir, backend="exact")
  # A manifest that is not JSON is skipped as uncommitted, with a warning naming it.
  garbled = versioned.manifest_path(index_dir, 9)
  with open(garbled, "w") as f:
    f.write('{"version": 9, "data_dir": ')
  caplog.clear()
  assert [v.version for v in versioned.list_versions(index_dir)] == [1, 2, 3, 4]
  assert [r for r in caplog.records if garbled in r.getMessage()]
  # A manifest naming files outside its export is refused before anything is read.
  escaping = tf_.publish_index(index_dir, 10, store.block_ids, _one_hot_index(store))
  manifest = versioned.read_json(versioned.manifest_path(index_dir, 10))
  manifest["files"][0]["name"] = "../000000000001." + "0" * 32 + "/x.npy"
  with open(versioned.manifest_path(index_dir, 10), "w") as f:
    json.dump(manifest, f)
  with pytest.raises(versioned.VerificationError, match="outside its directory"):
    index_loading.load_searcher(escaping, backend="exact")
  assert not index.maybe_swap(index_dir) and index.version == 1
  # A good newer export is taken.
  tf_.publish_index(index_dir, 11, store.block_ids, _one_hot_index(store)[::-1].copy())
  assert index.maybe_swap(index_dir) and index.version == 11


def test_damaged_encoder_snapshot_is_refused_by_the_index_builder(
    tmp_path, repo_dir, corpus, tokenizer, caplog):
  model_dir = str(tmp_path / "run")
  config = tf_.tiny_config(repo_dir, corpus, "ict")
  train_lib.save_params(config, model_dir)
  _, retriever = tf_.build(config)
  paths = snapshots.export_retriever(model_dir, 10, retriever, tokenizer, config)
  data_file, = tf.io.gfile.glob(os.path.join(paths["block_encoder"], "variables",
                                             "variables.data-*"))
  flip_byte(data_file, offset=len(storage.read_bytes(data_file)) // 2)
  index_dir = layout.index_dir(model_dir)
  with pytest.raises(versioned.VerificationError, match="variables.data.*CRC32C"):
    index_builder.build_once(model_dir, blocks_pattern(corpus), index_dir, 2, "exact", 3)
  assert versioned.list_versions(index_dir) == [] and _partial_export(index_dir, 10) is None
  # The builder's loop logs the refusal and keeps polling until training is done (told
  # never to give up: giving up is tests/test_builder_failures.py's).
  caplog.set_level(logging.ERROR)
  result = []
  thread = threading.Thread(target=lambda: result.append(index_builder.run_index_builder(
      index_builder.IndexBuilderConfig(model_dir, poll_seconds=0.1,
                                       max_consecutive_failures=0))))
  thread.start()
  wait_for(lambda: any("Index build failed" in r.getMessage() for r in caplog.records),
           "the builder to log the refusal", timeout=60)
  layout.mark_training_done(model_dir, 10)
  thread.join(60)
  assert result == [0]


class _Doubler(tf.Module):
  """A minimal model for the exporter: y = x * w."""

  def __init__(self, factor: float):
    super().__init__()
    self.w = tf.Variable(np.full([64], factor, np.float32))

  @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
  def predict(self, x):
    return {"y": x * self.w[0]}

  def signatures(self):
    return {"serving_default": self.predict}


def _export(out: str, version: int, factor: float) -> str:
  return exporter.save_export(_Doubler(factor), out, "doubler", version, {},
                              [{"x": np.ones([1], np.float32)}])


def test_damaged_served_model_is_refused_and_the_serving_version_stays(tmp_path, caplog):
  out = str(tmp_path / "models")
  first = _export(out, 1, 2.0)
  assert os.path.exists(os.path.join(first, "assets.extra", versioned.COPIED_MANIFEST))
  options = ServerOptions(model_name="doubler", model_base_path=os.path.join(out, "doubler"),
                          port=0, file_system_poll_wait_seconds=0)
  caplog.set_level(logging.ERROR, logger="serving.model_manager")
  with ModelServer(options) as server, grpc.insecure_channel(
      f"127.0.0.1:{server.port}") as channel:
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

    def answer():
      request = predict_pb2.PredictRequest()
      request.model_spec.name = "doubler"
      request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([3.0], np.float32)))
      response = stub.Predict(request, timeout=10)
      return response.model_spec.version.value, float(tf.make_ndarray(response.outputs["y"])[0])

    def status(version):
      response = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
          get_model_status_pb2.GetModelStatusRequest(
              model_spec=dict(name="doubler", version=dict(value=version))), timeout=10)
      entry, = response.model_version_status
      return entry.state, entry.status.error_code, entry.status.error_message

    assert answer() == (1, 6.0)
    damaged = {2: ("flipped byte", "variables/variables.data-*", "CRC32C does not match"),
               3: ("truncated", "saved_model.pb", "manifest says")}
    for version, (how, pattern, message) in damaged.items():
      path = _export(out, version, 5.0)
      target, = tf.io.gfile.glob(os.path.join(path, pattern))
      name = os.path.basename(pattern).rstrip("*")
      if how == "flipped byte":
        flip_byte(target, offset=os.path.getsize(target) // 2)
      else:
        truncate(target)
      caplog.clear()
      server.manager.poll()
      state, code, error = status(version)
      assert state == END and code == grpc.StatusCode.DATA_LOSS.value[0], (how, error)
      assert name in error and message in error, error
      assert [r for r in caplog.records if "failed to load" in r.getMessage()
              and name in r.getMessage()]
      assert answer() == (1, 6.0)
    _export(out, 4, 7.0)
    server.manager.poll()
    server.manager.wait_for_retirements(10)
    assert answer() == (4, 21.0)


# ------------------------------------------------------------------------------ server


def test_server_killed_and_restarted_serves_the_same_models_and_versions(
    tmp_path, repo_dir, children):
  models = tmp_path / "models"
  numeric = serving_models.save_numeric(str(tmp_path / "built_numeric"))
  qa = serving_models.save_fake_realm_qa(str(tmp_path / "built_qa"), "v1")
  for version in (1, 2):
    serving_models.publish(numeric, str(models / "numeric"), version)
  serving_models.publish(qa, str(models / "realm_qa"), 3)
  config_file = tmp_path / "models.config"
  config_file.write_text(
      f'model_config_list {{ config {{ name: "numeric" base_path: "{models / "numeric"}" '
      f'model_platform: "tensorflow" model_version_policy {{ all {{}} }} }} '
      f'config {{ name: "realm_qa" base_path: "{models / "realm_qa"}" '
      f'model_platform: "tensorflow" }} }}')

  def start(log_name):
    child = children(["-m", "serving.server", "--port=0",
                      f"--model_config_file={config_file}"], str(tmp_path / log_name),
                     repo_dir)
    line = wait_for(lambda: re.search(r"serving\.server: gRPC (\S+)", child.log()),
                    "the server to listen", child)
    return child, line.group(1)

  def observe(address) -> dict:
    with grpc.insecure_channel(address) as channel:
      models_stub = model_service_pb2_grpc.ModelServiceStub(channel)
      predict = prediction_service_pb2_grpc.PredictionServiceStub(channel)
      seen = {}
      for name in ("numeric", "realm_qa"):
        response = models_stub.GetModelStatus(get_model_status_pb2.GetModelStatusRequest(
            model_spec=dict(name=name)), timeout=10)
        seen[name] = sorted((s.version, s.state) for s in response.model_version_status)
      for version in (1, 2):
        request = predict_pb2.PredictRequest(model_spec=dict(name="numeric",
                                                             version=dict(value=version)))
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.ones([2, 3], np.float32)))
        seen[f"numeric/{version}"] = tf.make_ndarray(
            predict.Predict(request, timeout=10).outputs["y"]).tolist()
      request = predict_pb2.PredictRequest(model_spec=dict(name="realm_qa"))
      request.inputs["question"].CopyFrom(tf.make_tensor_proto(["who?"]))
      response = predict.Predict(request, timeout=10)
      seen["realm_qa"] += [response.model_spec.version.value,
                           tf.make_ndarray(response.outputs["answer"]).tolist()]
      return seen

  first, address = start("server1.log")
  before = observe(address)
  assert before["numeric"] == [(1, AVAILABLE), (2, AVAILABLE)]
  assert before["realm_qa"][:2] == [(3, AVAILABLE), 3]
  first.send(signal.SIGKILL)
  first.wait(30)
  second, address = start("server2.log")
  assert observe(address) == before
  second.send(signal.SIGTERM)
  assert second.wait(60) == 0
