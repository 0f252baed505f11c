"""Search over many shards: each shard's top-k, merged into the global top-k."""
from typing import Sequence

import tensorflow as tf

from realm_tf.retrieval.searcher import Searcher, SearchResult


class ShardedSearcher(Searcher):
  """Exact merge: the global top-k is always within the union of per-shard top-ks.

  Args:
    shards: the per-shard Searchers (same embedding dimension).
    name: the tf.Module's name.

  Raises:
    ValueError: no shards, or shards of different dimensions.
  """

  def __init__(self, shards: Sequence[Searcher], name: str = "sharded_searcher"):
    super().__init__(name=name)
    if not shards:
      raise ValueError("ShardedSearcher needs at least one shard")
    dims = {s.dimension for s in shards}
    if len(dims) != 1:
      raise ValueError(f"shards disagree on the embedding dimension: {sorted(dims)}")
    self.shards = list(shards)

  @property
  def num_blocks(self) -> int:
    """N, the blocks of every shard."""
    return sum(s.num_blocks for s in self.shards)

  @property
  def dimension(self) -> int:
    """P, the shards' embedding width."""
    return self.shards[0].dimension

  def search(self, queries: tf.Tensor, k) -> SearchResult:
    """Each shard's top-k of `queries` [Q, P], merged; see Searcher.search (k may be a
    scalar int32 tensor where the shards take one)."""
    k = self._check_k(k)
    results = [shard.search(queries, k) for shard in self.shards]
    if len(results) == 1:
      return results[0]
    ids = tf.concat([r.block_ids for r in results], axis=1)  # [Q, sum of per-shard k]
    scores = tf.concat([r.scores for r in results], axis=1)  # [Q, sum of per-shard k]
    top = tf.math.top_k(scores, k=k)  # [Q, k]
    return SearchResult(tf.gather(ids, top.indices, batch_dims=1), top.values)
