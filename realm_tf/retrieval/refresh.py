"""The trainer's side of the asynchronous index refresh, shared by every task that retrieves.

  trainer ── every refresh_every_steps: retriever snapshot ──► export/{query,block}_encoder/<step>
     ▲                                                               │
     │  newest committed index swapped into the KnowledgeIndex       ▼ index builder (child
     └──────────────── index/<step>/ ◄──── re-embeds the corpus ─────  process or other machines)

The file system is the only channel (realm_tf.io.layout names the paths). `IndexRefresher`
owns the host-side half: it waits (boundedly) for a first index, polls for newer ones
between train loops and swaps them in place, hands snapshots to the builder without
blocking the step loop, optionally runs the builder as a child process, reports staleness,
and writes TRAINING_DONE only when the schedule's last step is reached (a run cut short by
an error or --stop_at_step leaves builders on other machines running for its resumption).

A wait for an index (the first one, or a fresher one under index.max_staleness_steps) ends
early, with one line, when no index will come: this run's builder child exited, or an index
builder anywhere gave up after its --max_consecutive_failures failed builds in a row and
published its last error in <model_dir>/INDEX_BUILDER_FAILED (realm_tf.io.builder_failure:
read from the store at every poll, so a builder on another machine counts as well as the
child). Otherwise the trainer would wait out index.first_index_timeout_seconds (an hour)
and then only say to run the index builder.

In a multi-worker job every process has a refresher, but only the chief (realm_tf.io.roles)
exports snapshots, runs the builder child and writes TRAINING_DONE; index swaps are
collective (KnowledgeIndex.maybe_swap loads the version the chief chose, on every process),
so every wait here polls once per round on every process and ends on an agreed condition
(the chief reads a builder's failure; whether to stop for it is agreed by a collective).
"""
import dataclasses
import logging
import os
import subprocess
import sys
import threading
import time
from typing import Callable, Optional, Sequence

import tensorflow as tf

from realm_tf.io import builder_failure, heartbeat, layout, storage, versioned
from realm_tf.io.roles import HostRole
from realm_tf.retrieval.knowledge_index import KnowledgeIndex
from realm_tf.retrieval import snapshots


class IndexBuilderProcess:
  """`python -m beam.index_builder` as a child process owned by the trainer.

  Spawned (not imported: the library never imports the `beam` entry points). A pipe reader
  thread appends its output to model_dir/index_builder.log through storage.open_for_append,
  so model_dir may be on an object store; the builder is told that path (--log_path), which
  it names in the failure it publishes if it gives up.

  Args:
    model_dir: the training run's directory (the builder's --model_dir).
    extra_args: further command-line arguments of beam.index_builder (e.g. --max_builds 1).
  """

  def __init__(self, model_dir: str, extra_args: Sequence[str] = ()):
    self.model_dir = model_dir
    self.log_path = layout.builder_log_path(model_dir)
    self.process = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, "-m", "beam.index_builder", "--model_dir", model_dir,
         "--parent_pid", str(os.getpid()), "--log_path", self.log_path, *extra_args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    self._reader = threading.Thread(target=self._copy_output, daemon=True,
                                    name="index-builder-log")
    self._reader.start()
    logging.info("Index builder started (pid %d), log in %s", self.process.pid,
                 self.log_path)

  def _copy_output(self):
    try:
      with storage.open_for_append(self.log_path) as log:
        for line in self.process.stdout:
          log.write(line.decode("utf-8", errors="replace"))
          log.flush()
    except tf.errors.OpError as e:  # the log must never stop training
      logging.warning("Could not write %s: %s", self.log_path, e)
      for _ in self.process.stdout:  # keep draining so the builder never blocks on a pipe
        pass

  def exited(self) -> str:
    """'' while the builder runs; once it has exited, a line saying so that names its
    exit code and log."""
    code = self.process.poll()
    if code is None:
      return ""
    return (f"the index builder child (pid {self.process.pid}) exited with code {code}; "
            f"its log: {self.log_path}")

  def stop(self, timeout: float = 120.0):
    """Waits for the builder to exit; terminates it after `timeout` seconds.

    Args:
      timeout: seconds to wait before SIGTERM (then 30 s more for it to exit).
    """
    try:
      self.process.wait(timeout)
    except subprocess.TimeoutExpired:
      logging.warning("Index builder still running after %.0fs: terminating it", timeout)
      self.process.terminate()
      self.process.wait(30)
    self._reader.join(10)


@dataclasses.dataclass
class RefreshSettings:
  """What an IndexRefresher does; the fields that differ per task come from the task.

  Attributes:
    index_dir: the versioned index directory to load from (layout.index_dir).
    refresh_every_steps: steps between retriever snapshots handed to the builder.
    train_steps: trainer.train_steps; no snapshot is exported at or past it.
    first_index_timeout_seconds: how long `start` (and a staleness wait) waits for an
      index before raising TimeoutError.
    poll_seconds: minimum seconds between polls for a newer index (one process).
    start_builder: run `beam.index_builder` as a child process of the chief when it has
      an index to build (IndexRefresher.start_builder).
    max_staleness_steps: the most steps the index may lag the step reached before
      training waits for the builder.
    read_only: a side-car evaluator's refresher (see below).
  """
  index_dir: str
  refresh_every_steps: int  # 0: never hand over snapshots (a fixed index)
  train_steps: int
  first_index_timeout_seconds: float
  poll_seconds: float
  start_builder: bool = False
  max_staleness_steps: int = 0  # 0: never wait for the builder
  # A side-car evaluator's refresher: it loads the run's committed indexes and nothing else
  # (no snapshot, no builder, TRAINING_DONE untouched); it waits for a first index.
  read_only: bool = False


class IndexRefresher:
  """Host-side refresh of a KnowledgeIndex during training (see the module docstring).

  Args:
    model_dir: the training run's directory (snapshots, TRAINING_DONE, the builder log).
    index: the KnowledgeIndex the step searches; newer versions are swapped into it.
    settings: RefreshSettings.
    retriever: the model's retriever, exported as snapshots (chief only); None: no
      snapshots (then a first index must already be committed).
    build_shadow: builds a fresh retriever of the same architecture, into which the
      exporter copies the weights before saving (see snapshots.SnapshotExporter).
    tokenizer: the run's tokenizer, saved with each snapshot.
    config: the run's ExperimentConfig, saved with each snapshot.
    role: this process's part in a multi-process job (default: the only process).
  """

  def __init__(self, model_dir: str, index: KnowledgeIndex, settings: RefreshSettings,
               retriever=None, build_shadow: Optional[Callable[[], object]] = None,
               tokenizer=None, config=None, role: Optional[HostRole] = None):
    self.model_dir = model_dir
    self.index = index
    self.role = role or HostRole()
    self.settings = settings
    # Whether this process writes the run's refresh state: snapshots, the builder child,
    # TRAINING_DONE (the chief of the training job; never a side-car evaluator).
    self.writes = self.role.is_chief and not settings.read_only
    self.exporter = None
    if retriever is not None and self.writes and self._exports_snapshots():
      self.exporter = snapshots.SnapshotExporter(model_dir, retriever, build_shadow,
                                                 tokenizer, config)
    self.builder: Optional[IndexBuilderProcess] = None
    self._last_poll = 0.0
    self._failure_read_error = ""  # the last error reading a builder's failure (logged)

  def _exports_snapshots(self) -> bool:
    """Whether this refresher may ever export a snapshot: it refreshes, or no index is
    committed yet (the first one is built from a snapshot). Why ask: the exporter builds a
    shadow retriever, two more towers (0.9 GB at BERT-base), which an evaluation of a run
    that has its index never uses."""
    if self.settings.refresh_every_steps > 0:
      return True
    try:
      return versioned.latest_version(self.settings.index_dir) is None
    except OSError:  # the store did not answer: keep the way to build a first index
      return True

  def start(self, global_step: int, training: bool = True):
    """Makes sure a first index is loaded before the first step.

    An index already committed under index_dir (built by `beam.embed_corpus` before
    training, or by an earlier run) is used as is. Otherwise the current retriever is
    exported as snapshot `global_step` for the builder, and the trainer waits for its
    index for at most first_index_timeout_seconds. A read-only refresher (a side-car
    evaluator) only waits, as long, for the run's trainer to commit one.

    Args:
      global_step: the step training (or evaluation) starts from; the first snapshot's
        step.
      training: a training run: the chief clears TRAINING_DONE for the builders.

    Raises:
      FileNotFoundError: no index is committed and this run exports no snapshot.
      TimeoutError: no index loaded within first_index_timeout_seconds (the message says
        whether storage failed or nothing was published).
      RuntimeError: an index builder gave up and published its error, or this run's
        index builder child exited, before an index came (the message names the error or
        the exit code, and the builder's log).
    """
    writes = self.writes
    if training and writes:  # a new training slice: builders must follow it again
      layout.clear_training_done(self.model_dir)
      # A failure published during an earlier slice came from builders that followed that
      # slice and exited; this slice's builders (a new child, or ones restarted by hand)
      # have not failed yet. Cleared rather than compared by time: the failure's time is
      # another machine's clock, and the child started below takes seconds to clear it
      # itself, during which the first poll would read the old one.
      builder_failure.clear(self.model_dir)
    if self.settings.start_builder and writes:
      self.builder = self.start_builder()
    # The chief's view decides (a collective: every process takes the same branch).
    if self.settings.read_only:
      if versioned.latest_version(self.settings.index_dir) is None:
        logging.info("No index under %s yet: waiting up to %.0fs for the run's first one "
                     "(read-only: a side-car evaluator builds none)",
                     self.settings.index_dir, self.settings.first_index_timeout_seconds)
    elif self.role.chief_value(versioned.latest_version(self.settings.index_dir) is None):
      if self.role.any_process(writes and self.exporter is None):
        raise FileNotFoundError(f"{self.settings.index_dir}: no committed index, and this "
                                f"run exports no snapshot to build one from")
      if writes and snapshots.latest_snapshot_step(self.model_dir) is None:
        self.exporter.snapshot(global_step, wait=True)
      if self.builder is None and writes:
        logging.info("No index under %s yet: waiting for an index builder (run "
                     "`python -m beam.index_builder --model_dir %s`, or set "
                     "start_index_builder)", self.settings.index_dir, self.model_dir)
    deadline = time.time() + self.settings.first_index_timeout_seconds
    # An index already loaded (an evaluation before training, in the same run) counts.
    while not self.index.maybe_swap(self.settings.index_dir) and self.index.version is None:
      gone = self._builder_gone()
      if gone:
        self.stop(global_step, reached_train_steps=False)
        raise RuntimeError(f"{self.settings.index_dir}: no index yet, and {gone}")
      if self.role.chief_value(time.time() > deadline):
        self.stop(global_step, reached_train_steps=False)
        if self.index.storage_error:  # not "nothing published": the store did not answer
          raise TimeoutError(
              f"{self.settings.index_dir}: no index loaded within "
              f"{self.settings.first_index_timeout_seconds:.0f}s because storage failed: "
              f"{self.index.storage_error}")
        raise TimeoutError(
            f"{self.settings.index_dir}: no loadable index within "
            f"{self.settings.first_index_timeout_seconds:.0f}s (index.first_index_timeout_"
            f"seconds); build one with `python -m beam.embed_corpus` or run the index builder")
      time.sleep(min(self.settings.poll_seconds, 1.0))

  def start_builder(self) -> Optional[IndexBuilderProcess]:
    """The builder child, started only for work it will have: with refreshes, one that
    builds every snapshot until TRAINING_DONE; with a fixed index (refresh_every_steps 0),
    one that builds the first index and exits, or none when an index is committed (it
    would wait, a TensorFlow process idle, for snapshots that never come)."""
    if self.settings.refresh_every_steps > 0:
      return IndexBuilderProcess(self.model_dir)
    if versioned.latest_version(self.settings.index_dir) is not None:
      return None
    return IndexBuilderProcess(self.model_dir, ("--max_builds", "1"))

  def after_loop(self, global_step: int):
    """Between train loops: hand over a snapshot when due, swap in a newer index.

    With max_staleness_steps set, blocks until the index is at most that many steps behind.

    Args:
      global_step: the step the loop ended at.

    Raises:
      TimeoutError: the staleness bound was not met within first_index_timeout_seconds.
      RuntimeError: an index builder gave up (its published error), or this run's index
        builder child exited, while the index was too stale.
    """
    every = self.settings.refresh_every_steps
    if (self.exporter is not None and every > 0 and global_step % every == 0
        and global_step < self.settings.train_steps):
      self.exporter.snapshot(global_step)
    now = time.time()
    # Several processes poll every loop: a swap is collective, so whether to poll cannot
    # depend on each process's clock.
    if self.role.multi_process or now - self._last_poll >= self.settings.poll_seconds:
      self._last_poll = now
      self.index.maybe_swap(self.settings.index_dir)
    bound = self.settings.max_staleness_steps
    if bound > 0 and global_step - self.index_step() > bound:
      self._wait_for_fresher(global_step, bound)

  def poll(self) -> bool:
    """Swaps in the newest committed index if it is newer.

    Returns:
      True if a newer version was loaded.
    """
    self._last_poll = time.time()
    return self.index.maybe_swap(self.settings.index_dir)

  def index_step(self) -> int:
    """The step of this run at which the encoder behind the current index was taken.

    An index built from another run's encoder (a warm start's, e.g. ICT's, whose step
    counts that run's steps) predates this run: 0. No index: -1.
    """
    if self.index.export is None:
      return -1
    encoder_path = self.index.export.manifest.get("encoder", {}).get("path", "")
    if encoder_path and not layout.is_inside(encoder_path, self.model_dir):
      return 0
    return self.index.encoder_step

  def _wait_for_fresher(self, global_step: int, bound: int):
    """Blocks until the index is at most `bound` steps behind (index.max_staleness_steps)."""
    deadline = time.time() + self.settings.first_index_timeout_seconds
    logging.info("Index %s is %d steps behind step %d (bound %d): waiting for the builder",
                 self.index.version, global_step - self.index_step(), global_step, bound)
    if self.exporter is not None:
      # The builder can only build a snapshot that exists: the due ones may all have been
      # skipped while an earlier export was still saving (a loaded machine), and none is due
      # at the last step. Without this the wait could only end in the timeout.
      self.exporter.wait()
      newest = snapshots.latest_snapshot_step(self.model_dir)
      if newest is None or global_step - newest > bound:
        self.exporter.snapshot(global_step, wait=True)
    while global_step - self.index_step() > bound:
      gone = self._builder_gone()
      if gone:
        raise RuntimeError(f"{self.settings.index_dir}: the index is "
                           f"{global_step - self.index_step()} steps behind step {global_step} "
                           f"(index.max_staleness_steps {bound}), and {gone}")
      if self.role.chief_value(time.time() > deadline):
        raise TimeoutError(
            f"{self.settings.index_dir}: no index within {bound} steps of step {global_step} "
            f"after {self.settings.first_index_timeout_seconds:.0f}s "
            f"(index.max_staleness_steps); is the index builder running?")
      time.sleep(min(self.settings.poll_seconds, 1.0) or 0.1)
      self.index.maybe_swap(self.settings.index_dir)
      # Each round is a collective of every process: the job is alive, only waiting.
      heartbeat.current().wait_round("waiting for a fresher index")

  def _builder_gone(self) -> str:
    """Why waiting for an index is pointless ('' while a builder may still publish one):
    an index builder gave up and published its error (on any machine: read from the
    store), or this run's builder child has exited; and what was last published is
    already loaded. Without this a dead or failing builder left the trainer waiting out
    first_index_timeout_seconds in silence.

    A collective: every process waiting calls it at the same point. Only the chief reads
    the failure at each poll (one read per poll, not one per process); whether to stop is
    agreed, so every process takes the same branch, and each then reads the line once.
    """
    failure = self._published_failure() if self.role.is_chief else None
    gone = self.builder.exited() if self.builder is not None else ""
    if not self.role.any_process(failure is not None or bool(gone)):
      return ""
    # A builder that built its last index and exited published it first: one more look.
    if self.index.maybe_swap(self.settings.index_dir):
      return ""
    if failure is None:  # another process's flag, or the child published as it exited
      failure = self._published_failure()
    if failure is not None:
      return (f"{builder_failure.describe(failure)} (published in "
              f"{layout.builder_failure_path(self.model_dir)})")
    return gone or (f"another process found the index builder stopped (its child exited, "
                    f"or a failure published in {layout.builder_failure_path(self.model_dir)}"
                    f"); its log: {layout.builder_log_path(self.model_dir)}")

  def _published_failure(self) -> Optional[dict]:
    """An index builder's published failure (realm_tf.io.builder_failure), or None.

    A side-car evaluator's refresher (read_only) never reads one: it starts beside a
    trainer whose start clears an earlier slice's failure, and could read that one first;
    it keeps its own timeout. A failure that cannot be read is logged (once per message)
    and waited past: the store not answering is not a builder giving up.
    """
    if self.settings.read_only:
      return None
    try:
      return builder_failure.read(self.model_dir)
    except (OSError, versioned.VersionError) as e:
      if str(e) != self._failure_read_error:
        self._failure_read_error = str(e)
        logging.warning("Could not read an index builder's failure: %s", e)
      return None

  def logs(self, global_step: int) -> dict[str, float]:
    """Scalars for a train loop's logs.

    Args:
      global_step: the step the loop ended at.

    Returns:
      index_version (-1: none), index_staleness_steps (steps since the index's encoder
      was taken), index_staleness_seconds (since its snapshot) and index_refreshes.
    """
    return dict(index_version=float(self.index.version if self.index.version is not None
                                    else -1),
                index_staleness_steps=float(global_step - self.index_step()),
                index_staleness_seconds=float(time.time() - self.index.snapshot_time),
                index_refreshes=float(self.index.num_swaps - 1))

  def stop(self, global_step: int, reached_train_steps: bool):
    """Ends the refresh: waits for a pending snapshot, stops the builder child.

    Args:
      global_step: the step reached (recorded in TRAINING_DONE).
      reached_train_steps: the schedule is complete: TRAINING_DONE is written (which stops
        builders elsewhere) and the child builder gets 30 s to finish; otherwise the child
        is terminated and builders elsewhere keep running for the resumption.
    """
    if self.exporter is not None:
      self.exporter.wait()
    if reached_train_steps and self.writes:
      layout.mark_training_done(self.model_dir, global_step)
    if self.builder is not None:
      # Only a finished run stops its own builder; an index finished after the last step
      # would serve nothing, so the wait is short.
      if reached_train_steps:
        self.builder.stop(timeout=30.0)
      else:
        self.builder.process.terminate()
        self.builder.stop(timeout=30.0)

  def summary(self) -> dict:
    """index_refreshes and final_index_version; for the chief also the snapshots exported,
    skipped (an export still saving) and failed, by step."""
    out = dict(index_refreshes=self.index.num_swaps - 1, final_index_version=self.index.version)
    if self.exporter is not None:
      out.update(snapshots_exported=list(self.exporter.exported),
                 snapshots_skipped=list(self.exporter.skipped),
                 snapshot_errors=list(self.exporter.errors))
    return out
