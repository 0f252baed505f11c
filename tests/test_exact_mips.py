"""exact_top_k: the in-graph exact MIPS kernel every replica runs on its index shard."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf.retrieval import ExactSearcher
from realm_tf.retrieval.exact import exact_top_k


def _reference(queries, embeddings, k):
  """NumPy top-k: scores descending, equal scores by ascending row (a stable argsort)."""
  scores = queries.astype(np.float64) @ embeddings.astype(np.float64).T
  order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
  return np.take_along_axis(scores, order, axis=1), order


def _tied(num_rows, num_queries=5, dim=6, seed=0):
  """Small-integer vectors: many exactly equal scores, all exact in float32."""
  rng = np.random.default_rng(seed)
  embeddings = rng.integers(-1, 2, size=(num_rows, dim)).astype(np.float32)
  queries = rng.integers(-1, 2, size=(num_queries, dim)).astype(np.float32)
  return queries, embeddings


@pytest.mark.parametrize("num_rows,k,chunk_size,group_size", [
    (300, 10, 64, 8),     # several chunks, ties across chunk and group boundaries
    (301, 7, 64, 8),      # N not a multiple of the chunk: ragged tail
    (299, 7, 64, 8),      # tail not a multiple of the group: padded last group
    (200, 200, 32, 8),    # k = N: every row, in tie order
    (40, 30, 16, 8),      # k larger than the number of groups
    (5, 3, None, None),   # N smaller than one group
    (1, 1, None, None),
])
def test_equals_numpy_stable_argsort(num_rows, k, chunk_size, group_size):
  queries, embeddings = _tied(num_rows)
  kwargs = dict(chunk_size=chunk_size)
  if group_size is not None:
    kwargs["group_size"] = group_size
  scores, indices = exact_top_k(tf.constant(queries), tf.constant(embeddings), k, **kwargs)
  want_scores, want_indices = _reference(queries, embeddings, k)
  assert indices.dtype == tf.int32 and scores.dtype == tf.float32
  assert indices.shape == (len(queries), k)
  np.testing.assert_array_equal(indices.numpy(), want_indices)
  np.testing.assert_array_equal(scores.numpy(), want_scores.astype(np.float32))


def test_real_valued_vectors_over_many_chunks():
  rng = np.random.default_rng(1)
  embeddings = rng.normal(size=(5000, 16)).astype(np.float32)
  queries = rng.normal(size=(8, 16)).astype(np.float32)
  scores, indices = exact_top_k(queries, embeddings, 10, chunk_size=512)
  want_scores, want_indices = _reference(queries, embeddings, 10)
  np.testing.assert_array_equal(indices.numpy(), want_indices)
  np.testing.assert_allclose(scores.numpy(), want_scores, rtol=1e-5, atol=1e-5)


def test_bfloat16_embeddings_score_in_float32():
  rng = np.random.default_rng(2)
  embeddings = rng.normal(size=(700, 16)).astype(np.float32)
  queries = rng.normal(size=(6, 16)).astype(np.float32)
  bf16 = tf.cast(embeddings, tf.bfloat16)
  scores, indices = exact_top_k(queries, bf16, 10, chunk_size=128)
  assert scores.dtype == tf.float32
  # Against the float32 vectors: equal up to bfloat16's 8-bit mantissa.
  want_scores, _ = _reference(queries, embeddings, 10)
  np.testing.assert_allclose(scores.numpy(), want_scores, rtol=0.02, atol=0.05)
  # Against the bfloat16 values themselves: the same rows, scores to float32 rounding
  # (a bfloat16 accumulation would be off by far more).
  rounded = tf.cast(bf16, tf.float32).numpy()
  want_scores, want_indices = _reference(queries, rounded, 10)
  np.testing.assert_array_equal(indices.numpy(), want_indices)
  np.testing.assert_allclose(scores.numpy(), want_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("query_count", [5, None])  # static, or known only at run time
def test_compiles_with_xla_on_one_device(query_count):
  queries, embeddings = _tied(301)
  search = tf.function(
      lambda q, e: exact_top_k(q, e, 9, chunk_size=64, group_size=8), jit_compile=True,
      input_signature=[tf.TensorSpec([query_count, 6], tf.float32),
                       tf.TensorSpec([301, 6], tf.float32)])
  with tf.device("/CPU:0"):
    scores, indices = search(tf.constant(queries), tf.constant(embeddings))
  want_scores, want_indices = _reference(queries, embeddings, 9)
  np.testing.assert_array_equal(indices.numpy(), want_indices)
  np.testing.assert_array_equal(scores.numpy(), want_scores.astype(np.float32))


def test_runs_per_replica_shard_in_strategy_run(mirrored_strategy):
  """Each replica searches its own shard; merging the shards' top-k is the global top-k."""
  queries, embeddings = _tied(2 * 150, seed=3)
  shard_rows = 150
  with mirrored_strategy.scope():
    shards = tf.Variable(embeddings.reshape(2, shard_rows, -1), trainable=False)

  @tf.function
  def search(q):
    def replica_fn(q):
      replica = tf.distribute.get_replica_context().replica_id_in_sync_group
      scores, rows = exact_top_k(q, shards[replica], 8, chunk_size=64,
                                 group_size=8)
      return scores, rows + replica * shard_rows
    return mirrored_strategy.run(replica_fn, args=(q,))

  per_replica = search(tf.constant(queries))
  scores = np.concatenate([t.numpy() for t in mirrored_strategy.experimental_local_results(
      per_replica[0])], axis=1)
  rows = np.concatenate([t.numpy() for t in mirrored_strategy.experimental_local_results(
      per_replica[1])], axis=1)
  # Global merge as the knowledge index does it: shard 0's candidates come first, so a
  # stable sort by score keeps ties in row order.
  order = np.argsort(-scores, axis=1, kind="stable")[:, :8]
  want_scores, want_indices = _reference(queries, embeddings, 8)
  np.testing.assert_array_equal(np.take_along_axis(rows, order, axis=1), want_indices)
  np.testing.assert_array_equal(np.take_along_axis(scores, order, axis=1), want_scores)


@pytest.mark.parametrize("k", [0, -1, 41, 2.5, True, np.float32(3)])
def test_bad_k_is_a_clear_error(k):
  queries, embeddings = _tied(40)
  with pytest.raises(ValueError, match=r"k must be an int in \[1, 40\]"):
    exact_top_k(queries, embeddings, k)


def test_shape_errors_are_clear():
  queries, embeddings = _tied(40)
  with pytest.raises(ValueError, match=r"queries must be \[Q, 6\]"):
    exact_top_k(queries[:, :5], embeddings, 3)
  dynamic = tf.function(lambda e: exact_top_k(queries, e, 3),
                        input_signature=[tf.TensorSpec([None, 6], tf.float32)])
  with pytest.raises(ValueError, match="static shape"):
    dynamic.get_concrete_function()


def test_exact_searcher_keeps_its_api_with_bfloat16_embeddings():
  queries, embeddings = _tied(100, seed=4)
  block_ids = np.arange(1000, 1100, dtype=np.int64)
  searcher = ExactSearcher(tf.cast(embeddings, tf.bfloat16).numpy(), block_ids)
  assert searcher.embeddings.dtype == tf.bfloat16
  assert (searcher.num_blocks, searcher.dimension) == (100, 6)
  result = searcher.search(tf.constant(queries), 500)  # the Searcher contract caps k at N
  want_scores, want_indices = _reference(queries, embeddings, 100)
  assert result.block_ids.dtype == tf.int64
  np.testing.assert_array_equal(result.block_ids.numpy(), block_ids[want_indices])
  np.testing.assert_array_equal(result.scores.numpy(), want_scores)
