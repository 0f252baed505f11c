"""Training as several processes: `python -m realm_tf.train` launched as two workers with
TF_CONFIG on 127.0.0.1 (MultiWorkerMirroredStrategy, one CPU replica each, the tiny config).

What a multi-worker job must do, checked on real processes:
  - the loss at every step equals a single-process run with the same global batch;
  - each worker reads a disjoint share of the input files;
  - host-side work happens once, on the chief: params.yaml, metrics.jsonl, summaries,
    retriever snapshots, the index builder child, TRAINING_DONE; the non-chief checkpoints
    into a temporary directory of its own;
  - index swaps are collective: both workers load the same versions at the same steps;
  - the chief's checkpoints restore in a single process;
  - a worker stopped (SIGSTOP) or starved by its input pipeline mid-run ends the job, on
    every process, with one line naming it, within runtime.progress_stall_seconds + 30 s
    (the watchdogs; TensorFlow's own timeouts are set far beyond); one killed ends it
    through TensorFlow's error; launching both again resumes from the chief's last
    checkpoint, with the losses the failed run had computed past it.
"""
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from realm_tf.io import layout, versioned
from realm_tf.training import watchdog
from tests.synthetic_corpus import write_corpus


# Bounds, generous for a loaded 2-core machine (make test runs two test modules at once).
RUN_TIMEOUT = 420.0
KILL_TIMEOUT = 90.0  # from SIGKILL of one worker to the other's exit
# A stalled job: runtime.progress_stall_seconds for those runs; the job must end (every
# process's line written) within it + 30 s, and the watchdogs exit after serving their
# verdict a little longer (watchdog.QUERY_SECONDS twice). TensorFlow's own detectors are
# set far beyond: a collective timeout of 300 s, heartbeats of 600 s (a process stopped or
# starved goes on heartbeating from TensorFlow's point of view only with them that long).
STALL = 15.0
STALL_SETTINGS = [f"runtime.progress_stall_seconds={STALL:.0f}",
                  "runtime.collective_timeout_seconds=300",
                  "runtime.heartbeat_timeout_seconds=600"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """The invented corpus, with its ICT and pre-training examples split into two files of
  equal size (so two workers can read one file each)."""
  path = str(tmp_path_factory.mktemp("corpus"))
  write_corpus(path, num_shards=2)
  return path


def _free_ports(n: int) -> list[int]:
  sockets = [socket.socket() for _ in range(n)]
  for s in sockets:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports


def _command(repo_dir, model_dir, experiment, corpus, overrides, stop_at_step=None):
  data = "ict" if experiment == "ict" else "pretraining"
  items = [f"index.blocks={corpus}",
           f"task.{experiment}.train_data.input_path={os.path.join(corpus, data + '-*')}",
           f"task.{experiment}.train_data.shuffle_buffer_size=0",
           "trainer.steps_per_loop=1", *overrides]
  command = [sys.executable, "-m", "realm_tf.train", "--experiment", f"realm/{experiment}",
             "--config", str(repo_dir / "configs" / "tiny.yaml"), "--model_dir", model_dir,
             "--override", ",".join(items)]
  if stop_at_step is not None:
    command += ["--stop_at_step", str(stop_at_step)]
  return command


class Job:
  """Worker processes of one job (or one process without TF_CONFIG), logging to files."""

  def __init__(self, repo_dir, model_dir, experiment, corpus, overrides=(), workers=2,
               stop_at_step=None, tag="run"):
    self.logs = [f"{model_dir}.{tag}.w{i}.log" for i in range(workers)]
    self.temp_dirs = [f"{model_dir}.{tag}.tmp{i}" for i in range(workers)]
    command = _command(repo_dir, model_dir, experiment, corpus, overrides, stop_at_step)
    ports = _free_ports(workers)
    self.addresses = [f"127.0.0.1:{p}" for p in ports]
    self.processes = []
    for i in range(workers):
      # Each process's own temporary directory, where a non-chief keeps its checkpoints.
      temp = f"{model_dir}.{tag}.tmp{i}"
      os.makedirs(temp, exist_ok=True)
      env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="1", TMPDIR=temp)
      env.pop("TF_CONFIG", None)
      if workers > 1:
        env["TF_CONFIG"] = json.dumps(dict(
            cluster=dict(worker=self.addresses), task=dict(type="worker", index=i)))
      with open(self.logs[i], "w") as log:
        self.processes.append(subprocess.Popen(  # pylint: disable=consider-using-with
            command, cwd=repo_dir, env=env, stdout=log, stderr=subprocess.STDOUT))

  def wait(self, timeout=RUN_TIMEOUT) -> list[int]:
    deadline = time.time() + timeout
    try:
      return [p.wait(max(1.0, deadline - time.time())) for p in self.processes]
    finally:
      self.kill()

  def kill(self):
    for p in self.processes:
      if p.poll() is None:
        p.kill()
        p.wait()

  def text(self, i: int) -> str:
    with open(self.logs[i]) as f:
      return f.read()

  def trainer_pid(self, i: int) -> int:
    """The training process of worker i (the child of its watchdog)."""
    found = re.search(r"training process pid (\d+)", self.text(i))
    assert found, self.text(i)[-2000:]
    return int(found.group(1))

  def result(self, i: int = 0) -> dict:
    """The JSON summary the process printed last."""
    text = self.text(i)
    return json.JSONDecoder().raw_decode(text[text.rindex("\n{") + 1:])[0]

  def check_ok(self, codes):
    assert codes == [0] * len(codes), "\n\n".join(
        f"worker {i} exited {code}: {self.failure(i)}" for i, code in enumerate(codes))

  def failure(self, i: int) -> str:
    """The end of a worker's log from its last traceback (the error first, as CI output
    may be cut), else its last lines."""
    text = self.text(i)
    start = text.rfind("Traceback (most recent call last)")
    if start < 0:
      return text[-3000:]
    traceback = text[start:]
    return traceback.strip().splitlines()[-1] + "\n" + traceback[-6000:]


def _losses(model_dir) -> dict[int, float]:
  records = [r for r in layout.read_metrics(model_dir) if "loss" in r and r["mode"] != "eval"]
  steps = [r["step"] for r in records]
  assert len(steps) == len(set(steps)), f"metrics.jsonl written more than once: {steps}"
  return {r["step"]: r["loss"] for r in records}


def _files_read(text: str) -> set:
  pipelines = re.findall(r"Input pipeline (\d+) of (\d+) reads \d+ file\(s\): (\S+)", text)
  return {(int(i), int(n), paths) for i, n, paths in pipelines}


def test_ict_on_two_workers_equals_one_process_and_writes_once(repo_dir, corpus, tmp_path):
  steps = 8
  single_dir, multi_dir = str(tmp_path / "single"), str(tmp_path / "multi")
  settings = [f"trainer.train_steps={steps}"]
  # The one-process reference and the two-worker job run side by side (independent
  # directories; the reference only supplies the expected losses), so this test waits for
  # one start-up and one trace instead of two in a row.
  single = Job(repo_dir, single_dir, "ict", corpus, settings, workers=1)
  try:
    job = Job(repo_dir, multi_dir, "ict", corpus, settings)
    codes = job.wait()  # kills what is left of its processes in any case
    single.check_ok(single.wait())
  finally:
    single.kill()
  job.check_ok(codes)

  # Every step's loss equals the single process's (same global batch of 4, 2 per worker).
  want, got = _losses(single_dir), _losses(multi_dir)
  assert sorted(got) == list(range(1, steps + 1))
  for step in want:
    assert got[step] == pytest.approx(want[step], rel=2e-3, abs=1e-5), step

  # Disjoint shares of the input files, covering them all.
  shares = [_files_read(job.text(i)) for i in range(2)]
  assert shares[0] == {(0, 2, os.path.join(corpus, "ict-00000-of-00002.tfrecord"))}
  assert shares[1] == {(1, 2, os.path.join(corpus, "ict-00001-of-00002.tfrecord"))}

  # Host-side files once, by the chief (worker 0).
  assert "chief (writes host-side files)" in job.text(0) and "non-chief" in job.text(1)
  with tf.io.gfile.GFile(layout.training_done_path(multi_dir)) as f:
    assert json.load(f)["pid"] == job.trainer_pid(0)  # the watchdog's child
  assert len(glob.glob(os.path.join(multi_dir, "train", "events.out.tfevents.*"))) == 1
  encoders = versioned.list_versions(layout.block_encoder_dir(multi_dir))
  assert [v.version for v in encoders] == [steps]
  assert "ICT at step 8: retriever exported" in job.text(0)
  assert "retriever exported" not in job.text(1)
  # The non-chief checkpoints into a directory of its own; the chief's hold every step.
  assert glob.glob(os.path.join(job.temp_dirs[1], "realm-worker-ckpt-*", "ckpt-*.index"))
  assert not glob.glob(os.path.join(job.temp_dirs[0], "realm-worker-ckpt-*"))
  assert "Non-chief worker: checkpoints are saved to" in job.text(1)
  assert layout.checkpoint_step(multi_dir) == steps

  # The chief's checkpoints restore in one process, which goes on from step 8.
  resumed = Job(repo_dir, multi_dir, "ict", corpus, [f"trainer.train_steps={steps + 2}"],
                workers=1, tag="resumed")
  resumed.check_ok(resumed.wait())
  assert resumed.result()["start_step"] == steps
  assert resumed.result()["step"] == steps + 2


def test_pretrain_on_two_workers_refreshes_the_index_together(repo_dir, corpus, tmp_path):
  """The child index builder and at least two refreshes; max_staleness_steps makes the
  trainer wait for each new index, so the refreshes happen at known steps."""
  model_dir = str(tmp_path / "realm")
  job = Job(repo_dir, model_dir, "pretrain", corpus, [
      "trainer.train_steps=15", "task.pretrain.start_index_builder=true",
      "task.pretrain.refresh_every_steps=5", "index.max_staleness_steps=5",
      "index.first_index_timeout_seconds=300"])
  job.check_ok(job.wait())
  chief, other = job.text(0), job.text(1)

  result = job.result(0)
  assert result["index_refreshes"] >= 2, result
  # Both workers swapped in the same versions, in the same order.
  swapped = [re.findall(r"Knowledge index: version (\d+) .* swapped in", t) for t in (chief, other)]
  assert swapped[0] == swapped[1] and len(swapped[0]) >= 3, swapped
  # One builder, one export per snapshot, both by the chief.
  assert chief.count("Index builder started") == 1 and "Index builder started" not in other
  exported = re.findall(r"Snapshot of step (\d+) exported", chief)
  assert exported and len(exported) == len(set(exported))
  assert "Snapshot of step" not in other
  for root in (layout.block_encoder_dir(model_dir), layout.query_encoder_dir(model_dir)):
    committed = {v.path.rstrip("/") for v in versioned.list_versions(root)}
    data_dirs = {p.rstrip("/") for p in glob.glob(os.path.join(root, "0*"))
                 if not p.endswith(".json")}
    assert data_dirs == committed, "an export was written twice (one copy uncommitted)"
  steps = sorted(_losses(model_dir))
  assert steps == list(range(1, 16))
  with tf.io.gfile.GFile(layout.training_done_path(model_dir)) as f:
    assert json.load(f)["pid"] == job.trainer_pid(0)  # the watchdog's child


def _wait_for(predicate, timeout: float, what: str, interval: float = 0.5):
  deadline = time.time() + timeout
  while not predicate():
    if time.time() > deadline:
      raise AssertionError(f"timed out waiting for {what}")
    time.sleep(interval)


def _train_records(model_dir) -> list:
  """metrics.jsonl's train lines, in order (a relaunched run appends the steps it redoes)."""
  if not os.path.exists(layout.metrics_path(model_dir)):
    return []
  return [r for r in layout.read_metrics(model_dir) if "loss" in r and r["mode"] != "eval"]


def _stop_line(text: str) -> str:
  lines = [line for line in text.splitlines() if line.startswith("training stopped")]
  assert len(lines) == 1, text[-3000:]
  return lines[0]


def _past_a_checkpoint(model_dir, interval):
  def check():
    try:
      records = _train_records(model_dir)
    except ValueError:  # a line being written
      return False
    checkpoint = layout.checkpoint_step(model_dir)
    return (checkpoint >= interval and records
            and checkpoint + 2 <= records[-1]["step"] <= checkpoint + interval - 1)
  return check


def _ended_by_the_watchdogs(job, started, culprit):
  """Both processes exit 1 within the stall limit + 30 s (+ the watchdogs' linger) of the
  culprit stopping, each with one line naming `culprit` (one of them, if a tuple of the
  verdict's readings); every trainer is gone and each process's stacks are saved."""
  culprits = (culprit,) if isinstance(culprit, str) else culprit
  deadline = started + STALL + 30 + 2 * watchdog.QUERY_SECONDS + 5
  try:
    codes = [p.wait(max(1.0, deadline - time.time())) for p in job.processes]
  except subprocess.TimeoutExpired:
    raise AssertionError("the job did not end: " + "\n\n".join(
        job.text(i)[-3000:] for i in range(2))) from None
  finally:
    job.kill()
  assert codes == [1, 1], [job.text(i)[-2000:] for i in range(2)]
  for i in range(2):
    line = _stop_line(job.text(i))
    assert f"the job made no progress for {STALL:.0f}s (runtime.progress_stall_seconds)" \
        in line, line
    assert any(c in line for c in culprits), line
    assert "Relaunch every process with the same command" in line, line
    stacks = line.split("Every thread's stack of this process: ")[1].split(". Relaunch")[0]
    with open(stacks) as f:
      assert "most recent call first" in f.read()  # faulthandler's dump of the trainer
    pid = job.trainer_pid(i)
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().rsplit(
        ")", 1)[1].split()[0] == "Z", f"worker {i}'s trainer still runs"


@pytest.mark.fault
def test_a_stopped_worker_ends_the_job_with_one_line_naming_it(repo_dir, corpus, tmp_path):
  """Worker 1's training process stopped (SIGSTOP) a few steps past a checkpoint: nothing
  raises in TensorFlow (its timeouts are set far beyond), and the watchdogs end the job,
  each naming worker 1 as stopped."""
  model_dir = str(tmp_path / "ict")
  job = Job(repo_dir, model_dir, "ict", corpus, ["trainer.train_steps=2000",
                                                 "trainer.checkpoint_interval=5",
                                                 *STALL_SETTINGS])
  try:
    _wait_for(_past_a_checkpoint(model_dir, 5), RUN_TIMEOUT, "steps past a checkpoint",
              interval=0.1)
    os.kill(job.trainer_pid(1), signal.SIGSTOP)
  except BaseException:
    job.kill()
    raise
  _ended_by_the_watchdogs(job, time.time(), f"worker:1 ({job.addresses[1]}) is stopped "
                                            "(SIGSTOP, a debugger or a frozen VM)")


@pytest.mark.fault
def test_a_worker_starved_by_its_input_ends_the_job_with_one_line_naming_it(
    repo_dir, corpus, tmp_path):
  """Worker 1's input file replaced by a FIFO nobody writes: its next epoch's open never
  returns, the process stays alive (heartbeating, or not when it waits holding the GIL),
  and the watchdogs name it as stuck in its input pipeline (it delivered fewer batches
  than worker 0, which waits in the collective holding its next one)."""
  small = tmp_path / "corpus"
  shutil.copytree(corpus, small)
  for path in glob.glob(str(small / "ict-*")):  # 2 steps an epoch: a stall soon after
    records = [r.numpy() for r in tf.data.TFRecordDataset(path)][:4]
    with tf.io.TFRecordWriter(path) as w:
      for record in records:
        w.write(record)
  starved = str(small / "ict-00001-of-00002.tfrecord")
  model_dir = str(tmp_path / "ict")
  # The files were cut short by hand above, so they no longer match the corpus's manifest:
  # read as files made by another tool.
  job = Job(repo_dir, model_dir, "ict", str(small), ["trainer.train_steps=2000",
                                                     "trainer.checkpoint_interval=5",
                                                     "task.ict.train_data.unpublished_input"
                                                     "=true", *STALL_SETTINGS])
  try:
    _wait_for(_past_a_checkpoint(model_dir, 5), RUN_TIMEOUT, "steps past a checkpoint",
              interval=0.1)
    # Made beside it and renamed over it: between a remove and a mkfifo the worker could
    # find no file at all and fail (NotFoundError, its connections closed, TensorFlow's
    # line instead of the verdict: seen in the stall rounds).
    fifo = str(small / "starved-fifo.tmp")
    os.mkfifo(fifo)
    os.replace(fifo, starved)
    started = time.time()
  except BaseException:
    job.kill()
    raise
  # Waiting on the FIFO, it heartbeats, or not when it waits holding the GIL: either way
  # named with fewer batches delivered than worker 0.
  who = f"worker:1 ({job.addresses[1]}) is "
  _ended_by_the_watchdogs(job, started, (who + "stuck in its input pipeline (alive;",
                                         who + "not responding (its Python interpreter is "
                                         "blocked; "))


@pytest.mark.fault
def test_a_killed_worker_stops_the_job_and_a_relaunch_resumes(repo_dir, corpus, tmp_path):
  """1. Worker 1 killed (SIGKILL of its watchdog; the kernel ends its trainer with it) a few
  steps past a checkpoint: worker 0's TensorFlow raises, and it exits non-zero within
  KILL_TIMEOUT with one line naming worker 1 and its address.
  2. Both relaunched to a stop step: the job resumes from the chief's checkpoint, the steps
  the failed run had taken past it have the same losses again, and the retriever is
  exported once, at the stop step (the failed run published none)."""
  model_dir = str(tmp_path / "ict")
  settings = ["trainer.train_steps=2000", "trainer.checkpoint_interval=10"]
  job = Job(repo_dir, model_dir, "ict", corpus, settings)
  try:
    _wait_for(_past_a_checkpoint(model_dir, 10), RUN_TIMEOUT, "steps past a checkpoint",
              interval=0.1)
    trainer = job.trainer_pid(1)
    job.processes[1].send_signal(signal.SIGKILL)
    killed_at = time.time()
    code = job.processes[0].wait(KILL_TIMEOUT)
    stopped_after = time.time() - killed_at
  finally:
    job.kill()
  assert code != 0
  line = _stop_line(job.text(0))
  assert "another process of the job is unreachable" in line, line
  assert f"worker:1 ({job.addresses[1]}) lost" in line, line
  assert "Relaunch every process with the same command" in line
  assert stopped_after < KILL_TIMEOUT
  assert not os.path.exists(f"/proc/{trainer}") or open(f"/proc/{trainer}/stat").read(
  ).rsplit(")", 1)[1].split()[0] == "Z", "the killed watchdog's trainer lives on"
  checkpoint = layout.checkpoint_step(model_dir)
  before = _train_records(model_dir)
  past = {r["step"]: r["loss"] for r in before if r["step"] > checkpoint}
  assert past, (checkpoint, [r["step"] for r in before])
  assert "retriever exported" not in job.text(0)
  assert versioned.list_versions(layout.query_encoder_dir(model_dir)) == []

  stop = max(past) + 1
  resumed = Job(repo_dir, model_dir, "ict", corpus, settings, stop_at_step=stop,
                tag="resumed")
  resumed.check_ok(resumed.wait())
  for i in range(2):
    assert resumed.result(i)["start_step"] == checkpoint
    assert resumed.result(i)["step"] == stop
  assert "restored from the chief's" in resumed.text(1)
  again = _train_records(model_dir)[len(before):]
  assert again[0]["step"] == checkpoint + 1, again[:2]
  redone = {r["step"]: r["loss"] for r in again if r["step"] in past}
  assert sorted(redone) == sorted(past)
  for step, loss in past.items():
    assert redone[step] == pytest.approx(loss, rel=1e-5, abs=1e-6), step
  assert [v.version for v in versioned.list_versions(
      layout.query_encoder_dir(model_dir))] == [stop]
