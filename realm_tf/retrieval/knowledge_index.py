"""The knowledge index a training or evaluation step retrieves from, on the accelerators.

One module serves pre-training, Open-QA fine-tuning and evaluation (and the exports): it
holds, for every block z of the corpus Z,
  - its embedding under the (stale) document tower of the newest committed index export,
  - its pre-tokenized document-tower input `[CLS] title [SEP] body [SEP]` (word and type
    ids), and its body wordpieces for the reader,
as non-trainable variables **sharded across the replicas** of the strategy: replica r holds
rows [r*S, (r+1)*S), S = ceil(N / R). This is what the REALM authors did on TPU: exact MIPS
where each core scores its shard (a matmul and a top-k), the candidates of all cores are
gathered, and a global top-k picks the winners. Tokens and embeddings of the winners are
then fetched from whichever shard holds them with one all-reduce (each replica contributes
the rows it owns, zeros elsewhere). Every op has a static shape, so the step compiles with
XLA.

Memory: embeddings N x P in index.embedding_dtype plus N x (Lc + Lb) token ids, split over
R replicas. Nothing derivable is stored: the document tower's type ids and mask are made
from the word ids at gather time ([SEP] positions, padding). Token ids are stored as narrow
as the strategy allows: uint16 under one-process strategies (BERT's 30,522 entries fit),
int32 under TPU and multi-worker strategies (TPUs hold no uint16, and multi-worker
strategies broadcast initial values with collectives that take none). So a row costs,
with Lc = 288, Lb = 317 (Open-QA's reader of 320), float32 embeddings of P = 128, an int32
length, a validity flag and an int64 block id: 1,735 B with uint16 ids and 2,945 B with
int32 ids (~2.9 KB: 39 GB for 13.35M blocks, 1.2 GB per core of a v3-32 with bfloat16
embeddings). Evaluation and the exports need none of the tables: see below.

Block inputs have two layouts. Tables (the default; training): the token ids above, made
once on the host, gathered inside a compiled step. A text store (`texts`, a
data.block_texts.BlockTexts: evaluation and the QA exports): no tables at all; the
retrieved rows' titles and texts are read from the store and tokenized by the same rule
(data.block_texts.block_inputs), so the host holds only the embeddings and the store's
offsets (13.35M blocks: 6.8 GB float32 embeddings, 0.3 GB of offsets and ids). Its step
reads files and runs the tokenizer: no XLA, and no TPU (the tasks refuse that pairing).

The shards are `SyncOnRead` variables: each replica reads and writes only its own copy, so a
newer index is swapped in place by one assignment per replica (`swap`), with no retracing.

backend 'scann' (for corpora that do not fit, or CPU-only runs): the search runs on the host
with the export's ScaNN shards, called through `tf.py_function`; only the query embeddings
go to the host and only ids and scores come back. The searcher is a Python reference that
`swap` replaces, so a compiled step keeps working; XLA cannot compile the host call
(the config validator says so).

An in-graph `Searcher` (the serving exports: ScaNN's TF ops saved in the SavedModel) can
take over the search with `search_with`; rows, gathers and swaps stay the index's own, so
training, evaluation and serving go through this one class and its one result type.
"""
import logging
import threading
from typing import NamedTuple, Optional

import numpy as np
import tensorflow as tf

from realm_tf.data import block_texts as block_texts_lib
from realm_tf.data.block_store import BlockStore
from realm_tf.io import versioned
from realm_tf.modeling import collectives
from realm_tf.io.roles import HostRole
from realm_tf.retrieval.exact import exact_top_k
from realm_tf.retrieval.row_blocks import RowBlocks
from realm_tf.retrieval.index_export import load_shard_array
from realm_tf.retrieval.index_loading import load_searcher
from realm_tf.retrieval.searcher import Searcher, SearchResult
from realm_tf.text.tokenization import Tokenizer

BACKENDS = ("exact", "scann")
_NEG_INF = -1e30  # a score no real inner product reaches; finite so top_k stays ordered


class BlockInputs(NamedTuple):
  """What the towers and the reader need of retrieved blocks."""
  document: dict  # BERT inputs [B, K, Lc] for the document tower
  body_ids: tf.Tensor  # [B, K, Lb] int32 body wordpieces (zero-padded)
  body_lengths: tf.Tensor  # [B, K] int32
  embeddings: Optional[tf.Tensor]  # [B, K, P] float32 indexed (stale) ones; None: not gathered


def token_dtype(vocab_size: int) -> type:
  """The narrowest unsigned type that holds every word id of a vocabulary."""
  return np.uint16 if vocab_size <= 2**16 else np.int32


# Strategies whose variables take no uint16: multi-worker ones broadcast every variable's
# initial value with collectives (bool, float, half, double, int32, int64 only), and TPUs
# hold no uint16 tensors. Their token tables stay int32.
_WIDE_TOKEN_STRATEGIES = (tf.distribute.MultiWorkerMirroredStrategy,
                          tf.distribute.experimental.MultiWorkerMirroredStrategy,
                          tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy)


def variable_token_dtype(vocab_size: int, strategy: tf.distribute.Strategy) -> type:
  """token_dtype where `strategy` can hold it in a variable, else int32."""
  if isinstance(strategy, _WIDE_TOKEN_STRATEGIES):
    return np.int32
  return token_dtype(vocab_size)


def type_ids_of(word_ids: tf.Tensor, sep_id: int) -> tf.Tensor:
  """The type ids of `[CLS] title [SEP] body [SEP]` word ids [..., L], derived instead of
  stored: 1 after the first [SEP] up to the padding, 0 elsewhere (Tokenizer.join_bert's
  rule). A title cannot hold the [SEP] id: the tokenizer makes the text "[SEP]" into "[",
  "sep", "]"."""
  is_sep = tf.cast(tf.equal(word_ids, sep_id), tf.int32)
  after_first_sep = tf.cumsum(is_sep, axis=-1, exclusive=True) > 0
  return tf.cast(after_first_sep & (word_ids > 0), tf.int32)


def tokenize_blocks(store: BlockStore, tokenizer: Tokenizer, block_seq_length: int,
                    body_length: int, batch_size: int = 2048) -> dict[str, np.ndarray]:
  """Host-side, once: the document-tower word ids and the reader bodies of every block, ids
  in token_dtype (the type ids are type_ids_of the word ids)."""
  n = len(store)
  texts, titles = store.text_strings, store.title_strings
  ids = token_dtype(tokenizer.vocab_size)
  tables = dict(word_ids=np.zeros([n, block_seq_length], ids),
                body_ids=np.zeros([n, body_length], ids),
                body_lengths=np.zeros([n], np.int32))
  for start in range(0, n, batch_size):
    end = min(n, start + batch_size)
    pieces = tokenizer.tokenize(tf.constant(texts[start:end]))  # [b, (T)]
    tables["body_lengths"][start:end] = np.minimum(pieces.row_lengths().numpy(), body_length)
    tables["body_ids"][start:end] = pieces.to_tensor(shape=[end - start, body_length]).numpy()
    packed = tokenizer.encode(tf.constant(titles[start:end]), block_seq_length,
                              pair_texts=tf.constant(texts[start:end]))
    tables["word_ids"][start:end] = packed.input_word_ids.numpy()
  return tables


def row_ordered_embeddings(export: versioned.Version, block_ids: np.ndarray) -> np.ndarray:
  """The export's embeddings in the order of the corpus's rows.

  Args:
    export: a committed index export.
    block_ids: [N] the corpus's block ids, ascending (BlockStore.block_ids).

  Returns:
    [N, P] float32, row i the embedding of block_ids[i].

  Raises:
    ValueError: naming the export, if it holds no blocks or other blocks than the corpus.
    versioned.VerificationError: naming the file, if one is truncated or corrupted
      (checked against the manifest as read).
  """
  ids, vectors = [], []
  shards = export.manifest["shards"]
  for info in shards:
    if not info["num_blocks"]:
      continue
    ids.append(load_shard_array(export, info["shard"], len(shards), "block_ids.npy"))
    vectors.append(load_shard_array(export, info["shard"], len(shards),
                                    "embeddings.npy").astype(np.float32))
  if not ids:
    raise ValueError(f"index {export.path} holds no blocks")
  ids, vectors = np.concatenate(ids), np.concatenate(vectors)
  order = np.argsort(ids, kind="stable")
  ids, vectors = ids[order], vectors[order]
  if ids.shape != block_ids.shape or np.any(ids != block_ids):
    raise ValueError(f"index {export.path} covers {len(ids)} blocks that are not the "
                     f"corpus's {len(block_ids)}: rebuild it from these blocks")
  return vectors


class StreamedEmbeddings:
  """A committed export's embeddings in row order, read and assigned a shard at a time.

  At 13.35M blocks the embeddings are 6.8 GB as float32: concatenated, sorted into row
  order and converted to a tensor they would be held three or four times over. Here the
  export's block ids are read and checked against the corpus first (a refused export
  leaves the current one in place), and `rows` gives one row block at a time (row_blocks:
  each block assigned whole), so one shard and one block are held beside the variables.

  Args:
    export: a committed index export.
    block_ids: [N] the corpus's block ids, ascending.

  Raises:
    ValueError: the export holds no blocks or other blocks than the corpus.
    versioned.VerificationError: a file of the export is missing, truncated or corrupted.
  """

  def __init__(self, export: versioned.Version, block_ids: np.ndarray):
    self.export = export
    shards = export.manifest["shards"]
    self.parts = []  # (shard, rows [n] int64)
    seen, dimension = 0, None
    for info in shards:
      if not info["num_blocks"]:
        continue
      ids = load_shard_array(export, info["shard"], len(shards), "block_ids.npy")
      rows = np.searchsorted(block_ids, ids)
      if np.any(rows >= len(block_ids)) or np.any(
          block_ids[np.minimum(rows, len(block_ids) - 1)] != ids):
        raise ValueError(f"index {export.path} holds blocks that are not in the corpus of "
                         f"{len(block_ids)} blocks: rebuild it from these blocks")
      self.parts.append((info["shard"], rows))
      seen += len(ids)
      dimension = dimension or info.get("dimension")
    if not self.parts:
      raise ValueError(f"index {export.path} holds no blocks")
    covered = np.zeros([len(block_ids)], bool)
    for _, rows in self.parts:
      covered[rows] = True
    if seen != len(block_ids) or not covered.all():
      raise ValueError(f"index {export.path} covers {seen} blocks that are not the "
                       f"corpus's {len(block_ids)}: rebuild it from these blocks")
    self.num_shards = len(shards)
    self.num_blocks = len(block_ids)
    # Sizes and checksums now (a streamed read, one file at a time), so a damaged file
    # refuses the export before any row is replaced: rows are assigned in place, and a
    # CRC failure found half-way would leave blocks of two versions. At 13.35M blocks it
    # reads the 6.8 GB once more, which costs a swap seconds, not memory.
    versioned.verify_version(export, checksums=True)
    self.shape = (self.num_blocks, int(dimension))
    self._cached = (-1, None)  # (shard, its embeddings): the newest shard read
    # Shards whose rows are consecutive and ascending (read by slices in `rows`).
    self._consecutive = {shard for shard, rows in self.parts
                         if len(rows) and np.all(np.diff(rows) == 1)}

  def rows(self, start: int, end: int) -> np.ndarray:
    """[end - start, P] float32: rows [start, end) in row order, from the shards that hold
    them (the newest shard read is kept: consecutive shards are each read once).

    Why slices and a dropped cache: at 13.35M blocks a shard's embeddings are ~0.5 GB, and
    a boolean-mask copy of one, the previous shard still cached while the next is read,
    and the next one's bytes beside its array held ~2 GB more than the variables at the
    peak (realm_tf.evaluate's start). A shard of consecutive rows (every shard a released
    or beam-built index writes) is copied by slices of the array, which is itself a view of
    the bytes read (load_shard_array)."""
    out = np.zeros([end - start, self.shape[1]], np.float32)
    filled = 0
    for shard, rows in self.parts:
      consecutive = shard in self._consecutive
      if consecutive:
        lo, hi = max(start, int(rows[0])), min(end, int(rows[-1]) + 1)
        if lo >= hi:
          continue
      else:
        inside = (rows >= start) & (rows < end)
        if not inside.any():
          continue
      if self._cached[0] != shard:
        self._cached = (-1, None)  # freed before the next shard is read
        self._cached = (shard, load_shard_array(self.export, shard, self.num_shards,
                                                "embeddings.npy"))
      if consecutive:
        out[lo - start:hi - start] = self._cached[1][lo - int(rows[0]):hi - int(rows[0])]
        filled += hi - lo
      else:
        out[rows[inside] - start] = self._cached[1][inside]
        filled += int(inside.sum())
    if filled != end - start:
      raise ValueError(f"index {self.export.path}: rows [{start}, {end}) are not all covered")
    return out


def _replica_context():
  """(context, number of replicas, this replica's id) in a replica or default context."""
  context = tf.distribute.get_replica_context()
  if context is None:
    raise RuntimeError("KnowledgeIndex.search/gather run in a replica context "
                       "(inside strategy.run, or outside any strategy)")
  return context, context.num_replicas_in_sync, context.replica_id_in_sync_group


class KnowledgeIndex(tf.Module):
  """Sharded exact MIPS (or host ScaNN) plus block tables; see the module docstring.

  Built under the strategy (after the model); the embeddings are empty until a version is
  loaded (`swap`, `maybe_swap` or `set_embeddings`). `search` and `gather` run in a
  replica context, inside the compiled step.

  Args:
    store: the corpus Z (block ids ascending, titles and texts).
    tokenizer: the run's Tokenizer; every block is tokenized once, here.
    block_seq_length: Lc, the document tower's input length.
    body_length: Lb, body wordpieces kept per block for the reader.
    dimension: P, the embedding width.
    strategy: the strategy to shard over (default: the current one).
    backend: 'exact' (sharded on the accelerators) or 'scann' (host ScaNN).
    embedding_dtype: the accelerator copy's dtype ('float32' or 'bfloat16').
    rescore: 'scann': re-score its candidates exactly with the stored embeddings.
    texts: the text layout: the store's in-graph reader (`store` is then its
      data.block_texts.HostBlockTexts); None for token tables.
    name: the tf.Module's name.

  Raises:
    ValueError: `backend` is not 'exact' or 'scann', or `texts` holds other blocks.
  """

  def __init__(self, store: BlockStore, tokenizer: Tokenizer, block_seq_length: int,
               body_length: int, dimension: int, strategy: Optional[tf.distribute.Strategy]
               = None, backend: str = "exact", embedding_dtype: str = "float32",
               rescore: bool = False, texts: Optional[block_texts_lib.BlockTexts] = None,
               name: str = "knowledge_index"):
    super().__init__(name=name)
    if backend not in BACKENDS:
      raise ValueError(f"index backend must be one of {BACKENDS}, got {backend!r}")
    self.store = store
    self.strategy = strategy or tf.distribute.get_strategy()
    self.role = HostRole(self.strategy)  # who chooses the version to swap in
    self.backend = backend
    self.rescore = rescore
    self.dimension = dimension
    self.num_blocks = len(store)
    self.block_seq_length = int(block_seq_length)
    self.body_length = int(body_length)
    self.sep_id = tokenizer.sep_id
    self.num_replicas = self.strategy.num_replicas_in_sync
    self.shard_size = -(-self.num_blocks // self.num_replicas)  # S = ceil(N / R)
    self.version: Optional[int] = None
    self.export: Optional[versioned.Version] = None
    self.num_swaps = 0
    self._failed_version = -1  # newest export that failed to load (not retried)
    self.storage_error = ""  # why the last poll could not list the indexes ("" if it could)
    self._host_searcher = None  # backend 'scann': the current host-side searcher
    self._graph_searcher: Optional[Searcher] = None  # search_with: an in-graph searcher
    self._lock = threading.Lock()
    self.texts = texts
    self.tokenizer = tokenizer
    if texts is not None and texts.num_blocks != self.num_blocks:
      raise ValueError(f"the text store {texts.directory} holds {texts.num_blocks} blocks, "
                       f"the index {self.num_blocks}")
    tables = (None if texts is not None else
              tokenize_blocks(store, tokenizer, block_seq_length, body_length))
    dtype = tf.bfloat16 if embedding_dtype == "bfloat16" else tf.float32
    s = self.shard_size
    with self.strategy.scope():
      def sharded(shape, var_dtype, var_name):
        return tf.Variable(tf.zeros([s, *shape], var_dtype), trainable=False, name=var_name,
                           synchronization=tf.VariableSynchronization.ON_READ,
                           aggregation=tf.VariableAggregation.NONE)
      if self.num_replicas == 1:
        # One device: row blocks, filled a block at a time with plain reads after (see
        # realm_tf.retrieval.row_blocks); [N, P] in all.
        self.embedding_blocks = RowBlocks.unfilled(s, dimension, dtype)
        self.embeddings = None
      else:
        self.embedding_blocks = None
        self.embeddings = sharded([dimension], dtype, "embeddings")  # [S, P] per replica
      self.valid = sharded([], tf.bool, "valid")  # [S]: False on padding rows
      if tables is not None:
        ids = tf.as_dtype(variable_token_dtype(tokenizer.vocab_size, self.strategy))
        self.word_ids = sharded([block_seq_length], ids, "word_ids")  # [S, Lc]
        self.body_ids = sharded([body_length], ids, "body_ids")  # [S, Lb]
        self.body_lengths = sharded([], tf.int32, "body_lengths")  # [S]
      # Row → block id for every row (replicated: 8 bytes a block), and its inverse by
      # searchsorted (block ids are ascending in row order).
      self.block_ids = tf.Variable(store.block_ids, trainable=False, name="block_ids")
    columns = dict(valid=np.ones([self.num_blocks], bool))
    if tables is not None:
      columns.update(word_ids=tables["word_ids"], body_ids=tables["body_ids"],
                     body_lengths=tables["body_lengths"])
    self._assign_sharded(columns)

  # --------------------------------------------------------------------------- host side

  def _shard(self, values: np.ndarray, replica: int) -> np.ndarray:
    """Rows of `values` ([N, ...]) that replica `replica` holds, zero-padded to S."""
    s = self.shard_size
    part = values[replica * s:(replica + 1) * s]
    if len(part) < s:
      part = np.concatenate([part, np.zeros([s - len(part), *values.shape[1:]],
                                            values.dtype)])
    return part

  def _assign_sharded(self, columns: dict[str, np.ndarray]):
    """Assigns each replica its shard of every column (in place: no retracing)."""
    for key, values in columns.items():
      variable = getattr(self, key)
      distributed = self.strategy.experimental_distribute_values_from_function(
          lambda context, v=values, var=variable: tf.constant(np.asarray(
              self._shard(v, context.replica_id_in_sync_group), var.dtype.as_numpy_dtype)))
      self.strategy.run(lambda value, var=variable: var.assign(value), args=(distributed,))

  def swap(self, export: versioned.Version) -> None:
    """Loads a committed index export in place of the current one.

    The embeddings are checked against the corpus (same block ids) and assigned shard by
    shard; with 'scann' the host searcher reference is replaced. Compiled steps keep
    running: no variable or graph changes identity.

    Args:
      export: a committed index export of this corpus.

    Raises:
      ValueError: the export covers other blocks than the corpus.
      versioned.VerificationError: one of its files is missing, truncated or corrupted.
    """
    self._install(export, *self._load(export))

  def _load(self, export: versioned.Version) -> tuple[object, object]:
    """Host side of a swap: the export's embeddings (row order; with one replica a
    StreamedEmbeddings, checked but not yet read) and host searcher."""
    if self.num_replicas == 1:
      vectors = StreamedEmbeddings(export, self.store.block_ids)
    else:
      vectors = row_ordered_embeddings(export, self.store.block_ids)
    searcher = None
    if self.backend == "scann":
      # The index arrives through shared storage: every file is checksummed.
      searcher = load_searcher(export, "scann", self.rescore, verify_checksums=True)
    return vectors, searcher

  def _install(self, export: versioned.Version, vectors: np.ndarray, searcher) -> None:
    self.set_embeddings(vectors, export.version, export=export, host_searcher=searcher)
    logging.info("Knowledge index: version %d (%d blocks, %s) swapped in", export.version,
                 self.num_blocks, export.path)

  def set_embeddings(self, vectors: np.ndarray, version: int,
                     export: Optional[versioned.Version] = None, host_searcher=None):
    """Assigns [N, P] block embeddings (in row order) as index `version`, in place.

    `swap` calls this for committed exports; it also serves embeddings computed in memory
    (an export of a fixed corpus, tests). The 'scann' backend needs `host_searcher`.

    Args:
      vectors: [N, P] embeddings, row i that of the store's i-th block (an array, or
        with one replica a StreamedEmbeddings: assigned shard by shard).
      version: the version number to report (index_version in logs).
      export: the committed export they came from, if any (encoder_step reads it).
      host_searcher: 'scann': a Searcher over the same embeddings.

    Raises:
      ValueError: `vectors` is not [N, P], or 'scann' without a host searcher.
    """
    streamed = isinstance(vectors, StreamedEmbeddings)
    if not streamed:
      vectors = np.asarray(vectors, np.float32)
    if tuple(vectors.shape) != (self.num_blocks, self.dimension):
      raise ValueError(f"embeddings of shape {tuple(vectors.shape)} do not fit an index of "
                       f"{self.num_blocks} blocks x {self.dimension} dimensions")
    if self.backend == "scann" and host_searcher is None:
      raise ValueError("the 'scann' backend needs a host searcher with the embeddings")
    with self._lock:
      if self.embedding_blocks is not None:
        self.embedding_blocks.assign_blocks(
            vectors.rows if streamed else lambda start, end: vectors[start:end])
      else:
        self._assign_sharded(dict(embeddings=vectors))
      self._host_searcher = host_searcher
      self.version = version
      self.export = export
      self.num_swaps += 1

  def maybe_swap(self, index_dir: str) -> bool:
    """Swaps in the newest committed export under `index_dir` if it is newer; a broken
    export (damaged files, other blocks) is logged once and skipped until a newer one is
    committed, and the current one keeps serving.

    With several processes (multi-worker) every process must call this at the same point:
    the version is the one the chief sees, and it is swapped in everywhere or nowhere (a
    process that cannot load it makes every process refuse it), so all replicas' shards
    always come from one version.

    A store that cannot be listed is logged and recorded in `storage_error`; the current
    version keeps serving.

    Args:
      index_dir: the versioned index directory.

    Returns:
      True if a newer version was swapped in.
    """
    try:
      latest = versioned.latest_version(index_dir)
      self.storage_error = ""
    except OSError as e:  # the store could not be asked: keep searching what we have
      latest, self.storage_error = None, str(e)
      logging.error("Could not list the indexes under %s (keeping version %s): %s",
                    index_dir, self.version, e)
    wanted = self.role.chief_value(-1 if latest is None else latest.version)
    current = -1 if self.version is None else self.version
    if wanted < 0 or wanted <= max(current, self._failed_version):
      return False
    error, loaded, export = None, None, latest
    try:
      if export is None or export.version != wanted:
        export = versioned.read_version(versioned.manifest_path(index_dir, wanted))
      loaded = self._load(export)
    except Exception as e:  # pylint: disable=broad-except
      error = e
    if self.role.any_process(error is not None):
      self._failed_version = wanted
      logging.error("Index version %d under %s is refused, keeping version %s: %s", wanted,
                    index_dir, self.version, error or "another process could not load it")
      return False
    self._install(export, *loaded)
    return True

  @property
  def encoder_step(self) -> int:
    """The training step of the block encoder behind the current index (-1: none)."""
    if self.export is None:
      return -1
    return int(self.export.manifest.get("encoder", {}).get("step", self.export.version))

  @property
  def snapshot_time(self) -> float:
    """When the encoder snapshot behind the current index was committed."""
    if self.export is None:
      return 0.0
    encoder = self.export.manifest.get("encoder", {})
    return float(encoder.get("committed_at") or self.export.manifest.get("committed_at", 0.0))

  def search_with(self, searcher: Searcher) -> None:
    """Searches through `searcher` (TF ops, e.g. ScaNN's, saved with an export) instead of
    the sharded exact search; it must cover exactly this index's blocks.

    Args:
      searcher: an in-graph Searcher over the same N blocks.

    Raises:
      ValueError: the backend is not 'exact', or the searcher covers another number of
        blocks.
    """
    if self.backend != "exact":
      raise ValueError("an in-graph searcher replaces the 'exact' backend's search; this "
                       f"index searches with {self.backend!r}")
    if searcher.num_blocks != self.num_blocks:
      raise ValueError(f"the searcher covers {searcher.num_blocks} blocks, the index "
                       f"{self.num_blocks}")
    self._graph_searcher = searcher

  # --------------------------------------------------------------------------- in the step

  def rows(self, block_ids: tf.Tensor) -> tf.Tensor:
    """Global rows of block ids.

    Args:
      block_ids: int tensor of any shape; every id must be in the index (an unknown id
        maps to a neighbouring row, unchecked).

    Returns:
      int32 rows of the same shape.
    """
    flat = tf.reshape(tf.cast(block_ids, tf.int64), [1, -1])  # [1, n]
    rows = tf.searchsorted(self.block_ids[None, :], flat)  # [1, n]
    rows = tf.minimum(rows, self.num_blocks - 1)
    return tf.reshape(tf.cast(rows, tf.int32), tf.shape(block_ids))

  def search(self, queries: tf.Tensor, k: int,
             exclude_block_ids: Optional[tf.Tensor] = None) -> SearchResult:
    """The k blocks with the largest inner product with each query [B, P].

    Runs in a replica context. The queries carry no gradient out of the search.

    Args:
      queries: [B, P] query embeddings.
      k: blocks per query (a Python int).
      exclude_block_ids: optional [B]: a block each query must not retrieve (REALM's "no
        trivial retrievals": the block the masked sentence came from).

    Returns:
      SearchResult(block_ids [B, k] int64, scores [B, k] float32, rows [B, k] int32),
      best first.

    Raises:
      ValueError: k exceeds the blocks available.
      RuntimeError: 'scann' with no version swapped in yet (when the step runs), or not
        in a replica context.
    """
    if k > self.num_blocks - (exclude_block_ids is not None):
      raise ValueError(f"k={k} exceeds the {self.num_blocks} blocks of the index")
    fetch = k + (1 if exclude_block_ids is not None else 0)
    queries = tf.cast(tf.stop_gradient(queries), tf.float32)
    if self._graph_searcher is not None:
      rows, scores = self._graph_search(queries, fetch)
    elif self.backend == "scann":
      rows, scores = self._host_search(queries, fetch)
    else:
      rows, scores = self._sharded_exact_search(queries, fetch)
    block_ids = tf.gather(self.block_ids, rows)  # [B, fetch]
    if exclude_block_ids is not None:
      trivial = tf.equal(block_ids, tf.cast(exclude_block_ids, tf.int64)[:, None])
      scores = tf.where(trivial, _NEG_INF, scores)
      top = tf.math.top_k(scores, k=k)  # [B, k]: drops the trivial block (or the last)
      rows = tf.gather(rows, top.indices, batch_dims=1)
      block_ids = tf.gather(block_ids, top.indices, batch_dims=1)
      scores = top.values
    return SearchResult(block_ids, scores, rows)  # [B, k] each

  def _sharded_exact_search(self, queries: tf.Tensor, k: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Per-shard exact top-k of every replica's queries, then a global top-k."""
    context, num_replicas, replica = _replica_context()
    batch = tf.shape(queries)[0]
    all_queries = queries
    if num_replicas > 1:
      all_queries = collectives.all_gather(context, queries, axis=0)  # [B*R, P]
      static_batch = queries.shape[0]
      all_queries.set_shape([None if static_batch is None else static_batch * num_replicas,
                             queries.shape[1]])
    local_k = min(k, self.shard_size)
    if self.embedding_blocks is not None:
      scores, local_rows = self.embedding_blocks.top_k(all_queries, local_k)  # [B, k']
    else:
      scores, local_rows = exact_top_k(all_queries, self.embeddings, local_k)  # [B*R, k']
    scores = tf.where(tf.gather(self.valid, local_rows), scores, _NEG_INF)
    rows = local_rows + tf.cast(replica, tf.int32) * self.shard_size  # global rows
    if num_replicas > 1:
      # [R, B*R, k'] candidates of every shard → this replica's queries [B, R*k'].
      all_scores = collectives.all_gather(context, scores[None], axis=0)
      all_rows = collectives.all_gather(context, rows[None], axis=0)
      mine = tf.cast(replica, tf.int32) * batch + tf.range(batch)  # [B]
      scores = tf.reshape(tf.transpose(tf.gather(all_scores, mine, axis=1), [1, 0, 2]),
                          [batch, num_replicas * local_k])  # [B, R*k']
      rows = tf.reshape(tf.transpose(tf.gather(all_rows, mine, axis=1), [1, 0, 2]),
                        [batch, num_replicas * local_k])
    top = tf.math.top_k(scores, k=k)  # [B, k]
    return tf.gather(rows, top.indices, batch_dims=1), top.values

  def _graph_search(self, queries: tf.Tensor, k: int) -> tuple[tf.Tensor, tf.Tensor]:
    """The attached in-graph searcher (search_with) over all queries of this call."""
    found = self._graph_searcher.search(queries, k)
    # ScaNN's ops give no static shapes; the gathers downstream need the rank.
    block_ids = tf.reshape(found.block_ids, [-1, k])  # [B, k]
    scores = tf.reshape(found.scores, [-1, k])  # [B, k]
    return self.rows(block_ids), scores

  def _host_search(self, queries: tf.Tensor, k: int) -> tuple[tf.Tensor, tf.Tensor]:
    """ScaNN on the host: query embeddings go out, ids and scores come back."""

    def search(host_queries):
      searcher = self._host_searcher
      if searcher is None:
        raise RuntimeError("knowledge index: no index swapped in yet")
      found = searcher.search(host_queries, k)
      return found.block_ids, found.scores

    block_ids, scores = tf.py_function(search, [queries], [tf.int64, tf.float32],
                                       name="host_scann_search")
    block_ids.set_shape([queries.shape[0], k])
    scores.set_shape([queries.shape[0], k])
    return self.rows(block_ids), scores

  def gather(self, rows: tf.Tensor, embeddings: bool = True) -> BlockInputs:
    """Tokens and indexed embeddings of global `rows`, from whichever shard owns them.

    Each replica fills in its own rows (zeros elsewhere) and one all-reduce sums. Runs in
    a replica context.

    Args:
      rows: [B, K] int32 global rows (search's `rows`).
      embeddings: gather the indexed embeddings too; False where nothing scores with them
        (BM25, whose index never loads any: on one device its row blocks hold no values).

    Returns:
      BlockInputs: document inputs [B, K, Lc], body_ids [B, K, Lb], body_lengths [B, K],
      embeddings [B, K, P] float32 (the indexed, stale ones; None if not asked for).
    """
    context, num_replicas, replica = _replica_context()
    batch = tf.shape(rows)[0]
    all_rows = rows
    if num_replicas > 1:
      all_rows = collectives.all_gather(context, rows, axis=0)  # [B*R, K]
      all_rows.set_shape([None if rows.shape[0] is None else rows.shape[0] * num_replicas,
                          rows.shape[1]])
    local = all_rows - tf.cast(replica, tf.int32) * self.shard_size
    owned = (local >= 0) & (local < self.shard_size)  # [B*R, K]
    local = tf.clip_by_value(local, 0, self.shard_size - 1)

    def take(table):
      # Read the shard once as a tensor: gathering from the variable itself would switch
      # it to copy-on-read, and every later read would copy the whole shard.
      values = tf.gather(tf.convert_to_tensor(table), local)  # [B*R, K, ...]
      if values.dtype in (tf.uint16, tf.int16):  # narrow token ids: the step reads int32
        values = tf.cast(values, tf.int32)
      mask = tf.reshape(owned, tf.concat([tf.shape(owned),
                                          tf.ones([values.shape.rank - 2], tf.int32)], 0))
      return tf.where(mask, values, tf.zeros_like(values))

    parts = {}
    if embeddings:
      table = (self.embedding_blocks.take(local)  # one replica: every row is its own
               if self.embedding_blocks is not None else take(self.embeddings))
      parts["embeddings"] = tf.cast(table, tf.float32)
    if self.texts is None:
      parts.update(word_ids=take(self.word_ids), body_ids=take(self.body_ids),
                   body_lengths=take(self.body_lengths))
    if num_replicas > 1:
      mine = tf.cast(replica, tf.int32) * batch + tf.range(batch)
      parts = {key: tf.gather(collectives.all_reduce(context, tf.distribute.ReduceOp.SUM, value), mine)
               for key, value in parts.items()}
    if self.texts is not None:
      # Every replica reads its own rows' strings: the store is on the host, not sharded.
      titles, texts = self.texts.lookup(rows)  # [B, K] each
      document, body_ids, body_lengths = block_texts_lib.block_inputs(
          titles, texts, self.tokenizer, self.block_seq_length, self.body_length)
      return BlockInputs(document, body_ids, body_lengths, parts.get("embeddings"))
    word_ids = parts["word_ids"]
    document = dict(input_word_ids=word_ids, input_mask=tf.cast(word_ids > 0, tf.int32),
                    input_type_ids=type_ids_of(word_ids, self.sep_id))
    return BlockInputs(document, parts["body_ids"], parts["body_lengths"],
                       parts.get("embeddings"))
