"""The commit protocol: every published output is committed by one manifest written last.

One manifest format: a JSON object whose `files` lists every file of the output with its
size and CRC32C ({name, size, crc32c}), beside what the publisher says about it. One
verifier (`verify_files`, size always, CRC32C on request). Two layouts:

Versioned outputs (encoder snapshots, index exports, tagger and serving exports):

  <root>/
    000000001200.manifest.json        the commit: names its data directory, lists every
                                      file; written last, once
    000000001200.5f3a…/               the data (a SavedModel, index shards, ...)
    000000001300.9c1e…/               being written, or left by a crashed writer: no
                                      manifest names it, so no reader ever sees it
    _leases/000000001200.<id>.json    "a reader is using version 1200 until <time>"
    _claims/000000001300.000000.json  "writer <host:pid> is producing version 1300 until
                                      <time>" (generation 0; a takeover creates .000001)

A flat output (a corpus, whose readers open its directory directly):

  <output_dir>/
    blocks-00000-of-00008.tfrecord, ...
    manifest.json                     the commit: what the output holds, every file;
                                      written last (OutputWriter)

Why no directory rename: on GCS a rename is a copy and a delete per object, so a crash
in the middle leaves a half-renamed directory. Here every writer writes into its own
fresh directory (`<version>.<writer id>/`) and then creates the manifest object with a
create-if-absent primitive (`Storage.create_if_absent`: link(2) locally, an
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
- Writers sharing `root` on several machines (index builders) avoid doing the same work
  with a `Claim` per version: generations of a claim object, each created with the same
  create-if-absent primitive, the highest one counting; an expired one (its holder died)
  is taken over by creating the next generation, so of several claimers that judged it
  stale together exactly one wins. A claim only prevents duplicate work: what is
  published is still decided by the manifest's create-if-absent alone.

Everything reads and writes through a `storage.Storage`: tf.io.gfile (`storage.GFILE`,
the default) on the trainer side, Beam's FileSystems (realm_tf.pipelines.filesystems.BEAM)
on pipeline launchers and workers.

Public API: VersionWriter, Version, list_versions, latest_version, read_version,
verify_version, delete_version, read_verified (one file, checked as it is read), Lease,
Claim (current_claim, list_claims, claim_is_live, superseded_because), garbage_collect;
OutputWriter, check_output_dir and verify_published for flat outputs; write_json_atomic,
read_json; copy_version and publish_copy (to hand a version to a reader with its own
layout, e.g. TF Serving; the copy carries its manifest, which verify_copy checks).
"""
import dataclasses
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from typing import Callable, Dict, Iterable, List, Optional

import google_crc32c

from realm_tf.io.storage import GFILE, Storage

MANIFEST_SUFFIX = ".manifest.json"
MANIFEST = "manifest.json"  # a flat output's manifest, inside its directory
COPIED_MANIFEST = "realm_manifest.json"  # a copy_version copy's manifest (see there)
LEASES = "_leases"
CLAIMS = "_claims"
WRITER_MARKER = "_WRITER.json"  # inside a data dir while it is written; not a data file
_MANIFEST_RE = re.compile(r"^(\d{12})\.manifest\.json$")
_DATA_DIR_RE = re.compile(r"^(\d{12})\.([0-9a-f]{32})$")
_CLAIM_RE = re.compile(r"^(\d{12})\.(\d{6})\.json$")
_CHUNK = 8 << 20


class VersionError(RuntimeError):
  """A version that cannot be committed or read as asked."""


class VersionConflictError(VersionError):
  """A different version with the same number is already committed."""


class VerificationError(VersionError):
  """Files of a committed version are missing, truncated or corrupted."""


@dataclasses.dataclass
class Version:
  """A committed version, as its manifest names it.

  Attributes:
    version: the version number (e.g. the training step of a snapshot).
    path: the data directory, `<root>/<12-digit version>.<writer id>`.
    manifest: the manifest's JSON: the publisher's fields plus version, data_dir, writer,
      files ([{name, size, crc32c}]) and committed_at.
    store: the Storage it was read through (and reads its files through).
  """
  version: int
  path: str  # the data directory
  manifest: dict
  store: Storage = dataclasses.field(default=GFILE, repr=False, compare=False)


def version_name(version: int) -> str:
  """The 12-digit, zero-padded name of `version` (names sort as numbers do).

  Raises:
    ValueError: `version` is negative.
  """
  if version < 0:
    raise ValueError(f"version must be >= 0, got {version}")
  return f"{version:012d}"


def manifest_path(root: str, version: int) -> str:
  """`<root>/<12-digit version>.manifest.json`, the object whose creation commits `version`."""
  return os.path.join(root, version_name(version) + MANIFEST_SUFFIX)


def _encode(payload: dict) -> bytes:
  return json.dumps(payload, indent=2, sort_keys=True).encode("utf-8")


def write_json_atomic(path: str, payload: dict, store: Storage = GFILE):
  """A small JSON object readers see whole or not at all (Storage.write_bytes_atomic).

  Args:
    path: where to write (replaced if it exists).
    payload: a JSON-serialisable dict (written with sorted keys).
    store: the Storage to write through.
  """
  store.write_bytes_atomic(path, _encode(payload))


def read_json(path: str, store: Storage = GFILE) -> dict:
  """Reads a JSON object.

  Args:
    path: the object to read.
    store: the Storage to read through.

  Returns:
    The decoded JSON.

  Raises:
    FileNotFoundError: `path` does not exist.
    VersionError: it is not valid JSON.
  """
  data = store.read_bytes(path)
  try:
    return json.loads(data.decode("utf-8"))
  except ValueError as e:
    raise VersionError(f"{path}: not valid JSON ({e})") from e


# ---------------------------------------------------------------------------- checksums

def crc32c_of_file(path: str, store: Storage = GFILE) -> str:
  """CRC32C (hex) of a file, streamed: the checksum GCS itself keeps for objects."""
  checksum = google_crc32c.Checksum()
  with store.open_read(path) as f:
    while True:
      chunk = f.read(_CHUNK)
      if not chunk:
        break
      checksum.update(chunk)
  return checksum.digest().hex()


def crc32c_of_bytes(data: bytes) -> str:
  """CRC32C of `data` as 8 hex digits (the form manifests record)."""
  return google_crc32c.Checksum(data).digest().hex()


def file_entries(directory: str, known: Optional[Dict[str, dict]] = None,
                 store: Storage = GFILE, exclude: Iterable[str] = ()) -> List[dict]:
  """[{name, size, crc32c}] for every file under `directory` (sorted by name).

  `known` maps names to entries a writer computed while writing (it had the bytes), so
  large files need not be read back; each is still checked against the stored size.
  Names in `exclude` (and a writer's marker) are not data files.

  Args:
    directory: the directory to list (recursively).
    known: name (relative to `directory`) → {size, crc32c} computed while writing.
    store: the Storage to list and read through.
    exclude: names to leave out.

  Returns:
    [{name, size, crc32c}] sorted by name, names relative to `directory`.

  Raises:
    VersionError: a known file's stored size differs from the size written, or a known
      file is not found.
  """
  known = known or {}
  skipped = {WRITER_MARKER, *exclude}
  entries = []
  for name, size in sorted(store.file_sizes(directory).items()):
    if name in skipped:
      continue
    path = os.path.join(directory, name)
    entry = known.get(name)
    if entry is not None and int(entry["size"]) != size:
      raise VersionError(f"{path}: {size} bytes stored, {entry['size']} written")
    crc = entry["crc32c"] if entry is not None else crc32c_of_file(path, store)
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


def verify_files(directory: str, entries: Iterable[dict], checksums: bool = False,
                 store: Storage = GFILE) -> None:
  """The verifier: checks a manifest's `files` against what is stored.

  Args:
    directory: the directory the names are relative to.
    entries: the manifest's [{name, size, crc32c}].
    checksums: also compare CRC32C (reads every file); sizes are always compared.
    store: the Storage to read through.

  Raises:
    VerificationError: naming every missing, truncated or corrupted file (or a name
      outside `directory`).
  """
  problems = []
  for entry in entries:
    path = file_path(directory, entry["name"])
    try:
      size = store.size(path)
    except FileNotFoundError:
      problems.append(f"{path}: missing")
      continue
    if size != int(entry["size"]):
      problems.append(f"{path}: {size} bytes, manifest says {entry['size']} (truncated "
                      "or replaced)")
    elif checksums and crc32c_of_file(path, store) != entry["crc32c"]:
      problems.append(f"{path}: CRC32C does not match the manifest (corrupted)")
  if problems:
    raise VerificationError("; ".join(problems))


def _same_files(a: Iterable[dict], b: Iterable[dict]) -> bool:
  def key(entries):
    return sorted((e["name"], int(e["size"]), e["crc32c"]) for e in entries)
  return key(a) == key(b)


# ------------------------------------------------------------------------------ writing

class VersionWriter:
  """Writes one version into a fresh directory, then commits it with its manifest.

      with VersionWriter(root, 1200) as writer:
        tf.saved_model.save(module, writer.path)
        version = writer.commit({"kind": "block_encoder"})

  Leaving the block without commit (or with an exception) deletes the directory; a
  crashed process leaves it for `garbage_collect`.
  """

  def __init__(self, root: str, version: int, store: Storage = GFILE):
    self.root = root
    self.version = int(version)
    self.store = store
    self.writer_id = uuid.uuid4().hex
    self.path = os.path.join(root, f"{version_name(self.version)}.{self.writer_id}")
    self.committed: Optional[Version] = None
    store.makedirs(self.path)
    # Lets garbage_collect judge the age of this directory on file systems that keep no
    # object times (ram://) and before any data object exists.
    write_json_atomic(os.path.join(self.path, WRITER_MARKER),
                      dict(writer=self.writer_id, version=self.version,
                           started_at=time.time()), store)

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

    Args:
      manifest: the publisher's fields (kind, encoder, ...), stored beside `files`.
      files: [{name, size, crc32c}] computed while writing (names relative to the data
        directory); other files are checksummed here.
      identity: what makes two versions of this number the same (see above).

    Returns:
      The committed Version.

    Raises:
      VersionError: nothing was written, a listed file does not match what is stored, or
        an existing manifest of this number cannot be read.
      VersionConflictError: a different version with this number is committed.
    """
    known = {e["name"]: e for e in files or ()}
    entries = file_entries(self.path, known, self.store)
    if not entries:
      raise VersionError(f"{self.path}: nothing to commit (no files written)")
    self.store.delete_prefix(os.path.join(self.path, WRITER_MARKER))
    payload = dict(manifest or {}, version=self.version,
                   data_dir=os.path.basename(self.path), writer=self.writer_id,
                   files=entries, committed_at=time.time())
    if identity is not None:
      payload["identity"] = identity
    target = manifest_path(self.root, self.version)
    if self.store.create_if_absent(target, _encode(payload)):
      self.committed = Version(self.version, self.path, payload, self.store)
      logging.info("Committed %s (%d files)", self.path, len(entries))
      return self.committed
    existing = _read_manifest(self.root, target, self.store)
    if existing is None:
      raise VersionError(f"{target}: exists but cannot be read; not overwriting it")
    if existing.manifest.get("writer") == self.writer_id:
      self.committed = existing
      return existing
    if (existing.manifest.get("identity") == identity if identity is not None else
        _same_files(existing.manifest.get("files", []), entries)):
      logging.info("Version %d of %s is already committed with identical files (%s); "
                   "dropping this copy", self.version, self.root, existing.path)
      self.store.delete_prefix(self.path)
      self.committed = existing
      return existing
    self.store.delete_prefix(self.path)
    raise VersionConflictError(
        f"{target}: version {self.version} is already committed with different files "
        f"(in {existing.path}); refusing to replace it. Use a new version number.")

  @classmethod
  def for_existing_dir(cls, root: str, version: int, path: str,
                       store: Storage = GFILE) -> "VersionWriter":
    """The writer of a directory made earlier by another process.

    A Beam launcher makes the directory (VersionWriter(...).path), workers fill it, and
    one worker commits it through this writer.

    Args:
      root: the versioned output's root.
      version: the version the directory was made for.
      path: the data directory, `<root>/<12-digit version>.<writer id>`.
      store: the Storage to write through.

    Returns:
      A VersionWriter whose commit publishes `path`.

    Raises:
      VersionError: `path` is not a data directory of `version`.
    """
    match = _DATA_DIR_RE.match(os.path.basename(path.rstrip("/")))
    if not match or int(match.group(1)) != int(version):
      raise VersionError(f"{path}: not a data directory of version {version} "
                         "(create it with VersionWriter)")
    writer = cls.__new__(cls)
    writer.root, writer.version, writer.writer_id = root, int(version), match.group(2)
    writer.path, writer.committed, writer.store = path.rstrip("/"), None, store
    return writer

  def abort(self) -> None:
    """Deletes the data directory unless this writer committed it."""
    if self.committed is None:
      self.store.delete_prefix(self.path)

  def __enter__(self) -> "VersionWriter":
    return self

  def __exit__(self, *exc):
    self.abort()


def check_output_dir(output_dir: str, overwrite: bool, store: Storage = GFILE) -> None:
  """Fails before any work is done if a flat output holds anything and may not be replaced.

  Args:
    output_dir: the flat output's directory.
    overwrite: whether existing contents may be replaced.
    store: the Storage to look through.

  Raises:
    FileExistsError: `output_dir` holds files and `overwrite` is False.
  """
  if (store.exists(output_dir) or store.is_dir_like(output_dir)) and not overwrite:
    raise FileExistsError(f"{output_dir} already exists (holds files); remove it or pass "
                          "--overwrite")


class OutputWriter:
  """Writes a flat output (a corpus) straight into `output_dir`; `manifest.json`, written
  last, publishes it.

      with OutputWriter(output_dir, overwrite, store) as writer:
        ...write files under writer.path...
        manifest = writer.commit({"counts": ...}, files=checksums_from_workers)

  Readers trust the output only through its manifest (verify_published). With
  `overwrite`, the old manifest goes first (readers stop trusting the old output), then
  every stale object, so no old shard is left beside the new ones. Leaving the block
  without commit deletes what was written (the directory was empty when it started).
  """

  def __init__(self, output_dir: str, overwrite: bool = False, store: Storage = GFILE):
    self.path = output_dir.rstrip("/")
    self.store = store
    self.committed: Optional[dict] = None
    check_output_dir(self.path, overwrite, store)
    store.delete_prefix(os.path.join(self.path, MANIFEST))
    self.deleted = store.delete_prefix(self.path)

  def commit(self, manifest: dict, files: Optional[Iterable[dict]] = None) -> dict:
    """Lists every file, then creates manifest.json: the output is published.

    Args:
      manifest: what the output holds (counts, config, ...), stored beside `files`.
      files: [{name, size, crc32c}] the writers computed while writing (checked against
        the stored sizes); other files are checksummed here.

    Returns:
      The manifest written (with `files`).

    Raises:
      VersionError: a listed file does not match what is stored.
      VersionConflictError: another run published the directory meanwhile.
    """
    known = {e["name"]: e for e in files or ()}
    payload = dict(manifest, files=file_entries(self.path, known, self.store,
                                                exclude=(MANIFEST,)))
    target = os.path.join(self.path, MANIFEST)
    if not self.store.create_if_absent(target, _encode(payload)):
      raise VersionConflictError(f"{target}: another run published {self.path} while "
                                 "this one was writing it")
    self.committed = payload
    logging.info("Published %s (%d files)", self.path, len(payload["files"]))
    return payload

  def abort(self) -> None:
    """Deletes what was written unless this writer committed it."""
    if self.committed is None:
      self.store.delete_prefix(self.path)

  def __enter__(self) -> "OutputWriter":
    return self

  def __exit__(self, *exc):
    self.abort()


# ------------------------------------------------------------------------------ reading

def _read_manifest(root: str, path: str, store: Storage) -> Optional[Version]:
  """The version a manifest names; None (skipped, logged) if it is not JSON or was
  deleted since it was listed. A store that cannot be asked raises (StorageError): an
  outage is not "no such version"."""
  try:
    manifest = read_json(path, store)
  except (VersionError, FileNotFoundError) as e:
    logging.warning("Skipping %s: unreadable manifest (%s)", path, e)
    return None
  data_dir = manifest.get("data_dir")
  if not isinstance(data_dir, str) or not _DATA_DIR_RE.match(data_dir):
    logging.warning("Skipping %s: it names no data directory", path)
    return None
  return Version(int(manifest["version"]), os.path.join(root, data_dir), manifest, store)


def list_versions(root: str, store: Storage = GFILE) -> List[Version]:
  """Committed versions under `root`, oldest first (manifests only: never a partial one).

  Args:
    root: the versioned output's root (may not exist yet).
    store: the Storage to list through.

  Returns:
    The Versions; unreadable manifests are skipped (and logged).

  Raises:
    storage.StorageError: the store could not be asked (not "no versions").
  """
  if not store.is_dir_like(root):
    return []
  versions = []
  for name in store.listdir(root):
    if _MANIFEST_RE.match(name):
      version = _read_manifest(root, os.path.join(root, name), store)
      if version is not None:
        versions.append(version)
  return sorted(versions, key=lambda v: v.version)


def latest_version(root: str, store: Storage = GFILE) -> Optional[Version]:
  """The newest committed version under `root`, or None (see list_versions)."""
  versions = list_versions(root, store)
  return versions[-1] if versions else None


def read_version(path: str, store: Storage = GFILE) -> Version:
  """One committed version, from its data directory, its manifest, or `<root>/<version>`.

  Args:
    path: `<root>/<12-digit version>`, its data directory or its manifest.
    store: the Storage to read through.

  Returns:
    The committed Version (its files not verified: see verify_version).

  Raises:
    VersionError: `path` names no version, or it is not committed (a directory no
      manifest names), or its manifest is unreadable.
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
  if not store.exists(target):
    raise VersionError(f"{path}: not a committed version (no {target})")
  version = _read_manifest(root, target, store)
  if version is None:
    raise VersionError(f"{target}: unreadable manifest")
  if _DATA_DIR_RE.match(name) and version.path.rstrip("/") != path:
    raise VersionError(f"{path}: not committed (version {version.version} of {root} is "
                       f"{version.path})")
  return version


def verify_published(output_dir: str, checksums: bool = False,
                     store: Storage = GFILE) -> dict:
  """A flat output (OutputWriter) checked against its manifest's files.

  Args:
    output_dir: the flat output's directory.
    checksums: also compare CRC32C (reads every file); sizes are always compared.
    store: the Storage to read through.

  Returns:
    The manifest.

  Raises:
    VersionError: the output is not published (no manifest.json).
    VerificationError: a listed file is missing, truncated or corrupted.
  """
  path = os.path.join(output_dir, MANIFEST)
  if not store.exists(path):
    raise VersionError(f"{output_dir}: not published (no {MANIFEST}; a run may still be "
                       "writing it, or failed)")
  manifest = read_json(path, store)
  verify_files(output_dir, manifest.get("files", []), checksums, store)
  return manifest


def read_verified(version: Version, name: str) -> bytes:
  """One file of a committed version, checked against its manifest entry as it is read.

  Size and CRC32C are compared on the bytes the caller gets, so a reader that loads the
  file anyway (an index shard's embeddings) pays no second read for the checksum.

  Args:
    version: the committed Version.
    name: the file's name in the manifest (relative to the data directory).

  Returns:
    The file's bytes.

  Raises:
    VerificationError: naming the file: not in the manifest, missing, truncated or
      corrupted.
  """
  path = file_path(version.path, name)
  entry = next((e for e in version.manifest.get("files", []) if e["name"] == name), None)
  if entry is None:
    raise VerificationError(f"{path}: not listed in the manifest of version "
                            f"{version.version}")
  try:
    data = version.store.read_bytes(path)
  except FileNotFoundError:
    raise VerificationError(f"{path}: missing") from None
  if len(data) != int(entry["size"]):
    raise VerificationError(f"{path}: {len(data)} bytes, manifest says {entry['size']} "
                            "(truncated or replaced)")
  if crc32c_of_bytes(data) != entry["crc32c"]:
    raise VerificationError(f"{path}: CRC32C does not match the manifest (corrupted)")
  return data


def verify_version(version: Version, checksums: bool = False) -> Version:
  """Checks every file the manifest lists: size always, CRC32C if `checksums`.

  Args:
    version: the committed Version.
    checksums: also compare CRC32C (reads every file).

  Returns:
    `version`, verified.

  Raises:
    VerificationError: naming each missing, truncated or corrupted file.
  """
  verify_files(version.path, version.manifest.get("files", []), checksums, version.store)
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

  Args:
    version: the committed Version to copy.
    dest_dir: where its files go (same relative names).
    last: names copied after every other file.
    manifest_dir: the subdirectory of `dest_dir` for realm_manifest.json ('' : dest_dir).

  Returns:
    `dest_dir`.

  Raises:
    VerificationError: a source file, or a copied one, does not match the manifest.
  """
  store = version.store
  entries = version.manifest.get("files", [])
  verify_files(version.path, entries, store=store)
  write_json_atomic(os.path.join(dest_dir, manifest_dir, COPIED_MANIFEST), version.manifest,
                    store)
  last = set(last)
  ordered = ([e for e in entries if e["name"] not in last] +
             [e for e in entries if e["name"] in last])
  for entry in ordered:
    source = file_path(version.path, entry["name"])
    target = file_path(dest_dir, entry["name"])
    try:
      if store.size(target) == int(entry["size"]):
        continue  # copied by an earlier, interrupted run
    except FileNotFoundError:
      pass
    store.copy(source, target)
  verify_files(dest_dir, entries, store=store)
  return dest_dir


def verify_copy(dest_dir: str, manifest_dir: str = "", store: Storage = GFILE
                ) -> Optional[dict]:
  """Checks a copy_version copy against the manifest it carries (sizes and CRC32C).

  Args:
    dest_dir: the copy's directory.
    manifest_dir: where copy_version put realm_manifest.json, relative to `dest_dir`.
    store: the Storage to read through.

  Returns:
    The manifest, or None for a directory without one (not made by copy_version).

  Raises:
    VerificationError: naming each missing, truncated or corrupted file.
  """
  path = os.path.join(dest_dir, manifest_dir, COPIED_MANIFEST)
  if not store.exists(path):
    return None
  manifest = read_json(path, store)
  verify_files(dest_dir, manifest.get("files", []), checksums=True, store=store)
  return manifest


def publish_copy(version: Version, dest_dir: str, manifest_dir: str = "") -> str:
  """Hands a committed version over to a layout with its own commit convention (TF
  Serving's `<base>/<n>/`): copy_version, then the original is deleted, since the copy
  carries its manifest. A crash before the deletion leaves the original for a re-run to
  copy again.

  Args:
    version: the committed Version to hand over.
    dest_dir: the consumer's directory for it (e.g. `<base>/<n>`).
    manifest_dir: as for copy_version.

  Returns:
    `dest_dir`.
  """
  copy_version(version, dest_dir, manifest_dir=manifest_dir)
  delete_version(os.path.dirname(version.path.rstrip("/")), version)
  return dest_dir


# ------------------------------------------------------------------------------- leases

class _KeepAlive:
  """Calls `beat` every `interval` seconds on a daemon thread until stopped, or until
  `beat` returns False: what keeps a lease or a claim from lapsing while its holder
  lives (and lets it lapse once the holder is gone)."""

  def __init__(self, interval: float, beat: Callable[[], bool], name: str):
    self.interval, self.beat = interval, beat
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True, name=name)

  def start(self) -> "_KeepAlive":
    self._thread.start()
    return self

  def _run(self):
    while not self._stop.wait(self.interval):
      try:
        if self.beat() is False:
          return
      except Exception as e:  # pylint: disable=broad-except
        logging.error("%s: refreshing failed: %s", self._thread.name, e)

  def stop(self) -> None:
    self._stop.set()
    if self._thread.is_alive() and self._thread is not threading.current_thread():
      self._thread.join()


class Lease:
  """Tells garbage_collect that `version` of `root` is in use, until it expires.

      with Lease(encoder_root, snapshot.version, holder="index build"):
        ...read the snapshot...

  The lease object is rewritten every ttl/3 seconds by a daemon thread while held, and
  lapses `ttl_seconds` after the holder dies. Entering fails with VersionError if the
  version is no longer committed (it was collected before the lease was written).

  Args:
    root: the versioned output's root.
    version: the version read.
    holder: who reads it (recorded in the lease, for people).
    ttl_seconds: how long the lease outlives its last refresh.
    store: the Storage to write through.
  """

  def __init__(self, root: str, version: int, holder: str = "",
               ttl_seconds: float = 600.0, store: Storage = GFILE):
    self.root, self.version, self.holder = root, int(version), holder
    self.ttl_seconds = ttl_seconds
    self.store = store
    self.path = os.path.join(root, LEASES,
                             f"{version_name(self.version)}.{uuid.uuid4().hex}.json")
    self._keep_alive: Optional[_KeepAlive] = None

  def refresh(self) -> None:
    """Rewrites the lease object with expires_at = now + ttl_seconds."""
    write_json_atomic(self.path, dict(version=self.version, holder=self.holder,
                                      expires_at=time.time() + self.ttl_seconds),
                      self.store)

  def acquire(self) -> "Lease":
    """Writes the lease and starts refreshing it every ttl/3 seconds.

    Returns:
      self.

    Raises:
      VersionError: the version is no longer committed (the lease is removed again).
    """
    self.refresh()
    if not self.store.exists(manifest_path(self.root, self.version)):
      self.release()
      raise VersionError(f"version {self.version} of {self.root} is no longer committed")
    self._keep_alive = _KeepAlive(self.ttl_seconds / 3, self.refresh,
                                  f"lease-{self.version}").start()
    return self

  def release(self) -> None:
    """Stops refreshing and deletes the lease object."""
    if self._keep_alive is not None:
      self._keep_alive.stop()
      self._keep_alive = None
    self.store.delete_prefix(self.path)

  def __enter__(self) -> "Lease":
    return self.acquire()

  def __exit__(self, *exc):
    self.release()


def leased_versions(root: str, now: Optional[float] = None,
                    delete_expired: bool = False, store: Storage = GFILE) -> set:
  """Versions of `root` with an unexpired lease.

  Args:
    root: the versioned output's root.
    now: the time to judge expiry at (default: the clock).
    delete_expired: also delete expired lease objects.
    store: the Storage to read through.

  Returns:
    A set of version numbers.
  """
  now = time.time() if now is None else now
  leases_dir = os.path.join(root, LEASES)
  leased = set()
  if not store.is_dir_like(leases_dir):
    return leased
  for name in store.listdir(leases_dir):
    path = os.path.join(leases_dir, name)
    try:
      lease = read_json(path, store)
    except (VersionError, FileNotFoundError):
      continue  # being rewritten or released
    if float(lease.get("expires_at", 0)) > now:
      leased.add(int(lease["version"]))
    elif delete_expired:
      store.delete_prefix(path)
  return leased


# ------------------------------------------------------------------------------- claims

def claim_path(root: str, version: int, generation: int) -> str:
  """`<root>/_claims/<12-digit version>.<6-digit generation>.json`."""
  return os.path.join(root, CLAIMS, f"{version_name(version)}.{int(generation):06d}.json")


def list_claims(root: str, version: Optional[int] = None,
                store: Storage = GFILE) -> List[dict]:
  """Every claim object under `root` (of `version` only, if given), by version then
  generation. Each is the stored record plus `version`, `generation` and `path` from its
  name; one that cannot be read is {"unreadable": True} with those three.

  Args:
    root: the versioned output's root.
    version: only this version's claims (None: all).
    store: the Storage to read through.

  Returns:
    The claim records, sorted by (version, generation).
  """
  claims_dir = os.path.join(root, CLAIMS)
  if not store.is_dir_like(claims_dir):
    return []
  claims = []
  for name in store.listdir(claims_dir):
    match = _CLAIM_RE.match(name)
    if not match or (version is not None and int(match.group(1)) != int(version)):
      continue
    path = os.path.join(claims_dir, name)
    try:
      record = read_json(path, store)
    except FileNotFoundError:
      continue  # collected while we listed
    except VersionError:
      record = dict(unreadable=True)
    claims.append(dict(record, version=int(match.group(1)),
                       generation=int(match.group(2)), path=path))
  return sorted(claims, key=lambda c: (c["version"], c["generation"]))


def current_claim(root: str, version: int, store: Storage = GFILE) -> Optional[dict]:
  """The claim that counts for `version`: its highest generation (None if never claimed)."""
  claims = list_claims(root, version, store)
  return claims[-1] if claims else None


def claim_is_live(claim: Optional[dict], now: Optional[float] = None) -> bool:
  """Whether `claim` is held: no new generation may supersede it (see superseded_because).

  Args:
    claim: a claim record (list_claims), or None (never claimed: not live).
    now: the time to judge expiry at (default: the clock).
  """
  return claim is not None and superseded_because(claim, now) is None


def superseded_because(claim: dict, now: Optional[float] = None) -> Optional[str]:
  """Why the next generation may supersede `claim`, or None while it is held:
  'released'; 'expired' (its holder stopped refreshing it); 'holder gone' (it was made on
  this host by a process that no longer exists: a builder restarted after a crash need
  not wait out the TTL); 'unreadable' (it cannot say who holds it or until when).

  Args:
    claim: a claim record (list_claims).
    now: the time to judge expiry at (default: the clock).
  """
  now = time.time() if now is None else now
  if claim.get("unreadable"):
    return "unreadable"
  if "released_at" in claim:
    return "released"
  if float(claim.get("expires_at", 0)) <= now:
    return "expired"
  if _holder_gone(claim):
    return "holder gone"
  return None


def _holder_gone(claim: dict) -> bool:
  """The claim's process ran on this host and exists no more. Only ever judged on the
  holder's own host; a reused pid makes a dead holder look alive (its claim then
  expires as usual), never the other way round."""
  if claim.get("host") != socket.gethostname():
    return False
  try:
    pid = int(claim.get("pid"))
  except (TypeError, ValueError):
    return False
  if pid <= 0 or pid == os.getpid():
    return False
  try:
    os.kill(pid, 0)  # signal 0: only asks whether the process exists
  except ProcessLookupError:
    return True
  except OSError:  # exists, owned by someone else
    return False
  return False


def describe_claim(claim: Optional[dict]) -> str:
  """'<holder> (<host> pid <pid>, generation <g>)' for log lines."""
  if claim is None:
    return "nobody"
  if claim.get("unreadable"):
    return f"an unreadable claim (generation {claim['generation']})"
  return (f"{claim.get('holder') or 'a writer'} ({claim.get('host')} pid {claim.get('pid')}, "
          f"generation {claim['generation']})")


class Claim:
  """"I am producing version `version` of `root`, until <time>": one writer at a time.

  A lease says a version is being read; a claim says one is being written, so that
  writers sharing `root` on several machines (index builders) do not all do the same
  work. It never decides what is published: the manifest's create-if-absent does, so a
  failed claim (clock skew, a holder wrongly presumed dead, ram://) costs duplicate work,
  never a duplicate or corrupt version.

      claim = Claim(index_dir, 1200, holder="index builder")
      if claim.acquire():
        try:
          ...write and commit version 1200...
        finally:
          claim.release(index=path)
      else:
        describe_claim(claim.current)  # who holds it, and until when (claim.current)

  A claim is a series of generations, `<root>/_claims/<version>.<generation>.json`, each
  created once with `Storage.create_if_absent`; only the highest generation counts.
  `acquire` creates generation 0 if there is none, else generation g+1 if generation g
  has expired (its holder stopped refreshing it: it died), was released, or was made on
  this host by a process that is gone (superseded_because); otherwise it loses.
  Claimers that judged generation g stale at the same time race on creating the one
  object g+1, so exactly one of them wins. The holder's daemon thread rewrites its
  `expires_at` every ttl/3 seconds; if it finds a higher generation, the holder was
  presumed dead and taken over: `taken_over` then names the new holder and refreshing
  stops. `release` marks the generation released (with what came of it), which lets the
  next claimer create the next generation; claims are deleted by garbage_collect once
  their version is older than every committed version it keeps. Expiry compares wall
  clocks of different machines, as leases do: keep the TTL far above clock skew.

  Args:
    root: the versioned output's root.
    version: the version to be produced.
    holder: who claims it (recorded, for log lines and people).
    ttl_seconds: how long a claim outlives its last refresh.
    store: the Storage to write through.

  Raises:
    ValueError: ttl_seconds is not positive.
  """

  def __init__(self, root: str, version: int, holder: str = "",
               ttl_seconds: float = 600.0, store: Storage = GFILE):
    if ttl_seconds <= 0:
      raise ValueError(f"ttl_seconds must be positive, got {ttl_seconds}")
    self.root, self.version, self.holder = root, int(version), holder
    self.ttl_seconds = ttl_seconds
    self.store = store
    self.claimer = uuid.uuid4().hex
    self.generation: Optional[int] = None  # held generation, once acquired
    self.record: Optional[dict] = None
    self.current: Optional[dict] = None  # the claim that beat this one, when lost
    self.taken_over: Optional[dict] = None  # the claim that superseded this one
    self._lock = threading.Lock()
    self._keep_alive: Optional[_KeepAlive] = None

  @property
  def path(self) -> Optional[str]:
    """The held generation's object, or None before acquire wins."""
    if self.generation is None:
      return None
    return claim_path(self.root, self.version, self.generation)

  def acquire(self) -> bool:
    """Tries to create the next generation of the claim.

    Returns:
      True if this claimer now holds the claim (it is then refreshed every ttl/3 seconds);
      False, with `current` set, if a live claim of another holder stands.
    """
    for _ in range(3):  # a generation won by another may be released at once; look again
      current = current_claim(self.root, self.version, self.store)
      now = time.time()
      if claim_is_live(current, now):
        self.current = current
        return False
      generation = 0 if current is None else current["generation"] + 1
      record = dict(version=self.version, generation=generation, holder=self.holder,
                    host=socket.gethostname(), pid=os.getpid(), claimer=self.claimer,
                    claimed_at=now, expires_at=now + self.ttl_seconds)
      if current is not None:
        record["after"] = dict(generation=current["generation"],
                               why=superseded_because(current, now),
                               holder=describe_claim(current))
      if self.store.create_if_absent(claim_path(self.root, self.version, generation),
                                     _encode(record)):
        self.generation, self.record = generation, record
        if current is not None and record["after"]["why"] != "released":
          logging.warning("Took over the claim on version %d of %s from %s (%s)",
                          self.version, self.root, record["after"]["holder"],
                          record["after"]["why"])
        self._keep_alive = _KeepAlive(self.ttl_seconds / 3, self.refresh,
                                      f"claim-{self.version}").start()
        return True
    self.current = current_claim(self.root, self.version, self.store)
    return False

  def refresh(self) -> bool:
    """Extends the claim by ttl_seconds (the keep-alive thread calls this).

    Returns:
      True if extended; False if released, never held, or superseded by a higher
      generation (`taken_over` is then set).
    """
    with self._lock:
      if self.record is None or "released_at" in self.record:
        return False
      current = current_claim(self.root, self.version, self.store)
      if current is not None and current["generation"] > self.generation:
        self.taken_over = current
        logging.warning("The claim on version %d of %s was taken over by %s: this holder "
                        "was presumed dead (refresh it more often than ttl_seconds=%.0f)",
                        self.version, self.root, describe_claim(current), self.ttl_seconds)
        return False
      self.record = dict(self.record, expires_at=time.time() + self.ttl_seconds)
      write_json_atomic(self.path, self.record, self.store)
      return True

  def release(self, **outcome) -> None:
    """Stops refreshing and marks the claim released; the next claimer may then claim.

    Nothing is written if the claim was never held, is released already, or was taken
    over.

    Args:
      **outcome: JSON-serialisable fields recorded in the released claim (e.g. the
        committed path, or the error).
    """
    if self._keep_alive is not None:
      self._keep_alive.stop()
      self._keep_alive = None
    with self._lock:
      if self.record is None or "released_at" in self.record or self.taken_over:
        return
      self.record = dict(self.record, released_at=time.time(), **outcome)
      write_json_atomic(self.path, self.record, self.store)



def _collect_claims(root: str, below: int, now: float, store: Storage) -> List[str]:
  """Deletes the claims of versions older than `below` that nobody holds: no writer will
  produce those versions any more (newer ones are committed)."""
  deleted = []
  by_version: Dict[int, List[dict]] = {}
  for claim in list_claims(root, store=store):
    by_version.setdefault(claim["version"], []).append(claim)
  for version, claims in sorted(by_version.items()):
    if version >= below or any(claim_is_live(c, now) for c in claims):
      continue
    for claim in claims:
      store.delete_prefix(claim["path"])
      deleted.append(claim["path"])
  return deleted


# ---------------------------------------------------------------------- garbage collection

def delete_version(root: str, version: Version) -> None:
  """Deletes a committed version of `root`: its manifest first, so readers stop listing
  it before its files disappear.

  Args:
    root: the versioned output's root.
    version: the committed Version to delete (leases are not checked here).
  """
  version.store.delete_prefix(manifest_path(root, version.version))
  version.store.delete_prefix(version.path)


def garbage_collect(root: str, keep: int = 3, stale_seconds: float = 6 * 3600,
                    now: Optional[float] = None, store: Storage = GFILE) -> List[str]:
  """Deletes committed versions older than the newest `keep` that no lease protects,
  claims of versions older than every version kept that nobody holds, and data
  directories no manifest names once nothing in them is younger than `stale_seconds`
  (crashed writers; younger ones may still be written). A version's manifest goes first,
  so readers stop listing it before its files disappear.

  Args:
    root: the versioned output's root.
    keep: committed versions kept (the newest); leased ones are kept besides.
    stale_seconds: the age after which an unreferenced data directory is a crashed
      writer's.
    now: the time to judge ages and leases at (default: the clock).
    store: the Storage to list and delete through.

  Returns:
    The deleted paths (data directories and claim objects).
  """
  now = time.time() if now is None else now
  deleted = []
  leased = leased_versions(root, now, delete_expired=True, store=store)
  versions = list_versions(root, store)
  for version in versions[:max(0, len(versions) - keep)]:
    # Leases are read again right before each deletion, which narrows (not closes) the
    # window in which a lease written after the first read is missed; Lease.acquire's
    # check that the manifest still exists covers the other order.
    if version.version in leased or version.version in leased_versions(root, now,
                                                                        store=store):
      logging.info("Keeping leased version %s", version.path)
      continue
    delete_version(root, version)
    deleted.append(version.path)
  if not store.is_dir_like(root):
    return deleted
  kept = [v for v in versions if v.path not in deleted]
  if kept:
    deleted.extend(_collect_claims(root, kept[0].version, now, store))
  referenced = {os.path.basename(v.path) for v in versions}
  for name in store.listdir(root):
    match = _DATA_DIR_RE.match(name)
    if not match or name in referenced or int(match.group(1)) in leased:
      continue
    path = os.path.join(root, name)
    age = now - _last_activity(path, store)
    if age > stale_seconds:
      store.delete_prefix(path)
      deleted.append(path)
  return deleted


def _last_activity(data_dir: str, store: Storage) -> float:
  """Newest object time under `data_dir`, or its writer's start time; `now` if neither is
  known (never delete what cannot be dated)."""
  newest = store.newest_mtime(data_dir)
  marker = os.path.join(data_dir, WRITER_MARKER)
  try:
    newest = max(newest, float(read_json(marker, store).get("started_at", 0)))
  except (VersionError, FileNotFoundError):
    pass
  return newest if newest > 0 else time.time()
