"""Writers: `VersionWriter` commits one version of a versioned output, `OutputWriter`
publishes a flat output; each writes its files first and its manifest last."""
import logging
import os
import time
import uuid
from typing import Iterable, Optional

from realm_tf.io.storage import GFILE, Storage
from realm_tf.io.versioned.manifest import (
  DATA_DIR_RE,
  MANIFEST,
  WRITER_MARKER,
  Version,
  VersionConflictError,
  VersionError,
  file_entries,
  json_bytes,
  manifest_path,
  same_files,
  version_from_manifest,
  version_name,
  write_json_atomic,
)


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
    if self.store.create_if_absent(target, json_bytes(payload)):
      self.committed = Version(self.version, self.path, payload, self.store)
      logging.info("Committed %s (%d files)", self.path, len(entries))
      return self.committed
    existing = version_from_manifest(self.root, target, self.store)
    if existing is None:
      raise VersionError(f"{target}: exists but cannot be read; not overwriting it")
    if existing.manifest.get("writer") == self.writer_id:
      self.committed = existing
      return existing
    if (existing.manifest.get("identity") == identity if identity is not None else
        same_files(existing.manifest.get("files", []), entries)):
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
    match = DATA_DIR_RE.match(os.path.basename(path.rstrip("/")))
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
    if not self.store.create_if_absent(target, json_bytes(payload)):
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
