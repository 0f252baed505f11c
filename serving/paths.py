"""Where models may live and which version directories count, as TF Serving lays them out.

  <base_path>/
    1/saved_model.pb         version 1 (directory names are non-negative integers)
    7/saved_model.pb         version 7
    .tmp-7-…/ , README       ignored: not an integer

Model paths arrive from the config file and from HandleReloadConfigRequest (a remote
caller), and a SavedModel can run arbitrary ops, so a path is only accepted inside an
allowed root: no `..` component, and for local paths the resolved location (after
symlinks) must stay inside the root. Inside a base path, a version directory (or any
symlink in it) that resolves outside the base path is refused, so a version cannot pull in
files from elsewhere. Object-store paths (gs://…) have no symlinks; the textual checks
apply to them.
"""
import dataclasses
import os
import re
from typing import Iterable, Optional

import tensorflow as tf

from realm_tf.io import storage
from serving import errors

SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
_VERSION_NAME = re.compile(r"^\d{1,18}$")  # fits in int64, like TF Serving's parse


def is_url(path: str) -> bool:
  return "://" in path


def _has_parent_reference(path: str) -> bool:
  return any(part == ".." for part in re.split(r"[/\\]", path))


def _local_real(path: str) -> str:
  return os.path.realpath(os.path.abspath(path))


def is_inside(path: str, root: str) -> bool:
  """True if `path` is `root` or below it (both already resolved)."""
  if is_url(path) or is_url(root):
    root = root.rstrip("/") + "/"
    return path.rstrip("/") + "/" == root or path.startswith(root)
  return os.path.commonpath([path, root]) == root


def resolve_root(root: str) -> str:
  if _has_parent_reference(root):
    raise ValueError(f"model root {root!r} contains '..'")
  return root.rstrip("/") if is_url(root) else _local_real(root)


def resolve_base_path(base_path: str, allowed_roots: Iterable[str], source: str) -> str:
  """The resolved base path of a model, or a ValueError naming `source` and the path."""
  if not base_path:
    raise ValueError(f"{source}: base_path is empty")
  if _has_parent_reference(base_path):
    raise ValueError(f"{source}: base_path {base_path!r} contains '..'")
  resolved = base_path.rstrip("/") if is_url(base_path) else _local_real(base_path)
  roots = list(allowed_roots)
  if roots and not any(is_inside(resolved, root) for root in roots):
    raise ValueError(f"{source}: base_path {base_path!r} resolves to {resolved}, outside "
                     f"the allowed model roots {roots} (see --model_root)")
  return resolved


@dataclasses.dataclass(frozen=True)
class VersionDir:
  """One version directory found under a base path, with a stamp that changes on rewrite."""
  version: int
  path: str
  stamp: tuple


@dataclasses.dataclass
class Listing:
  versions: dict  # int → VersionDir
  refused: dict  # int → reason: directories that claim a version but cannot be served


def _stamp(path: str) -> Optional[tuple]:
  """(file name, mtime, size) of the saved model file, or None if there is none yet."""
  for name in SAVED_MODEL_FILES:
    file_path = os.path.join(path, name)
    if tf.io.gfile.exists(file_path):
      stat = tf.io.gfile.stat(file_path)
      return (name, stat.mtime_nsec, stat.length)
  return None


def _is_dir(path: str) -> bool:
  """A directory (or a GCS prefix); False only when nothing is there. Any other failure
  raises: tf.io.gfile.isdir returns False on every error, and an outage read as "no
  versions" would retire every model being served."""
  return storage.is_dir_like(path)


def list_versions(base_path: str) -> Listing:
  """The version directories under `base_path` that hold a saved model.

  Directories without saved_model.pb(txt) are skipped (a version still being copied in;
  TF Serving recommends writing elsewhere and renaming, as realm_tf's exports do). Storage
  failures raise tf.errors.OpError (the poller logs them and keeps what it serves).
  """
  listing = Listing(versions={}, refused={})
  if not _is_dir(base_path):
    return listing
  real_base = base_path if is_url(base_path) else _local_real(base_path)
  seen_names = {}
  for entry in sorted(tf.io.gfile.listdir(base_path)):
    name = entry.rstrip("/")
    if not _VERSION_NAME.match(name):
      continue
    version = int(name)
    path = os.path.join(base_path, name)
    if not _is_dir(path):
      continue
    if version in seen_names:
      listing.refused[version] = (f"directories {seen_names[version]!r} and {name!r} both "
                                  f"claim version {version}")
      listing.versions.pop(version, None)
      continue
    seen_names[version] = name
    if not is_url(path) and not is_inside(_local_real(path), real_base):
      listing.refused[version] = (f"{path} resolves to {_local_real(path)}, outside the "
                                  f"base path {real_base}")
      continue
    stamp = _stamp(path)
    if stamp is not None:
      listing.versions[version] = VersionDir(version, path, stamp)
  return listing


def check_tree_inside(version_path: str, base_path: str):
  """Refuses a version whose files include a symlink leading outside the base path."""
  if is_url(version_path):
    return
  real_base = _local_real(base_path)
  for directory, subdirs, files in os.walk(version_path, followlinks=False):
    for name in subdirs + files:
      path = os.path.join(directory, name)
      if os.path.islink(path) and not is_inside(_local_real(path), real_base):
        raise errors.failed_precondition(
            f"{path} is a symlink to {_local_real(path)}, outside the base path "
            f"{real_base}")
