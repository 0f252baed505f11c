"""Atomic publication of a pipeline's output directory, manifest last.

The pipeline writes into a hidden sibling directory of the output (same file system, so
the final rename is cheap). On a local file system the whole directory is renamed into
place in one step, so no reader ever sees a half-written output. Object stores (gs://)
have no directory rename: data files are moved first and manifest.json is written last,
so a reader that waits for the manifest never sees a partial output.
"""
import json
import os
import shutil
import uuid
from typing import Any, Dict

from apache_beam.io.filesystems import FileSystems
from apache_beam.io.localfilesystem import LocalFileSystem

MANIFEST = "manifest.json"


def _is_local(path: str) -> bool:
  return isinstance(FileSystems.get_filesystem(path), LocalFileSystem)


def _output_exists(output_dir: str) -> bool:
  if _is_local(output_dir):
    return os.path.exists(output_dir)
  return FileSystems.exists(FileSystems.join(output_dir, MANIFEST))


def check_output_dir(output_dir: str, overwrite: bool) -> None:
  """Fails before any work is done if the output exists and may not be replaced."""
  if _output_exists(output_dir) and not overwrite:
    raise FileExistsError(f"{output_dir} already exists; remove it or pass --overwrite")


def temporary_dir(output_dir: str) -> str:
  """A fresh hidden sibling of `output_dir`, created (locally) and empty."""
  parent, name = FileSystems.split(output_dir.rstrip("/"))
  work_dir = FileSystems.join(parent, f".{name}.tmp-{uuid.uuid4().hex[:12]}")
  if _is_local(work_dir):
    os.makedirs(work_dir)
  return work_dir


def discard(work_dir: str) -> None:
  """Removes a temporary directory after a failed run."""
  if _is_local(work_dir):
    shutil.rmtree(work_dir, ignore_errors=True)
  elif FileSystems.exists(work_dir):
    FileSystems.delete([work_dir])


def read_json(path: str) -> Any:
  with FileSystems.open(path) as f:
    return json.loads(f.read().decode("utf-8"))


def _write_json(path: str, value: Dict[str, Any]) -> None:
  with FileSystems.create(path) as f:
    f.write(json.dumps(value, indent=2, sort_keys=False).encode("utf-8") + b"\n")


def publish(work_dir: str, output_dir: str, manifest: Dict[str, Any], overwrite: bool) -> None:
  """Moves the finished `work_dir` to `output_dir` with `manifest` as its last file."""
  check_output_dir(output_dir, overwrite)
  if _is_local(output_dir):
    _write_json(os.path.join(work_dir, MANIFEST), manifest)
    old = None
    if os.path.exists(output_dir):
      old = temporary_dir(output_dir)
      os.rmdir(old)
      os.rename(output_dir, old)
    os.rename(work_dir, output_dir)
    if old:
      shutil.rmtree(old)
    return
  if FileSystems.exists(output_dir):
    FileSystems.delete([output_dir])
  sources = [m.path for m in FileSystems.match([FileSystems.join(work_dir, "*")])[0].metadata_list]
  FileSystems.rename(sources, [FileSystems.join(output_dir, FileSystems.split(s)[1])
                               for s in sources])
  _write_json(FileSystems.join(output_dir, MANIFEST), manifest)
  discard(work_dir)
