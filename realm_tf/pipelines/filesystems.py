"""Directory-like operations over Beam's FileSystems (local, gs://, and the rest).

Beam's `FileSystems.exists` answers for one object: on GCS a "directory" is only a name
prefix, so `exists('gs://b/corpus')` is False even when thousands of objects live under
`gs://b/corpus/`. These helpers match `<dir>/**` instead, which lists every object under
the prefix on every Beam file system. The TF-side twin is realm_tf/io/storage.py.
"""
import json
from typing import Any, Dict, List

from apache_beam.io.filesystems import FileSystems


def _all_under(path: str) -> str:
  return FileSystems.join(path.rstrip("/"), "**")


def list_files(path: str) -> List[Any]:
  """FileMetadata (path, size_in_bytes, ...) of every object under `path`, sorted."""
  result = FileSystems.match([_all_under(path)])[0]
  return sorted(result.metadata_list, key=lambda m: m.path)


def is_dir_like(path: str) -> bool:
  """True when `path` is a directory holding files, or a prefix with objects under it."""
  return bool(FileSystems.match([_all_under(path)], limits=[1])[0].metadata_list)


def exists(path: str) -> bool:
  """A file (object) or a non-empty directory / prefix."""
  return FileSystems.exists(path) or is_dir_like(path)


def delete_prefix(path: str) -> int:
  """Deletes every object under `path` (and a local directory tree); returns the count.

  Deleting the listed objects rather than the "directory" is what works on GCS, where
  deleting `gs://b/dir` removes nothing.
  """
  files = [m.path for m in list_files(path)]
  if files:
    FileSystems.delete(files)
  if FileSystems.exists(path):  # a local directory (now empty), or a same-named object
    FileSystems.delete([path])
  return len(files)


def read_json(path: str) -> Any:
  try:
    with FileSystems.open(path) as f:
      data = f.read()
  except Exception as e:  # Beam raises BeamIOError/IOError depending on the file system
    raise FileNotFoundError(f"{path}: cannot be read ({e})") from e
  try:
    return json.loads(data.decode("utf-8"))
  except ValueError as e:
    raise ValueError(f"{path}: not valid JSON ({e})") from e


def write_json(path: str, value: Dict[str, Any]) -> None:
  """One object, written in one upload (visible on GCS only once complete)."""
  with FileSystems.create(path) as f:
    f.write(json.dumps(value, indent=2, sort_keys=False).encode("utf-8") + b"\n")
