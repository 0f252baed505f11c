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


def _all_under(path: str) -> str:
  return FileSystems.join(path.rstrip("/"), "**")


def _relative(path: str, root: str) -> str:
  prefix = root.rstrip("/") + "/"
  if not path.startswith(prefix):
    raise ValueError(f"{path}: listed under {root} but outside it")
  return path[len(prefix):]


class BeamStorage(storage.Storage):
  """Storage over Beam's FileSystems. Beam has no create-if-absent: commits check, then
  write (the ram:// caveat of realm_tf.io.versioned applies)."""

  def _metadata(self, root: str) -> List[Any]:
    """FileMetadata (path, size_in_bytes, ...) of every object under `root`, sorted."""
    result = FileSystems.match([_all_under(root)])[0]
    return sorted(result.metadata_list, key=lambda m: m.path)

  def exists(self, path: str) -> bool:
    return FileSystems.exists(path)

  def is_dir_like(self, path: str) -> bool:
    return bool(FileSystems.match([_all_under(path)], limits=[1])[0].metadata_list)

  def list_files(self, root: str) -> List[str]:
    return [_relative(m.path, root) for m in self._metadata(root)]

  def file_sizes(self, root: str) -> Dict[str, int]:
    return {_relative(m.path, root): int(m.size_in_bytes) for m in self._metadata(root)}

  def size(self, path: str) -> int:
    try:
      metadata = FileSystems.match([path])[0].metadata_list
    except Exception as e:  # Beam raises BeamIOError/IOError depending on the file system
      raise FileNotFoundError(f"{path}: no such file ({e})") from e
    if not metadata:
      raise FileNotFoundError(f"{path}: no such file")
    return int(metadata[0].size_in_bytes)

  @contextlib.contextmanager
  def open_read(self, path: str) -> Iterator[BinaryIO]:
    try:
      f = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    except Exception as e:  # Beam raises BeamIOError/IOError depending on the file system
      raise FileNotFoundError(f"{path}: cannot be read ({e})") from e
    with f:
      yield f

  def write_bytes_atomic(self, path: str, data: bytes) -> None:
    """One object, written in one upload (visible on GCS only once complete)."""
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
      f.write(data)

  def create_if_absent(self, path: str, data: bytes) -> bool:
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

