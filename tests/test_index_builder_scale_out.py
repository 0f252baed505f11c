"""Several index builders on one model_dir (as on several machines): each retriever snapshot
is built once, by whichever builder claimed it, and every index version is published once.

  claims       generations created-if-absent (realm_tf.io.versioned.Claim): a live claim
               stands, a released or expired one (or one whose process is gone from this
               host) is superseded by the next generation, of two threads taking over one
               stale claim exactly one wins, a holder presumed dead learns it was taken
               over, and garbage collection drops the claims of versions it no longer keeps
  processes    two real `python -m beam.index_builder` on one model_dir, each with its
               own host name (as on two machines); snapshots published one after another
               (the second while the first is being built): each built exactly once, the
               two builders at the same time, every index verifies; a builder SIGKILLed
               mid-build: the other takes its snapshot over once the claim expires; the
               same two builders with claims switched off both embed a snapshot (the
               claim is what prevents it) and still publish one version
"""
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from realm_tf.corpus import published, schema
from realm_tf.io import layout, storage, versioned
from realm_tf.retrieval import encoders
from tests.test_storage_publishers import _HashEncoder

TIMEOUT = 180.0  # seconds a builder may take for what a test waits for (a loaded machine)
WAIT_SECONDS = 60.0  # for a state of a claim in this process (a loaded machine)


@pytest.fixture(params=["local", "ram"])
def root(request, tmp_path):
  if request.param == "local":
    yield str(tmp_path / "index")
  else:
    path = f"ram://claims-{uuid.uuid4().hex}/index"
    yield path
    storage.delete_prefix(path)


def _generations(root: str, version: int) -> list:
  return [c["generation"] for c in versioned.list_claims(root, version)]


# ------------------------------------------------------------------------------- claims


def test_a_live_claim_stands_and_a_released_one_is_superseded(root):
  first = versioned.Claim(root, 10, holder="builder a")
  assert first.acquire() and first.generation == 0
  second = versioned.Claim(root, 10, holder="builder b")
  assert not second.acquire()
  assert second.current["holder"] == "builder a" and second.current["pid"] == os.getpid()
  assert "builder a" in versioned.describe_claim(second.current)
  # Another version is another claim.
  other = versioned.Claim(root, 20, holder="builder b")
  assert other.acquire()
  other.release()
  first.release(outcome="committed", index="somewhere")
  [released] = versioned.list_claims(root, 10)
  assert released["outcome"] == "committed" and "released_at" in released
  assert not versioned.claim_is_live(released)
  # Released: the next claimer creates the next generation, saying what it follows.
  assert second.acquire() and second.generation == 1
  assert second.record["after"] == dict(generation=0, why="released",
                                        holder=versioned.describe_claim(released))
  second.release()
  assert _generations(root, 10) == [0, 1]


def _wait_for_claim(root: str, version: int, condition, what: str) -> dict:
  """The claim object as read once `condition(claim)` holds; fails after WAIT_SECONDS."""
  end = time.monotonic() + WAIT_SECONDS
  while time.monotonic() < end:
    claim = versioned.current_claim(root, version)
    if condition(claim):
      return claim
    time.sleep(0.02)
  raise AssertionError(f"timed out after {WAIT_SECONDS:.0f} s waiting for {what}; the claim "
                       f"is {versioned.current_claim(root, version)}")


def test_a_held_claim_is_kept_alive_and_a_dead_holders_claim_expires(root):
  ttl = 0.6
  holder = versioned.Claim(root, 5, holder="alive", ttl_seconds=ttl)
  assert holder.acquire()
  lapses_at = holder.record["expires_at"]  # when the claim would lapse without refreshes
  # The keep-alive rewrites expires_at (its write time + ttl) every ttl/3: seen rewritten 3
  # times, the last time after the moment the claim would have lapsed. Waited for in the
  # claim object itself, whatever the refreshes' timing on a loaded machine.
  expiries = [lapses_at]

  def refreshed_past_its_first_expiry(claim):
    if claim["expires_at"] != expiries[-1]:
      expiries.append(claim["expires_at"])
    return len(expiries) > 3 and claim["expires_at"] - ttl > lapses_at

  refreshed = _wait_for_claim(root, 5, refreshed_past_its_first_expiry,
                              "3 refreshes of the claim, one after its first expiry")
  assert expiries == sorted(expiries)  # each refresh moves the expiry later
  assert refreshed["generation"] == 0 and refreshed["claimer"] == holder.claimer
  # A claimer judging it when it would have lapsed unrefreshed finds it held.
  assert versioned.superseded_because(refreshed, now=lapses_at) is None
  # The holder hangs (or dies): nothing refreshes the claim, and it lapses.
  holder._keep_alive.stop()  # pylint: disable=protected-access
  _wait_for_claim(root, 5, lambda claim: not versioned.claim_is_live(claim),
                  "the unrefreshed claim to lapse")
  successor = versioned.Claim(root, 5, holder="successor", ttl_seconds=60)
  assert successor.acquire() and successor.generation == 1
  assert successor.record["after"]["why"] == "expired"
  # The old holder learns it was presumed dead, and never marks the new claim released.
  assert holder.refresh() is False and holder.taken_over["holder"] == "successor"
  holder.release(outcome="committed")
  assert versioned.claim_is_live(versioned.current_claim(root, 5))
  successor.release()


def test_a_claim_whose_process_is_gone_from_this_host_is_superseded_at_once(root):
  """A builder restarted on the machine where one died need not wait out the TTL; a
  claim made on another host is judged by its expiry alone."""
  gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  dead_pid = int(gone.stdout)  # exited and reaped: no such process any more
  for host, version in (("elsewhere", 1), (socket.gethostname(), 2)):
    record = dict(version=version, generation=0, holder="killed builder", host=host,
                  pid=dead_pid, claimer="x", claimed_at=time.time(),
                  expires_at=time.time() + 3600)
    assert storage.create_if_absent(versioned.claim_path(root, version, 0),
                                    json.dumps(record).encode())
  elsewhere = versioned.Claim(root, 1, holder="restarted")
  assert not elsewhere.acquire() and elsewhere.current["pid"] == dead_pid
  here = versioned.Claim(root, 2, holder="restarted")
  assert here.acquire() and here.generation == 1
  assert here.record["after"]["why"] == "holder gone"
  here.release()


class _MeetingStore(storage.GFileStorage):
  """Holds every claim creation at a barrier: all racers have judged the claim before
  any of them creates the next generation (the window a takeover must survive)."""

  def __init__(self, barrier: threading.Barrier):
    self.barrier = barrier

  def create_if_absent(self, path: str, data: bytes) -> bool:
    if f"/{versioned.CLAIMS}/" in path:
      self.barrier.wait(timeout=30)
    return super().create_if_absent(path, data)


def test_two_threads_taking_over_one_stale_claim_exactly_one_wins(tmp_path):
  """Both see generation 0 expired and both create generation 1: create-if-absent lets
  exactly one of them hold it (local disk: link(2)), every round."""
  root = str(tmp_path / "index")
  for version in range(20):
    dead = dict(version=version, generation=0, holder="dead builder", host="gone", pid=1,
                claimer="x", claimed_at=0.0, expires_at=1.0)
    assert storage.create_if_absent(versioned.claim_path(root, version, 0),
                                    json.dumps(dead).encode())
    store = _MeetingStore(threading.Barrier(2))
    claims = [versioned.Claim(root, version, holder=f"thread {i}", store=store)
              for i in range(2)]
    won = [None, None]
    threads = [threading.Thread(target=lambda i=i: won.__setitem__(i, claims[i].acquire()))
               for i in range(2)]
    for thread in threads:
      thread.start()
    for thread in threads:
      thread.join(60)
    assert sorted(won) == [False, True], (version, won)
    winner, loser = (claims[0], claims[1]) if won[0] else (claims[1], claims[0])
    assert winner.generation == 1 and winner.record["after"]["why"] == "expired"
    assert loser.current["claimer"] == winner.claimer and loser.current["generation"] == 1
    assert _generations(root, version) == [0, 1]
    winner.release()


def test_garbage_collection_drops_claims_of_versions_it_no_longer_keeps(tmp_path):
  root = str(tmp_path / "index")
  for version in (1, 2, 3, 4):
    claim = versioned.Claim(root, version, holder="builder")
    assert claim.acquire()
    writer = versioned.VersionWriter(root, version)
    storage.write_bytes_atomic(os.path.join(writer.path, "data.bin"), b"v%d" % version)
    writer.commit()
    claim.release(outcome="committed")
  building_old = versioned.Claim(root, 0, holder="slow builder")  # still at work on 0
  assert building_old.acquire()
  abandoned = versioned.Claim(root, 3, holder="failed builder")
  assert abandoned.acquire()
  abandoned.release(outcome="failed")
  versioned.garbage_collect(root, keep=2)
  assert [v.version for v in versioned.list_versions(root)] == [3, 4]
  # Below version 3 only the live claim stays; kept versions keep their record.
  assert [(c["version"], c["generation"]) for c in versioned.list_claims(root)] == [
      (0, 0), (3, 0), (3, 1), (4, 0)]
  building_old.release()


# ---------------------------------------------------------------------------- processes


@pytest.fixture
def model_dir(tmp_path, repo_dir):
  """A run's model_dir (tiny config's params.yaml, no snapshot yet) and a 20-block corpus."""
  blocks = tmp_path / "corpus"
  published.publish_records(str(blocks), dict(blocks=([
      dict(block_id=100 + i, doc_uid=f"d{i}", title=f"T{i}", text=f"text {i}")
      for i in range(20)], schema.BLOCK)), num_shards=2)
  run = tmp_path / "run"
  run.mkdir()
  params = (repo_dir / "configs" / "tiny.yaml").read_text()
  # Every version the test publishes is kept, to be counted.
  params = params.replace("\nindex:\n", "\nindex:\n  keep_versions: 10\n", 1)
  assert "keep_versions: 10" in params
  storage.write_text_atomic(layout.params_path(str(run)), params)
  return str(run), str(blocks)


# `python -m beam.index_builder ARGS` as if on its own machine: HOST stands for the host
# name (two builders here are two machines, so neither can see the other's processes);
# "no-claims" switches the claims off (every builder believes it holds every claim), only
# to show what they prevent.
_ON_HOST = """
import runpy, socket, sys
from realm_tf.io import versioned
from realm_tf.pipelines import index_builder
host, claims = sys.argv[1:3]
socket.gethostname = lambda: host
if claims == "no-claims":
  def no_claim(index_dir, version, ttl_seconds):
    return True, versioned.Claim(index_dir, version, index_builder.builder_name(), ttl_seconds)
  index_builder.claim_snapshot = no_claim
sys.argv = ["beam.index_builder", *sys.argv[3:]]
runpy.run_module("beam.index_builder", run_name="__main__", alter_sys=True)
"""


class _Builders:
  """Two builder processes on one model_dir, as on two machines, each logging to its own
  file."""

  def __init__(self, tmp_path, repo_dir, model_dir: str, blocks: str, claims: bool = True,
               claim_ttl_seconds: float = 600.0):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(repo_dir),
               PYTHONUNBUFFERED="1")
    self.logs = [str(tmp_path / f"builder{i}.log") for i in range(2)]
    self.processes = []
    self.killed = set()
    for machine, log in enumerate(self.logs):
      with open(log, "w") as out:
        self.processes.append(subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, "-c", _ON_HOST, f"machine-{machine}",
             "claims" if claims else "no-claims", "--model_dir", model_dir, "--blocks", blocks,
             "--num_shards", "2", "--poll_seconds", "0.2",
             "--claim_ttl_seconds", str(claim_ttl_seconds)],
            cwd=str(repo_dir), env=env, stdout=out, stderr=subprocess.STDOUT))

  def texts(self) -> list:
    texts = []
    for log in self.logs:
      with open(log, errors="replace") as f:
        texts.append(f.read())
    return texts

  def wait_for(self, condition, what: str, timeout: float = TIMEOUT):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
      if condition():
        return
      for process, text in zip(self.processes, self.texts()):
        if process.poll() is not None and process.pid not in self.killed:
          raise AssertionError(f"a builder exited ({process.returncode}) before {what}; "
                               f"its log ends:\n{text[-3000:]}")
      time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; logs end:\n" +
                         "\n---\n".join(t[-2000:] for t in self.texts()))

  def watching(self) -> bool:
    return all(" watching " in text for text in self.texts())

  def kill(self, pid: int) -> None:
    """SIGKILL: the builder dies mid-build, without releasing anything."""
    [process] = [p for p in self.processes if p.pid == pid]
    self.killed.add(pid)
    process.kill()
    process.wait(30)

  def finish(self, model_dir: str) -> None:
    layout.mark_training_done(model_dir, 0)
    for process, text in zip(self.processes, self.texts()):
      if process.pid not in self.killed:
        assert process.wait(TIMEOUT) == 0, text[-3000:]

  def close(self) -> None:
    for process in self.processes:
      if process.poll() is None:
        process.kill()
        process.wait(30)


@pytest.fixture
def builders(tmp_path, repo_dir):
  started = []
  yield lambda *args, **kw: started.append(_Builders(tmp_path, repo_dir, *args, **kw)) \
      or started[-1]
  for group in started:
    group.close()


def _publish(model_dir: str, step: int) -> None:
  encoders.export_encoder(_HashEncoder(scale=float(step)), layout.block_encoder_dir(model_dir),
                          step=step)


def _building(texts: list, version: int) -> int:
  """How many builds of index `version` were started, over every builder's log."""
  return sum(len(re.findall(rf"Building index {version} from", t)) for t in texts)


def _data_dirs(index_dir: str) -> list:
  return sorted(n for n in os.listdir(index_dir) if re.match(r"^\d{12}\.[0-9a-f]{32}$", n))


def test_two_builder_processes_build_each_snapshot_once(model_dir, builders):
  """Snapshots 10 and 20 overlap (20 appears while 10 is being built), 30 is raced for by
  two idle builders, and 40's builder is killed mid-build: the other takes 40 over once
  the dead one's claim expires (claims live 5 s here, refreshed every 5/3 s)."""
  run, blocks = model_dir
  index_dir = layout.index_dir(run)
  group = builders(run, blocks, claim_ttl_seconds=5)
  group.wait_for(group.watching, "both builders to watch the model_dir")

  # Snapshot 10; while it is being built, snapshot 20: the idle builder takes it.
  _publish(run, 10)
  group.wait_for(lambda: versioned.current_claim(index_dir, 10), "a claim on snapshot 10")
  _publish(run, 20)
  group.wait_for(lambda: {v.version for v in versioned.list_versions(index_dir)} >= {10, 20},
                 "indexes 10 and 20")
  # Snapshot 30, with both builders idle: they race for its claim.
  _publish(run, 30)
  group.wait_for(lambda: versioned.latest_version(index_dir).version == 30, "index 30")
  # Snapshot 40: its builder dies holding the claim.
  _publish(run, 40)
  group.wait_for(lambda: versioned.current_claim(index_dir, 40), "a claim on snapshot 40")
  dead = versioned.current_claim(index_dir, 40)
  group.kill(dead["pid"])
  group.wait_for(lambda: versioned.latest_version(index_dir).version == 40, "index 40")
  group.finish(run)

  texts = group.texts()
  versions = versioned.list_versions(index_dir)
  assert [v.version for v in versions] == [10, 20, 30, 40]
  claims = versioned.list_claims(index_dir)
  assert [(c["version"], c["generation"]) for c in claims] == [
      (10, 0), (20, 0), (30, 0), (40, 0), (40, 1)]
  for version, claim in zip(versions, claims[:3] + claims[4:]):
    versioned.verify_version(version, checksums=True)
    assert version.manifest["num_blocks"] == 20
    # The claim's holder built it, and says so in the manifest and its log.
    assert claim["outcome"] == "committed" and claim["index"] == version.path
    assert version.manifest["builder"] == claim["holder"]
    owner = next(t for t in texts if f"Index {version.version} built by {claim['holder']}" in t)
    assert f"Building index {version.version} from" in owner
  # Each snapshot built once at a time: 10, 20, 30 once; 40 by the other builder only
  # after its first builder died (killed as it claimed it: before or just after it said
  # "Building"), its claim never released, taking the claim over.
  assert [_building(texts, v) for v in (10, 20, 30)] == [1, 1, 1]
  dead_log, = [t for t in texts if f":{dead['pid']} watching" in t]
  survivor_log, = [t for t in texts if t is not dead_log]
  assert _building([dead_log], 40) <= 1 and _building([survivor_log], 40) == 1
  killed, taken_over = claims[3], claims[4]
  assert "released_at" not in killed and killed["pid"] == dead["pid"]
  assert taken_over["pid"] != dead["pid"] and taken_over["after"]["why"] == "expired"
  assert taken_over["claimed_at"] >= killed["expires_at"]
  assert any(re.search(r"Took over the claim on version 40 .*machine-\d.*\(expired\)", t)
             for t in texts)
  # No version committed twice, no copy left beside the committed ones except what the
  # killed build had written (unreferenced, for garbage collection).
  committed = {os.path.basename(v.path) for v in versions}
  assert committed <= set(_data_dirs(index_dir))
  assert all(d.startswith("000000000040.") for d in set(_data_dirs(index_dir)) - committed)
  # Both builders worked, and 20 was claimed while 10 was still being built.
  assert len({v.manifest["builder"] for v in versions[:2]}) == 2
  assert claims[1]["claimed_at"] < versions[0].manifest["committed_at"]
  # A builder that lost a claim said whose work it waited for.
  assert any(re.search(r"Snapshot \d+ is being built by index builder", t) for t in texts)
  assert "Traceback" not in survivor_log


def test_without_claims_both_builders_embed_one_snapshot(model_dir, builders):
  """What the claim prevents, shown by switching it off: both builders embed snapshot 10.
  The commit still publishes one version; the second build's copy is dropped."""
  run, blocks = model_dir
  index_dir = layout.index_dir(run)
  group = builders(run, blocks, claims=False)
  group.wait_for(group.watching, "both builders to watch the model_dir")
  _publish(run, 10)
  group.wait_for(lambda: versioned.list_versions(index_dir), "index 10")
  group.finish(run)  # a builder still embedding finishes its build first
  texts = group.texts()
  assert _building(texts, 10) == 2  # the duplicate work a claim prevents
  assert len(re.findall(r"Index 10 was committed first by .*duplicate work", "".join(texts))) == 1
  [version] = versioned.list_versions(index_dir)
  versioned.verify_version(version, checksums=True)
  assert _data_dirs(index_dir) == [os.path.basename(version.path)]
  assert versioned.list_claims(index_dir) == []
