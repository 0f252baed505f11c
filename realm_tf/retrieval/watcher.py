"""Search over the newest committed index export, swapped in while callers search."""
import functools
from typing import Callable, Optional

import tensorflow as tf

from realm_tf.io.watcher import VersionWatcher
from realm_tf.retrieval.index_export import IndexExport
from realm_tf.retrieval.loading import load_searcher
from realm_tf.retrieval.searcher import Searcher, SearchResult


class IndexWatcher(VersionWatcher[Searcher]):
  """A VersionWatcher over an index directory that can also search."""

  def __init__(self, index_dir: str, backend: str = "scann", rescore: bool = False,
               poll_seconds: float = 10.0,
               on_swap: Optional[Callable[[IndexExport], None]] = None,
               loader: Optional[Callable[[IndexExport], Searcher]] = None):
    super().__init__(index_dir,
                     loader or functools.partial(load_searcher, backend=backend,
                                                 rescore=rescore),
                     poll_seconds=poll_seconds, on_swap=on_swap, name="index-watcher")

  @property
  def index_dir(self) -> str:
    return self.root

  def search(self, queries: tf.Tensor, k: int) -> SearchResult:
    current = self.current  # one read: a concurrent swap cannot split this search
    if current is None:
      raise RuntimeError(f"{self.root}: no index loaded yet; call wait_until_ready()")
    return current[1].search(queries, k)
