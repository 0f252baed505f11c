"""The commit protocol (realm_tf.io.versioned) on local disk and ram://, over tf.io.gfile
and over Beam's FileSystems.

ram:// behaves like an object store where it matters: "directories" are prefixes,
objects keep no modification time, and nothing can be created only-if-absent.
"""
import json
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest
import tensorflow as tf

from realm_tf.io import storage, versioned
from realm_tf.pipelines import filesystems


@pytest.fixture(params=["local", "ram"])
def root(request, tmp_path):
  if request.param == "local":
    return str(tmp_path / "versions")
  return f"ram://versioned-{uuid.uuid4().hex}/versions"


def _write(path: str, name: str, data: bytes):
  tf.io.gfile.makedirs(os.path.dirname(os.path.join(path, name)))
  storage.write_bytes_atomic(os.path.join(path, name), data)


def _commit(root: str, version: int, payload: bytes = b"weights", **manifest):
  writer = versioned.VersionWriter(root, version)
  _write(writer.path, "sub/data.bin", payload)
  _write(writer.path, "meta.txt", b"meta")
  return writer.commit(manifest)


def test_commit_lists_files_with_sizes_and_checksums(root):
  committed = _commit(root, 12, kind="test")
  [listed] = versioned.list_versions(root)
  assert listed.version == 12 and listed.path == committed.path
  assert listed.manifest["kind"] == "test"
  assert {f["name"]: f["size"] for f in listed.manifest["files"]} == {
      "meta.txt": 4, "sub/data.bin": 7}
  assert versioned.read_version(committed.path).path == committed.path
  assert versioned.read_version(os.path.join(root, "000000000012")).path == committed.path
  versioned.verify_version(listed, checksums=True)


def test_crash_between_files_and_manifest_leaves_nothing_readable(root, monkeypatch):
  def crash(path, data):
    raise OSError("killed before the manifest")
  with monkeypatch.context() as patch:
    patch.setattr(storage, "create_if_absent", crash)
    writer = versioned.VersionWriter(root, 5)
    _write(writer.path, "data.bin", b"complete files")
    with pytest.raises(OSError, match="killed"):
      writer.commit({})
  # The files are all there, but no reader sees a version.
  assert storage.list_files(writer.path)
  assert versioned.list_versions(root) == [] and versioned.latest_version(root) is None
  with pytest.raises(versioned.VersionError, match="not a committed version"):
    versioned.read_version(writer.path)
  # The next attempt commits (a new directory: the old one is only garbage).
  retried = _commit(root, 5, payload=b"complete files")
  assert [v.path for v in versioned.list_versions(root)] == [retried.path]
  assert retried.path != writer.path


def test_identical_recommit_is_success_and_conflicting_is_an_error(root):
  first = _commit(root, 3)
  again = _commit(root, 3)
  assert again.path == first.path  # the identical copy was dropped
  with pytest.raises(versioned.VersionConflictError, match="different files"):
    _commit(root, 3, payload=b"other weights")
  assert [v.path for v in versioned.list_versions(root)] == [first.path]
  # Losers delete their copies: one data directory, one manifest.
  names = sorted(n.rstrip("/") for n in tf.io.gfile.listdir(root))
  assert names == sorted([os.path.basename(first.path), "000000000003.manifest.json"])


def test_threads_racing_on_one_version_commit_exactly_one(tmp_path):
  root = str(tmp_path / "race")
  barrier = threading.Barrier(8)
  results, errors = [], []

  def write(i):
    writer = versioned.VersionWriter(root, 9)
    _write(writer.path, "data.bin", f"writer {i}".encode())
    barrier.wait()
    try:
      results.append(writer.commit({"writer_index": i}))
    except versioned.VersionConflictError as e:
      errors.append(e)

  threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert len(results) == 1 and len(errors) == 7
  [committed] = versioned.list_versions(root)
  assert committed.path == results[0].path
  assert versioned.read_version(committed.path).manifest["writer_index"] == (
      committed.manifest["writer_index"])


_RACER = """
import os, sys, time
from realm_tf.io import versioned
root, tag, ready = sys.argv[1], sys.argv[2], sys.argv[3]
writer = versioned.VersionWriter(root, 21)
with open(os.path.join(writer.path, "data.bin"), "w") as f:
  f.write("writer " + tag)
open(os.path.join(ready, tag), "w").close()
deadline = time.time() + 120
while len(os.listdir(ready)) < 2 and time.time() < deadline:  # both at the line
  time.sleep(0.001)
try:
  print("WON", writer.commit({"tag": tag}).path)
except versioned.VersionConflictError:
  print("LOST")
"""


def test_two_processes_racing_on_one_version_commit_exactly_one(tmp_path):
  root = str(tmp_path / "race")
  ready = tmp_path / "ready"
  ready.mkdir()
  env = dict(os.environ, PYTHONPATH=os.getcwd(), TF_CPP_MIN_LOG_LEVEL="3")
  procs = [subprocess.Popen([sys.executable, "-c", _RACER, root, tag, str(ready)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
           for tag in ("a", "b")]
  outputs = [p.communicate(timeout=180)[0].strip().splitlines()[-1] for p in procs]
  assert sorted(o.split()[0] for o in outputs) == ["LOST", "WON"], outputs
  [committed] = versioned.list_versions(root)
  assert [o.split()[1] for o in outputs if o.startswith("WON")] == [committed.path]


def test_verify_detects_truncation_and_a_flipped_byte(root):
  committed = _commit(root, 4, payload=b"0123456789")
  path = os.path.join(committed.path, "sub", "data.bin")
  storage.write_bytes_atomic(path, b"0123456789"[:6])
  with pytest.raises(versioned.VerificationError, match=r"data.bin: 6 bytes.*truncated"):
    versioned.verify_version(committed)
  storage.write_bytes_atomic(path, b"0123456788")  # same size, one byte changed
  versioned.verify_version(committed)  # sizes agree ...
  with pytest.raises(versioned.VerificationError, match=r"data.bin: CRC32C"):
    versioned.verify_version(committed, checksums=True)  # ... the checksum does not
  storage.delete_prefix(path)
  with pytest.raises(versioned.VerificationError, match=r"data.bin: missing"):
    versioned.verify_version(committed)


def test_gc_keeps_leased_and_in_progress_versions_and_deletes_unreferenced(root):
  old, leased, newest = (_commit(root, v, payload=bytes([v])) for v in (1, 2, 3))
  crashed = versioned.VersionWriter(root, 4)  # a writer that died long ago
  _write(crashed.path, "data.bin", b"partial")
  in_progress = versioned.VersionWriter(root, 5)  # a writer still at work
  _write(in_progress.path, "data.bin", b"partial")
  marker = os.path.join(crashed.path, versioned.WRITER_MARKER)
  versioned.write_json_atomic(marker, dict(json.loads(storage.read_text(marker)),
                                           started_at=time.time() - 7200))
  if storage.is_local(root):  # local disk keeps object times: make the crash's files old
    for name in storage.list_files(crashed.path):
      os.utime(os.path.join(crashed.path, name), (time.time() - 7200,) * 2)
  with versioned.Lease(root, 2, holder="index build", ttl_seconds=3600):
    deleted = versioned.garbage_collect(root, keep=1, stale_seconds=3600)
    assert sorted(deleted) == sorted([old.path, crashed.path])
    assert [v.version for v in versioned.list_versions(root)] == [2, 3]
    assert storage.list_files(leased.path) and storage.list_files(in_progress.path)
    assert not storage.is_dir_like(old.path) and not storage.is_dir_like(crashed.path)
  # Lease released: the leased version goes too; the in-progress writer still stays.
  assert versioned.garbage_collect(root, keep=1, stale_seconds=3600) == [leased.path]
  assert storage.list_files(in_progress.path)
  assert [v.path for v in versioned.list_versions(root)] == [newest.path]


def test_expired_lease_protects_nothing_and_is_removed(root):
  _commit(root, 1)
  _commit(root, 2)
  lease = versioned.Lease(root, 1, ttl_seconds=60)
  lease.refresh()  # written, holder then died (no release)
  assert versioned.leased_versions(root) == {1}
  later = time.time() + 120
  assert [os.path.basename(p)[:12] for p in versioned.garbage_collect(
      root, keep=1, now=later)] == ["000000000001"]
  assert versioned.leased_versions(root, now=later) == set()
  assert not storage.list_files(os.path.join(root, versioned.LEASES))


def test_lease_on_a_collected_version_fails(root):
  _commit(root, 1)
  _commit(root, 2)
  versioned.garbage_collect(root, keep=1)
  with pytest.raises(versioned.VersionError, match="no longer committed"):
    versioned.Lease(root, 1).acquire()


def test_a_directory_made_by_one_writer_is_committed_by_another(root):
  """A Beam launcher makes the data directory, workers fill it, one worker commits it."""
  made = versioned.VersionWriter(root, 8).path
  _write(made, "x.bin", b"x")
  path = versioned.VersionWriter.for_existing_dir(root, 8, made).commit({"k": 1}).path
  assert path == made and versioned.latest_version(root).manifest["k"] == 1
  versioned.write_json_atomic(os.path.join(root, "DONE"), {"step": 8})
  assert versioned.read_json(os.path.join(root, "DONE")) == {"step": 8}


@pytest.fixture(params=["gfile", "beam"])
def store(request):
  if request.param == "gfile":
    return storage.GFILE
  return filesystems.BEAM


def test_a_flat_output_is_published_by_its_manifest_written_last(tmp_path, store):
  output = str(tmp_path / "corpus")
  with versioned.OutputWriter(output, store=store) as writer:
    store.write_bytes_atomic(os.path.join(output, "blocks-0.tfrecord"), b"blocks")
    store.write_bytes_atomic(os.path.join(output, "sub", "ict-0.tfrecord"), b"ict!")
    with pytest.raises(versioned.VersionError, match="not published"):
      versioned.verify_published(output, store=store)
    known = [dict(name="blocks-0.tfrecord", size=6,
                  crc32c=versioned.crc32c_of_bytes(b"blocks"))]
    manifest = writer.commit({"counts": {"blocks": 1}}, files=known)
  assert manifest["counts"] == {"blocks": 1}
  assert {f["name"]: f["size"] for f in manifest["files"]} == {
      "blocks-0.tfrecord": 6, "sub/ict-0.tfrecord": 4}
  assert versioned.verify_published(output, checksums=True, store=store) == manifest
  assert sorted(store.list_files(output)) == [
      "blocks-0.tfrecord", versioned.MANIFEST, "sub/ict-0.tfrecord"]
  with pytest.raises(FileExistsError, match="already exists"):
    versioned.OutputWriter(output, store=store)
  with pytest.raises(RuntimeError, match="planted"):  # a failed run leaves nothing
    with versioned.OutputWriter(output, overwrite=True, store=store) as writer:
      assert writer.deleted == 2  # every stale object, after the old manifest
      store.write_bytes_atomic(os.path.join(output, "blocks-1.tfrecord"), b"new")
      raise RuntimeError("planted")
  assert not store.is_dir_like(output)


def test_a_written_size_that_disagrees_with_storage_is_refused(tmp_path, store):
  output = str(tmp_path / "corpus")
  with versioned.OutputWriter(output, store=store) as writer:
    store.write_bytes_atomic(os.path.join(output, "blocks-0.tfrecord"), b"blocks")
    with pytest.raises(versioned.VersionError, match="6 bytes stored, 7 written"):
      writer.commit({}, files=[dict(name="blocks-0.tfrecord", size=7, crc32c="00")])
    with pytest.raises(versioned.VersionError, match="written but not found"):
      writer.commit({}, files=[dict(name="gone.tfrecord", size=1, crc32c="00")])
  assert not store.is_dir_like(output)


def test_versions_commit_and_verify_over_beam_filesystems(tmp_path):
  root = str(tmp_path / "versions")
  writer = versioned.VersionWriter(root, 3, store=filesystems.BEAM)
  filesystems.BEAM.write_bytes_atomic(os.path.join(writer.path, "a/b.bin"), b"bytes")
  committed = writer.commit({"kind": "test"})
  # Beam and TF read the same protocol.
  [listed] = versioned.list_versions(root)
  assert listed.path == committed.path and listed.manifest["kind"] == "test"
  assert versioned.read_version(committed.path, filesystems.BEAM).path == committed.path
  versioned.verify_version(versioned.latest_version(root, filesystems.BEAM), checksums=True)
  assert versioned.read_verified(committed, "a/b.bin") == b"bytes"
