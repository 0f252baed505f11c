"""A multi-worker job that loses or stalls on a process: which peer the line names, and the
watchdog that ends a stalled job whatever TensorFlow does.

The watchdog is tested here on real processes and real sockets, with stand-in trainers
(standard library only, started in a second) that feed the real heartbeat: two watchdogs,
one per task of a two-task TF_CONFIG on 127.0.0.1, each the parent of its trainer. The
whole job with TensorFlow's collectives is tests/test_multi_worker.py (system tier).
"""
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

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
# advancing, as in a collective, and `how` says what this one does.
STAND_IN = r"""
import ctypes, json, os, sys, threading, time
from realm_tf.io import heartbeat
from realm_tf.training import watchdog
assert watchdog.started_by_watchdog()
shared, how, stall_seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
beat = heartbeat.current()
me = watchdog.this_task(os.environ)
with open(os.path.join(shared, me.name + ".tmp"), "w") as f:
  f.write(os.environ[heartbeat.WATCHDOG_ADDRESS_ENV])
os.replace(os.path.join(shared, me.name + ".tmp"), os.path.join(shared, me.name))
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
if how == "starve":
  time.sleep(3600)  # its next batch never comes
beat.batch()  # the others hold their next batch, and wait in the collective
if how == "wedge":
  ctypes.PyDLL(None).pause()  # blocks holding the GIL: no Python thread runs again
if how == "abort":
  os.abort()
if how == "report":  # TensorFlow raised: it writes its line, then its exit hangs
  line = "training stopped (worker:1): another process of the job is unreachable: x"
  beat.reported_line(line)
  print(line, file=sys.stderr, flush=True)
  threading.Thread(target=threading.Event().wait).start()
  sys.exit(1)
time.sleep(3600)
"""

RUN_WATCHDOG = """
import sys
from realm_tf.training import watchdog
sys.exit(watchdog.Watchdog(sys.argv[1:], __import__("os").environ,
                           exit_grace_seconds=2, query_seconds=2).run())
"""


class StandInJob:
  """Two watchdogs on 127.0.0.1, each with a stand-in trainer; `hows` per worker."""

  def __init__(self, tmp_path, hows, stall_seconds=2.0):
    self.shared = tmp_path / "shared"
    self.shared.mkdir()
    cluster = {"worker": ["127.0.0.1:7001", "127.0.0.1:7002"]}
    self.logs = [tmp_path / f"w{i}.log" for i in range(2)]
    self.watchdogs = []
    for i, how in enumerate(hows):
      env = dict(os.environ, TF_CONFIG=json.dumps(dict(cluster=cluster,
                                                       task=dict(type="worker", index=i))),
                 TMPDIR=str(tmp_path))
      with open(self.logs[i], "w") as log:
        self.watchdogs.append(subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, "-c", RUN_WATCHDOG, sys.executable, "-c", STAND_IN,
             str(self.shared), how, str(stall_seconds)],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))

  def trainer_pid(self, i) -> int:
    deadline = time.time() + 60
    while time.time() < deadline:
      text = self.text(i)
      if "training process pid " in text:
        return int(text.split("training process pid ")[1].split(",")[0])
      time.sleep(0.05)
    raise AssertionError(self.text(i))

  def progressing(self):
    """Waits until both heartbeats, as their watchdogs read them, show the job watched and
    a few loops ended."""
    deadline = time.time() + 60
    directories = [self.text(i).split("heartbeat and stacks in ")[1].split()[0]
                   for i in (self.trainer_pid(0) and 0, self.trainer_pid(1) and 1)]
    while True:
      beats = [heartbeat.read(d) or {} for d in directories]
      if all(b.get("watch") and b.get("step", 0) >= 3 for b in beats):
        return
      assert time.time() < deadline, [self.text(i) for i in range(2)]
      time.sleep(0.05)

  def wait(self, timeout=60):
    try:
      return [p.wait(timeout) for p in self.watchdogs]
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
  started = time.time()
  assert job.wait() == [1, 1]
  assert time.time() - started < 2 + 15  # the limit, then a few polls and the stacks
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
  assert job.wait() == [1, 1]
  for i in range(2):
    line = job.line(i)
    assert "worker:1 (127.0.0.1:7002) is stuck in its input pipeline (alive;" in line, line
    assert "worker:0 (127.0.0.1:7001)" not in line
  starving = STAND_IN.splitlines().index("  time.sleep(3600)  # its next batch never comes")
  assert f'File "<string>", line {starving + 1} in <module>' in _stacks(job.line(1))


def test_a_peer_asking_while_the_trainer_is_frozen_is_told_the_state_it_stalled_in(
    tmp_path, monkeypatch):
  """The race behind a starved worker's job naming its peer "stopped": a peer's question
  answered while this watchdog freezes its trainer. Here the answer is held inside its
  heartbeat read until the freeze has happened (or 2 s, if the freeze must wait for it);
  it must describe the running trainer either way, never the frozen one."""
  env = dict(os.environ, TF_CONFIG=json.dumps(dict(
      cluster={"worker": ["127.0.0.1:7001", "127.0.0.1:7002"]},
      task=dict(type="worker", index=0))), TMPDIR=str(tmp_path))
  handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
  dog = watchdog.Watchdog([sys.executable, "-c", "import time; time.sleep(60)"], env)
  in_answer, frozen, answers = threading.Event(), threading.Event(), []
  read = heartbeat.read

  def held_read(directory):
    if threading.current_thread() is not threading.main_thread():  # the answering thread
      in_answer.set()
      frozen.wait(2)
    return read(directory)

  monkeypatch.setattr(heartbeat, "read", held_read)
  try:
    asker = threading.Thread(target=lambda: answers.append(watchdog.ask(
        f"127.0.0.1:{dog.server.server_address[1]}", timeout=10)))
    asker.start()
    assert in_answer.wait(10)
    dog._serve_and_freeze(dict(task="worker:0", trainer="running", batches=3))
    # SIGSTOP takes effect asynchronously: the answer goes on once the kernel shows it.
    deadline = time.time() + 10
    while watchdog._process_state(dog.child.pid) not in ("T", "t") and time.time() < deadline:
      time.sleep(0.01)
    assert watchdog._process_state(dog.child.pid) in ("T", "t")  # it was frozen
    frozen.set()
    asker.join(15)
    assert answers and answers[0]["trainer"] == "running", answers
    assert dog.status()["trainer"] == "running"  # and what is served from now on
  finally:
    dog._kill()
    dog.server.shutdown()
    for signum, handler in handlers.items():
      signal.signal(signum, handler)


def test_a_worker_blocked_holding_the_gil_is_named_and_its_stacks_saved(tmp_path):
  # The limit is above HEARTBEAT_STALE_SECONDS: only then is a blocked heartbeat stale.
  job = StandInJob(tmp_path, ["wait", "wedge"], stall_seconds=watchdog.HEARTBEAT_STALE_SECONDS + 2)
  job.progressing()
  assert job.wait(timeout=90) == [1, 1]
  for i in range(2):
    assert ("worker:1 (127.0.0.1:7002) is not responding (its Python interpreter is "
            "blocked)") in job.line(i)
  blocked = STAND_IN.splitlines().index("  ctypes.PyDLL(None).pause()  # blocks holding the "
                                        "GIL: no Python thread runs again")
  # faulthandler wrote the blocked thread's stack without the GIL.
  assert f'File "<string>", line {blocked + 1} in <module>' in _stacks(job.line(1))


def test_a_trainer_killed_by_a_signal_gets_the_line_it_could_not_write(tmp_path):
  job = StandInJob(tmp_path, ["wait", "abort"], stall_seconds=60)
  job.progressing()
  try:
    assert job.watchdogs[1].wait(30) == 128 + signal.SIGABRT, job.text(1)
  finally:
    job.kill()
  assert job.line(1).startswith(
      "training stopped (worker:1 of 2 processes): the training process was ended by "
      "SIGABRT; worker:1 (127.0.0.1:7002) has exited (-6). Relaunch every process"), job.line(1)


def test_a_trainer_whose_exit_hangs_after_its_line_is_ended(tmp_path):
  job = StandInJob(tmp_path, ["wait", "report"], stall_seconds=30)
  job.progressing()
  started = time.time()
  job.watchdogs[1].wait(30)
  assert job.watchdogs[1].returncode == 1
  assert time.time() - started < 2 + 10
  text = job.text(1)
  assert job.line(1).endswith("another process of the job is unreachable: x")  # only its own
  assert "had not exited 2s after its line; ended" in text
  job.kill()


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
