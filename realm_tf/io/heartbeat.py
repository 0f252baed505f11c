"""What a training process tells its watchdog: a small JSON file on local disk, rewritten
every second by a daemon thread (standard library only: the watchdog that reads it never
imports TensorFlow).

A multi-worker step is a collective, so a worker that stops (SIGSTOP, a frozen VM), wedges
or starves in its input pipeline stops every other worker too. TensorFlow notices some of
that itself (a peer's closed connections, missing heartbeats, a collective timeout), but
only through its own error path, which has been seen to abort or wedge the waiting process
before any Python runs. The watchdog (realm_tf.training.watchdog, the parent of the
training process) therefore watches this file instead and needs neither that error path
nor the trainer's GIL: what stops changing is the signal.

What the file holds (`Heartbeat.snapshot`):
  time        when the writer thread last wrote: a stale time means the interpreter is
              blocked (a thread holding the GIL), or the process is stopped.
  progress    counters that move while training moves: `loops` (train and evaluation
              loops begun and ended), `batches` (batches the input pipelines delivered),
              `step`, `waits` (rounds of a collective wait, e.g. for a fresher index), and
              `phase` (what the trainer is doing: "train", "evaluate", "host", ...).
  watch       written once the job is known (`describe_job`): this task, its role, the
              stall limits, the checkpoint directory and the peers' watchdog addresses.
  reported    the exit line, when the trainer wrote one itself (TensorFlow raised).
  checkpoint_step  the chief's newest checkpoint step this process has seen.

The environment names the file's directory (WATCHDOG_DIR_ENV): without it (one process, a
TPU slice's one program, a test) `current()` is a writer that writes nothing.
"""
import faulthandler
import json
import os
import signal
import threading
import time
from typing import Optional

# Set by the watchdog for the training process it starts: the directory of this file, the
# stacks file, and the watchdog's own status address (host:port) for the peers.
WATCHDOG_DIR_ENV = "REALM_WATCHDOG_DIR"
WATCHDOG_ADDRESS_ENV = "REALM_WATCHDOG_ADDRESS"
HEARTBEAT_FILE = "heartbeat.json"
STACKS_FILE = "stacks.txt"
# The watchdog's side: its exit line, written before it continues a trainer it found
# stopped (to take its stacks) or lets it run on. A trainer whose step then fails for the
# peers its watchdog's verdict already ended writes no second line (`verdict_written`).
VERDICT_FILE = "verdict.txt"
WRITE_SECONDS = 1.0


def heartbeat_path(directory: str) -> str:
  return os.path.join(directory, HEARTBEAT_FILE)


def stacks_path(directory: str) -> str:
  return os.path.join(directory, STACKS_FILE)


def verdict_path(directory: str) -> str:
  return os.path.join(directory, VERDICT_FILE)


def write_verdict(directory: str, line: str) -> None:
  """The watchdog's exit line, for its trainer to see (written whole: os.replace)."""
  tmp = verdict_path(directory) + ".tmp"
  with open(tmp, "w") as f:
    f.write(line + "\n")
  os.replace(tmp, verdict_path(directory))


def read(directory: str) -> Optional[dict]:
  """The newest heartbeat in `directory`, None before the first (or if unreadable: the
  writer replaces the file atomically, so that only happens before it exists)."""
  try:
    with open(heartbeat_path(directory)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


class Heartbeat:
  """The training process's side: counters the trainer bumps, written by a daemon thread.

  Bumping a counter is a dict update under a lock (no I/O on the training path); the
  thread writes the whole state every WRITE_SECONDS through a temporary file and
  os.replace, so the watchdog never reads half a file.
  """

  def __init__(self, directory: Optional[str]):
    self.directory = directory
    self._lock = threading.Lock()
    self._state = dict(pid=os.getpid(), time=time.time(), loops=0, batches=0, step=-1,
                       waits=0, phase="starting", first_loop_ended=False, watch=None,
                       reported=None, checkpoint_step=None)
    self._thread = None
    self._stacks = None

  @property
  def enabled(self) -> bool:
    return self.directory is not None

  def start(self) -> "Heartbeat":
    """Writes the first heartbeat and starts the writer thread. Also makes SIGUSR1 write
    every thread's stack to the stacks file, through faulthandler: in C, without the GIL,
    so a process blocked in TensorFlow still answers the watchdog's request."""
    if self.enabled and self._thread is None:
      # Kept open for the process's life: faulthandler writes to its descriptor.
      self._stacks = open(stacks_path(self.directory), "w")  # pylint: disable=consider-using-with
      faulthandler.register(signal.SIGUSR1, file=self._stacks, all_threads=True)
      self._write()
      self._thread = threading.Thread(target=self._run, name="watchdog-heartbeat",
                                      daemon=True)
      self._thread.start()
    return self

  def _run(self):
    while True:
      time.sleep(WRITE_SECONDS)
      self._write()

  def _write(self):
    with self._lock:
      self._state["time"] = time.time()
      text = json.dumps(self._state)
    tmp = heartbeat_path(self.directory) + ".tmp"
    with open(tmp, "w") as f:
      f.write(text)
    os.replace(tmp, heartbeat_path(self.directory))

  def _change(self, count: Optional[str] = None, **values):
    """Adds 1 to the counter `count` and sets `values`, in one step under the lock; nothing
    without a watchdog."""
    if not self.enabled:
      return
    with self._lock:
      if count:
        self._state[count] += 1
      self._state.update(values)

  def snapshot(self) -> dict:
    with self._lock:
      return dict(self._state)

  def describe_job(self, task: str, address: str, role: str, stall_seconds: float,
                   collective_timeout_seconds: float, checkpoint_dir: str,
                   peers: dict) -> None:
    """What the watchdog needs to judge a stall and write the exit line.

    Args:
      task: this process's task, "worker:1".
      address: its address in TF_CONFIG.
      role: HostRole.describe() (for the exit line).
      stall_seconds: runtime.progress_stall_seconds.
      collective_timeout_seconds: runtime.collective_timeout_seconds (the limit until the
        first train loop ends: that loop traces and compiles).
      checkpoint_dir: where a relaunch resumes from.
      peers: {task: {"address": TF address, "watchdog": watchdog host:port}} of every
        other process.
    """
    self._change(watch=dict(task=task, address=address, role=role,
                            stall_seconds=float(stall_seconds),
                            collective_timeout_seconds=float(collective_timeout_seconds),
                            checkpoint_dir=checkpoint_dir, peers=peers))

  def loop_begun(self, phase: str) -> None:
    """A train ("train") or evaluation ("evaluate") loop starts."""
    self._change("loops", phase=phase)

  def loop_ended(self, phase: str, step: int) -> None:
    """A loop ended at global step `step`; the host's work between loops follows."""
    ended = dict(first_loop_ended=True) if phase == "train" else {}
    self._change("loops", step=int(step), phase="host", **ended)

  def batch(self) -> None:
    """An input pipeline delivered a batch (called from tf.data's thread)."""
    self._change("batches")

  def wait_round(self, what: str) -> None:
    """One round of a wait that all processes poll together (a collective per round), so
    each round is progress of the whole job."""
    self._change("waits", phase=what)

  def checkpoint_seen(self, step: int) -> None:
    self._change(checkpoint_step=int(step))

  def verdict_written(self) -> bool:
    """Whether this process's watchdog has ended the job with its line (write_verdict)."""
    return self.enabled and os.path.exists(verdict_path(self.directory))

  def reported_line(self, line: str) -> None:
    """The trainer wrote its own exit line: the watchdog adds none, and only bounds how
    long the exit may take."""
    self._change(reported=dict(line=line, time=time.time()))
    if self.enabled:
      self._write()


_CURRENT: Optional[Heartbeat] = None


def current() -> Heartbeat:
  """This process's heartbeat: writing to WATCHDOG_DIR_ENV's directory when a watchdog
  started the process, else one that writes nothing. The first call starts the writer."""
  global _CURRENT  # pylint: disable=global-statement
  if _CURRENT is None:
    _CURRENT = Heartbeat(os.environ.get(WATCHDOG_DIR_ENV) or None).start()
  return _CURRENT
