"""The watchdog: the parent of every multi-worker training process, ending a stalled job.

A multi-worker step is a collective, so one worker that stops stops them all. TensorFlow's
own answers (closed connections, the coordination service's heartbeats, the collective
timeout) reach Python only through its error path, and after a collective timeout
TensorFlow 2.20 has been seen to abort the waiting process ("Mutex corrupt") or wedge it
before any Python ran: no line, or a hang that nothing relaunches. The watchdog needs
neither that path nor the trainer's GIL, as torchrun's agent does for PyTorch: it is a
small process of its own that never imports TensorFlow.

  python -m realm_tf.train ...  (TF_CONFIG naming ≥ 2 tasks)
    └─ watchdog (this module): starts the same command as its child, serves its status
       on a TCP port, reads the child's heartbeat file (realm_tf.io.heartbeat)
         └─ the training process: bumps counters, publishes the watchdog's address to
            its peers through the coordination service's key-value store

When the heartbeat's progress counters have not moved for the limit — until the first
train loop has ended (it traces and compiles) runtime.collective_timeout_seconds + 30 s,
then runtime.progress_stall_seconds — the watchdog asks every peer's watchdog how its
trainer is, judges which process stopped the job (`judge`), saves every thread's stack of
its own trainer (faulthandler, on SIGUSR1: no GIL needed), kills it and exits 1 with one
line naming the culprit(s) and the relaunch. Each watchdog does the same for its own
process, so the whole job ends within the limit plus a few seconds, and a scheduler that
relaunches on a non-zero exit resumes it from the chief's checkpoint.

Also: a trainer that wrote its own line (TensorFlow raised) but has not exited 30 s later
is ended; one killed by a signal (an abort) gets the line it could not write; SIGTERM and
SIGINT are passed on (preemption saves, exit 42); when the watchdog dies, the kernel kills
its child (PR_SET_PDEATHSIG), so a peer sees the process gone.
"""
import dataclasses
import json
import math
import os
import signal
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Mapping, Optional, Sequence

from realm_tf.io import heartbeat

EXIT_GRACE_SECONDS = 30.0  # a trainer that wrote its exit line must be gone by then
QUERY_SECONDS = 5.0  # a peer's watchdog that does not answer within this is named
HEARTBEAT_STALE_SECONDS = 10.0  # no heartbeat for this long: the interpreter is blocked
STACKS_WAIT_SECONDS = 5.0
POLL_SECONDS = 0.5
# A status is a few hundred bytes: a peer that sends more is not sending one, and is not
# read further.
MAX_REPLY_BYTES = 1 << 16
_KEY_PREFIX = "realm_tf/watchdog/"


@dataclasses.dataclass(frozen=True)
class Peer:
  """A process of a multi-worker job: its TF_CONFIG task and address."""
  task_type: str
  index: int
  address: str

  @property
  def name(self) -> str:
    return f"{self.task_type}:{self.index}"

  def __str__(self) -> str:
    return f"{self.name} ({self.address})"

  @property
  def device(self) -> str:
    return f"/job:{self.task_type}/replica:0/task:{self.index}"

  @property
  def watchdog_key(self) -> str:
    """The coordination-service key under which this task's watchdog address is shared."""
    return f"{_KEY_PREFIX}{self.task_type}/{self.index}"


def peers(cluster: Mapping[str, Sequence[str]], task_type: str, index: int) -> list:
  """Every other chief and worker task of `cluster` ({job: [address, ...]})."""
  return [Peer(job, i, address) for job in ("chief", "worker")
          for i, address in enumerate(cluster.get(job, ()))
          if (job, i) != (task_type, index)]


def this_task(env: Mapping[str, str]) -> Optional[Peer]:
  """This process's task when TF_CONFIG names a job of two or more chief/worker tasks
  (a multi-worker job), else None. Malformed TF_CONFIG: None (the trainer reports it)."""
  try:
    config = json.loads(env.get("TF_CONFIG") or "{}")
    cluster, task = config.get("cluster") or {}, config.get("task") or {}
    size = sum(len(cluster.get(job, ())) for job in ("chief", "worker"))
    task_type, index = task["type"], int(task["index"])
    return Peer(task_type, index, cluster[task_type][index]) if size >= 2 else None
  except (ValueError, KeyError, TypeError, IndexError, AttributeError):
    return None


def should_supervise(env: Mapping[str, str]) -> bool:
  """A multi-worker task, not already the watchdog's child."""
  return this_task(env) is not None and not env.get(heartbeat.WATCHDOG_DIR_ENV)


def stop_line(role: str, cause: str, checkpoint_step, checkpoint_dir: str) -> str:
  """The one line a multi-worker process exits with when the job cannot go on."""
  step = "?" if checkpoint_step is None else checkpoint_step
  return (f"training stopped ({role}): {cause}. Relaunch every process with the same "
          f"command: training resumes from the chief's checkpoint at step {step} in "
          f"{checkpoint_dir}.")


# ------------------------------------------------------------------------------ the verdict


def judge(statuses: Mapping[str, object], addresses: Mapping[str, str]) -> list:
  """Which processes stopped a stalled job, each as "task (address) <how>".

  A process that is gone, stopped, or not answering (or answering with something that is
  no status) is named for that; one whose interpreter is blocked (a stale heartbeat) too,
  with its batch counts when it delivered fewer than the others: a trainer waiting on its
  input can hold the GIL while it waits (seen under load in the starved-worker test), and
  one blocked just before asking for its next batch counts the same, so the line gives the
  counts and both readings. If every process heartbeats, those whose input pipelines
  delivered fewer batches than the others are starved (in lockstep every process has
  consumed the same batches; one waiting in a collective already holds its next batch).
  If none is, all are named: alive, fed, and stuck elsewhere.

  Args:
    statuses: {task: its watchdog's status (a dict as `parse_status` returns it), None if
      it did not answer, or a clause saying how its answer was no status}, this process
      included.
    addresses: {task: address in TF_CONFIG}.

  Returns:
    The descriptions, in task order.
  """
  named, running, blocked = [], {}, set()
  for task in sorted(statuses):
    who, status = f"{task} ({addresses.get(task, '?')})", statuses[task]
    if status is None:
      named.append(f"{who} does not answer (its host is down, frozen or cut off)")
    elif isinstance(status, str):
      named.append(f"{who} {status}")
    elif status.get("trainer") == "exited":
      named.append(f"{who} has exited ({status.get('exit')})")
    elif status.get("trainer") == "stopped":
      named.append(f"{who} is stopped (SIGSTOP, a debugger or a frozen VM)")
    else:
      running[task] = status
      if (status.get("heartbeat_age") is None
          or status["heartbeat_age"] > HEARTBEAT_STALE_SECONDS):
        blocked.add(task)
  if named or not running:
    return named
  most = max(s.get("batches", 0) for s in running.values())
  for task, status in running.items():
    who, batches = f"{task} ({addresses.get(task, '?')})", status.get("batches", 0)
    counts = f"{batches} batches delivered, the others {most}; at step {status.get('step')}"
    if task in blocked and batches < most:
      named.append(f"{who} is not responding (its Python interpreter is blocked; {counts}: "
                   f"stuck on its input or before asking for it)")
    elif task in blocked:
      named.append(f"{who} is not responding (its Python interpreter is blocked)")
    elif batches < most and not blocked:
      named.append(f"{who} is stuck in its input pipeline (alive; {counts})")
  if named:
    return named
  return [f"{task} ({addresses.get(task, '?')}) is alive and fed but not advancing"
          for task in running]


# ------------------------------------------------------------------------ asking a peer


class BadReply(ValueError):
  """A peer's watchdog answered, but not with a status; the message says how, in one
  clause for the verdict ("its reply is ...")."""


def _shown(value, width: int = 40) -> str:
  """`value` as one short line for a verdict (repr escapes line breaks)."""
  text = repr(value)
  return text if len(text) <= width else text[:width - 3] + "..."


def _is_number(value) -> bool:
  # bool is an int to Python but never a number in a status; json.loads reads NaN and
  # Infinity, which no age is.
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and (isinstance(value, int) or math.isfinite(value)))


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


_JSON_TYPES = ((dict, "object"), (list, "array"), (str, "string"), (bool, "boolean"),
               (int, "number"), (float, "number"), (type(None), "null"))
# Each field of a status that `judge` (and the verdict it hands on) reads: (must it be
# there, what it may be, what that is called in the verdict). Watchdog.status writes them.
_STATUS_FIELDS = {
    "trainer": (True, lambda v: v in ("running", "stopped", "exited"),
                "one of 'running', 'stopped', 'exited'"),
    "heartbeat_age": (True, lambda v: v is None or _is_number(v), "a number of seconds or null"),
    "batches": (True, lambda v: _is_int(v) and v >= 0, "a count of batches"),
    "exit": (False, lambda v: v is None or _is_int(v), "an exit code or null"),
    "step": (False, lambda v: v is None or _is_int(v), "a step or null"),
    "verdict": (False, lambda v: v is None or (isinstance(v, list) and all(
        isinstance(line, str) and "\n" not in line and "\r" not in line for line in v)),
                "a list of one-line strings or null"),
}


def parse_status(data: bytes) -> dict:
  """A peer watchdog's reply, checked to be a status that `judge` can read.

  Args:
    data: the reply's bytes, everything the peer sent before it closed the connection.

  Returns:
    The status: a JSON object whose fields `judge` reads have the types Watchdog.status
    gives them (other fields are left as they are).

  Raises:
    BadReply: the reply is empty, cut off, not UTF-8 JSON, not an object, lacks a field or
      has one of the wrong type; its message says which, in one clause.
  """
  if not data:
    raise BadReply("its reply is empty (the connection closed before any status was sent)")
  if len(data) > MAX_REPLY_BYTES:
    raise BadReply(f"its reply is longer than {MAX_REPLY_BYTES} bytes")
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise BadReply(f"its reply is not UTF-8 text ({e.reason} at byte {e.start}: "
                   f"{_shown(data)})") from None
  try:
    status = json.loads(text)
  except json.JSONDecodeError as e:
    # The text ended inside a value (a string, or where more must follow): the rest never
    # came. A string that ends early is reported at its start.
    if e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated string"):
      raise BadReply(f"its reply is cut off after {len(data)} bytes ({e.msg})") from None
    raise BadReply(f"its reply is not JSON ({e.msg} at character {e.pos}: "
                   f"{_shown(text)})") from None
  except (ValueError, RecursionError) as e:  # an integer of 4,300+ digits, deep nesting
    raise BadReply(f"its reply is not JSON that can be read ({type(e).__name__}: "
                   f"{_shown(str(e), 60)})") from None
  if not isinstance(status, dict):
    kind = next(name for t, name in _JSON_TYPES if isinstance(status, t))
    raise BadReply(f"its reply is a JSON {kind}, not an object: {_shown(status)}")
  for field, (required, valid, what) in _STATUS_FIELDS.items():
    if field not in status:
      if required:
        raise BadReply(f"its reply has no {field!r}: {_shown(status, 60)}")
    elif not valid(status[field]):
      raise BadReply(f"its reply's {field!r} is {_shown(status[field])}, not {what}")
  if status["trainer"] == "exited" and not _is_int(status.get("exit")):
    raise BadReply(f"its reply says its trainer exited but gives no exit code: "
                   f"{_shown(status.get('exit'))}")
  return status


def ask(address: str, timeout: float = QUERY_SECONDS) -> dict:
  """A watchdog's status at `address` (host:port).

  Args:
    address: the peer watchdog's status address.
    timeout: how long the whole answer may take.

  Returns:
    The status, as `parse_status` checks it.

  Raises:
    OSError: no answer (unreachable, refused, nothing within `timeout`, reset before any
      byte).
    BadReply: an answer that is no status, or that broke off part-way.
    ValueError: `address` is not host:port.
  """
  host, _, port = address.rpartition(":")
  if not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ValueError(f"its watchdog address {address!r} is not host:port")
  deadline = time.monotonic() + timeout  # for the whole answer, not for each read
  data = b""
  with socket.create_connection((host, int(port)), timeout=timeout) as connection:
    while len(data) <= MAX_REPLY_BYTES:  # past it, parse_status names the reply too long
      try:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
          raise TimeoutError(f"no whole answer within {timeout:.0f}s")
        connection.settimeout(remaining)
        chunk = connection.recv(65536)
      except OSError as e:
        if data:  # it answered, then reset or stalled part-way
          raise BadReply(f"its reply broke off after {len(data)} bytes "
                         f"({e.strerror or str(e) or type(e).__name__})") from None
        raise
      if not chunk:
        break
      data += chunk
  return parse_status(data)


def _process_state(pid: int) -> Optional[str]:
  """The kernel's one-letter state of `pid` (R, S, D, T, Z, ...), None where /proc is not."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0]
  except (OSError, IndexError):
    return None


def _die_with_parent() -> None:
  """In the child: the kernel kills it when its watchdog dies (Linux), and it exits if the
  watchdog was already gone before that was set."""
  try:
    import ctypes  # noqa: PLC0415  only the watchdog's child needs it, and only on Linux
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass


# ------------------------------------------------------------------------------- the parent


class _StatusHandler(socketserver.StreamRequestHandler):

  def handle(self):
    try:
      self.wfile.write(json.dumps(self.server.status()).encode())
    except OSError:
      pass  # the asker left before the answer: nothing to tell it
    finally:
      self.server.answered()


class _StatusServer(socketserver.ThreadingTCPServer):
  """Serves `status()` to every connection, and counts the connections answered."""
  daemon_threads = True
  allow_reuse_address = True

  def __init__(self, status: Callable[[], dict]):
    super().__init__(("", 0), _StatusHandler)
    self.status = status
    self._answers = 0
    self._answered = threading.Condition()

  def answered(self) -> None:
    with self._answered:
      self._answers += 1
      self._answered.notify_all()

  def wait_answers(self, count: int, timeout: float) -> bool:
    """Waits until `count` connections have been answered in all, at most `timeout`
    seconds; whether they were."""
    with self._answered:
      return self._answered.wait_for(lambda: self._answers >= count, timeout)


class Watchdog:
  """Starts `command` as its child and watches it (see the module docstring).

  Args:
    command: the training process's command line.
    env: its environment (TF_CONFIG names this task).
    exit_grace_seconds: how long a trainer that wrote its exit line may take to exit, and
      what the first train loop may take beyond the collective timeout.
    query_seconds: how long a peer's watchdog has to answer.
    clock: what stalls and the exit grace are measured with (seconds, time.monotonic);
      tests inject one that stands still until their stand-in trainers have stalled.
  """

  def __init__(self, command: Sequence[str], env: Mapping[str, str],
               exit_grace_seconds: float = EXIT_GRACE_SECONDS,
               query_seconds: float = QUERY_SECONDS,
               clock: Callable[[], float] = time.monotonic):
    self.task = this_task(env)
    if self.task is None:
      raise ValueError("the watchdog supervises a task of a multi-worker TF_CONFIG")
    self.exit_grace_seconds = exit_grace_seconds
    self.query_seconds = query_seconds
    # After a verdict, the status (with the verdict) is served until every peer's watchdog
    # has asked for it (each asks once, when it judges or its trainer ended), so that one
    # judging later names the same culprit instead of one that "does not answer"; at most
    # this long (a peer whose host is down never asks).
    self.linger_seconds = 2 * query_seconds
    self._peers_to_ask = 0
    self.clock = clock
    self.directory = tempfile.mkdtemp(prefix=f"realm-watchdog-{self.task.task_type}"
                                             f"{self.task.index}-")
    self._progress = None
    self._progress_at = self.clock()
    self._reported_at = None
    self._verdict = None
    self._served = None
    self._stacks_due = False
    self._ended_by_us = False
    # Held by status() and by _serve_stalled_state: see there.
    self._state_lock = threading.Lock()
    self.server = _StatusServer(self.status)
    threading.Thread(target=self.server.serve_forever, name="watchdog-status",
                     daemon=True).start()
    host = self.task.address.rpartition(":")[0]
    child_env = dict(env)
    child_env[heartbeat.WATCHDOG_DIR_ENV] = self.directory
    child_env[heartbeat.WATCHDOG_ADDRESS_ENV] = f"{host}:{self.server.server_address[1]}"
    self.child = subprocess.Popen(list(command), env=child_env)  # pylint: disable=consider-using-with
    sys.stderr.write(f"Watchdog of {self.task}: training process pid {self.child.pid}, "
                     f"status on port {self.server.server_address[1]}, heartbeat and stacks "
                     f"in {self.directory}\n")
    sys.stderr.flush()
    for signum in (signal.SIGTERM, signal.SIGINT):
      signal.signal(signum, self._forward)

  def _forward(self, signum, frame):
    del frame
    if self.child.poll() is None:
      self.child.send_signal(signum)

  # ----------------------------------------------------------------------- observation

  def _observe(self) -> Optional[dict]:
    beat = heartbeat.read(self.directory)
    if beat is not None:
      progress = tuple(beat.get(k) for k in ("loops", "batches", "step", "waits", "phase"))
      if progress != self._progress:
        self._progress, self._progress_at = progress, self.clock()
      if beat.get("reported") and self._reported_at is None:
        self._reported_at = self.clock()
    return beat

  def status(self) -> dict:
    """What a peer's watchdog is told about this process (and what `judge` reads): once
    this watchdog has decided to end the job, the state its trainer stalled in, and the
    verdict."""
    with self._state_lock:
      if self._served is not None:
        return dict(self._served, verdict=self._verdict)
      return self._live_status()

  def _live_status(self) -> dict:
    beat = heartbeat.read(self.directory) or {}
    code = self.child.poll()
    state = _process_state(self.child.pid) if code is None else None
    trainer = "exited" if code is not None else (
        "stopped" if state in ("T", "t") else "running")
    return dict(task=self.task.name, trainer=trainer, exit=code, process_state=state,
                heartbeat_age=(time.time() - beat["time"]) if "time" in beat else None,
                batches=beat.get("batches", 0), step=beat.get("step"),
                phase=beat.get("phase"), idle_seconds=self.clock() - self._progress_at,
                verdict=self._verdict)

  def limit(self, beat: Optional[dict]) -> Optional[tuple]:
    """(seconds, what they are) the child may go without progress now, None: unwatched."""
    if not beat:
      return None
    watch, reported = beat.get("watch"), beat.get("reported")
    if reported:
      return self.exit_grace_seconds, "the grace to exit after its line"
    if not watch or not beat.get("loops"):
      return None  # starting up: the first index wait and the like have their own bounds
    if not beat.get("first_loop_ended"):
      return (watch["collective_timeout_seconds"] + self.exit_grace_seconds,
              f"runtime.collective_timeout_seconds + {self.exit_grace_seconds:.0f}s, for "
              "the first loop's compilation")
    return watch["stall_seconds"], "runtime.progress_stall_seconds"

  # ---------------------------------------------------------------------------- ending

  def _job_statuses(self, watch: dict, own: dict) -> tuple:
    """({task: status, None if its watchdog did not answer, a clause if its answer was no
    status}, {task: TF address}) of every process of the job (what `judge` reads), this
    one's status being `own`."""
    statuses = self._peer_statuses(watch)
    statuses[self.task.name] = own
    addresses = {task: peer["address"] for task, peer in watch.get("peers", {}).items()}
    addresses[self.task.name] = self.task.address
    return statuses, addresses

  def _peer_statuses(self, watch: dict) -> dict:
    answers = {}

    def one(task, address):
      # A peer that answers with something that is no status is named for that, as one
      # that does not answer is (None): its status is unknown, so it may be the culprit.
      try:
        answers[task] = ask(address, self.query_seconds) if address else None
      except BadReply as e:
        answers[task] = f"does not answer properly: {e}"
      except ValueError as e:  # its address (from the coordination service)
        answers[task] = f"cannot be asked: {e}"
      except OSError:
        answers[task] = None

    threads = [threading.Thread(target=one, args=(task, peer.get("watchdog")), daemon=True)
               for task, peer in watch.get("peers", {}).items()]
    for t in threads:
      t.start()
    for t in threads:
      t.join(self.query_seconds + 1)
    return {task: answers.get(task) for task in watch.get("peers", {})}

  def _save_stacks(self) -> str:
    """Every thread's stack of the child into the stacks file (its faulthandler, on
    SIGUSR1; a stopped child is continued so that it can handle the signal)."""
    path = heartbeat.stacks_path(self.directory)
    if self.child.poll() is not None:
      return path
    stopped = _process_state(self.child.pid) in ("T", "t")
    self.child.send_signal(signal.SIGUSR1)
    if stopped:
      self.child.send_signal(signal.SIGCONT)
    deadline, size = time.monotonic() + STACKS_WAIT_SECONDS, -1
    while time.monotonic() < deadline:
      time.sleep(0.25)
      now = os.path.getsize(path) if os.path.exists(path) else 0
      if now and now == size:
        break
      size = now
    return path

  def _kill(self):
    self._ended_by_us = True
    if self.child.poll() is None:
      self.child.kill()
    self.child.wait()

  def _end_stalled(self, beat: dict, limit: tuple) -> int:
    watch = beat.get("watch") or {}
    if beat.get("reported"):
      stacks = self._save_stacks()
      self._kill()
      sys.stderr.write(f"Watchdog of {self.task}: the training process had not exited "
                       f"{limit[0]:.0f}s after its line; ended (every thread's stack: "
                       f"{stacks})\n")
      return 1
    # Every watchdog of the job decides within moments of the others (a collective stalls
    # them together). The state the trainer stalled in is taken and served from now on,
    # its stacks saved, and then it is frozen: while the watchdogs ask each other and
    # judge, no trainer can drop its connections (which would make a peer's TensorFlow
    # raise and write a line of its own) or change what its watchdog reports.
    own = self._serve_stalled_state()
    if own["trainer"] == "stopped":
      # Continued for its stacks only after the verdict (run's finally): continued now, it
      # would join the step its peers wait in and reset their clocks.
      stacks = heartbeat.stacks_path(self.directory)
      self._stacks_due = True
    else:
      stacks = self._save_stacks()
    self._freeze()
    self._peers_to_ask = len(watch.get("peers", {}))
    statuses, addresses = self._job_statuses(watch, own)
    # A peer that judged first decides for the job: every line names the same culprit.
    verdicts = [s["verdict"] for s in statuses.values()
                if isinstance(s, dict) and s.get("verdict")]
    self._verdict = verdicts[0] if verdicts else judge(statuses, addresses)
    beat = heartbeat.read(self.directory) or beat
    if not beat.get("reported"):  # else the trainer wrote its own line before it was frozen
      cause = (f"the job made no progress for {limit[0]:.0f}s ({limit[1]}): "
               f"{'; '.join(self._verdict)}. Every thread's stack of this process: {stacks}")
      self._write_line(watch, beat, cause)
    # Killed once every peer has asked for the verdict (run's finally).
    return 1

  def _serve_stalled_state(self) -> dict:
    """The trainer's status now, which the peers are told from now on.

    Taken and served in one step under the lock that status() holds while it reads the
    live state, before the stacks are saved and the trainer is frozen. Saving the stacks
    can wake a trainer blocked in a system call (SIGUSR1 interrupts it: it runs and
    heartbeats again), and the freeze makes it "stopped": a peer's question answered from
    the live state after either would describe the trainer as it never stalled (seen
    under load: a trainer blocked holding the GIL, woken by the stacks request, told as
    alive). An answer already under way when the state is served finishes first, from the
    state before both.

    Returns:
      The status (this process's own, for `judge`).
    """
    with self._state_lock:
      self._served = self._live_status()
      return self._served

  def _freeze(self):
    """Stops the trainer (SIGSTOP) once its stalled state is served."""
    if self.child.poll() is None:
      self.child.send_signal(signal.SIGSTOP)

  def _write_line(self, watch: dict, beat: dict, cause: str):
    role = watch.get("role") or self.task.name
    line = stop_line(role, cause, beat.get("checkpoint_step"), watch.get("checkpoint_dir", "?"))
    # First for the trainer: continued for its stacks after the verdict (a stopped one),
    # its step fails on the peers already ended, and it must not add a line of its own.
    heartbeat.write_verdict(self.directory, line)
    sys.stderr.write(line + "\n")
    sys.stderr.flush()

  def _ended(self, code: int) -> int:
    """The child exited by itself: its code, and for a death by signal the line it could
    not write (an abort in TensorFlow, the OOM killer)."""
    if code >= 0 or self._ended_by_us:
      return code if code >= 0 else 1
    beat = heartbeat.read(self.directory) or {}
    watch = beat.get("watch")
    if watch and not beat.get("reported"):
      statuses, addresses = self._job_statuses(watch, self.status())  # exited: named
      try:
        name = signal.Signals(-code).name
      except ValueError:
        name = f"signal {-code}"
      self._write_line(watch, beat, f"the training process was ended by {name}; "
                                    f"{'; '.join(judge(statuses, addresses))}")
    return 128 - code

  def run(self) -> int:
    """Watches until the child exits or is ended; returns the exit code for the job."""
    try:
      while True:
        code = self.child.poll()
        if code is not None:
          return self._ended(code)
        beat = self._observe()
        limit = self.limit(beat)
        if limit is not None:
          since = self._reported_at if beat.get("reported") else self._progress_at
          if self.clock() - since > limit[0]:
            return self._end_stalled(beat, limit)
        time.sleep(POLL_SECONDS)
    finally:
      if self._verdict is not None:
        self.server.wait_answers(self._peers_to_ask, self.linger_seconds)
      if self._stacks_due:
        self._save_stacks()
      if self.child.poll() is None:
        self._kill()
      self.server.shutdown()


def supervise(command: Sequence[str], env: Optional[Mapping[str, str]] = None) -> int:
  """Runs `command` under a Watchdog; the job's exit code."""
  return Watchdog(command, os.environ if env is None else env).run()


def started_by_watchdog() -> bool:
  """In the training process a watchdog started: makes it die with its watchdog and starts
  its heartbeat (and the stack dump on SIGUSR1) before anything can block. False
  elsewhere."""
  if not os.environ.get(heartbeat.WATCHDOG_DIR_ENV):
    return False
  _die_with_parent()
  heartbeat.current()
  return True
