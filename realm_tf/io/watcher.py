"""Follows a directory of committed versions and swaps in newer ones without blocking."""
import logging
import threading
from typing import Any, Callable, Generic, Optional, TypeVar

from realm_tf.io.versioned import Version, latest_version

T = TypeVar("T")


class VersionWatcher(Generic[T]):
  """Holds the newest loaded version of `root` (an index, an encoder snapshot, ...).

  A newer version is loaded off to the side while the current one keeps serving; the swap
  is one reference assignment, so readers never wait on a load. A version that fails to
  load is logged and skipped until a newer one appears.
  """

  def __init__(self, root: str, loader: Callable[[Version], T], poll_seconds: float = 10.0,
               on_swap: Optional[Callable[[Version], Any]] = None, name: str = "watcher"):
    self.root = root
    self.poll_seconds = poll_seconds
    self._load = loader
    self._on_swap = on_swap
    self._name = name
    self._current: Optional[tuple[Version, T]] = None
    self._failed_version = -1
    self._ready = threading.Event()
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None
    self.num_swaps = 0

  @property
  def current(self) -> Optional[tuple[Version, T]]:
    return self._current

  @property
  def version(self) -> Optional[int]:
    current = self._current
    return None if current is None else current[0].version

  def poll_once(self) -> bool:
    """Loads the newest committed version if it is newer; True if it swapped."""
    latest = latest_version(self.root)
    current = -1 if self.version is None else self.version
    if latest is None or latest.version <= max(current, self._failed_version):
      return False
    try:
      loaded = self._load(latest)
    except Exception as e:  # pylint: disable=broad-except
      # A broken version must not take down the trainer or server that is reading.
      logging.error("%s: %s failed to load, keeping version %s: %s", self._name,
                    latest.path, self.version, e)
      self._failed_version = latest.version
      return False
    self._current = (latest, loaded)
    self.num_swaps += 1
    self._ready.set()
    logging.info("%s: swapped to version %d (%s)", self._name, latest.version, latest.path)
    if self._on_swap is not None:
      self._on_swap(latest)
    return True

  def start(self):
    if self._thread is None:
      self._stop.clear()
      self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
      self._thread.start()
    return self

  def stop(self, timeout: float = 30.0):
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout)
      self._thread = None

  def wait_until_ready(self, timeout: Optional[float] = None) -> bool:
    """Blocks until some version is loaded (the only time readers should wait)."""
    if self._thread is None:
      self.poll_once()
    return self._ready.wait(timeout)

  def _run(self):
    while not self._stop.is_set():
      try:
        self.poll_once()
      except Exception as e:  # pylint: disable=broad-except
        logging.error("%s: polling %s failed: %s", self._name, self.root, e)
      self._stop.wait(self.poll_seconds)

  def __enter__(self):
    return self.start()

  def __exit__(self, *exc):
    self.stop()
