"""The one interface every MIPS backend implements."""
import abc
from typing import NamedTuple, Optional

import tensorflow as tf


class SearchResult(NamedTuple):
  """Top-k blocks per query, best first: the one result type of every search."""
  block_ids: tf.Tensor  # [Q, k] int64
  scores: tf.Tensor  # [Q, k] float32 inner products
  # [Q, k] int32 rows of the KnowledgeIndex that searched (ascending block id order), where
  # its blocks' inputs and embeddings are gathered; None from a bare Searcher.
  rows: Optional[tf.Tensor] = None


class Searcher(tf.Module, abc.ABC):
  """search(queries [Q, P], k) → SearchResult over one committed index export.

  The backends behind KnowledgeIndex's host search (ScaNN on the host CPU, called from the
  training step; the in-step default is KnowledgeIndex's own sharded exact MIPS) and behind
  the serving exports (exact, or ScaNN's TF ops inside the SavedModel). TF ops only, so a
  searcher runs inside a tf.function and is saved with a SavedModel."""

  @property
  @abc.abstractmethod
  def num_blocks(self) -> int:
    """How many blocks the searcher covers."""

  @property
  @abc.abstractmethod
  def dimension(self) -> int:
    """Embedding size P."""

  @abc.abstractmethod
  def search(self, queries: tf.Tensor, k: int) -> SearchResult:
    """The k blocks with the largest inner product with each query.

    Args:
      queries: [Q, P] float query embeddings.
      k: blocks per query; more than num_blocks gives num_blocks.

    Returns:
      SearchResult(block_ids [Q, k] int64, scores [Q, k] float32), best first.

    Raises:
      ValueError: k < 1.
    """

  def _check_k(self, k):
    """k, at most num_blocks. A scalar int32 tensor (a count chosen per request, e.g. the
    candidates a served index re-scores) is clipped in graph; its caller checked it."""
    if isinstance(k, tf.Tensor):
      return tf.minimum(k, self.num_blocks)
    if k < 1:
      raise ValueError(f"k must be positive, got {k}")
    return min(k, self.num_blocks)
