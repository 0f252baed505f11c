"""The commit protocol's storage over Beam's FileSystems (local, gs://, and the rest).

Pipeline launchers and workers publish through realm_tf.io.versioned like everything
else; `BEAM` is the `storage.Storage` they pass it, so gs:// goes through Beam's GCS
client (apache-beam[gcp], which honours STORAGE_EMULATOR_HOST) rather than TensorFlow's.

Beam's `FileSystems.exists` answers for one object: on GCS a "directory" is only a name
prefix, so `exists('gs://b/corpus')` is False even when thousands of objects live under
`gs://b/corpus/`. Listings here match `<dir>/**` instead, which finds every object under
the prefix on every Beam file system.
"""
import contextlib
from typing import Any, BinaryIO, Dict, Iterator, List

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from realm_tf.io import storage


def _is_not_found(error: BaseException) -> bool:
  """Whether a Beam file-system error says "no such object" (rather than "could not
  ask"). Beam wraps the file system's own exception (BeamIOError.exception_details, or
  the cause): FileNotFoundError locally, google-cloud-storage's NotFound (404) on GCS."""
  seen = set()
  pending = [error]
  while pending:
    e = pending.pop()
    if e is None or id(e) in seen:
      continue
    seen.add(id(e))
    if isinstance(e, FileNotFoundError) or type(e).__name__ == "NotFound":
      return True
    if getattr(e, "code", None) == 404 or getattr(e, "status_code", None) == 404:
      return True
    details = getattr(e, "exception_details", None)
    if isinstance(details, dict):
      pending.extend(v for v in details.values() if isinstance(v, BaseException))
    pending.extend([e.__cause__, e.__context__])
  return False


def _read_error(path: str, error: Exception) -> OSError:
  if _is_not_found(error):
    return FileNotFoundError(f"{path}: no such file{storage.why_nothing_matches(path)}")
  return storage.StorageError(f"{path}: storage failed ({type(error).__name__}: {error})")


def _all_under(path: str) -> str:
  return FileSystems.join(path.rstrip("/"), "**")


def _relative(path: str, root: str) -> str:
  prefix = root.rstrip("/") + "/"
  if not path.startswith(prefix):
    raise ValueError(f"{path}: listed under {root} but outside it")
  return path[len(prefix):]


class BeamStorage(storage.Storage):
  """Storage over Beam's FileSystems. Beam has no create-if-absent: on gs:// commits use
  google-cloud-storage's ifGenerationMatch=0 upload (storage.create_if_absent's GCS path);
  elsewhere they check, then write (the ram:// caveat of realm_tf.io.versioned applies).
  Listing and reading failures other than "not found" raise storage.StorageError."""

  def _match(self, pattern: str, root: str, limit=None) -> List[Any]:
    """FileMetadata matching `pattern`; [] when nothing is there; FileNotFoundError when
    the root itself is missing (an unknown bucket); StorageError when the store could not
    be asked (no permission, no network, a server error)."""
    try:
      return FileSystems.match([pattern], limits=[limit] if limit else None)[0].metadata_list
    except Exception as e:  # Beam raises BeamIOError/IOError depending on the file system
      if _is_not_found(e):
        # A listing finds nothing without an error; "not found" from the listing itself
        # means its root is missing (on GCS: the bucket). An error, not an empty answer.
        raise FileNotFoundError(f"{root}: cannot be listed"
                                f"{storage.why_nothing_matches(root) or ' (not found)'}") from e
      raise storage.StorageError(
          f"{root}: storage failed ({type(e).__name__}: {e})") from e

  def match_files(self, pattern: str) -> List[str]:
    """Paths matching a file pattern ([] if none; StorageError if the store failed)."""
    return sorted(m.path for m in self._match(pattern, pattern))

  def _metadata(self, root: str) -> List[Any]:
    """FileMetadata (path, size_in_bytes, ...) of every object under `root`, sorted."""
    return sorted(self._match(_all_under(root), root), key=lambda m: m.path)

  def exists(self, path: str) -> bool:
    try:
      return FileSystems.exists(path)
    except Exception as e:  # Beam raises BeamIOError/IOError depending on the file system
      raise _read_error(path, e) from e

  def is_dir_like(self, path: str) -> bool:
    return bool(self._match(_all_under(path), path, limit=1))

  def list_files(self, root: str) -> List[str]:
    return [_relative(m.path, root) for m in self._metadata(root)]

  def file_sizes(self, root: str) -> Dict[str, int]:
    return {_relative(m.path, root): int(m.size_in_bytes) for m in self._metadata(root)}

  def size(self, path: str) -> int:
    try:
      metadata = FileSystems.match([path])[0].metadata_list
    except Exception as e:  # Beam raises BeamIOError/IOError depending on the file system
      raise _read_error(path, e) from e
    if not metadata:
      raise FileNotFoundError(f"{path}: no such file")
    return int(metadata[0].size_in_bytes)

  @contextlib.contextmanager
  def open_read(self, path: str) -> Iterator[BinaryIO]:
    try:
      f = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    except Exception as e:  # Beam raises BeamIOError/IOError depending on the file system
      raise _read_error(path, e) from e
    with f:
      yield f

  def write_bytes_atomic(self, path: str, data: bytes) -> None:
    """One object, written in one upload (visible on GCS only once complete)."""
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
      f.write(data)

  def create_if_absent(self, path: str, data: bytes) -> bool:
    if storage.scheme(path) == "gs":
      created = storage.gcs_create_if_absent(path, data)
      if created is not None:
        return created
    if FileSystems.exists(path):
      return False
    self.write_bytes_atomic(path, data)
    return self.read_bytes(path) == data

  def makedirs(self, path: str) -> None:
    """Nothing: Beam's file systems create parents as they write."""

  def delete_prefix(self, path: str) -> int:
    """Deletes every object under `path` (and a local directory tree or a same-named
    object). Deleting the listed objects rather than the "directory" is what works on
    GCS, where deleting `gs://b/dir` removes nothing."""
    files = [m.path for m in self._metadata(path)]
    if files:
      FileSystems.delete(files)
    if FileSystems.exists(path):  # a local directory (now empty), or a same-named object
      FileSystems.delete([path])
    return len(files)

  def newest_mtime(self, path: str) -> float:
    metadata = self._metadata(path) or FileSystems.match([path])[0].metadata_list
    return max((m.last_updated_in_seconds or 0.0 for m in metadata), default=0.0)

  def copy(self, source: str, target: str) -> None:
    FileSystems.copy([source], [target])


BEAM = BeamStorage()

