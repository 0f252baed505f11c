"""Garbage collection: committed versions beyond the newest `keep` that no lease protects,
claims nobody will act on any more, and data directories crashed writers left behind."""
import logging
import os
import time
from typing import Dict, List, Optional

from realm_tf.io.storage import GFILE, Storage
from realm_tf.io.versioned.claims import claim_is_live, list_claims
from realm_tf.io.versioned.leases import leased_versions
from realm_tf.io.versioned.manifest import (
  DATA_DIR_RE,
  WRITER_MARKER,
  Version,
  VersionError,
  manifest_path,
  read_json,
)
from realm_tf.io.versioned.reading import list_versions


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
    match = DATA_DIR_RE.match(name)
    if not match or name in referenced or int(match.group(1)) in leased:
      continue
    path = os.path.join(root, name)
    age = now - _last_activity(path, store)
    if age > stale_seconds:
      store.delete_prefix(path)
      deleted.append(path)
  return deleted



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
