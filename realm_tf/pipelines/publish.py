"""Publication of a corpus pipeline's output directory: files first, manifest.json last.

Object stores have no directory rename (on GCS a rename is a copy and a delete per
object; a crash in the middle leaves a mixture), so the pipeline writes straight into the
output directory and the output counts as published only once `manifest.json` exists:
every reader of a corpus waits for (or checks) the manifest. The manifest lists every
file with its size and CRC32C (computed on the workers after the writes, each file read once
more, in parallel), so readers can verify a corpus with
realm_tf.io.versioned.verify_published.

  check_output_dir → prepare_output_dir (with --overwrite: manifest deleted first, so
  readers stop trusting the old output, then every stale object) → pipeline →
  write_manifest. On failure, `discard` deletes what the failed run wrote.
"""
from typing import Any, Dict

from apache_beam.io.filesystems import FileSystems

from realm_tf.pipelines import filesystems

MANIFEST = "manifest.json"


def manifest_path(output_dir: str) -> str:
  return FileSystems.join(output_dir.rstrip("/"), MANIFEST)


def check_output_dir(output_dir: str, overwrite: bool) -> None:
  """Fails before any work is done if the output holds anything and may not be replaced."""
  if filesystems.exists(output_dir) and not overwrite:
    raise FileExistsError(f"{output_dir} already exists (holds files); remove it or pass "
                          "--overwrite")


def prepare_output_dir(output_dir: str, overwrite: bool) -> int:
  """An empty output directory: with `overwrite`, the old manifest and then every stale
  object are deleted (so no old shard is left beside the new ones). Returns the number of
  objects deleted."""
  check_output_dir(output_dir, overwrite)
  if FileSystems.exists(manifest_path(output_dir)):
    FileSystems.delete([manifest_path(output_dir)])
  return filesystems.delete_prefix(output_dir)


def discard(output_dir: str) -> None:
  """Removes what a failed run wrote (the output was empty when it started)."""
  filesystems.delete_prefix(output_dir)


def write_manifest(output_dir: str, manifest: Dict[str, Any]) -> str:
  """Publishes the output: the manifest object is written last, in one upload."""
  path = manifest_path(output_dir)
  filesystems.write_json(path, manifest)
  return path
