"""Follows an index directory and swaps in newer exports without blocking searchers."""
import functools
import logging
import threading
from typing import Callable, Optional

import tensorflow as tf

from realm_tf.retrieval.index_export import IndexExport, latest_export
from realm_tf.retrieval.loading import load_searcher
from realm_tf.retrieval.searcher import Searcher, SearchResult


class IndexWatcher:
  """Holds the newest loaded searcher of `index_dir`, polling for newer exports.

  A newer export is loaded off to the side while the current searcher keeps serving; the
  swap is one reference assignment, so searching threads never wait on a load. An export
  that fails to load is logged and skipped until a newer one appears.
  """

  def __init__(self, index_dir: str, backend: str = "scann", rescore: bool = False,
               poll_seconds: float = 10.0,
               on_swap: Optional[Callable[[IndexExport], None]] = None,
               loader: Optional[Callable[[IndexExport], Searcher]] = None):
    self.index_dir = index_dir
    self.poll_seconds = poll_seconds
    self._load = loader or functools.partial(load_searcher, backend=backend, rescore=rescore)
    self._on_swap = on_swap
    self._current: Optional[tuple[IndexExport, Searcher]] = None
    self._failed_version = -1
    self._ready = threading.Event()
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None
    self.num_swaps = 0

  @property
  def current(self) -> Optional[tuple[IndexExport, Searcher]]:
    return self._current

  @property
  def version(self) -> Optional[int]:
    current = self._current
    return None if current is None else current[0].version

  def poll_once(self) -> bool:
    """Loads the newest committed export if it is newer; True if it swapped."""
    export = latest_export(self.index_dir)
    if export is None or export.version <= max(self.version or -1, self._failed_version):
      return False
    try:
      searcher = self._load(export)
    except Exception as e:  # pylint: disable=broad-except
      # A broken export must not take down the trainer or server that is searching.
      logging.error("Index export %s failed to load, keeping version %s: %s", export.path,
                    self.version, e)
      self._failed_version = export.version
      return False
    self._current = (export, searcher)
    self.num_swaps += 1
    self._ready.set()
    logging.info("Index swapped to version %d (%s)", export.version, export.path)
    if self._on_swap is not None:
      self._on_swap(export)
    return True

  def start(self) -> "IndexWatcher":
    if self._thread is None:
      self._thread = threading.Thread(target=self._run, name="index-watcher", daemon=True)
      self._thread.start()
    return self

  def stop(self, timeout: float = 30.0):
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout)
      self._thread = None

  def wait_until_ready(self, timeout: Optional[float] = None) -> bool:
    """Blocks until some export is loaded (the only time callers should wait)."""
    if self._thread is None:
      self.poll_once()
    return self._ready.wait(timeout)

  def search(self, queries: tf.Tensor, k: int) -> SearchResult:
    current = self._current  # one read: a concurrent swap cannot split this search
    if current is None:
      raise RuntimeError(f"{self.index_dir}: no index loaded yet; call wait_until_ready()")
    return current[1].search(queries, k)

  def _run(self):
    while not self._stop.is_set():
      try:
        self.poll_once()
      except Exception as e:  # pylint: disable=broad-except
        logging.error("Polling %s failed: %s", self.index_dir, e)
      self._stop.wait(self.poll_seconds)

  def __enter__(self):
    return self.start()

  def __exit__(self, *exc):
    self.stop()
