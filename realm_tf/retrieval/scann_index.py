"""ScaNN, in one module: how a shard's searcher is built, saved and loaded, and how it is
searched, on the host or inside a served graph, with options chosen per call.

  build     ScannParams / scann_params_for (the shipped configuration by shard size),
            build_scann, release, scann_state (build → serialise → release);
  shards    ScannShard: a searcher's state (what `scann/` of an index shard holds) and
            its block ids; build_shards (in memory, shard by shard), load_shard (an
            index shard's saved `scann/`); ShardLayout, what the state's ScaNN config
            says a search may change;
  search    ScannSearcher (one shard, a Searcher), host_searcher (its handle made
            eagerly: training's host search, benchmarks) and graph_searcher (handles made
            in the served graph: ScannHandle, bound_handles);
  options   SearchOptions, searching_with, check_search_options: the fraction of each
            shard's leaves searched and the candidates reordered, per call, without
            rebuilding a shard (ScaNN's search op takes both as inputs).

Everything searches through ScaNN's TensorFlow ops, so a searcher lives in a graph and in a
SavedModel. Their builder cannot build SOAR (spilled assignments): a model server with
ScaNN's ops could not serve it, so it is not offered.
"""
import contextlib
import dataclasses
import math
import threading
from typing import NamedTuple, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
from scann.proto import scann_pb2
from scann.scann_ops.py import scann_ops
from scann.scann_ops.py.scann_builder import ReorderType

from realm_tf.retrieval.row_blocks import block_bounds, gather_rows
from realm_tf.retrieval.searcher import Searcher, SearchResult
from realm_tf.retrieval.sharded import ShardedSearcher

# ScaNN's guidance by dataset size: brute force below ~20k points, asymmetric hashing
# (AH) + exact reordering below ~100k, partitioning tree + AH + reordering above.
BRUTE_FORCE_BELOW = 20_000
TREE_ABOVE = 100_000
# A tree's leaves searched by default (it has about sqrt(N) leaves). The design: the
# smallest round fraction whose recall@5 against exact search meets the target
# (benchmarks.released_scale's TARGETS) while the search stays a small part of exact
# search's time, read from the recall curves at full-size shards of embeddings generated
# to match real ones (benchmarks/results/synthetic_embeddings.md) and at REALM's full
# index (benchmarks/results/released_scale.md, which says whether the target is met with
# what a ScaNN export serves). A served request can ask for fewer or more leaves
# (answer_with_search_options) without a rebuild.
SEARCHED_LEAVES_FRACTION = 0.2
# The most candidates a request may ask to have re-scored (reorder_num_neighbors): a
# re-scoring export gathers [questions, candidates, P] embeddings per request, so the
# bound keeps one request from taking the server's memory; far above any default
# (served_index.RESCORED_PER_NEIGHBOUR per neighbour, a shard's reorder_num_neighbors).
MAX_REORDER_NUM_NEIGHBORS = 10_000
# The ops of ScaNN's TensorFlow library (scann/scann_ops/cc/_scann_ops.so) a served graph
# uses: a handle made from a saved state, then a batched search. No stock
# tensorflow_model_server registers them; a ScaNN-enabled build links them (deploy/README.md),
# and the export check (realm_tf.export.model_server_ops) allows exactly these beyond its
# stock list.
SERVED_SCANN_OPS = frozenset({"Scann>TensorsToScann", "Scann>ScannSearchBatched"})
REORDER_TYPES = {"float32": ReorderType.FLOAT32, "int8": ReorderType.INT8,
                 "bfloat16": ReorderType.BFLOAT16}


@dataclasses.dataclass
class ScannParams:
  """How one shard's ScaNN searcher is built (all overridable).

  reorder_dtype: the data the candidates are re-scored with (and brute force scores with):
  'int8' by default ('float32' for brute force, scann_params_for), 'float32' or
  'bfloat16'. Why int8: a searcher holds its reordering data twice (the state's variables
  and the searcher its op builds from them), and float32 data is 4 bytes per dimension and
  block against int8's 1 (benchmarks/scann_scale.py measures both, and the recall each
  gives). ScaNN's own scores are then int8 inner products, not float32 ones; a ScaNN QA
  export re-scores its candidates from embeddings of its own instead and serves the
  shards without this data (without_reordering).
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


# The REALM authors' searcher (ORQA's language/orqa/utils/scann_utils.py,
# load_scann_searcher's defaults): 1,000 leaves, 100 searched, AH with 2 dimensions a
# block and ScaNN's default (isotropic) loss, no reordering. Measured beside the shipped
# configuration (benchmarks.scann_scale, benchmarks.synthetic_embeddings).
AUTHORS_PARAMS = ScannParams(mode="tree_ah_reorder", num_leaves=1000, num_leaves_to_search=100,
                             training_sample_size=100_000, dimensions_per_block=2,
                             anisotropic_quantization_threshold=None,
                             reorder_num_neighbors=0)


def scann_params_for(num_points: int, **overrides) -> ScannParams:
  """ScaNN's recommended configuration for a shard of `num_points` vectors.

  Args:
    num_points: the shard's number of vectors.
    **overrides: ScannParams fields to set instead (a `mode` given here picks that
      mode's defaults for the size).

  Returns:
    brute force in float32 for small shards (exact scores; their data is small), asymmetric
    hashing with int8 reordering for mid-sized ones, and a tree (about sqrt(N) leaves,
    SEARCHED_LEAVES_FRACTION of them searched) above.
  """
  mode = overrides.get("mode") or ("brute_force" if num_points < BRUTE_FORCE_BELOW else
                                   "ah_reorder" if num_points < TREE_ABOVE else
                                   "tree_ah_reorder")
  if mode == "brute_force":
    params = ScannParams(mode=mode, reorder_dtype="float32")
  elif mode == "tree_ah_reorder":
    leaves = max(1, int(round(math.sqrt(num_points))))
    params = ScannParams(mode=mode, num_leaves=leaves,
                         num_leaves_to_search=max(1, int(leaves * SEARCHED_LEAVES_FRACTION)),
                         training_sample_size=min(num_points, 250_000))
  else:
    params = ScannParams(mode=mode)
  return dataclasses.replace(params, **overrides)


def build_scann(embeddings: np.ndarray, params: ScannParams, num_neighbors: int = 10,
                builder=scann_ops.builder):
  """A ScaNN searcher over `embeddings` [N, P] float32, by dot product.

  Args:
    embeddings: [N, P] vectors (a float32 C-ordered array or memmap is not copied here).
    params: how to build it (scann_params_for).
    num_neighbors: the searcher's default number of neighbours.
    builder: scann_ops.builder (a searcher whose state a SavedModel holds), or
      scann_ops_pybind.builder (the same C++ searcher and builder options, not
      serialisable into a graph; it reads a memmap in place, where the TensorFlow builder
      holds a tensor copy beside it).

  Returns:
    The builder's searcher (scann_ops.ScannSearcher for the default).

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
  builder = builder(embeddings, num_neighbors, "dot_product")
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



def scann_state(embeddings: np.ndarray, params: ScannParams) -> tf.Module:
  """A searcher's state over `embeddings` [N, P]: built, serialised, and the built
  searcher released (its state is independent of it).

  The one way a shard's searcher is made, whether it is saved as an index shard's
  `scann/` (index_export.write_shard) or kept in memory (build_shards, ScannSearcher.build).

  Args:
    embeddings: [N, P] float32 vectors.
    params: how to build it (scann_params_for).

  Returns:
    scann_ops.ScannState, a tf.Module (tf.saved_model.save writes it as `scann/`).
  """
  built = build_scann(embeddings, params)
  try:
    return built.serialize_to_module()
  finally:
    release(built)


# --------------------------------------------------------------------------------- shards


@dataclasses.dataclass(frozen=True)
class ShardLayout:
  """What a shard's searcher does per query unless told otherwise, as its ScaNN config
  says: the one record of it that every state carries (an index shard's shard.json
  records the parameters asked for, which build_scann clamps to the shard's size).

  Attributes:
    num_leaves: leaves of its partitioning tree; 0: no tree (every point is scored).
    num_leaves_to_search: leaves searched per query by default (0 without a tree).
    reorder_num_neighbors: candidates re-scored by default; 0: no reordering.
  """
  num_leaves: int
  num_leaves_to_search: int
  reorder_num_neighbors: int

  @classmethod
  def of_state(cls, state: tf.Module) -> "ShardLayout":
    """The layout of a ScannState (or its restored form), from its serialised config."""
    config = _config(state)
    tree = config.HasField("partitioning")
    reorder = config.HasField("exact_reordering")
    return cls(
        num_leaves=config.partitioning.num_children if tree else 0,
        num_leaves_to_search=(config.partitioning.query_spilling.max_spill_centers
                              if tree else 0),
        reorder_num_neighbors=config.exact_reordering.approx_num_neighbors if reorder else 0)


def _config(state: tf.Module) -> scann_pb2.ScannConfig:
  """A ScannState's (or its restored form's) serialised config, parsed."""
  config = scann_pb2.ScannConfig()
  config.ParseFromString(np.asarray(state.scann_config.numpy()).reshape(-1)[0])
  return config


class ScannShard(NamedTuple):
  """One shard: ScaNN's state (what an index shard's `scann/` holds) and the block ids of
  its rows."""
  state: tf.Module  # scann_ops.ScannState (or its restored form)
  block_ids: np.ndarray  # [n] int64

  @property
  def layout(self) -> ShardLayout:
    """What per-call search options can change in this shard (ShardLayout)."""
    return ShardLayout.of_state(self.state)


def without_reordering(shard: ScannShard) -> ScannShard:
  """The shard searched by asymmetric hashing alone: its config without exact reordering
  and its int8 reordering data left out (ScaNN's scalar placeholders instead), with its
  tree, codes and codebook kept. A shard without reordering is returned as it is.

  Why: a QA export that re-scores the candidates from embeddings of its own
  (served_index.RESCORED_PER_NEIGHBOUR) gains little from ScaNN's int8 re-scoring before
  it, whose data a served version holds twice (the restored variables and the searcher
  built from them) where its own float16 copy is held once; benchmarks/results/
  scann_rescoring.md measures recall@5 with and without the int8 step, each re-scored
  from float16, float32 and bfloat16 rows. The index's own shards keep their reordering
  (the trainer's host search uses it).
  """
  s = shard.state
  config = _config(s)
  if not config.HasField("exact_reordering"):
    return shard
  config.ClearField("exact_reordering")
  stripped = scann_ops.ScannState([
      tf.constant([config.SerializeToString()]), s.serialized_partitioner,
      s.datapoint_to_token, s.ah_codebook, s.hashed_dataset,
      tf.zeros([], tf.int8), tf.zeros([], tf.float32),  # int8 dataset, multipliers
      s.dp_norms, s.dataset])
  return ScannShard(stripped, shard.block_ids)


def build_shards(embeddings, block_ids: np.ndarray, rows: Optional[np.ndarray] = None,
                 rows_per_shard: int = 0, **overrides) -> list[ScannShard]:
  """ScaNN states over `rows` of `embeddings`, one shard of at most `rows_per_shard` rows
  at a time: where an index version carries no ScaNN shards, and in benchmarks.

  Why shard by shard: ScaNN's builder copies its dataset more than once, so one searcher
  over all of REALM's blocks needs several times their embeddings in the building
  process, more than a 24 GB machine holds; a shard of ROWS_PER_BLOCK rows needs that for
  its own rows only, and each builder's searcher is released once its state is taken
  (benchmarks/results/released_scale.md records the import's build). The shards are
  searched together and merged (ShardedSearcher).

  Args:
    embeddings: [N, P] in row order (a RowBlocks, or an array or memmap).
    block_ids: [N] int64 ids of those rows.
    rows: the rows to cover (default all), in the order the shards take them.
    rows_per_shard: rows of a shard at most (0: ROWS_PER_BLOCK).
    **overrides: ScannParams fields replacing scann_params_for's choices.

  Returns:
    One ScannShard per piece of `rows`.
  """
  block_ids = np.asarray(block_ids, np.int64)
  rows = np.arange(len(block_ids)) if rows is None else np.asarray(rows, np.int64)
  shards = []
  for start, end in block_bounds(len(rows), rows_per_shard):
    piece = rows[start:end]
    state = scann_state(gather_rows(embeddings, piece),
                        scann_params_for(len(piece), **overrides))
    shards.append(ScannShard(state, block_ids[piece]))
  return shards


def load_shard(directory: str, block_ids: np.ndarray) -> ScannShard:
  """The ScaNN state saved in `directory` (an index shard's `scann/`) and its block ids.

  Args:
    directory: the state's SavedModel.
    block_ids: [n] int64 ids of the shard's rows (its block_ids.npy).

  Returns:
    The ScannShard; its layout (the build's leaves and reordering) comes with its state.
  """
  return ScannShard(tf.saved_model.load(directory), np.asarray(block_ids, np.int64))


# -------------------------------------------------------------------------------- options


class SearchOptions(NamedTuple):
  """How a ScaNN search may differ from each shard's build-time defaults, per call.

  leaves_fraction: the fraction of each shard's leaves searched, in (0, 1]: a shard of L
  leaves searches max(1, ceil(fraction × L)) of them. A fraction rather than a number of
  leaves because shards differ in size and each has about sqrt(n) leaves (scann_params_for),
  so one number would mean a different share of each shard. Shards without a tree ignore it.
  reorder_num_neighbors: candidates re-scored (at least the neighbours asked for): by a
  shard's exact reordering, or, in a QA export that re-scores ScaNN's candidates from
  embeddings of its own (served_index.ServedIndex), the candidates it takes from ScaNN
  and re-scores; shards without reordering ignore it.

  Each is None (every shard's own), a number, or a scalar tensor (float32, int32). A
  tensor that is 0 or less also means every shard's own: a served graph's `answer` passes
  that to the function `answer_with_search_options` shares with it (check_search_options
  refuses it from a caller).
  """
  leaves_fraction: Union[None, float, tf.Tensor] = None
  reorder_num_neighbors: Union[None, int, tf.Tensor] = None


_bound = threading.local()


def bound_options() -> SearchOptions:
  """The SearchOptions bound by the innermost searching_with (all None outside any)."""
  return getattr(_bound, "options", None) or SearchOptions()


@contextlib.contextmanager
def searching_with(options: SearchOptions):
  """Within: every ScannSearcher.search (run, or traced into a graph) uses `options`.

  Why a binding rather than an argument: the searches of a served QA module happen deep in
  the model (OpenQAModel.retrieve → ServedIndex → ShardedSearcher), which knows nothing of
  ScaNN; as bound_handles binds the graph's searchers, this binds how they search. In a
  tf.function the options are read when it is traced: pass tensors (its inputs) to vary
  them per call."""
  previous = getattr(_bound, "options", None)
  _bound.options = options
  try:
    yield
  finally:
    _bound.options = previous


def check_search_options(leaves_fraction, reorder_num_neighbors, k: int,
                         has_tree: bool = True, rescores: bool = True) -> SearchOptions:
  """Validated options from a caller, as tensors that run after their checks.

  An option that cannot change the search it is given to is refused rather than ignored,
  unless it has the one value that says what that search does anyway: a leaves_fraction
  of 1 where no shard has a tree (each scores every block), reorder_num_neighbors of `k`
  where nothing re-scores candidates (ScaNN's own scores of the k found).

  Args:
    leaves_fraction: scalar float32, in (0, 1].
    reorder_num_neighbors: scalar int32, from `k` to MAX_REORDER_NUM_NEIGHBORS.
    k: the neighbours every search asks for.
    has_tree: whether any shard searched has a tree (leaves to choose from).
    rescores: whether anything re-scores candidates (a shard's reordering, or embeddings
      that re-score ScaNN's candidates).

  Returns:
    SearchOptions of the two values (each searched with only once its checks pass).

  Raises:
    tf.errors.InvalidArgumentError: naming the option refused (when the check runs: at
      once eagerly or for constants, else when the graph runs).
  """
  fraction = tf.convert_to_tensor(leaves_fraction, tf.float32)
  reorder = tf.convert_to_tensor(reorder_num_neighbors, tf.int32)
  k_tensor = tf.constant(k, tf.int32)
  if has_tree:
    checks = [
        tf.debugging.assert_greater(fraction, 0.0,
                                    message="leaves_fraction must be in (0, 1]"),
        tf.debugging.assert_less_equal(fraction, 1.0,
                                       message="leaves_fraction must be in (0, 1]")]
  else:
    checks = [tf.debugging.assert_equal(
        fraction, 1.0, message="leaves_fraction: no shard of this export has a tree (each "
        "scores every block), so it can only be 1")]
  if rescores:
    checks += [
        tf.debugging.assert_greater_equal(
            reorder, k_tensor,
            message=f"reorder_num_neighbors must be at least the {k} neighbours searched for"),
        tf.debugging.assert_less_equal(
            reorder, tf.constant(MAX_REORDER_NUM_NEIGHBORS, tf.int32),
            message=f"reorder_num_neighbors must be at most {MAX_REORDER_NUM_NEIGHBORS:,}")]
  else:
    checks.append(tf.debugging.assert_equal(
        reorder, k_tensor, message=f"reorder_num_neighbors: nothing in this export "
        f"re-scores candidates (ScaNN's own scores), so it can only be the {k} neighbours "
        "searched for"))
  with tf.control_dependencies(checks):
    return SearchOptions(tf.identity(fraction), tf.identity(reorder))


def leaves_to_search(fraction, layout: ShardLayout):
  """The leaves a shard searches for a leaves_fraction (its search op's input).

  Args:
    fraction: None, a number or a scalar float32 tensor (0 or less: the shard's own).
    layout: the shard's ShardLayout.

  Returns:
    -1 (the shard's own) without a tree or a fraction, else max(1, ceil(fraction ×
    num_leaves)), at most num_leaves: an int, or an int32 tensor for a tensor fraction.
    Computed in float32, the fraction's own precision, so that the float32 nearest
    j / num_leaves gives j leaves.
  """
  if fraction is None or not layout.num_leaves:
    return -1  # ScaNN's op ignores leaves_to_search without a tree; -1 says so
  if not isinstance(fraction, tf.Tensor):
    return min(layout.num_leaves, max(1, math.ceil(np.float32(fraction)
                                                   * np.float32(layout.num_leaves))))
  leaves = tf.cast(tf.math.ceil(fraction * float(layout.num_leaves)), tf.int32)
  leaves = tf.clip_by_value(leaves, 1, layout.num_leaves)
  return tf.where(fraction > 0.0, leaves, -1)


def _reorder_count(reorder, layout: ShardLayout, fetch: int):
  """The search op's pre_reorder_num_neighbors: -1 (the shard's own) without reordering
  or a count, else the count but at least `fetch` (ScaNN returns no more neighbours than
  it re-scores, so fewer would shorten the result)."""
  if reorder is None or not layout.reorder_num_neighbors:
    return -1
  if not isinstance(reorder, tf.Tensor) and not isinstance(fetch, tf.Tensor):
    return max(int(reorder), fetch)
  reorder = tf.convert_to_tensor(reorder, tf.int32)
  return tf.where(reorder > 0, tf.maximum(reorder, fetch), -1)


# --------------------------------------------------------------------------------- search


class ScannSearcher(Searcher):
  """One shard: a ScaNN searcher, its block ids, optionally the float embeddings for exact
  re-scoring of the candidates ScaNN returns. Made by host_searcher or graph_searcher.

  Args:
    searcher: what searches: a scann_ops.ScannSearcher, or a _GraphScann in a served graph.
    block_ids: [N] int64 ids of its rows.
    dimension: P.
    layout: the shard's ShardLayout (what per-call options can change).
    rescore_embeddings: [N, P] float32 to re-score candidates exactly; None: ScaNN's
      scores.
    state: the ScaNN state the searcher was made from, kept alive with it (host
      searchers; a graph searcher's ScannHandle tracks its own).
    name: the tf.Module's name.
  """

  def __init__(self, searcher, block_ids, dimension: int, layout: ShardLayout,
               rescore_embeddings: Optional[np.ndarray] = None,
               state: Optional[tf.Module] = None, name: str = "scann_searcher"):
    super().__init__(name=name)
    self._searcher = searcher
    block_ids = np.asarray(block_ids, np.int64)
    self._num_blocks = int(block_ids.shape[0])
    self._dimension = dimension
    self.layout = layout
    self.state = state
    self.block_ids = tf.Variable(block_ids, trainable=False, name="block_ids")
    self.rescore_embeddings = None
    if rescore_embeddings is not None:
      self.rescore_embeddings = tf.Variable(rescore_embeddings, trainable=False,
                                            name="rescore_embeddings")

  @classmethod
  def build(cls, embeddings: np.ndarray, block_ids=None, params: Optional[ScannParams] = None,
            rescore: bool = False, name: str = "scann_searcher") -> "ScannSearcher":
    """A host searcher over `embeddings` [N, P], built here (block ids default to 0..N-1).

    Args:
      embeddings: [N, P] float32 vectors.
      block_ids: [N] int64 ids (default 0..N-1).
      params: how to build it (default scann_params_for(N)).
      rescore: keep the embeddings to re-score candidates exactly.
      name: the tf.Module's name.

    Returns:
      host_searcher over the built shard.
    """
    embeddings = np.asarray(embeddings, np.float32)
    if block_ids is None:
      block_ids = np.arange(embeddings.shape[0], dtype=np.int64)
    params = params or scann_params_for(embeddings.shape[0])
    shard = ScannShard(scann_state(embeddings, params), np.asarray(block_ids, np.int64))
    return host_searcher(shard, embeddings.shape[1],
                         rescore_embeddings=embeddings if rescore else None, name=name)

  @property
  def num_blocks(self) -> int:
    """N, the blocks searched."""
    return self._num_blocks

  @property
  def dimension(self) -> int:
    """P, the embedding width."""
    return self._dimension

  # Plain TensorFlow calls, no tensor-dependent Python: autograph's conversion of it in a
  # saved QA module's trace failed, calling another method's converted code (TypeError).
  @tf.autograph.experimental.do_not_convert
  def search(self, queries: tf.Tensor, k, overfetch: int = 4) -> SearchResult:
    """Approximate top-k of `queries` [Q, P]; see Searcher.search (k may be a scalar
    int32 tensor). The bound SearchOptions (searching_with), if any, say how many leaves
    and candidates.

    With rescore_embeddings, k * overfetch candidates are fetched and re-scored exactly.
    """
    k = self._check_k(k)
    queries = tf.cast(queries, tf.float32)
    fetch = k
    if self.rescore_embeddings is not None:
      fetch = (tf.minimum(k * overfetch, self.num_blocks) if isinstance(k, tf.Tensor)
               else min(k * overfetch, self.num_blocks))
    options = bound_options()
    indices, scores = self._searcher.search_batched(
        queries, final_num_neighbors=fetch,
        pre_reorder_num_neighbors=_reorder_count(options.reorder_num_neighbors,
                                                 self.layout, fetch),
        leaves_to_search=leaves_to_search(options.leaves_fraction,
                                           self.layout))  # [Q, m], m <= fetch
    # ScaNN pads with index -1 a query that finds fewer than asked, but only up to the most
    # any query of the batch found: where the leaves searched hold fewer than `fetch`
    # points for every query, m < fetch. Padded to fetch, as the top-k below needs.
    missing = fetch - tf.shape(indices)[1]
    indices = tf.pad(tf.cast(indices, tf.int64), [[0, 0], [0, missing]],
                     constant_values=-1)  # [Q, fetch]
    scores = tf.pad(scores, [[0, 0], [0, missing]])  # [Q, fetch]
    if self.rescore_embeddings is not None:
      candidates = tf.gather(self.rescore_embeddings, tf.maximum(indices, 0))  # [Q, fetch, P]
      scores = tf.einsum("qp,qfp->qf", queries, tf.cast(candidates, tf.float32))
    # Rank the -1 padding last.
    scores = tf.where(indices >= 0, scores, tf.float32.min)
    top = tf.math.top_k(scores, k=k)  # [Q, k]
    local = tf.gather(indices, top.indices, batch_dims=1)
    return SearchResult(tf.gather(self.block_ids, tf.maximum(local, 0)), top.values)


def host_searcher(shard: ScannShard, dimension: int,
                  rescore_embeddings: Optional[np.ndarray] = None,
                  name: str = "scann_searcher") -> ScannSearcher:
  """A searcher whose handle is made now, eagerly (training's host search, benchmarks).

  Args:
    shard: the state and block ids (load_shard, build_shards).
    dimension: P.
    rescore_embeddings: [n, P] float32 to re-score candidates exactly (None: ScaNN's).
    name: the tf.Module's name.

  Returns:
    The ScannSearcher, holding the state.
  """
  return ScannSearcher(scann_ops.searcher_from_module(shard.state), shard.block_ids,
                       int(dimension), shard.layout, rescore_embeddings=rescore_embeddings,
                       state=shard.state, name=name)


class _Untracked:
  """Holds Python objects out of SavedModel's object graph (a traced tensor, a function
  made for eager calls: neither is the module's state)."""

  def __init__(self, **objects):
    self.__dict__.update(objects)


class ScannHandle(tf.Module):
  """A ScaNN searcher inside a SavedModel, deserialised once, not per request.

  scann_ops' `searcher_from_module` makes the handle eagerly, and an eager resource handle
  cannot be captured by a SavedModel function. Here the served graph holds the
  `TensorsToScann` op over the searcher's state variables. Its kernel is a
  ResourceOpKernel that builds the searcher on its first run and, once initialised,
  returns the same handle on every later run without reading the data again (ScaNN's
  scann_ops.cc: TensorsToScannOp::Compute). The kernel lives as long as the loaded
  function (TF2) or the session (tensorflow_model_server), so the searcher is built by the
  first call, which the warm-up requests make at load time, and freed with the model. No
  shared_name: two loaded versions never share (or leak) a searcher.

  One op per graph: every op node has a kernel, and so a searcher, of its own, so a graph
  whose searches sit in several branches (a cond, a loop's body) would build one per
  branch. `bound_handles` makes each handle's op once, at the top of the traced function,
  for every branch to capture; signatures that should share a searcher bind the handles
  made by one function they all call (searcher_function). Eagerly, TensorFlow caches one kernel per op signature, which every
  shard's op would share (each shard would search the first one's data): an eager call
  makes the op in a function of the handle's own.
  """

  def __init__(self, state: tf.Module, name: str = "scann_handle"):
    super().__init__(name=name)
    self.state = state  # scann_ops.ScannState (or its restored form): the searcher's data
    self._made = _Untracked(bound=None, eager=None)

  def _make(self) -> tf.Tensor:
    s = self.state
    return scann_ops.tensors_to_scann(
        s.dataset, s.scann_config, s.serialized_partitioner, s.datapoint_to_token,
        s.ah_codebook, s.hashed_dataset, s.int8_dataset, s.int8_multipliers, s.dp_norms)

  def handle(self) -> tf.Tensor:
    """The searcher's resource handle, made in graph by a TensorsToScann op (see above)."""
    made = self._made
    if made.bound is not None:
      return made.bound
    if tf.executing_eagerly():
      if made.eager is None:
        made.eager = tf.function(self._make)
      return made.eager()
    return self._make()


def searcher_function(handles: Sequence[ScannHandle]):
  """One tf.function (no inputs) that makes every handle's searcher, its TensorsToScann
  op, and returns their resource handles: for bound_handles' `make`.

  Why one function: each shard's searcher is then built by one op, once, whichever
  signature runs first, and every graph that calls the function searches with it
  (tests/test_export_qa.py checks that a signature's first call builds none of its own).
  Graphs that each made the ops themselves were seen to share searchers too in a loaded
  SavedModel, but by where an op stands in its graph rather than by the state it reads:
  two signatures that made two shards' ops in opposite orders searched each other's
  shards (TensorFlow 2.20, ScaNN 1.4.2). One function leaves one op per shard.

  Args:
    handles: the ScannHandles (graph_searcher's).

  Returns:
    The tf.function; each call returns a list of resource tensors, one per handle.
  """
  # pylint: disable-next=protected-access
  return tf.function(lambda: [handle._make() for handle in handles], input_signature=[])


@contextlib.contextmanager
def bound_handles(handles: Sequence[ScannHandle], make=None):
  """Within: each handle's searcher handle is made once, in the graph being traced, and
  every search of that graph (its branches included) uses it (see ScannHandle).

  Args:
    handles: the ScannHandles searched.
    make: a searcher_function of `handles`, called once here, so that every graph that
      binds it shares its searchers; None: each handle's op is made in this graph.
  """
  # pylint: disable=protected-access
  made = make() if make is not None else [handle._make() for handle in handles]
  for handle, tensor in zip(handles, made):
    handle._made.bound = tensor
  try:
    yield
  finally:
    for handle in handles:
      handle._made.bound = None


class _GraphScann:
  """scann_ops.ScannSearcher's search_batched over a ScannHandle's in-graph handle."""

  def __init__(self, handle: ScannHandle):
    self._handle = handle

  @tf.autograph.experimental.do_not_convert
  def search_batched(self, queries, final_num_neighbors=None,
                     pre_reorder_num_neighbors=None, leaves_to_search=None):
    return scann_ops.ScannSearcher(self._handle.handle()).search_batched(
        queries, final_num_neighbors, pre_reorder_num_neighbors, leaves_to_search)


def graph_searcher(shards: Sequence[ScannShard], dimension: int
                   ) -> tuple[ShardedSearcher, list[ScannHandle]]:
  """A Searcher over in-graph ScaNN handles, one per shard, merged (ShardedSearcher).

  Its scores are ScaNN's (reordered inner products in the shards' reorder_dtype); a QA
  export re-scores its candidates with embeddings of its own, or, keeping none
  (realm_tf.export.assembly.ScannSearch without a rescore_dtype), takes them as p(z|x)'s
  logits.

  Args:
    shards: the ScaNN states and their block ids (an index version's, or build_shards').
    dimension: P.

  Returns:
    (the searcher, the ScannHandles the module must track and bind: bound_handles).

  Raises:
    ValueError: no shards.
  """
  if not shards:
    raise ValueError("a ScaNN export needs at least one ScaNN shard")
  handles, searchers = [], []
  for i, shard in enumerate(shards):
    handle = ScannHandle(shard.state, name=f"scann_handle_{i}")
    handles.append(handle)
    searchers.append(ScannSearcher(_GraphScann(handle), shard.block_ids, int(dimension),
                                   shard.layout, name=f"scann_{i}"))
  return ShardedSearcher(searchers), handles
