"""The one interface every MIPS backend implements."""
import abc
from typing import NamedTuple

import tensorflow as tf


class SearchResult(NamedTuple):
  """Top-k blocks per query, best first."""
  block_ids: tf.Tensor  # [Q, k] int64
  scores: tf.Tensor  # [Q, k] float32 inner products


class Searcher(tf.Module, abc.ABC):
  """search(queries [Q, P], k) → SearchResult; TF ops only, so it runs in a tf.function
  (the host input pipeline of a TPU job, a training step) and inside a SavedModel."""

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
    """The k blocks with the largest inner product with each query."""

  def _check_k(self, k: int) -> int:
    if k < 1:
      raise ValueError(f"k must be positive, got {k}")
    return min(k, self.num_blocks)
