"""A multi-worker job that loses or stalls on a process: which peer the line names, and the
watchdog that ends a stalled job whatever TensorFlow does.

The watchdog is tested here on real processes and real sockets, with stand-in trainers
(standard library only, started in a second) that feed the real heartbeat: two watchdogs,
one per task of a two-task TF_CONFIG on 127.0.0.1, each the parent of its trainer. The
whole job with TensorFlow's collectives is tests/test_multi_worker.py (system tier).
"""
import contextlib
import functools
import itertools
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types

import pytest
import tensorflow as tf

from realm_tf.configs import load_config
from realm_tf.io import heartbeat
from realm_tf.training import peer_failures, watchdog

REPO = pathlib.Path(__file__).resolve().parents[1]


class _Resolver:
  task_type, task_id = "worker", 0

  def cluster_spec(self):
    return tf.train.ClusterSpec({"worker": ["10.0.0.1:2222", "10.0.0.2:2222",
                                            "10.0.0.3:2222"]})


class _Strategy:
  cluster_resolver = _Resolver()


HEARTBEATS_STOPPED = (
    "Collective ops is aborted by: Error reported from /job:worker/task:2: The following "
    "tasks are unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:2\nThe "
    "tasks have crashed.")
COLLECTIVE_TIMED_OUT = ("Graph execution error:\n\nDetected at node CollectiveReduceV2\n"
                        "Collective has timed out during execution.")


def test_the_lost_peer_is_named_with_its_address(repo_dir, monkeypatch):
  """The peer TensorFlow names; else the one that does not answer a health check; else,
  all answering after a collective timeout, every peer (one of them is alive but stuck);
  else none."""
  config = load_config(str(repo_dir / "configs" / "tiny.yaml"),
                       ["runtime.collective_timeout_seconds=30"], experiment="realm/ict")
  probed = []
  silent = {"/job:worker/replica:0/task:1"}
  monkeypatch.setattr(peer_failures, "_answers",
                      lambda peer, seconds: probed.append(peer) or peer.device not in silent)
  describe = peer_failures.describe_lost_peers
  said = describe(tf.errors.UnavailableError(None, None, HEARTBEATS_STOPPED), _Strategy(),
                  config.runtime)
  assert said.startswith("worker:2 (10.0.0.3:2222) lost (named by TensorFlow; heartbeats")
  assert not probed
  timed_out = tf.errors.DeadlineExceededError(None, None, COLLECTIVE_TIMED_OUT)
  said = describe(timed_out, _Strategy(), config.runtime)
  assert said == ("worker:1 (10.0.0.2:2222) lost (no answer to a health check within 5s; a "
                  "collective waited 30s (runtime.collective_timeout_seconds))")
  assert [p.index for p in probed] == [1, 2]  # never itself
  silent.clear()
  said = describe(timed_out, _Strategy(), config.runtime)
  assert said.startswith("worker:1 (10.0.0.2:2222), worker:2 (10.0.0.3:2222) lost (all "
                         "answer a health check: one is alive but stuck")
  probed.clear()
  said = describe(timed_out, _Strategy(), config.runtime, probe_seconds=None)
  assert said.startswith("worker:1 (10.0.0.2:2222), worker:2 (10.0.0.3:2222) lost (one of "
                         "them, not asked which; a collective waited 30s")
  assert not probed
  # An error that is no collective's (a storage outage, say) blames no peer.
  said = describe(tf.errors.UnavailableError(None, None, "GCS answered 503\nretry later"),
                  _Strategy(), config.runtime)
  assert said == ("no peer found lost, every one answers a health check (UnavailableError: "
                  "GCS answered 503)")


# ------------------------------------------------------------------------------- the verdict

ADDRESSES = {"worker:0": "h0:1", "worker:1": "h1:1", "worker:2": "h2:1"}


def _alive(batches, step=7):
  return dict(trainer="running", heartbeat_age=0.5, batches=batches, step=step)


def test_the_verdict_names_the_process_that_stopped_the_job():
  judge = watchdog.judge
  # Gone, stopped, silent, blocked: named for that, whatever the others' counters say.
  assert judge({"worker:0": _alive(9), "worker:1": dict(trainer="stopped"),
                "worker:2": _alive(9)}, ADDRESSES) == [
      "worker:1 (h1:1) is stopped (SIGSTOP, a debugger or a frozen VM)"]
  assert judge({"worker:0": _alive(9), "worker:1": None}, ADDRESSES) == [
      "worker:1 (h1:1) does not answer (its host is down, frozen or cut off)"]
  assert judge({"worker:0": _alive(9), "worker:1": dict(trainer="exited", exit=-9)},
               ADDRESSES) == ["worker:1 (h1:1) has exited (-9)"]
  assert judge({"worker:0": _alive(9),
                "worker:1": dict(trainer="running", heartbeat_age=60.0, batches=9)},
               ADDRESSES) == [
      "worker:1 (h1:1) is not responding (its Python interpreter is blocked)"]
  # Blocked and behind the others: on its input holding the GIL, or just before asking.
  assert judge({"worker:0": _alive(9),
                "worker:1": dict(trainer="running", heartbeat_age=60.0, batches=8, step=7)},
               ADDRESSES) == [
      "worker:1 (h1:1) is not responding (its Python interpreter is blocked; 8 batches "
      "delivered, the others 9; at step 7: stuck on its input or before asking for it)"]
  # All alive: the one that delivered fewer batches starves (the others hold their next).
  assert judge({"worker:0": _alive(9), "worker:1": _alive(8), "worker:2": _alive(9)},
               ADDRESSES) == [
      "worker:1 (h1:1) is stuck in its input pipeline (alive; 8 batches delivered, the "
      "others 9; at step 7)"]
  # All alive and fed: every process is named, none singled out.
  assert judge({"worker:0": _alive(9), "worker:1": _alive(9)}, ADDRESSES) == [
      "worker:0 (h0:1) is alive and fed but not advancing",
      "worker:1 (h1:1) is alive and fed but not advancing"]


def test_only_a_multi_worker_task_is_supervised():
  cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
  env = {"TF_CONFIG": json.dumps(dict(cluster=cluster, task=dict(type="worker", index=1)))}
  assert watchdog.this_task(env) == watchdog.Peer("worker", 1, "127.0.0.1:2")
  assert watchdog.should_supervise(env)
  assert not watchdog.should_supervise(dict(env, **{heartbeat.WATCHDOG_DIR_ENV: "/tmp/x"}))
  one = {"TF_CONFIG": json.dumps(dict(cluster={"worker": ["a:1"]},
                                      task=dict(type="worker", index=0)))}
  for not_multi in ({}, one, {"TF_CONFIG": "{not json"}, {"TF_CONFIG": '{"cluster": {}}'}):
    assert not watchdog.should_supervise(not_multi)


def test_the_watchdog_never_imports_tensorflow():
  code = ("import sys; from realm_tf.training import watchdog; "
          "assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
  subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


# --------------------------------------------------------------------- watchdogs at work

# A stand-in trainer: feeds the real heartbeat as realm_tf.train does (loops, batches, the
# peers' watchdog addresses — here through files instead of the coordination service) for
# LOOPS loops, the same number on every process as in lockstep; then every process stops
# advancing, as in a collective, and `how` says what this one does. Once in the state it
# stalls in, it says so in a file of its own (<task>.stalled: the counters it stalled at).
STAND_IN = r"""
import ctypes, json, os, sys, threading, time
from realm_tf.io import heartbeat
from realm_tf.training import watchdog
assert watchdog.started_by_watchdog()
shared, how, stall_seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
beat = heartbeat.current()
me = watchdog.this_task(os.environ)

def publish(name, text):
  with open(os.path.join(shared, name + ".tmp"), "w") as f:
    f.write(text)
  os.replace(os.path.join(shared, name + ".tmp"), os.path.join(shared, name))

publish(me.name, os.environ[heartbeat.WATCHDOG_ADDRESS_ENV])
others = {}
for peer in watchdog.peers(json.loads(os.environ["TF_CONFIG"])["cluster"], me.task_type,
                           me.index):
  path = os.path.join(shared, peer.name)
  while not os.path.exists(path):
    time.sleep(0.05)
  others[peer.name] = dict(address=peer.address, watchdog=open(path).read())
beat.describe_job(me.name, me.address, f"{me.name} of 2 processes", stall_seconds, 600,
                  "/runs/ckpt", others)
beat.checkpoint_seen(10)
for step in range(1, 41):
  beat.loop_begun("train"); beat.batch(); beat.loop_ended("train", step)
  time.sleep(0.05)
beat.loop_begun("train")
if how != "starve":
  beat.batch()  # the others hold their next batch, and wait in the collective
if how == "report":  # TensorFlow raised: it writes its line, then its exit hangs
  line = "training stopped (worker:1): another process of the job is unreachable: x"
  beat.reported_line(line)
  print(line, file=sys.stderr, flush=True)
state = beat.snapshot()
publish(me.name + ".stalled", json.dumps(dict(loops=state["loops"], batches=state["batches"],
                                              reported=bool(state["reported"]))))
if how == "starve":
  time.sleep(3600)  # its next batch never comes
if how == "wedge":
  ctypes.PyDLL(None).pause()  # blocks holding the GIL: no Python thread runs again
if how == "abort":
  os.abort()
if how == "report":
  threading.Thread(target=threading.Event().wait).start()
  sys.exit(1)
time.sleep(3600)
"""

# The watchdogs' clock stands still until the test creates the file STAND_IN_CLOCK names
# (once every stand-in has reached the state it stalls in), then runs: however slowly a
# loaded machine runs the stand-ins, no stall is judged before the job has stalled, and
# every verdict reads the final states. Peers have 30 s to answer: a bound for a hung test
# only (a watchdog serves its verdict until its peer has asked, not for a set time).
RUN_WATCHDOG = """
import os, sys, time
from realm_tf.training import watchdog

class HeldClock:
  def __init__(self, release):
    self.release, self.started = release, None

  def __call__(self):
    if self.started is None:
      if not os.path.exists(self.release):
        return 0.0
      self.started = time.monotonic()
    return time.monotonic() - self.started

release = os.environ.get("STAND_IN_CLOCK")
sys.exit(watchdog.Watchdog(sys.argv[1:], os.environ, exit_grace_seconds=2, query_seconds=30,
                           clock=HeldClock(release) if release else time.monotonic).run())
"""
HANG_GUARD = 120.0  # seconds: only ends a test that hangs, never what a test judges


def _until(condition, what):
  """Waits for `condition()`: an event, with HANG_GUARD only against a hung test."""
  deadline = time.monotonic() + HANG_GUARD
  while not condition():
    assert time.monotonic() < deadline, f"never happened: {what}"
    time.sleep(0.05)


class StandInJob:
  """Two watchdogs on 127.0.0.1, each with a stand-in trainer; `hows` per worker. Their
  clock is held until `release()`."""

  def __init__(self, tmp_path, hows, stall_seconds=2.0):
    self.shared = tmp_path / "shared"
    self.shared.mkdir()
    self.hows = hows
    cluster = {"worker": ["127.0.0.1:7001", "127.0.0.1:7002"]}
    self.logs = [tmp_path / f"w{i}.log" for i in range(2)]
    self.watchdogs = []
    for i, how in enumerate(hows):
      env = dict(os.environ, TF_CONFIG=json.dumps(dict(cluster=cluster,
                                                       task=dict(type="worker", index=i))),
                 TMPDIR=str(tmp_path), STAND_IN_CLOCK=str(self.shared / "clock"))
      with open(self.logs[i], "w") as log:
        self.watchdogs.append(subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, "-c", RUN_WATCHDOG, sys.executable, "-c", STAND_IN,
             str(self.shared), how, str(stall_seconds)],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))

  def trainer_pid(self, i) -> int:
    _until(lambda: "training process pid " in self.text(i), f"worker {i}'s trainer")
    return int(self.text(i).split("training process pid ")[1].split(",")[0])

  def directory(self, i) -> str:
    """The heartbeat directory of worker `i`'s watchdog."""
    self.trainer_pid(i)
    return self.text(i).split("heartbeat and stacks in ")[1].split()[0]

  def progressing(self):
    """Waits until both heartbeats, as their watchdogs read them, show the job watched and
    a few loops ended."""
    directories = [self.directory(i) for i in range(2)]

    def watched():
      beats = [heartbeat.read(d) or {} for d in directories]
      return all(b.get("watch") and b.get("step", 0) >= 3 for b in beats)

    _until(watched, "both heartbeats watched at step 3")

  def stalled(self, i, in_heartbeat=True):
    """Waits until stand-in `i` has reached the state it stalls in and, with
    `in_heartbeat`, until its heartbeat (what its watchdog reads) shows it (a stand-in
    blocked holding the GIL never writes it)."""
    marker = self.shared / f"worker:{i}.stalled"
    _until(marker.exists, f"worker {i} stalled ({self.hows[i]})")
    if in_heartbeat:
      final, directory = json.loads(marker.read_text()), self.directory(i)

      def shown():
        beat = heartbeat.read(directory) or {}
        return (beat.get("loops"), beat.get("batches"), bool(beat.get("reported"))) == (
            final["loops"], final["batches"], final["reported"])

      _until(shown, f"worker {i}'s heartbeat at {final}")

  def release(self):
    """Lets the watchdogs' clock run: from now on a stall can be judged."""
    (self.shared / "clock").touch()

  def wait(self):
    try:
      return [p.wait(HANG_GUARD) for p in self.watchdogs]
    finally:
      for p in self.watchdogs:
        if p.poll() is None:
          p.kill()

  def kill(self):
    for p in self.watchdogs:
      p.kill()
      p.wait()

  def text(self, i) -> str:
    return self.logs[i].read_text()

  def line(self, i) -> str:
    lines = [l for l in self.text(i).splitlines() if l.startswith("training stopped")]
    assert len(lines) == 1, self.text(i)
    return lines[0]


def _stacks(line: str) -> str:
  path = line.split("Every thread's stack of this process: ")[1].split(". Relaunch")[0]
  return pathlib.Path(path).read_text()


def _trainer_gone(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return True
  with open(f"/proc/{pid}/stat") as f:  # a zombie not yet reaped counts as gone
    return f.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_stopped_worker_is_named_by_every_watchdog_and_the_job_ends(tmp_path):
  job = StandInJob(tmp_path, ["wait", "wait"])
  stopped = job.trainer_pid(1)
  job.progressing()
  os.kill(stopped, signal.SIGSTOP)
  # SIGSTOP takes effect asynchronously: the job has stalled once the kernel shows it.
  _until(lambda: watchdog._process_state(stopped) in ("T", "t"), "worker 1 stopped")
  job.stalled(0)
  job.release()
  # Each watchdog ended the job for the verdict: its one line, exit 1, its trainer killed.
  assert job.wait() == [1, 1]
  for i in range(2):
    line = job.line(i)
    assert line.startswith(f"training stopped (worker:{i} of 2 processes): the job made no "
                           "progress for 2s (runtime.progress_stall_seconds): worker:1 "
                           "(127.0.0.1:7002) is stopped (SIGSTOP, a debugger or a frozen VM)")
    assert line.endswith("Relaunch every process with the same command: training resumes "
                         "from the chief's checkpoint at step 10 in /runs/ckpt.")
    assert "in <module>" in _stacks(line)  # every thread's stack, the main one included
  assert _trainer_gone(stopped) and _trainer_gone(job.trainer_pid(0))


def test_a_starved_worker_is_named_as_stuck_in_its_input_pipeline(tmp_path):
  job = StandInJob(tmp_path, ["wait", "starve"])
  job.progressing()
  job.stalled(0)
  job.stalled(1)
  job.release()
  assert job.wait() == [1, 1]
  for i in range(2):
    line = job.line(i)
    assert ("worker:1 (127.0.0.1:7002) is stuck in its input pipeline (alive; 40 batches "
            "delivered, the others 41; at step 40)") in line, line
    assert "worker:0 (127.0.0.1:7001)" not in line
  starving = STAND_IN.splitlines().index("  time.sleep(3600)  # its next batch never comes")
  assert f'File "<string>", line {starving + 1} in <module>' in _stacks(job.line(1))


@contextlib.contextmanager
def _watchdog_of(tmp_path, monkeypatch, index: int, seconds: int):
  """A Watchdog of worker `index` of a 2-worker job over a trainer that sleeps `seconds`,
  its heartbeat directory under tmp_path; killed and its signal handlers restored after."""
  env = dict(os.environ, TF_CONFIG=json.dumps(dict(
      cluster={"worker": ["127.0.0.1:7001", "127.0.0.1:7002"]},
      task=dict(type="worker", index=index))), TMPDIR=str(tmp_path))
  handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its heartbeat directory
  dog = watchdog.Watchdog([sys.executable, "-c", f"import time; time.sleep({seconds})"], env)
  try:
    yield dog
  finally:
    dog._kill()
    dog.server.shutdown()
    for signum, handler in handlers.items():
      signal.signal(signum, handler)


def test_a_peer_asking_while_the_trainer_is_frozen_is_told_the_state_it_stalled_in(
    tmp_path, monkeypatch):
  """The race behind a starved worker's job naming its peer "stopped": a peer's question
  answered while this watchdog freezes its trainer. Here the answer is held inside its
  heartbeat read until the freeze has happened (or 2 s, if the freeze must wait for it);
  it must describe the running trainer either way, never the frozen one."""
  in_answer, frozen, answers = threading.Event(), threading.Event(), []
  read = heartbeat.read

  def held_read(directory):
    if threading.current_thread() is not threading.main_thread():  # the answering thread
      in_answer.set()
      frozen.wait(2)
    return read(directory)

  with _watchdog_of(tmp_path, monkeypatch, 0, 60) as dog:
    monkeypatch.setattr(heartbeat, "read", held_read)
    asker = threading.Thread(target=lambda: answers.append(watchdog.ask(
        f"127.0.0.1:{dog.server.server_address[1]}", timeout=HANG_GUARD)))
    asker.start()
    assert in_answer.wait(HANG_GUARD)
    dog._serve_stalled_state()  # as _end_stalled does: served, then frozen
    dog._freeze()
    # SIGSTOP takes effect asynchronously: the answer goes on once the kernel shows it.
    _until(lambda: watchdog._process_state(dog.child.pid) in ("T", "t"), "the freeze")
    frozen.set()
    asker.join(HANG_GUARD)
    assert answers and answers[0]["trainer"] == "running", answers
    assert dog.status()["trainer"] == "running"  # and what is served from now on


def test_a_trainer_continued_after_its_watchdogs_verdict_writes_no_line_of_its_own(
    tmp_path, monkeypatch):
  """A trainer found stopped is continued after the verdict, for its stacks; its step then
  fails on the peers the verdict ended (TensorFlow: connection reset), and it would write
  a second "training stopped" line (seen in make test-system: worker:1's own line after
  its watchdog's). The watchdog's line is written for it first; its exit line is empty."""
  with _watchdog_of(tmp_path, monkeypatch, 1, 60) as dog:
    trainer_side = heartbeat.Heartbeat(dog.directory)  # what the trainer reads
    monkeypatch.setattr(heartbeat, "_CURRENT", trainer_side)
    assert not trainer_side.verdict_written()
    dog._write_line({"role": "worker:1 of 2 processes"}, {}, "worker:1 is stopped")
    assert trainer_side.verdict_written()
    with open(heartbeat.verdict_path(dog.directory), encoding="utf-8") as f:
      assert f.read().startswith("training stopped (worker:1 of 2 processes)")
    # Before any probe of the peers (the arguments would fail): nothing to write.
    assert peer_failures.lost_peer_line(RuntimeError("reset"), None, None, "") == ""


def test_a_trainer_woken_by_the_stacks_request_is_still_told_as_it_stalled(
    tmp_path, monkeypatch, capfd):
  """SIGUSR1 for the stacks can wake a trainer blocked in a system call (pause() holding
  the GIL returns), which then heartbeats again: a peer that asks meanwhile is told the
  state it stalled in (its heartbeat stale: blocked), not the live one."""
  watch = dict(task="worker:0", address="127.0.0.1:7001", role="worker:0 of 2 processes",
               stall_seconds=2.0, collective_timeout_seconds=600.0, checkpoint_dir="/runs/ckpt",
               peers={})

  def beat_at(when):  # the heartbeat file as the trainer's writer thread leaves it
    state = dict(time=when, loops=3, batches=2, step=1, waits=0, phase="train",
                 first_loop_ended=True, watch=watch, reported=None, checkpoint_step=10)
    path = heartbeat.heartbeat_path(dog.directory)
    pathlib.Path(path + ".tmp").write_text(json.dumps(state))
    os.replace(path + ".tmp", path)
    return state

  answers = []

  def woken():  # the stacks request wakes it: it heartbeats, and a peer asks
    beat_at(time.time())
    answers.append(watchdog.ask(f"127.0.0.1:{dog.server.server_address[1]}", HANG_GUARD))
    return heartbeat.stacks_path(dog.directory)

  stale = watchdog.HEARTBEAT_STALE_SECONDS + 60
  with _watchdog_of(tmp_path, monkeypatch, 0, 600) as dog:
    monkeypatch.setattr(dog, "_save_stacks", woken)
    assert dog._end_stalled(beat_at(time.time() - stale), (2.0, "the limit")) == 1
  assert answers[0]["heartbeat_age"] > stale, answers  # the stalled state
  assert dog._verdict == ["worker:0 (127.0.0.1:7001) is not responding (its Python "
                          "interpreter is blocked)"]
  assert "is not responding" in capfd.readouterr().err


# A peer's reply that is no status: named in the verdict for what it is, as a peer that does
# not answer is. Each fake peer answers every connection with its reply and closes it.
_GOOD = dict(task="worker:1", trainer="running", exit=None, process_state="S",
             heartbeat_age=0.5, batches=2, step=1, phase="train", idle_seconds=1.0,
             verdict=None)
BAD_REPLIES = {  # task: (reply, what the verdict says of it)
    "worker:1": (json.dumps(_GOOD).encode(), None),  # a status: not named
    "worker:2": (b"<html>busy</html>\r\n",
                 "its reply is not JSON (Expecting value at character 0: "
                 "'<html>busy</html>\\r\\n')"),
    "worker:3": (b"[1, 2]", "its reply is a JSON array, not an object: [1, 2]"),
    "worker:4": (json.dumps(dict(_GOOD, heartbeat_age="0.5s")).encode(),
                 "its reply's 'heartbeat_age' is '0.5s', not a number of seconds or null"),
    "worker:5": (json.dumps(dict(_GOOD, batches="2")).encode(),
                 "its reply's 'batches' is '2', not a count of batches"),
    "worker:6": (b'{"batches": 2, "heartbeat_age": 0.5}',
                 "its reply has no 'trainer': {'batches': 2, 'heartbeat_age': 0.5}"),
    "worker:7": (b"", "its reply is empty (the connection closed before any status was sent)"),
    "worker:8": (b'{"trainer": "running", "heartbeat_a',  # closed mid-reply
                 "its reply is cut off after 35 bytes (Unterminated string starting at)"),
}

# The trainer of worker:0 of a job whose peers' watchdogs are the fake peers (argv[1]:
# {task: {"address", "watchdog"}}; argv[2]: its role): one loop, then it stalls.
STALLING_TRAINER = r"""
import json, sys, time
from realm_tf.io import heartbeat
from realm_tf.training import watchdog
assert watchdog.started_by_watchdog()
beat = heartbeat.current()
beat.describe_job("worker:0", "127.0.0.1:7000", sys.argv[2], 2, 600, "/runs/ckpt",
                  json.loads(sys.argv[1]))
beat.checkpoint_seen(10)
beat.loop_begun("train"); beat.batch(); beat.loop_ended("train", 1)
beat.loop_begun("train"); beat.batch()
time.sleep(600)
"""


class _FakePeer:
  """A peer "watchdog" on 127.0.0.1 answering every connection with `reply`."""

  def __init__(self, reply: bytes):
    self.reply = reply
    self.listener = socket.create_server(("127.0.0.1", 0))
    self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
    threading.Thread(target=self._serve, daemon=True).start()

  def _serve(self):
    while True:
      try:
        connection, _ = self.listener.accept()
      except OSError:
        return  # closed
      with connection:
        connection.sendall(self.reply)

  def close(self):
    self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (closing alone does not)
    self.listener.close()


def test_a_peer_that_answers_with_no_status_is_named_for_what_its_reply_is(
    tmp_path, monkeypatch, capfd):
  """Not JSON, not an object, a field of the wrong type or missing, an empty reply, one
  cut off part-way: run() ends the stalled job with one line naming each such peer and
  what its reply was, and raises nothing."""
  fakes = {task: _FakePeer(reply) for task, (reply, _) in BAD_REPLIES.items()}
  cluster = {"worker": [f"127.0.0.1:{7000 + i}" for i in range(len(fakes) + 1)]}
  env = dict(os.environ, TF_CONFIG=json.dumps(dict(cluster=cluster,
                                                   task=dict(type="worker", index=0))),
             TMPDIR=str(tmp_path))
  peers = {task: dict(address=cluster["worker"][int(task.split(":")[1])],
                      watchdog=fake.address) for task, fake in fakes.items()}
  handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
  monkeypatch.setattr(watchdog, "POLL_SECONDS", 0.05)
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its heartbeat directory
  role = f"worker:0 of {len(cluster['worker'])} processes"
  # Each reading of the clock is 10 s after the last: the stall (limit 2 s) is judged at
  # the first poll that sees the job watched, whatever the machine's load.
  dog = watchdog.Watchdog(
      [sys.executable, "-c", STALLING_TRAINER, json.dumps(peers), role], env,
      query_seconds=HANG_GUARD, clock=functools.partial(next, itertools.count(0.0, 10.0)))
  dog.linger_seconds = 0  # the fake peers never ask for its verdict
  try:
    assert dog.run() == 1
  finally:
    dog._kill()
    dog.server.shutdown()
    for fake in fakes.values():
      fake.close()
    for signum, handler in handlers.items():
      signal.signal(signum, handler)
  named = [f"{task} ({peers[task]['address']}) does not answer properly: {what}"
           for task, (_, what) in BAD_REPLIES.items() if what]
  assert dog.status()["verdict"] == named  # what its peers would be told
  err = capfd.readouterr().err
  assert "Traceback" not in err, err
  lines = [l for l in err.splitlines() if l.startswith("training stopped")]
  assert len(lines) == 1, err
  assert lines[0].startswith(
      "training stopped (worker:0 of 9 processes): the job made no progress for 2s "
      f"(runtime.progress_stall_seconds): {'; '.join(named)}. Every thread's stack"), lines[0]


class _Connection:
  """A connection whose reads return `chunks` in turn; an exception among them is raised."""

  def __init__(self, chunks):
    self.chunks = list(chunks)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False

  def settimeout(self, seconds):
    del seconds

  def recv(self, size):
    del size
    chunk = self.chunks.pop(0)
    if isinstance(chunk, Exception):
      raise chunk
    return chunk


def test_a_reply_that_breaks_off_is_named_a_connection_that_fails_first_is_no_answer(
    monkeypatch):
  """A reset or a stall after part of the reply is a bad reply; before any byte, no answer
  (as an unreachable peer). Connections stand in for the sockets: a real reset races the
  asker's connect."""
  replies = []
  monkeypatch.setattr(watchdog, "socket", types.SimpleNamespace(
      create_connection=lambda address, timeout: _Connection(replies.pop(0))))
  replies.append([b'{"trainer": "running"', ConnectionResetError(104, "Connection reset by peer")])
  with pytest.raises(watchdog.BadReply, match=r"^its reply broke off after 21 bytes "
                                              r"\(Connection reset by peer\)$"):
    watchdog.ask("h1:1")
  replies.append([b'{"trainer": ', b'"running"', TimeoutError("timed out")])
  with pytest.raises(watchdog.BadReply, match=r"^its reply broke off after 21 bytes "
                                              r"\(timed out\)$"):
    watchdog.ask("h1:1")
  replies.append([ConnectionResetError(104, "Connection reset by peer")])
  with pytest.raises(ConnectionResetError):
    watchdog.ask("h1:1")
  replies.append([json.dumps(_GOOD).encode()[:30], json.dumps(_GOOD).encode()[30:], b""])
  assert watchdog.ask("h1:1") == _GOOD  # a status in two reads
  for address in ("h1", "h1:", "h1:http", ":80", "h1:70000"):
    with pytest.raises(ValueError, match="is not host:port"):
      watchdog.ask(address)


def test_a_reply_is_read_as_a_status_only_if_judge_can_read_it():
  parse = watchdog.parse_status
  assert parse(json.dumps(_GOOD).encode()) == _GOOD
  exited = dict(_GOOD, trainer="exited", exit=-9, verdict=["worker:1 (h1:1) has exited (-9)"])
  assert parse(json.dumps(exited).encode()) == exited
  for reply, what in [
      (b"\xff\xfe{}", "its reply is not UTF-8 text (invalid start byte at byte 0: "
                      "b'\\xff\\xfe{}')"),
      (b" " * (watchdog.MAX_REPLY_BYTES + 1), "its reply is longer than 65536 bytes"),
      (b"[" * 5000, "its reply is not JSON that can be read (RecursionError: "),
      (b'{"trainer": "running"} {}', "its reply is not JSON (Extra data at character 23: "),
      (b"null", "its reply is a JSON null, not an object: None"),
      (json.dumps(dict(_GOOD, heartbeat_age=float("nan"))).encode(),
       "its reply's 'heartbeat_age' is nan, not a number of seconds or null"),
      (json.dumps(dict(_GOOD, batches=True)).encode(),
       "its reply's 'batches' is True, not a count of batches"),
      (json.dumps(dict(_GOOD, batches=-1)).encode(),
       "its reply's 'batches' is -1, not a count of batches"),
      (json.dumps(dict(_GOOD, trainer="paused")).encode(),
       "its reply's 'trainer' is 'paused', not one of 'running', 'stopped', 'exited'"),
      (json.dumps(dict(_GOOD, trainer="exited")).encode(),
       "its reply says its trainer exited but gives no exit code: None"),
      (json.dumps(dict(_GOOD, verdict="x")).encode(),
       "its reply's 'verdict' is 'x', not a list of one-line strings or null"),
      (json.dumps(dict(_GOOD, verdict=["a\nb"])).encode(),
       "its reply's 'verdict' is ['a\\nb'], not a list of one-line strings or null")]:
    with pytest.raises(watchdog.BadReply) as error:
      parse(reply)
    assert str(error.value).startswith(what), (reply[:40], str(error.value))


def test_a_worker_blocked_holding_the_gil_is_named_and_its_stacks_saved(tmp_path):
  # The limit is above HEARTBEAT_STALE_SECONDS, and the clock runs only once the blocked
  # trainer can write no heartbeat: at the verdict its heartbeat is older than the limit.
  job = StandInJob(tmp_path, ["wait", "wedge"], stall_seconds=watchdog.HEARTBEAT_STALE_SECONDS + 2)
  job.progressing()
  job.stalled(0)
  job.stalled(1, in_heartbeat=False)
  blocked_pid = job.trainer_pid(1)

  def in_pause():  # the kernel's wait channel of its main thread
    with open(f"/proc/{blocked_pid}/wchan") as f:
      return "pause" in f.read()

  _until(in_pause, "worker 1 blocked in pause()")
  job.release()
  assert job.wait() == [1, 1]
  for i in range(2):
    assert ("worker:1 (127.0.0.1:7002) is not responding (its Python interpreter is "
            "blocked") in job.line(i)
  blocked = STAND_IN.splitlines().index("  ctypes.PyDLL(None).pause()  # blocks holding the "
                                        "GIL: no Python thread runs again")
  # faulthandler wrote the blocked thread's stack without the GIL.
  assert f'File "<string>", line {blocked + 1} in <module>' in _stacks(job.line(1))


def test_a_trainer_killed_by_a_signal_gets_the_line_it_could_not_write(tmp_path):
  # The clock is never released: the trainer's death, not a stall, ends worker 1.
  job = StandInJob(tmp_path, ["wait", "abort"])
  job.progressing()
  try:
    assert job.watchdogs[1].wait(HANG_GUARD) == 128 + signal.SIGABRT, job.text(1)
  finally:
    job.kill()
  assert job.line(1).startswith(
      "training stopped (worker:1 of 2 processes): the training process was ended by "
      "SIGABRT; worker:1 (127.0.0.1:7002) has exited (-6). Relaunch every process"), job.line(1)


def test_a_trainer_whose_exit_hangs_after_its_line_is_ended(tmp_path):
  job = StandInJob(tmp_path, ["wait", "report"], stall_seconds=30)
  job.progressing()
  job.stalled(1)  # its line written, its heartbeat says so, and its exit hangs
  trainer = job.trainer_pid(1)
  job.release()
  try:
    assert job.watchdogs[1].wait(HANG_GUARD) == 1, job.text(1)
  finally:
    job.kill()
  # Ended by its watchdog for the exit grace, with no line but its own.
  assert "had not exited 2s after its line; ended" in job.text(1)
  assert job.line(1).endswith("another process of the job is unreachable: x")
  assert _trainer_gone(trainer)


def test_sigterm_reaches_the_trainer(tmp_path):
  """A preemption notice goes to the trainer (which saves and exits 42 in realm_tf)."""
  env = dict(os.environ, TF_CONFIG=json.dumps(dict(
      cluster={"worker": ["127.0.0.1:7001", "127.0.0.1:7002"]},
      task=dict(type="worker", index=0))), TMPDIR=str(tmp_path))
  trainer = ("import signal, sys, time; from realm_tf.training import watchdog; "
             "watchdog.started_by_watchdog(); "
             "signal.signal(signal.SIGTERM, lambda *a: sys.exit(42)); "
             "print('ready', flush=True); time.sleep(60)")
  with subprocess.Popen([sys.executable, "-c", RUN_WATCHDOG, sys.executable, "-c", trainer],
                        cwd=REPO, env=env, stdout=subprocess.PIPE, text=True) as process:
    assert process.stdout.readline().strip() == "ready"
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 42


@pytest.mark.parametrize("writes", [True, False])
def test_heartbeat_round_trip(tmp_path, writes):
  beat = heartbeat.Heartbeat(str(tmp_path) if writes else None).start()
  beat.loop_begun("train")
  beat.batch()
  beat.loop_ended("train", 5)
  beat.reported_line("x")
  state = heartbeat.read(str(tmp_path))
  if not writes:
    assert state is None and beat.snapshot()["loops"] == 0
    return
  assert (state["loops"], state["batches"], state["step"], state["first_loop_ended"],
          state["reported"]["line"]) == (2, 1, 5, True, "x")
