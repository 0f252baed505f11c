"""Exact MIPS: one matmul and top_k. The reference for recall, and the right backend
in-graph on TPU/GPU and for corpora that fit in accelerator memory."""
import numpy as np
import tensorflow as tf

from realm_tf.retrieval.searcher import Searcher, SearchResult


class ExactSearcher(Searcher):
  """Scores every block; embeddings [N, P] float32 (or float16, computed in float32)."""

  def __init__(self, embeddings, block_ids=None, name: str = "exact_searcher"):
    super().__init__(name=name)
    embeddings = np.asarray(embeddings)
    if embeddings.ndim != 2:
      raise ValueError(f"embeddings must be [N, P], got shape {embeddings.shape}")
    if block_ids is None:
      block_ids = np.arange(embeddings.shape[0], dtype=np.int64)
    block_ids = np.asarray(block_ids, np.int64)
    if block_ids.shape != (embeddings.shape[0],):
      raise ValueError(f"block_ids {block_ids.shape} do not match embeddings "
                       f"{embeddings.shape}")
    self._num_blocks, self._dimension = embeddings.shape
    # Variables rather than constants: a SavedModel stores them once, in its checkpoint.
    self.embeddings = tf.Variable(embeddings, trainable=False, name="embeddings")
    self.block_ids = tf.Variable(block_ids, trainable=False, name="block_ids")

  @property
  def num_blocks(self) -> int:
    return self._num_blocks

  @property
  def dimension(self) -> int:
    return self._dimension

  def search(self, queries: tf.Tensor, k: int) -> SearchResult:
    k = self._check_k(k)
    queries = tf.cast(queries, tf.float32)
    scores = tf.matmul(queries, tf.cast(self.embeddings, tf.float32),
                       transpose_b=True)  # [Q, N]
    top = tf.math.top_k(scores, k=k)  # [Q, k]
    return SearchResult(tf.gather(self.block_ids, top.indices), top.values)
