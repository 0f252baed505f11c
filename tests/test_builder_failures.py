"""An index builder that fails every build gives up, publishes its last error, and the
trainer's wait for an index stops at once with that error.

  builder  FailedBuilds: N failed builds in a row → <model_dir>/INDEX_BUILDER_FAILED and
           exit 3; a committed build resets the count; an old failure is removed when a
           builder starts and when it commits
  trainer  IndexRefresher's first-index and staleness waits stop within one poll of a
           published failure, with its line and the builder's log; the decision goes
           through the role's collectives; an earlier slice's failure stops no new slice
  both     a builder whose snapshot cannot run (in-process, where only the published file
           can end the wait, and as the trainer's real child process) ends the trainer's
           wait with its error, with index.first_index_timeout_seconds at an hour
"""
import os
import threading
import time
import types

import pytest
import tensorflow as tf

from beam import index_builder as index_builder_cli
from realm_tf.io import builder_failure, layout, storage, versioned
from realm_tf.pipelines import index_builder
from realm_tf.retrieval import encoders
from realm_tf.retrieval.refresh import IndexRefresher, RefreshSettings
from realm_tf.training import train_lib
from tests import task_fixtures as tf_

HOUR = 3600.0  # index.first_index_timeout_seconds in these tests: passing proves the early stop


def _run_dir(tmp_path, repo_dir, corpus) -> str:
  """A run directory with params.yaml (configs/tiny.yaml; index.blocks: `corpus`; a
  builder polls every 0.1 s)."""
  model_dir = str(tmp_path / "run")
  config = tf_.tiny_config(repo_dir, corpus, "pretrain", index__poll_seconds=0.1)
  train_lib.save_params(config, model_dir)
  return model_dir


def _commit_snapshot(model_dir: str, step: int) -> None:
  """A committed block-encoder version `step` (the builder loop only reads its number
  here: build_once is replaced)."""
  with versioned.VersionWriter(layout.block_encoder_dir(model_dir), step) as writer:
    storage.write_bytes_atomic(os.path.join(writer.path, "saved_model.pb"), b"stand-in")
    writer.commit({"kind": "block_encoder", "step": step})


def _stale_failure(model_dir: str) -> dict:
  """A failure an earlier builder published (an earlier slice of the run)."""
  return builder_failure.publish(model_dir, "index builder old-host:1", 3,
                                 RuntimeError("an earlier slice's failure"), 3,
                                 "/old/index_builder.log")


# ------------------------------------------------------------------------------ builder


def test_the_builder_gives_up_after_n_failed_builds_in_a_row_and_a_success_resets_the_count(
    tmp_path, repo_dir, corpus, monkeypatch, capsys):
  """fail, fail, commit, fail, fail, fail with --max_consecutive_failures 3: the commit in
  between resets the count (without it the builder would give up at the fourth build),
  so it gives up at the sixth, publishes that error and exits 3."""
  model_dir = _run_dir(tmp_path, repo_dir, corpus)
  _commit_snapshot(model_dir, 7)
  _stale_failure(model_dir)
  outcomes = ["fail", "fail", "commit", "fail", "fail", "fail", "commit"]
  calls, failure_seen = [], []  # (the loop catches what is raised here: recorded instead)

  def scripted_build(model_dir_, *args, **kwargs):
    del args
    calls.append(kwargs["snapshot"].version)
    if len(calls) == len(outcomes):  # the script is over: a builder still going stops
      layout.mark_training_done(model_dir_, 7)
    failure_seen.append(builder_failure.read(model_dir_) is not None)
    if outcomes[len(calls) - 1] == "commit":
      _stale_failure(model_dir_)  # (another builder gave up meanwhile: a commit clears it)
      return str(tmp_path / f"index-{len(calls)}")
    raise ValueError(f"build {len(calls)} failed\nsecond line, not published")

  monkeypatch.setattr(index_builder, "build_once", scripted_build)
  before = time.time()
  code = index_builder_cli.main(["--model_dir", model_dir, "--poll_seconds", "0.1",
                                 "--max_consecutive_failures", "3", "--log_path",
                                 "/logs/builder.log"])
  assert code == index_builder_cli.GAVE_UP_EXIT == 3
  assert calls == [7] * 6
  # The old failure was removed as the builder started; the one published during the
  # commit (by another builder) was removed by the commit.
  assert failure_seen == [False] * 6
  record = builder_failure.read(model_dir)
  assert before <= record.pop("time") <= time.time()
  assert record == dict(builder=index_builder.builder_name(), snapshot=7,
                        error_type="ValueError", error="build 6 failed", failures=3,
                        log_path="/logs/builder.log")
  line, = capsys.readouterr().err.strip().splitlines()
  assert line.startswith(f"beam.index_builder: error: {index_builder.builder_name()} gave up "
                         "after 3 failed builds in a row (the last on snapshot 7, at ")
  assert line.endswith("): ValueError: build 6 failed; its log: /logs/builder.log")


def test_failed_builds_count_bounds_and_never(tmp_path):
  """The published error is the first line, bounded; 0 never gives up; < 0 is refused."""
  model_dir = str(tmp_path / "run")
  counter = index_builder.FailedBuilds(model_dir, 2)
  counter.failed(OSError("first"), None)
  assert builder_failure.read(model_dir) is None
  with pytest.raises(index_builder.BuilderGaveUp, match="before it could read a snapshot"):
    counter.failed(RuntimeError("x" * 2000 + "\nmore"), None)
  record = builder_failure.read(model_dir)
  assert record["error"] == "x" * builder_failure.ERROR_CHARS and record["snapshot"] is None
  assert "its log: not recorded" in builder_failure.describe(record)
  never = index_builder.FailedBuilds(str(tmp_path / "other"), 0)
  for _ in range(20):
    never.failed(RuntimeError("again"), 1)
  assert never.count == 20 and builder_failure.read(str(tmp_path / "other")) is None
  with pytest.raises(ValueError, match="max_consecutive_failures must be >= 0"):
    index_builder.FailedBuilds(model_dir, -1)
  with pytest.raises(SystemExit):
    index_builder_cli.parse_args(["--model_dir", model_dir, "--max_consecutive_failures",
                                  "-1"])


# ------------------------------------------------------------------------------ trainer


class _Index:
  """Stands in for a KnowledgeIndex that nothing new is published to. `on_poll(n)` runs at
  the n-th poll (maybe_swap), before it answers. A wait still polling after `max_polls`
  (a minute in the tests with a real builder) fails the test, rather than running into
  the hour's timeout."""
  storage_error = ""
  snapshot_time, num_swaps = 0.0, 0

  def __init__(self, version=None, encoder_step=-1, on_poll=lambda n: None, max_polls=100):
    self.version, self.encoder_step, self.on_poll = version, encoder_step, on_poll
    self.export = types.SimpleNamespace(manifest={}) if version is not None else None
    self.polls, self.max_polls = 0, max_polls

  def maybe_swap(self, index_dir):
    del index_dir
    self.polls += 1
    if self.polls > self.max_polls:
      raise AssertionError(f"still waiting for an index after {self.max_polls} polls")
    self.on_poll(self.polls)
    return False


class _Exporter:
  """Stands in for the SnapshotExporter: the snapshot is taken at once."""

  def __init__(self):
    self.snapshots = []

  def snapshot(self, step, wait=False):
    del wait
    self.snapshots.append(step)
    return True

  def wait(self):
    pass


def _refresher(tmp_path, index, role=None, **settings) -> IndexRefresher:
  settings = RefreshSettings(**dict(dict(
      index_dir=str(tmp_path / "run" / "index"), refresh_every_steps=20, train_steps=400,
      first_index_timeout_seconds=HOUR, poll_seconds=0), **settings))
  refresher = IndexRefresher(str(tmp_path / "run"), index, settings, role=role)
  refresher.exporter = _Exporter()
  return refresher


def _publish_at(model_dir: str, poll: int):
  """A builder that gives up between the trainer's polls poll-1 and poll."""
  def on_poll(n):
    if n == poll:
      builder_failure.publish(model_dir, "index builder far-host:42", 0,
                              RuntimeError("the encoder cannot run"), 3,
                              layout.builder_log_path(model_dir))
  return on_poll


def test_a_published_failure_ends_the_first_index_wait_within_one_poll(tmp_path):
  model_dir = str(tmp_path / "run")
  index = _Index(on_poll=_publish_at(model_dir, 5))
  refresher = _refresher(tmp_path, index)
  with pytest.raises(RuntimeError) as raised:
    refresher.start(0)
  message = str(raised.value)
  assert "\n" not in message
  assert message.startswith(f"{tmp_path}/run/index: no index yet, and index builder "
                            "far-host:42 gave up after 3 failed builds in a row (the last on "
                            "snapshot 0, at ")
  assert message.endswith(f"RuntimeError: the encoder cannot run; its log: {model_dir}/"
                          f"index_builder.log (published in {model_dir}/INDEX_BUILDER_FAILED)")
  # The poll that saw it was the last: one more look for an index, then the error.
  assert index.polls == 6
  assert refresher.exporter.snapshots == [0]


def test_a_published_failure_ends_the_staleness_wait(tmp_path):
  model_dir = str(tmp_path / "run")
  index = _Index(version=120, encoder_step=120, on_poll=_publish_at(model_dir, 3))
  refresher = _refresher(tmp_path, index, max_staleness_steps=60)
  with pytest.raises(RuntimeError, match=r"80 steps behind step 200 \(index.max_staleness_"
                                         r"steps 60\), and index builder far-host:42 gave up "
                                         r".*RuntimeError: the encoder cannot run; its log: "):
    refresher.after_loop(200)
  assert index.polls == 4


def test_an_earlier_slices_failure_does_not_stop_a_new_one(tmp_path):
  """A new training slice clears the failure (builders restarted for it have not failed);
  a wait that starts no slice (an evaluation of the run) still reads it and stops."""
  model_dir = str(tmp_path / "run")
  _stale_failure(model_dir)

  def index_at_third_poll(n):  # this slice's builder publishes the first index
    if n == 3:
      index.version, index.encoder_step = 0, 0
  index = _Index(on_poll=index_at_third_poll)
  _refresher(tmp_path, index).start(0)
  assert index.version == 0 and builder_failure.read(model_dir) is None

  _stale_failure(model_dir)
  with pytest.raises(RuntimeError, match="old-host:1 gave up .* an earlier slice's failure"):
    _refresher(tmp_path, _Index()).start(0, training=False)
  # A side-car evaluator never reads one (it keeps waiting, up to its own timeout).
  evaluator = _refresher(tmp_path, _Index(), read_only=True)
  assert evaluator._builder_gone() == ""  # pylint: disable=protected-access


class _Role:
  """Stands in for HostRole in a two-process job: `peer_flag` is the other process's flag
  in every any_process collective; the chief's values are this process's when it is the
  chief. Records this process's flags."""
  multi_process, num_processes = True, 2

  def __init__(self, is_chief, peer_flag=False):
    self.is_chief, self.peer_flag, self.flags = is_chief, peer_flag, []

  def any_process(self, flag):
    self.flags.append(bool(flag))
    return bool(flag) or self.peer_flag

  def chief_value(self, value):
    return int(value)


def test_every_process_stops_through_the_collective_and_only_the_chief_reads_each_poll(
    tmp_path, monkeypatch):
  model_dir = str(tmp_path / "run")
  _publish_at(model_dir, 1)(1)
  reads = []
  read = builder_failure.read
  monkeypatch.setattr(builder_failure, "read", lambda d: reads.append(d) or read(d))
  # The chief reads the failure at its poll and raises the flag in the collective.
  chief = _Role(is_chief=True)
  refresher = _refresher(tmp_path, _Index(version=120, encoder_step=120), role=chief,
                         max_staleness_steps=60)
  refresher.builder = None
  with pytest.raises(RuntimeError, match="far-host:42 gave up"):
    refresher._wait_for_fresher(200, 60)  # pylint: disable=protected-access
  assert chief.flags == [True] and reads == [model_dir]
  # A worker reads nothing while the collective says go on; once the chief's flag comes,
  # it reads the line once and stops with the same error.
  reads.clear()
  worker = _Role(is_chief=False)
  index = _Index(version=120, encoder_step=120,
                 on_poll=lambda n: setattr(worker, "peer_flag", n >= 3))
  refresher = _refresher(tmp_path, index, role=worker, max_staleness_steps=60)
  with pytest.raises(RuntimeError, match="far-host:42 gave up"):
    refresher._wait_for_fresher(200, 60)  # pylint: disable=protected-access
  # Its flag at the collectives of polls 1-3 (the chief's came up at the third poll);
  # the fourth collective stopped it.
  assert worker.flags == [False] * 4 and reads == [model_dir]


# ------------------------------------------------------------------------------ both


class _EncoderThatCannotRun(tf.Module):
  """A block-encoder snapshot with the real signature whose every call fails."""
  kind = encoders.BLOCK
  seq_length = 8
  dimension = 16  # configs/tiny.yaml: model.retriever.projection_size

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="title"),
                                tf.TensorSpec([None], tf.string, name="text")])
  def embed(self, title, text):
    del text
    tf.debugging.assert_equal(tf.size(title), -1, message="this encoder cannot run")
    return {"embeddings": tf.zeros([tf.size(title), self.dimension])}

  def signatures(self):
    return {"serving_default": self.embed}


@pytest.fixture
def failing_run(tmp_path, repo_dir, corpus):
  """A run over the invented corpus whose only snapshot (step 0) cannot embed a block."""
  model_dir = _run_dir(tmp_path, repo_dir, corpus)
  encoders.export_encoder(_EncoderThatCannotRun(), layout.block_encoder_dir(model_dir), 0)
  return model_dir


def _expect_gave_up(message: str, model_dir: str, log: str):
  assert "\n" not in message
  assert message.startswith(f"{layout.index_dir(model_dir)}: no index yet, and index builder ")
  assert " gave up after 3 failed builds in a row (the last on snapshot 0, at " in message
  # Beam's error names the TensorFlow one; its first line only: the log has the rest.
  assert "): RuntimeError: tensorflow.python.framework.errors_impl.InvalidArgumentError: " \
         "Graph execution error:; its log: " + log in message
  assert message.endswith(f"(published in {layout.builder_failure_path(model_dir)})")
  assert "exited with code" not in message  # the published error's line, not the exit's


def test_an_in_process_builder_that_fails_every_build_stops_the_wait(tmp_path, failing_run):
  """The real build, failing for real in this process (make test's path of the child test
  below). No child: only the published failure can end the wait early."""
  model_dir = failing_run
  errors = []

  def builder():
    try:
      index_builder.run_index_builder(index_builder.IndexBuilderConfig(
          model_dir, poll_seconds=0.1, log_path="/logs/in-process.log"))
    except index_builder.BuilderGaveUp as e:
      errors.append(e)

  thread = threading.Thread(target=builder)
  # Started at the trainer's first poll: after its start cleared any earlier failure.
  index = _Index(on_poll=lambda n: n == 1 and thread.start(), max_polls=600)
  refresher = _refresher(tmp_path, index, poll_seconds=0.1)
  try:
    with pytest.raises(RuntimeError) as raised:
      refresher.start(0)
  finally:
    layout.mark_training_done(model_dir, 0)  # stops the builder if the wait ended otherwise
    if thread.ident is not None:
      thread.join(120)
  assert len(errors) == 1 and str(errors[0]) in str(raised.value)
  _expect_gave_up(str(raised.value), model_dir, "/logs/in-process.log")
  assert versioned.list_versions(layout.index_dir(model_dir)) == []


def test_a_builder_child_that_fails_every_build_stops_the_trainer(tmp_path, failing_run):
  """IndexRefresher.start with start_builder: the real `python -m beam.index_builder`
  child fails every build and gives up; the trainer's wait for the first index
  ends with the error it published, naming its log, where the full error is. (Its exit
  code is not asserted: the trainer terminates it as it stops, and may come first; main's
  exit 3 is the first test's.)"""
  model_dir = failing_run
  refresher = _refresher(tmp_path, _Index(max_polls=300), poll_seconds=0.2,
                         start_builder=True)
  try:
    with pytest.raises(RuntimeError) as raised:
      refresher.start(0)
  finally:
    if refresher.builder is not None:
      refresher.builder.process.kill()  # (a no-op once it exited by itself)
      refresher.builder.stop(timeout=30)
  log_path = layout.builder_log_path(model_dir)
  _expect_gave_up(str(raised.value), model_dir, log_path)
  log = storage.read_text(log_path)
  assert log.count("Index build failed") == 3 and "this encoder cannot run" in log
  assert builder_failure.read(model_dir)["builder"] in str(raised.value)
