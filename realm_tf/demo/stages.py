"""Stages of the demo: one directory each under the run directory, reused when finished.

A stage is finished when its directory holds `stage.done`, written last, whose key matches
the stage's parameters and the identities of the stages it reads. A stage started with
other parameters (or upstream outputs made since) is deleted and run again; one started
with the same key and cut short is run again in place, so the training stages resume from
their checkpoints. Commands run as child processes in their own process group, with their
output in `<stage>/log.txt` and progress lines (plus a heartbeat) on the console.
"""
import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence

DONE = "stage.done"
STARTED = "stage.started"
LOG = "log.txt"
HEARTBEAT_SECONDS = 30.0

# Lines of the child processes worth showing: training progress (realm_tf.training.
# progress), Open-QA evaluations, the reader's training on own blocks, the corpus
# pipeline's and the embedding job's results, the index refresh.
PROGRESS = re.compile(
    r"\[(ict|pretrain|openqa)\] (step|evaluation)|\bstep \d+/\d+ |entity F1|"
    r"records in, \d+ accepted|Building index|Embedding .* into|Published .*/index/|"
    r"Index builder started|serving gRPC on|Published .*/realm_qa/|own-block reader")

# The prefix (time, level, source) of absl and logging lines, dropped on the console.
_LOG_PREFIX = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ \S+\] |"
                         r"^\d{4}-\d\d-\d\d [\d:,.]+ [A-Z]+ (realm_tf\.\w+: )?|"
                         r"^INFO:\S+:")


def clock(seconds: float) -> str:
  seconds = int(round(seconds))
  return f"{seconds // 60}m{seconds % 60:02d}s"


class StageError(RuntimeError):
  """A stage's command failed; the message names its log."""


@dataclasses.dataclass
class StageRecord:
  name: str
  title: str
  directory: str
  seconds: float
  reused: bool
  info: dict


class Stages:
  """Runs stages in order under `run_dir`; `records` is the summary's material."""

  def __init__(self, run_dir: str, log: Callable[[str], None] = print):
    self.run_dir = os.path.abspath(run_dir)
    self.log = log
    self.records: List[StageRecord] = []
    self._identities: Dict[str, str] = {}
    os.makedirs(self.run_dir, exist_ok=True)

  def path(self, name: str, *parts: str) -> str:
    return os.path.join(self.run_dir, name, *parts)

  def done_info(self, name: str) -> Optional[dict]:
    path = self.path(name, DONE)
    if not os.path.exists(path):
      return None
    with open(path, encoding="utf-8") as f:
      return json.load(f)

  def run(self, name: str, title: str, params: dict, upstream: Sequence[str],
          body: Callable[[str], dict]) -> dict:
    """Runs `body(stage_dir)` unless finished with this key; returns its info dict."""
    key = json.dumps(dict(params=params, upstream={u: self._identities[u] for u in upstream}),
                     sort_keys=True, default=str)
    directory = self.path(name)
    done = self.done_info(name)
    if done is not None and done.get("key") == key:
      self._identities[name] = done["identity"]
      self.records.append(StageRecord(name, title, directory, done["seconds"], True,
                                      done["info"]))
      self.log(f"[{name}] {title}: reused (finished earlier in {clock(done['seconds'])}); "
               f"{directory}")
      return done["info"]
    started = os.path.join(directory, STARTED)
    if os.path.isdir(directory):
      if not os.path.exists(started):
        raise StageError(f"{directory} exists but was not made by the demo (no {STARTED}): "
                         f"move it away or choose another --run_dir")
      with open(started, encoding="utf-8") as f:
        same = f.read() == key
      if done is not None or not same:
        self.log(f"[{name}] made with other settings or inputs: starting it again")
        shutil.rmtree(directory)
      else:
        self.log(f"[{name}] cut short earlier: continuing it")
    os.makedirs(directory, exist_ok=True)
    with open(started, "w", encoding="utf-8") as f:
      f.write(key)
    self.log(f"[{name}] {title} ...")
    start = time.time()
    info = body(directory) or {}
    seconds = time.time() - start
    identity = hashlib.sha256(f"{key}{time.time()}".encode()).hexdigest()[:16]
    tmp = os.path.join(directory, DONE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump(dict(key=key, identity=identity, seconds=seconds, info=info,
                     finished_at=time.time()), f, indent=2, default=str)
    os.replace(tmp, os.path.join(directory, DONE))
    self._identities[name] = identity
    self.records.append(StageRecord(name, title, directory, seconds, False, info))
    self.log(f"[{name}] done in {clock(seconds)}")
    return info

  def record(self, name: str, title: str, seconds: float, info: dict):
    """A step that is never reused (serving), for the summary."""
    self.records.append(StageRecord(name, title, self.path(name), seconds, False, info))


class Command:
  """A child process in its own process group; output to a log, progress to the console."""

  def __init__(self, argv: Sequence[str], log_path: str, label: str,
               log: Callable[[str], None] = print, env: Optional[dict] = None,
               on_line: Optional[Callable[[str], None]] = None):
    self.argv = list(argv)
    self.label = label
    self.log = log
    self.log_path = log_path
    self.on_line = on_line
    self.start_time = time.time()
    self._last_shown = self.start_time
    self._stop = threading.Event()
    env = dict(os.environ if env is None else env)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    self._log_file = open(log_path, "a", encoding="utf-8")  # pylint: disable=consider-using-with
    self._log_file.write(f"$ {' '.join(self.argv)}\n")
    self._log_file.flush()
    self.process = subprocess.Popen(  # pylint: disable=consider-using-with
        self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        errors="replace", env=env, start_new_session=True)
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()
    self._beat = threading.Thread(target=self._heartbeat, daemon=True)
    self._beat.start()

  def _show(self, text: str):
    self._last_shown = time.time()
    self.log(f"  [{self.label} {clock(time.time() - self.start_time)}] {text}")

  def _read(self):
    for line in self.process.stdout:
      self._log_file.write(line)
      self._log_file.flush()
      line = line.rstrip()
      if self.on_line is not None:
        self.on_line(line)
      if PROGRESS.search(line):
        # Drop the logging prefix (time, level, file) of absl and logging lines.
        self._show(_LOG_PREFIX.sub("", line)[:160])

  def _heartbeat(self):
    while not self._stop.wait(5.0):
      if time.time() - self._last_shown >= HEARTBEAT_SECONDS:
        self._show("still running")

  def wait(self, timeout: Optional[float] = None) -> int:
    try:
      code = self.process.wait(timeout)
    finally:
      if self.process.poll() is not None:
        self._reader.join(10)
        self._stop.set()
        self._log_file.close()
    return code

  def stop(self, grace: float = 30.0):
    """SIGTERM to the whole process group (children such as an index builder too), then
    SIGKILL after `grace` seconds."""
    if self.process.poll() is None:
      try:
        os.killpg(self.process.pid, signal.SIGTERM)
      except ProcessLookupError:
        pass
      try:
        self.process.wait(grace)
      except subprocess.TimeoutExpired:
        try:
          os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
        self.process.wait(10)
    self.wait()


def tail(path: str, lines: int = 25) -> str:
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      return "".join(f.readlines()[-lines:])
  except OSError:
    return ""


def run_command(argv: Sequence[str], stage_dir: str, label: str,
                log: Callable[[str], None] = print,
                on_line: Optional[Callable[[str], None]] = None) -> None:
  """Runs a command to completion (its process group stopped on any interruption);
  StageError with the end of its log when it fails."""
  log_path = os.path.join(stage_dir, LOG)
  log(f"  $ {' '.join(_short(a) for a in argv)}")
  command = Command(argv, log_path, label, log, on_line=on_line)
  try:
    code = command.wait()
  except BaseException:
    command.stop(grace=10.0)
    raise
  if code != 0:
    raise StageError(f"{label}: `{' '.join(argv[:4])} ...` exited with {code}; "
                     f"log: {log_path}\n{tail(log_path)}")


def _short(arg: str) -> str:
  return "python" if arg == sys.executable else arg


def python_module(module: str, *args: str) -> List[str]:
  return [sys.executable, "-m", module, *args]
