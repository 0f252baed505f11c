"""ScaNN through its TensorFlow ops, so a searcher lives in a graph and in a SavedModel."""
import dataclasses
import math
from typing import Optional

import numpy as np
import tensorflow as tf
from scann.scann_ops.py import scann_ops
from scann.scann_ops.py.scann_builder import ReorderType

from realm_tf.retrieval.searcher import Searcher, SearchResult

# ScaNN's guidance by dataset size: brute force below ~20k points, asymmetric hashing
# (AH) + exact reordering below ~100k, partitioning tree + AH + reordering above.
BRUTE_FORCE_BELOW = 20_000
TREE_ABOVE = 100_000
REORDER_TYPES = {"float32": ReorderType.FLOAT32, "int8": ReorderType.INT8,
                 "bfloat16": ReorderType.BFLOAT16}


@dataclasses.dataclass
class ScannParams:
  """How one shard's ScaNN searcher is built (all overridable).

  reorder_dtype: the data the candidates are re-scored with (and brute force scores with):
  'int8' by default ('float32' for brute force, scann_params_for), 'float32' or
  'bfloat16'. Why int8: a served searcher holds its
  reordering data twice (the state's variables and the searcher its op builds from them),
  and float32 data is 512 bytes a block at P = 128, 6.4 GiB twice at REALM's 13,353,718
  blocks; int8 is a quarter of it (benchmarks/scann_scale.py measures both, and the recall
  each gives). The served scores (p(z|x)'s logits in a ScaNN export) are then int8 inner
  products, not float32 ones.
  reorder_num_neighbors: candidates re-scored; 0 keeps asymmetric hashing's scores (no
  reordering, as the REALM authors' searcher).
  anisotropic_quantization_threshold: None is ScaNN's own default (no anisotropic loss).
  """
  mode: str  # 'brute_force', 'ah_reorder' or 'tree_ah_reorder'
  num_leaves: int = 0
  num_leaves_to_search: int = 0
  dimensions_per_block: int = 2
  anisotropic_quantization_threshold: Optional[float] = 0.2
  reorder_num_neighbors: int = 100
  reorder_dtype: str = "int8"
  training_sample_size: int = 100_000

  def to_dict(self) -> dict:
    """The parameters as a JSON-serialisable dict (recorded in shard.json and manifests)."""
    return dataclasses.asdict(self)


def scann_params_for(num_points: int, **overrides) -> ScannParams:
  """ScaNN's recommended configuration for a shard of `num_points` vectors.

  Args:
    num_points: the shard's number of vectors.
    **overrides: ScannParams fields to set instead (a `mode` given here picks that
      mode's defaults for the size).

  Returns:
    brute force in float32 for small shards (exact scores; their data is small), asymmetric
    hashing with int8 reordering for mid-sized ones, and a tree (about sqrt(N) leaves,
    1/20 searched) above.
  """
  mode = overrides.get("mode") or ("brute_force" if num_points < BRUTE_FORCE_BELOW else
                                   "ah_reorder" if num_points < TREE_ABOVE else
                                   "tree_ah_reorder")
  if mode == "brute_force":
    params = ScannParams(mode=mode, reorder_dtype="float32")
  elif mode == "tree_ah_reorder":
    leaves = max(1, int(round(math.sqrt(num_points))))
    params = ScannParams(mode=mode, num_leaves=leaves,
                         num_leaves_to_search=max(1, leaves // 20),
                         training_sample_size=min(num_points, 250_000))
  else:
    params = ScannParams(mode=mode)
  return dataclasses.replace(params, **overrides)


def build_scann(embeddings: np.ndarray, params: ScannParams, num_neighbors: int = 10):
  """A scann_ops searcher over `embeddings` [N, P] float32, by dot product.

  Args:
    embeddings: [N, P] vectors.
    params: how to build it (scann_params_for).
    num_neighbors: the searcher's default number of neighbours.

  Returns:
    A scann_ops.ScannSearcher.

  Raises:
    ValueError: an unknown params.mode.
  """
  embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
  n = embeddings.shape[0]
  if params.reorder_dtype not in REORDER_TYPES:
    raise ValueError(f"reorder_dtype must be one of {sorted(REORDER_TYPES)}, got "
                     f"{params.reorder_dtype!r}")
  if params.reorder_num_neighbors < 0:
    raise ValueError(f"reorder_num_neighbors must be >= 0, got {params.reorder_num_neighbors}")
  reorder_type = REORDER_TYPES[params.reorder_dtype]
  threshold = params.anisotropic_quantization_threshold
  threshold = float("nan") if threshold is None else threshold
  builder = scann_ops.builder(embeddings, num_neighbors, "dot_product")
  if params.mode == "brute_force":
    return builder.score_brute_force(quantize=reorder_type).build()
  if params.mode == "tree_ah_reorder":
    builder = builder.tree(num_leaves=min(params.num_leaves, n),
                           num_leaves_to_search=min(params.num_leaves_to_search, n),
                           training_sample_size=min(params.training_sample_size, n))
  elif params.mode != "ah_reorder":
    raise ValueError(f"unknown ScaNN mode {params.mode!r}")
  builder = builder.score_ah(
      params.dimensions_per_block, anisotropic_quantization_threshold=threshold,
      training_sample_size=min(params.training_sample_size, n))
  if params.reorder_num_neighbors:
    builder = builder.reorder(params.reorder_num_neighbors, quantize=reorder_type)
  return builder.build()


def release(searcher: scann_ops.ScannSearcher) -> None:
  """Frees a searcher that scann_ops' builder made.

  Why: the builder registers its searcher under a unique shared name in TensorFlow's
  resource manager, where it stays (dataset copy included) for the life of the process
  once its Python object is gone; a process building shard after shard would hold them
  all. Call once the searcher is no longer used (its serialised state is independent)."""
  tf.raw_ops.DestroyResourceOp(resource=searcher.searcher_handle, ignore_lookup_error=True)


class ScannSearcher(Searcher):
  """One shard: a ScaNN searcher, its block ids, optionally the float embeddings for exact
  re-scoring of the candidates ScaNN returns.

  Args:
    searcher: the scann_ops searcher (build_scann, or one deserialised from an export).
    block_ids: [N] int64 ids of its rows.
    dimension: P.
    rescore_embeddings: [N, P] float32 to re-score candidates exactly; None: ScaNN's
      scores.
    num_leaves_to_search: overrides the searcher's leaves per query (tree mode).
    name: the tf.Module's name.
  """

  def __init__(self, searcher: scann_ops.ScannSearcher, block_ids, dimension: int,
               rescore_embeddings: Optional[np.ndarray] = None,
               num_leaves_to_search: Optional[int] = None, name: str = "scann_searcher"):
    super().__init__(name=name)
    self._searcher = searcher
    block_ids = np.asarray(block_ids, np.int64)
    self._num_blocks = int(block_ids.shape[0])
    self._dimension = dimension
    self._leaves = num_leaves_to_search
    self.block_ids = tf.Variable(block_ids, trainable=False, name="block_ids")
    self.rescore_embeddings = None
    if rescore_embeddings is not None:
      self.rescore_embeddings = tf.Variable(rescore_embeddings, trainable=False,
                                            name="rescore_embeddings")

  @classmethod
  def build(cls, embeddings: np.ndarray, block_ids=None, params: Optional[ScannParams] = None,
            rescore: bool = False, **kwargs) -> "ScannSearcher":
    """Builds a ScaNN searcher over `embeddings` [N, P] (block ids default to 0..N-1).

    `params` defaults to scann_params_for(N); `rescore` keeps the embeddings for exact
    re-scoring; other keyword arguments go to the constructor.
    """
    embeddings = np.asarray(embeddings, np.float32)
    if block_ids is None:
      block_ids = np.arange(embeddings.shape[0], dtype=np.int64)
    params = params or scann_params_for(embeddings.shape[0])
    return cls(build_scann(embeddings, params), block_ids, embeddings.shape[1],
               rescore_embeddings=embeddings if rescore else None, **kwargs)

  @property
  def num_blocks(self) -> int:
    """N, the blocks searched."""
    return self._num_blocks

  @property
  def dimension(self) -> int:
    """P, the embedding width."""
    return self._dimension

  def serialize_to_module(self) -> tf.Module:
    """ScaNN's own state module, to be saved with tf.saved_model.save."""
    return self._searcher.serialize_to_module()

  # Plain TensorFlow calls, no tensor-dependent Python: autograph's conversion of it in a
  # saved QA module's trace failed, calling another method's converted code (TypeError).
  @tf.autograph.experimental.do_not_convert
  def search(self, queries: tf.Tensor, k: int, overfetch: int = 4) -> SearchResult:
    """Approximate top-k of `queries` [Q, P]; see Searcher.search.

    With rescore_embeddings, k * overfetch candidates are fetched and re-scored exactly.
    """
    k = self._check_k(k)
    queries = tf.cast(queries, tf.float32)
    fetch = min(k * overfetch, self.num_blocks) if self.rescore_embeddings is not None else k
    indices, scores = self._searcher.search_batched(
        queries, final_num_neighbors=fetch, leaves_to_search=self._leaves)  # [Q, fetch]
    indices = tf.cast(indices, tf.int64)
    if self.rescore_embeddings is not None:
      candidates = tf.gather(self.rescore_embeddings, tf.maximum(indices, 0))  # [Q, fetch, P]
      scores = tf.einsum("qp,qfp->qf", queries, tf.cast(candidates, tf.float32))
    # ScaNN pads with index -1 when it finds fewer than asked: rank those last.
    scores = tf.where(indices >= 0, scores, tf.float32.min)
    top = tf.math.top_k(scores, k=k)  # [Q, k]
    local = tf.gather(indices, top.indices, batch_dims=1)
    return SearchResult(tf.gather(self.block_ids, tf.maximum(local, 0)), top.values)
