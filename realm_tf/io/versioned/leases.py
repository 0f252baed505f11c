"""Leases: "a reader is using version N until <time>", which garbage_collect respects; and
the keep-alive thread that refreshes a lease (or a claim) while its holder lives."""
import logging
import os
import threading
import time
import uuid
from typing import Callable, Optional

from realm_tf.io.storage import GFILE, Storage
from realm_tf.io.versioned.manifest import (
  VersionError,
  manifest_path,
  read_json,
  version_name,
  write_json_atomic,
)

LEASES = "_leases"


class KeepAlive:
  """Calls `beat` every `interval` seconds on a daemon thread until stopped, or until
  `beat` returns False: what keeps a lease or a claim from lapsing while its holder
  lives (and lets it lapse once the holder is gone)."""

  def __init__(self, interval: float, beat: Callable[[], bool], name: str):
    self.interval, self.beat = interval, beat
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True, name=name)

  def start(self) -> "KeepAlive":
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
    self._keep_alive: Optional[KeepAlive] = None

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
    self._keep_alive = KeepAlive(self.ttl_seconds / 3, self.refresh,
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
