"""Versioned directories committed atomically: the file system as a message bus.

  <root>/
    000000001200/              one version (e.g. a training step), readable
      manifest.json            the commit marker, written last
      ...
    .tmp-000000001200-<uuid>/  being written; never read

A version is written under a temporary name, renamed into place when complete, and then
committed by writing `manifest.json` (itself through a temporary file and a rename).
Readers list only versions that have a manifest, so they never see a partial one: on local
disks the rename is atomic; on object stores a directory rename is a copy, and the
manifest, written after it, still marks the end.
"""
import dataclasses
import json
import logging
import os
import re
import time
import uuid
from typing import Optional

import tensorflow as tf

MANIFEST = "manifest.json"
TMP_PREFIX = ".tmp-"
_VERSION_RE = re.compile(r"^\d{12}$")


class VersionError(RuntimeError):
  """A version that cannot be committed or read as asked."""


@dataclasses.dataclass
class Version:
  version: int
  path: str
  manifest: dict


def version_name(version: int) -> str:
  if version < 0:
    raise ValueError(f"version must be >= 0, got {version}")
  return f"{version:012d}"


def write_json_atomic(path: str, payload: dict):
  tmp = f"{path}.tmp-{uuid.uuid4().hex}"
  with tf.io.gfile.GFile(tmp, "w") as f:
    json.dump(payload, f, indent=2, sort_keys=True)
  tf.io.gfile.rename(tmp, path, overwrite=True)


def read_json(path: str) -> dict:
  with tf.io.gfile.GFile(path) as f:
    return json.load(f)


def new_tmp_dir(root: str, version: int) -> str:
  """A fresh temporary directory to write `version` into."""
  path = os.path.join(root, f"{TMP_PREFIX}{version_name(version)}-{uuid.uuid4().hex}")
  tf.io.gfile.makedirs(path)
  return path


def commit(tmp_dir: str, root: str, version: int, manifest: dict) -> str:
  """Renames a complete temporary directory to `<root>/<version>` and commits it."""
  final = os.path.join(root, version_name(version))
  if tf.io.gfile.exists(final):
    raise VersionError(f"{final}: version {version} already exists")
  tf.io.gfile.rename(tmp_dir, final)
  write_json_atomic(os.path.join(final, MANIFEST),
                    dict(manifest, version=version, committed_at=time.time()))
  return final


def read_version(path: str) -> Version:
  """One committed version directory."""
  manifest_path = os.path.join(path, MANIFEST)
  if not tf.io.gfile.exists(manifest_path):
    raise VersionError(f"{path}: not a committed version (no {MANIFEST})")
  manifest = read_json(manifest_path)
  return Version(int(manifest.get("version", 0)), path, manifest)


def list_versions(root: str) -> list[Version]:
  """Committed versions under `root`, oldest first."""
  if not tf.io.gfile.isdir(root):
    return []
  versions = []
  for name in tf.io.gfile.listdir(root):
    name = name.rstrip("/")
    if not _VERSION_RE.match(name):
      continue
    path = os.path.join(root, name)
    manifest_path = os.path.join(path, MANIFEST)
    if not tf.io.gfile.exists(manifest_path):
      continue
    try:
      manifest = read_json(manifest_path)
    except (json.JSONDecodeError, tf.errors.OpError) as e:
      logging.warning("Skipping %s: unreadable manifest (%s)", path, e)
      continue
    versions.append(Version(int(name), path, manifest))
  return sorted(versions, key=lambda v: v.version)


def latest_version(root: str) -> Optional[Version]:
  versions = list_versions(root)
  return versions[-1] if versions else None


def garbage_collect(root: str, keep: int = 3, stale_tmp_seconds: float = 6 * 3600) -> list[str]:
  """Deletes all but the newest `keep` versions, and temporary directories older than
  `stale_tmp_seconds` (left by crashed writers; younger ones may be in progress)."""
  deleted = []
  versions = list_versions(root)
  for v in versions[:max(0, len(versions) - keep)]:
    tf.io.gfile.rmtree(v.path)
    deleted.append(v.path)
  if tf.io.gfile.isdir(root):
    now = time.time()
    for name in tf.io.gfile.listdir(root):
      name = name.rstrip("/")
      path = os.path.join(root, name)
      if name.startswith(TMP_PREFIX) and now - _mtime(path) > stale_tmp_seconds:
        tf.io.gfile.rmtree(path)
        deleted.append(path)
  return deleted


def _mtime(path: str) -> float:
  try:
    return tf.io.gfile.stat(path).mtime_nsec / 1e9
  except tf.errors.OpError:
    return time.time()
