"""Exact MIPS in the graph: `exact_top_k`, and `ExactSearcher` built on it.

Exact search is the reference for recall, and the right backend in-graph on TPU/GPU and
for corpora that fit in accelerator memory (the knowledge index shards block embeddings
across replicas and calls `exact_top_k` on each shard).
"""
import numpy as np
import tensorflow as tf

from realm_tf.retrieval.searcher import Searcher, SearchResult

# Rows per score group. Stage 1 keeps only the maximum score of each group of this many
# consecutive rows, so the first top-k runs over N / 32 group maxima instead of N scores,
# and stage 2 rescores only k groups (k * 32 rows) per query. Measured on 1M x 128,
# batches of 256, k = 10 (2 cores): 32 beat 16, 64 and 128 by 25% or more.
GROUP_SIZE = 32

# Rows scored per loop iteration: a [Q, 32768] float32 score block (32 MB at Q = 256) is
# produced, reduced to group maxima and dropped, so [Q, N] never exists at once (1 GB at
# 256 x 1M). 16K to 128K rows run within 2% of each other on CPU (the matmul dominates);
# 32K keeps the transient small while the per-iteration overhead stays negligible.
DEFAULT_CHUNK_SIZE = 32768


def exact_top_k(queries, embeddings, k: int, *, chunk_size: int | None = None,
                group_size: int = GROUP_SIZE):
  """The k rows of `embeddings` with the largest inner product with each query.

  Why not `tf.math.top_k(queries @ embeddings.T, k)`: on CPU the top_k over a [Q, N]
  score matrix costs more than the matmul itself, and the matrix is Q * N * 4 bytes.
  This kernel is exact in two stages instead:
    1. in row chunks, score a chunk and keep only the maximum of each group of
       `group_size` consecutive rows (N / group_size maxima per query overall);
    2. take the top-k groups by maximum, rescore just their rows (k * group_size per
       query) and take the top-k of those.
  Stage 2 cannot miss a result: a row in the true top-k whose group was not picked would
  be beaten by the best rows of k picked groups, k distinct rows at least as good, ties
  included, since groups are contiguous and both top_k calls prefer the lower index.

  Static shapes throughout (a tf.while_loop with a fixed trip count over full chunks and
  a statically sliced tail), so it runs in a tf.function, in a tf.distribute replica
  context and under `jit_compile=True`. `tf.math.approx_max_k` is not used: it is
  approximate on TPU by design, which would make "exact" a property of the device.

  Plain graph or XLA: both give the same results and, on CPU at 1M x 128, about the same
  speed, several times the full-matrix top_k's (benchmarks/results/train_step.md). The caller
  decides: ExactSearcher.search does not ask for XLA (it also runs in host input
  pipelines and SavedModels, where a compile per query shape buys nothing), while a
  train step compiled with jit_compile=True, as on TPU, compiles it with the step.

  Embeddings held in a variable: do not tf.gather rows of that variable itself anywhere
  (gather from `tf.convert_to_tensor(variable)` instead). A ResourceGather switches the
  variable to copy-on-read for good, after which every read copies all of it: 27 ms per
  read of a 1M x 128 float32 variable here, once per call of this function.

  Args:
    queries: [Q, P] float tensor (cast to float32).
    embeddings: [N, P] float32 or bfloat16 tensor or variable with a static shape;
      scores are accumulated in float32 whatever its dtype.
    k: Python int, 1 <= k <= N.
    chunk_size: rows scored per loop iteration (rounded down to a multiple of
      `group_size`); None picks DEFAULT_CHUNK_SIZE.
    group_size: rows per group maximum in stage 1.

  Returns:
    (scores [Q, k] float32, indices [Q, k] int32) best first; equal scores are ordered
    by ascending row index. Scores of stage 2 are recomputed, so a row whose score
    differs from a picked one only by float32 rounding can swap with it (as with any
    two matmul kernels); there is no other approximation.

  Raises:
    ValueError: k is not an int in [1, N], or shapes are not static and matching.
  """
  # One read of a variable, then plain tensor ops only. Slicing the variable in the
  # loop and gathering stage 2's rows from it (ResourceGather) would put it in
  # copy-on-read mode, so that each of the loop's reads copies all N x P values (4x slower
  # at 1M x 128).
  embeddings = tf.convert_to_tensor(embeddings)
  queries = tf.cast(tf.convert_to_tensor(queries), tf.float32)
  if embeddings.shape.rank != 2 or not embeddings.shape.is_fully_defined():
    raise ValueError(f"embeddings must be [N, P] with a static shape, got "
                     f"{embeddings.shape}")
  num_rows, dim = embeddings.shape
  if queries.shape.rank != 2 or queries.shape[1] != dim:
    raise ValueError(f"queries must be [Q, {dim}] to match embeddings [{num_rows}, {dim}], "
                     f"got {queries.shape}")
  if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= num_rows:
    raise ValueError(f"k must be an int in [1, {num_rows}] (the number of embedding rows), "
                     f"got {k!r}")
  k = int(k)
  if group_size < 1:
    raise ValueError(f"group_size must be positive, got {group_size}")
  group = min(int(group_size), num_rows)
  chunk = DEFAULT_CHUNK_SIZE if chunk_size is None else int(chunk_size)
  if chunk < 1:
    raise ValueError(f"chunk_size must be positive, got {chunk_size}")
  chunk = max(group, chunk // group * group)
  chunk = min(chunk, num_rows // group * group)  # >= group since group <= num_rows
  num_chunks = num_rows // chunk
  tail_start = num_chunks * chunk
  neg_inf = tf.constant(float("-inf"), tf.float32)

  # Stage 1 scores rows-major, [rows, Q]: the group maximum is then an elementwise max
  # over `group` contiguous [Q] vectors, which vectorises well, and XLA:CPU runs the whole
  # kernel about 1.8x faster than with [Q, rows] and an inner-axis reduction of 32.
  def group_maxima(rows):
    """rows [R, P] -> [ceil(R / group), Q]: the best score in each group of rows."""
    scores = tf.matmul(tf.cast(rows, tf.float32), queries, transpose_b=True)  # [R, Q]
    num = rows.shape[0]
    padding = -num % group
    if padding:  # Only the tail can be ragged; -inf never wins a max.
      scores = tf.pad(scores, [[0, padding], [0, 0]], constant_values=neg_inf)
    scores = tf.reshape(scores, [(num + padding) // group, group, -1])  # [G, group, Q]
    return tf.reduce_max(scores, axis=1)  # [G, Q]

  def chunk_body(i, maxima_array):
    rows = tf.slice(embeddings, tf.stack([i * chunk, 0]), [chunk, dim])  # [chunk, P]
    return i + 1, maxima_array.write(i, group_maxima(rows))

  maxima_array = tf.TensorArray(tf.float32, size=num_chunks, element_shape=tf.TensorShape(
      [chunk // group, queries.shape[0]]))
  _, maxima_array = tf.while_loop(
      lambda i, _: i < num_chunks, chunk_body, (tf.constant(0), maxima_array),
      maximum_iterations=num_chunks)
  maxima = maxima_array.stack()  # [num_chunks, chunk / group, Q]
  maxima = tf.reshape(maxima, [num_chunks * (chunk // group), -1])  # [G_full, Q]
  if tail_start < num_rows:
    maxima = tf.concat([maxima, group_maxima(embeddings[tail_start:])], axis=0)  # [G, Q]
  maxima = tf.transpose(maxima)  # [Q, G]
  num_groups = -(-num_rows // group)

  # Stage 2. Picked groups are sorted by index so candidate positions follow row order and
  # the final top_k (which prefers the lower position on ties) prefers the lower row.
  _, best_groups = tf.math.top_k(maxima, k=min(k, num_groups))  # [Q, g]
  best_groups = tf.sort(best_groups, axis=1)
  candidates = (best_groups[:, :, tf.newaxis] * group
                + tf.range(group, dtype=tf.int32))  # [Q, g, group]
  candidates = tf.reshape(candidates, [-1, best_groups.shape[1] * group])  # [Q, g * group]
  is_row = candidates < num_rows  # False only past the end of a ragged last group
  rows = tf.gather(embeddings, tf.minimum(candidates, num_rows - 1))  # [Q, g * group, P]
  scores = tf.einsum("qp,qcp->qc", queries, tf.cast(rows, tf.float32))  # [Q, g * group]
  scores = tf.where(is_row, scores, neg_inf)
  top = tf.math.top_k(scores, k=k)  # [Q, k]
  return top.values, tf.gather(candidates, top.indices, batch_dims=1)


class ExactSearcher(Searcher):
  """Scores every block with `exact_top_k` (the Searcher interface; saved with a SavedModel).

  Args:
    embeddings: [N, P] float32, bfloat16 or float16 (other dtypes become float32); an
      array, tensor or variable.
    block_ids: [N] int64 ids of the rows (default: 0..N-1).
    name: the tf.Module's name.

  Raises:
    ValueError: embeddings are not [N, P], or block_ids not [N].
  """

  def __init__(self, embeddings, block_ids=None, name: str = "exact_searcher"):
    super().__init__(name=name)
    if isinstance(embeddings, (tf.Tensor, tf.Variable)):
      embeddings = embeddings.numpy()
    embeddings = np.asarray(embeddings)
    if embeddings.ndim != 2:
      raise ValueError(f"embeddings must be [N, P], got shape {embeddings.shape}")
    if block_ids is None:
      block_ids = np.arange(embeddings.shape[0], dtype=np.int64)
    block_ids = np.asarray(block_ids, np.int64)
    if block_ids.shape != (embeddings.shape[0],):
      raise ValueError(f"block_ids {block_ids.shape} do not match embeddings "
                       f"{embeddings.shape}")
    if embeddings.dtype not in (np.float32, np.float16, tf.bfloat16.as_numpy_dtype):
      embeddings = embeddings.astype(np.float32)
    self._num_blocks, self._dimension = embeddings.shape
    # Variables rather than constants: a SavedModel stores them once, in its checkpoint.
    self.embeddings = tf.Variable(embeddings, trainable=False, name="embeddings")
    self.block_ids = tf.Variable(block_ids, trainable=False, name="block_ids")

  @property
  def num_blocks(self) -> int:
    """N, the blocks searched."""
    return self._num_blocks

  @property
  def dimension(self) -> int:
    """P, the embedding width."""
    return self._dimension

  def search(self, queries: tf.Tensor, k: int) -> SearchResult:
    """Exact top-k of `queries` [Q, P]; see Searcher.search (rows is None)."""
    k = self._check_k(k)  # The Searcher contract clamps k to num_blocks.
    scores, rows = exact_top_k(queries, self.embeddings, k)
    # Gathers from the read value, not the variable: see exact_top_k on copy-on-read.
    block_ids = tf.gather(tf.convert_to_tensor(self.block_ids), rows)  # [Q, k]
    return SearchResult(block_ids, scores)
