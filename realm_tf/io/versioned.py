"""Versioned directories on any file system, committed by one object written last.

  <root>/
    000000001200.manifest.json        the commit: names its data directory, lists every
                                      file with size and CRC32C; written last, once
    000000001200.5f3a…/               the data (a SavedModel, index shards, ...)
    000000001300.9c1e…/               being written, or left by a crashed writer: no
                                      manifest names it, so no reader ever sees it
    _leases/000000001200.<id>.json    "a reader is using version 1200 until <time>"

Why no directory rename: on GCS a rename is a copy and a delete per object, so a crash
in the middle leaves a half-renamed directory. Here every writer writes into its own
fresh directory (`<version>.<writer id>/`) and then creates the manifest object with a
create-if-absent primitive (`storage.create_if_absent`: link(2) locally, an
ifGenerationMatch=0 upload on GCS). Hence:

- A crash at any point before the manifest leaves only an unreferenced directory; the
  next attempt writes a new one and commits.
- Two writers racing on one version: exactly one manifest is created. The loser reads
  the winner's manifest: identical files (same names, sizes and CRC32C) is success and
  it returns the winner's version; different files is a VersionError ("conflict").
  File systems without create-if-absent (ram://, others): check, write, read back; two
  writers whose check and write interleave exactly can both return success, and the
  last manifest written stands (the other's directory is then unreferenced).
- Readers list manifests only and can `verify_version` the files against them (sizes
  always, CRC32C on request), so truncation and corruption are reported by file name.
- `garbage_collect` deletes versions beyond the newest `keep` unless a reader holds a
  `Lease` on them, and deletes unreferenced directories only once their newest object (or
  their writer's start marker) is older than `stale_seconds`: never one being written.
  Lease expiry compares wall clocks of different machines: keep TTLs far above skew. A
  lease taken on an old version while a GC pass is deleting it can lose that race (the
  lease's holder then finds files missing and fails; verify_version names them); leases
  on versions among the newest `keep` never can.

Public API: VersionWriter, Version, list_versions, latest_version, read_version,
verify_version, delete_version, read_verified (one file, checked as it is read), Lease, garbage_collect,
write_json_atomic, read_json, verify_published,
copy_version (to hand a version to a reader with its own layout, e.g. TF Serving; the copy
carries its manifest, which verify_copy checks)
(for flat outputs such as a corpus, whose manifest.json also lists its files) (plus the older
new_tmp_dir/commit pair, now thin wrappers over VersionWriter).
"""
import dataclasses
import json
import logging
import os
import re
import threading
import time
import uuid
from typing import Dict, Iterable, List, Optional

import google_crc32c
import tensorflow as tf

from realm_tf.io import storage

MANIFEST_SUFFIX = ".manifest.json"
MANIFEST = "manifest.json"  # name of a flat (non-versioned) output's manifest
COPIED_MANIFEST = "realm_manifest.json"  # a copy_version copy's manifest (see there)
LEASES = "_leases"
WRITER_MARKER = "_WRITER.json"  # inside a data dir while it is written; not a data file
_MANIFEST_RE = re.compile(r"^(\d{12})\.manifest\.json$")
_DATA_DIR_RE = re.compile(r"^(\d{12})\.([0-9a-f]{32})$")
_CHUNK = 8 << 20


class VersionError(RuntimeError):
  """A version that cannot be committed or read as asked."""


class VersionConflictError(VersionError):
  """A different version with the same number is already committed."""


class VerificationError(VersionError):
  """Files of a committed version are missing, truncated or corrupted."""


@dataclasses.dataclass
class Version:
  version: int
  path: str  # the data directory
  manifest: dict


def version_name(version: int) -> str:
  if version < 0:
    raise ValueError(f"version must be >= 0, got {version}")
  return f"{version:012d}"


def manifest_path(root: str, version: int) -> str:
  return os.path.join(root, version_name(version) + MANIFEST_SUFFIX)


def write_json_atomic(path: str, payload: dict):
  """A small JSON object readers see whole or not at all (see storage.write_bytes_atomic)."""
  storage.write_text_atomic(path, json.dumps(payload, indent=2, sort_keys=True))


def read_json(path: str) -> dict:
  try:
    with tf.io.gfile.GFile(path) as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise VersionError(f"{path}: not valid JSON ({e})") from e


# ---------------------------------------------------------------------------- checksums

def crc32c_of_file(path: str) -> str:
  """CRC32C (hex) of a file, streamed: the checksum GCS itself keeps for objects."""
  checksum = google_crc32c.Checksum()
  with tf.io.gfile.GFile(path, "rb") as f:
    while True:
      chunk = f.read(_CHUNK)
      if not chunk:
        break
      checksum.update(chunk)
  return checksum.digest().hex()


def crc32c_of_bytes(data: bytes) -> str:
  return google_crc32c.Checksum(data).digest().hex()


def file_entries(directory: str, known: Optional[Dict[str, dict]] = None) -> List[dict]:
  """[{name, size, crc32c}] for every file under `directory` (sorted by name).

  `known` maps names to entries a writer computed while writing (it had the bytes), so
  large files need not be read back; each is still checked against the stored size.
  """
  known = known or {}
  entries = []
  for name in storage.list_files(directory):
    if name == WRITER_MARKER:
      continue
    path = os.path.join(directory, name)
    size = tf.io.gfile.stat(path).length
    entry = known.get(name)
    if entry is not None and int(entry["size"]) != size:
      raise VersionError(f"{path}: {size} bytes stored, {entry['size']} written")
    crc = entry["crc32c"] if entry is not None else crc32c_of_file(path)
    entries.append(dict(name=name, size=int(size), crc32c=crc))
  missing = sorted(set(known) - {e["name"] for e in entries})
  if missing:
    raise VersionError(f"{directory}: files written but not found: {missing}")
  return entries


def file_path(directory: str, name: str) -> str:
  """`directory`/`name` for a file name read from a manifest.

  A manifest is data from shared storage: a name that is absolute, has a scheme, or has
  an empty, '.' or '..' component could steer a reader (or copy_version's writes) outside
  the version, so it is refused with a VerificationError.
  """
  parts = str(name).replace("\\", "/").split("/")
  if (not isinstance(name, str) or name.startswith("/") or "://" in name
      or any(part in ("", ".", "..") for part in parts)):
    raise VerificationError(f"{directory}: the manifest names a file {name!r} outside "
                            "its directory; refusing it")
  return os.path.join(directory, name)


def verify_files(directory: str, entries: Iterable[dict], checksums: bool = False) -> None:
  """Raises VerificationError naming every missing, truncated or corrupted file."""
  problems = []
  for entry in entries:
    path = file_path(directory, entry["name"])
    try:
      size = tf.io.gfile.stat(path).length
    except tf.errors.NotFoundError:
      problems.append(f"{path}: missing")
      continue
    if size != int(entry["size"]):
      problems.append(f"{path}: {size} bytes, manifest says {entry['size']} (truncated "
                      "or replaced)")
    elif checksums and crc32c_of_file(path) != entry["crc32c"]:
      problems.append(f"{path}: CRC32C does not match the manifest (corrupted)")
  if problems:
    raise VerificationError("; ".join(problems))


# ------------------------------------------------------------------------------ writing

class VersionWriter:
  """Writes one version into a fresh directory, then commits it with its manifest.

      with VersionWriter(root, 1200) as writer:
        tf.saved_model.save(module, writer.path)
        version = writer.commit({"kind": "block_encoder"})

  Leaving the block without commit (or with an exception) deletes the directory; a
  crashed process leaves it for `garbage_collect`.
  """

  def __init__(self, root: str, version: int):
    self.root = root
    self.version = int(version)
    self.writer_id = uuid.uuid4().hex
    self.path = os.path.join(root, f"{version_name(self.version)}.{self.writer_id}")
    self.committed: Optional[Version] = None
    tf.io.gfile.makedirs(self.path)
    # Lets garbage_collect judge the age of this directory on file systems that keep no
    # object times (ram://) and before any data object exists.
    write_json_atomic(os.path.join(self.path, WRITER_MARKER),
                      dict(writer=self.writer_id, version=self.version,
                           started_at=time.time()))

  def commit(self, manifest: Optional[dict] = None,
             files: Optional[Iterable[dict]] = None,
             identity: Optional[str] = None) -> Version:
    """Lists and checksums the directory, then creates the manifest object (last).

    Returns the committed Version: this writer's, or an identical one committed first by
    another writer (this directory is then deleted). Raises VersionConflictError if a
    different version with this number is committed. Two versions are identical when
    their files are (names, sizes, CRC32C), or, if the publisher gives an `identity`
    (for formats whose bytes differ between equal saves, e.g. a SavedModel's random
    ids), when the identities are equal.
    """
    known = {e["name"]: e for e in files or ()}
    entries = file_entries(self.path, known)
    if not entries:
      raise VersionError(f"{self.path}: nothing to commit (no files written)")
    storage.delete_prefix(os.path.join(self.path, WRITER_MARKER))
    payload = dict(manifest or {}, version=self.version,
                   data_dir=os.path.basename(self.path), writer=self.writer_id,
                   files=entries, committed_at=time.time())
    if identity is not None:
      payload["identity"] = identity
    target = manifest_path(self.root, self.version)
    data = json.dumps(payload, indent=2, sort_keys=True).encode("utf-8")
    if storage.create_if_absent(target, data):
      self.committed = Version(self.version, self.path, payload)
      logging.info("Committed %s (%d files)", self.path, len(entries))
      return self.committed
    existing = _read_manifest(self.root, target)
    if existing is None:
      raise VersionError(f"{target}: exists but cannot be read; not overwriting it")
    if existing.manifest.get("writer") == self.writer_id:
      self.committed = existing
      return existing
    if (existing.manifest.get("identity") == identity if identity is not None else
        _same_files(existing.manifest.get("files", []), entries)):
      logging.info("Version %d of %s is already committed with identical files (%s); "
                   "dropping this copy", self.version, self.root, existing.path)
      storage.delete_prefix(self.path)
      self.committed = existing
      return existing
    storage.delete_prefix(self.path)
    raise VersionConflictError(
        f"{target}: version {self.version} is already committed with different files "
        f"(in {existing.path}); refusing to replace it. Use a new version number.")

  @classmethod
  def for_existing_dir(cls, root: str, version: int, path: str) -> "VersionWriter":
    """The writer of a directory made earlier by another process (a Beam launcher makes
    it, workers fill it, one worker commits it)."""
    match = _DATA_DIR_RE.match(os.path.basename(path.rstrip("/")))
    if not match or int(match.group(1)) != int(version):
      raise VersionError(f"{path}: not a data directory of version {version} "
                         "(create it with VersionWriter)")
    writer = cls.__new__(cls)
    writer.root, writer.version, writer.writer_id = root, int(version), match.group(2)
    writer.path, writer.committed = path.rstrip("/"), None
    return writer

  def abort(self) -> None:
    if self.committed is None:
      storage.delete_prefix(self.path)

  def __enter__(self) -> "VersionWriter":
    return self

  def __exit__(self, *exc):
    self.abort()


def _same_files(a: Iterable[dict], b: Iterable[dict]) -> bool:
  def key(entries):
    return sorted((e["name"], int(e["size"]), e["crc32c"]) for e in entries)
  return key(a) == key(b)


def new_tmp_dir(root: str, version: int) -> str:
  """Deprecated: use VersionWriter. A fresh data directory for `version`."""
  return VersionWriter(root, version).path


def commit(tmp_dir: str, root: str, version: int, manifest: dict) -> str:
  """Deprecated: use VersionWriter. Commits a directory from `new_tmp_dir`; returns the
  committed data directory (the first writer's, if an identical one won a race)."""
  return VersionWriter.for_existing_dir(root, version, tmp_dir).commit(manifest).path


# ------------------------------------------------------------------------------ reading

def _read_manifest(root: str, path: str) -> Optional[Version]:
  try:
    manifest = read_json(path)
  except (VersionError, tf.errors.OpError) as e:
    logging.warning("Skipping %s: unreadable manifest (%s)", path, e)
    return None
  data_dir = manifest.get("data_dir")
  if not isinstance(data_dir, str) or not _DATA_DIR_RE.match(data_dir):
    logging.warning("Skipping %s: it names no data directory", path)
    return None
  return Version(int(manifest["version"]), os.path.join(root, data_dir), manifest)


def list_versions(root: str) -> List[Version]:
  """Committed versions under `root`, oldest first (manifests only: never a partial one)."""
  if not storage.is_dir_like(root):
    return []
  versions = []
  for name in tf.io.gfile.listdir(root):
    if _MANIFEST_RE.match(name.rstrip("/")):
      version = _read_manifest(root, os.path.join(root, name.rstrip("/")))
      if version is not None:
        versions.append(version)
  return sorted(versions, key=lambda v: v.version)


def latest_version(root: str) -> Optional[Version]:
  versions = list_versions(root)
  return versions[-1] if versions else None


def read_version(path: str) -> Version:
  """One committed version, from its data directory, its manifest, or `<root>/<version>`.

  Raises VersionError if it is not committed (a directory no manifest names).
  """
  path = path.rstrip("/")
  root, name = os.path.split(path)
  if _MANIFEST_RE.match(name):
    target = path
  elif _DATA_DIR_RE.match(name) or re.match(r"^\d{12}$", name):
    target = manifest_path(root, int(name[:12]))
  else:
    raise VersionError(f"{path}: not a version (expected <root>/<12-digit version>[.<id>] "
                       f"or its {MANIFEST_SUFFIX})")
  if not tf.io.gfile.exists(target):
    raise VersionError(f"{path}: not a committed version (no {target})")
  version = _read_manifest(root, target)
  if version is None:
    raise VersionError(f"{target}: unreadable manifest")
  if _DATA_DIR_RE.match(name) and version.path.rstrip("/") != path:
    raise VersionError(f"{path}: not committed (version {version.version} of {root} is "
                       f"{version.path})")
  return version


def verify_published(output_dir: str, checksums: bool = False) -> dict:
  """A flat published output (a corpus: files plus `manifest.json` written last) checked
  against its manifest's file list; returns the manifest. VersionError if unpublished."""
  path = os.path.join(output_dir, MANIFEST)
  if not tf.io.gfile.exists(path):
    raise VersionError(f"{output_dir}: not published (no {MANIFEST}; a run may still be "
                       "writing it, or failed)")
  manifest = read_json(path)
  verify_files(output_dir, manifest.get("files", []), checksums)
  return manifest


def read_verified(version: Version, name: str) -> bytes:
  """One file of a committed version, checked against its manifest entry as it is read.

  Size and CRC32C are compared on the bytes the caller gets, so a reader that loads the
  file anyway (an index shard's embeddings) pays no second read for the checksum.
  Raises VerificationError naming the file.
  """
  path = file_path(version.path, name)
  entry = next((e for e in version.manifest.get("files", []) if e["name"] == name), None)
  if entry is None:
    raise VerificationError(f"{path}: not listed in the manifest of version "
                            f"{version.version}")
  try:
    data = storage.read_bytes(path)
  except tf.errors.NotFoundError:
    raise VerificationError(f"{path}: missing") from None
  if len(data) != int(entry["size"]):
    raise VerificationError(f"{path}: {len(data)} bytes, manifest says {entry['size']} "
                            "(truncated or replaced)")
  if crc32c_of_bytes(data) != entry["crc32c"]:
    raise VerificationError(f"{path}: CRC32C does not match the manifest (corrupted)")
  return data


def verify_version(version: Version, checksums: bool = False) -> Version:
  """Checks every file the manifest lists: size always, CRC32C if `checksums`.

  Raises VerificationError naming each missing, truncated or corrupted file.
  """
  verify_files(version.path, version.manifest.get("files", []), checksums)
  return version


def copy_version(version: Version, dest_dir: str,
                 last: Iterable[str] = ("saved_model.pb", "saved_model.pbtxt"),
                 manifest_dir: str = "") -> str:
  """Copies a committed version's files to `dest_dir`, the `last` files at the end.

  For consumers with their own commit convention, such as TF Serving's
  `<base_path>/<integer version>/`, which loads a version once its saved_model.pb exists:
  copying that file last makes a half-copied directory invisible to it on any file
  system. Every file is checked against the manifest's size before and after the copy.
  The manifest itself goes along as `<dest_dir>/<manifest_dir>/realm_manifest.json`
  (written before the `last` files), so whoever loads the copy can check it with
  verify_copy wherever it was copied to. Re-running after a crash completes the copy.
  Returns `dest_dir`.
  """
  entries = version.manifest.get("files", [])
  verify_files(version.path, entries)
  write_json_atomic(os.path.join(dest_dir, manifest_dir, COPIED_MANIFEST), version.manifest)
  last = set(last)
  ordered = ([e for e in entries if e["name"] not in last] +
             [e for e in entries if e["name"] in last])
  for entry in ordered:
    source = file_path(version.path, entry["name"])
    target = file_path(dest_dir, entry["name"])
    try:
      if tf.io.gfile.stat(target).length == int(entry["size"]):
        continue  # copied by an earlier, interrupted run
    except tf.errors.NotFoundError:
      pass
    tf.io.gfile.makedirs(os.path.dirname(target))
    if storage.scheme(target) == "ram" and tf.io.gfile.exists(target):
      tf.io.gfile.remove(target)  # ram:// appends on overwrite (see storage.py)
    tf.io.gfile.copy(source, target, overwrite=True)
  verify_files(dest_dir, entries)
  return dest_dir


def verify_copy(dest_dir: str, manifest_dir: str = "") -> Optional[dict]:
  """Checks a copy_version copy against the manifest it carries (sizes and CRC32C).

  Returns the manifest, or None for a directory without one (not made by copy_version);
  raises VerificationError naming each missing, truncated or corrupted file.
  """
  path = os.path.join(dest_dir, manifest_dir, COPIED_MANIFEST)
  if not tf.io.gfile.exists(path):
    return None
  manifest = read_json(path)
  verify_files(dest_dir, manifest.get("files", []), checksums=True)
  return manifest


# ------------------------------------------------------------------------------- leases

class Lease:
  """Tells garbage_collect that `version` of `root` is in use, until it expires.

      with Lease(encoder_root, snapshot.version, holder="index build"):
        ...read the snapshot...

  The lease object is rewritten every ttl/3 seconds by a daemon thread while held, and
  lapses `ttl_seconds` after the holder dies. Entering fails with VersionError if the
  version is no longer committed (it was collected before the lease was written).
  """

  def __init__(self, root: str, version: int, holder: str = "",
               ttl_seconds: float = 600.0):
    self.root, self.version, self.holder = root, int(version), holder
    self.ttl_seconds = ttl_seconds
    self.path = os.path.join(root, LEASES,
                             f"{version_name(self.version)}.{uuid.uuid4().hex}.json")
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None

  def refresh(self) -> None:
    write_json_atomic(self.path, dict(version=self.version, holder=self.holder,
                                      expires_at=time.time() + self.ttl_seconds))

  def acquire(self) -> "Lease":
    self.refresh()
    if not tf.io.gfile.exists(manifest_path(self.root, self.version)):
      self.release()
      raise VersionError(f"version {self.version} of {self.root} is no longer committed")
    self._thread = threading.Thread(target=self._keep_alive, daemon=True,
                                    name=f"lease-{self.version}")
    self._thread.start()
    return self

  def _keep_alive(self):
    while not self._stop.wait(self.ttl_seconds / 3):
      try:
        self.refresh()
      except Exception as e:  # pylint: disable=broad-except
        logging.error("Refreshing lease %s failed: %s", self.path, e)

  def release(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
      self._thread = None
    storage.delete_prefix(self.path)

  def __enter__(self) -> "Lease":
    return self.acquire()

  def __exit__(self, *exc):
    self.release()


def leased_versions(root: str, now: Optional[float] = None,
                    delete_expired: bool = False) -> set:
  """Versions of `root` with an unexpired lease (optionally deleting expired leases)."""
  now = time.time() if now is None else now
  leases_dir = os.path.join(root, LEASES)
  leased = set()
  if not storage.is_dir_like(leases_dir):
    return leased
  for name in tf.io.gfile.listdir(leases_dir):
    path = os.path.join(leases_dir, name)
    try:
      lease = read_json(path)
    except (VersionError, tf.errors.NotFoundError):
      continue  # being rewritten or released
    if float(lease.get("expires_at", 0)) > now:
      leased.add(int(lease["version"]))
    elif delete_expired:
      storage.delete_prefix(path)
  return leased


# ---------------------------------------------------------------------- garbage collection

def delete_version(root: str, version: Version) -> None:
  """Deletes a committed version of `root`: its manifest first, so readers stop listing
  it before its files disappear."""
  storage.delete_prefix(manifest_path(root, version.version))
  storage.delete_prefix(version.path)


def garbage_collect(root: str, keep: int = 3, stale_seconds: float = 6 * 3600,
                    now: Optional[float] = None) -> List[str]:
  """Deletes committed versions older than the newest `keep` that no lease protects, and
  data directories no manifest names once nothing in them is younger than
  `stale_seconds` (crashed writers; younger ones may still be written). Returns the
  deleted paths. A version's manifest goes first, so readers stop listing it before its
  files disappear.
  """
  now = time.time() if now is None else now
  deleted = []
  leased = leased_versions(root, now, delete_expired=True)
  versions = list_versions(root)
  for version in versions[:max(0, len(versions) - keep)]:
    # Leases are read again right before each deletion, which narrows (not closes) the
    # window in which a lease written after the first read is missed; Lease.acquire's
    # check that the manifest still exists covers the other order.
    if version.version in leased or version.version in leased_versions(root, now):
      logging.info("Keeping leased version %s", version.path)
      continue
    delete_version(root, version)
    deleted.append(version.path)
  if not storage.is_dir_like(root):
    return deleted
  referenced = {os.path.basename(v.path) for v in versions}
  for name in tf.io.gfile.listdir(root):
    name = name.rstrip("/")
    match = _DATA_DIR_RE.match(name)
    if not match or name in referenced or int(match.group(1)) in leased:
      continue
    path = os.path.join(root, name)
    age = now - _last_activity(path)
    if age > stale_seconds:
      storage.delete_prefix(path)
      deleted.append(path)
  return deleted


def _last_activity(data_dir: str) -> float:
  """Newest object time under `data_dir`, or its writer's start time; `now` if neither is
  known (never delete what cannot be dated)."""
  newest = storage.newest_mtime(data_dir)
  marker = os.path.join(data_dir, WRITER_MARKER)
  try:
    newest = max(newest, float(read_json(marker).get("started_at", 0)))
  except (VersionError, tf.errors.NotFoundError):
    pass
  return newest if newest > 0 else time.time()
