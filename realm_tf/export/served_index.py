"""What a QA export holds of the corpus, laid out to be served at Wikipedia scale.

At REALM's Wikipedia size the training-time KnowledgeIndex cannot be saved as is: its
token tables are N x (Lc + Lb) ids and the block texts and titles one string variable,
all resident in every loaded version (benchmarks/scale.py measures each part, per block
and extrapolated to 13,353,718 blocks: benchmarks/results/scale.md). A served question
needs only the k blocks it retrieves, so an export holds:

  - the embeddings [N, P] (float32 as evaluated, or float16 at half the memory) and the
    block ids [N] int64, as variables: what exact search scans on every question (a ScaNN
    export keeps them, float16 by default, only to re-score its searcher's candidates);
  - the titles and texts in the run's block text store (realm_tf.data.block_texts, the
    one store evaluation reads too): zlib-compressed chunk files linked among the
    SavedModel's assets, read and inflated with core TensorFlow ops for the retrieved rows
    only, so they cost disk and page cache, not the server's resident memory;
  - no token tables: the retrieved texts are tokenized in graph
    (data.block_texts.block_inputs, the rule every layout follows).

`ServedIndex` implements the in-step half of the model's BlockIndex protocol (rows, search,
gather) over that layout, so OpenQAModel.retrieve/read run unchanged on it. Every op is a
core TensorFlow (or tf.text) op, except ScaNN's when a ScaNN searcher is attached.
"""
import os
import tempfile
from typing import NamedTuple, Optional

import numpy as np
import tensorflow as tf

from realm_tf.data import block_texts as block_texts_lib
from realm_tf.data.block_texts import BlockTexts
from realm_tf.retrieval import scann_index
from realm_tf.retrieval.row_blocks import RowBlocks
from realm_tf.retrieval.searcher import Searcher, SearchResult
from realm_tf.text.tokenization import Tokenizer


class ServedBlocks(NamedTuple):
  """BlockInputs (what the towers and the reader need) plus the blocks' strings."""
  document: dict  # BERT inputs [B, K, Lc] for the document tower
  body_ids: tf.Tensor  # [B, K, Lb] int32 body wordpieces (zero-padded)
  body_lengths: tf.Tensor  # [B, K] int32
  embeddings: Optional[tf.Tensor]  # [B, K, P] float32 indexed embeddings (None: see ServedIndex)
  titles: tf.Tensor  # [B, K] string
  texts: tf.Tensor  # [B, K] string


# With a searcher and embeddings, the searcher proposes this many candidates per neighbour
# asked for (unless a request chooses the number: rescored_candidates) and the embeddings
# re-score them. The design: quantized scores misorder near-ties that float16 ones do
# not, so the embeddings rank a generous candidate list, which is cheap (k x 20 rows a
# question); benchmarks/results/scann_rescoring.md measures recall@5 ranked each way, at
# other leaf fractions and with and without ScaNN's int8 reordering before it, and
# benchmarks/results/released_scale.md at REALM's full index.
RESCORED_PER_NEIGHBOUR = 20


def rescored_candidates(k: int, num_blocks: int, reorder_num_neighbors=None):
  """How many of a searcher's candidates the embeddings re-score for k neighbours.

  Args:
    k: the neighbours asked for.
    num_blocks: N, the blocks searched.
    reorder_num_neighbors: the number a request chose (scann_index.SearchOptions): None, a
      number, or a scalar int32 tensor (0 or less: not chosen).

  Returns:
    k x RESCORED_PER_NEIGHBOUR where none was chosen, else the number chosen; at least k
    and at most N either way: an int, or an int32 tensor for a tensor choice.
  """
  default = min(k * RESCORED_PER_NEIGHBOUR, num_blocks)
  if reorder_num_neighbors is None:
    return default
  if not isinstance(reorder_num_neighbors, tf.Tensor):
    return min(max(int(reorder_num_neighbors), k), num_blocks)
  chosen = tf.clip_by_value(tf.cast(reorder_num_neighbors, tf.int32), k, num_blocks)
  return tf.where(reorder_num_neighbors > 0, chosen, default)


class ServedIndex(tf.Module):
  """Embeddings, block ids and a BlockTexts store: the BlockIndex a QA export searches.

  Search is exact over the embeddings' row blocks (the KnowledgeIndex's exact search on one
  replica, so an export answers as evaluation does), or an attached in-graph Searcher
  (ScaNN's ops) covering the same block ids, in one of two ways:
    - with embeddings (float16 is enough), the searcher proposes rescored_candidates
      (RESCORED_PER_NEIGHBOUR per neighbour, or as many as a request's
      reorder_num_neighbors: scann_index.searching_with) and the embeddings re-score
      them: the top k are then ranked and scored by the embeddings' inner products, as
      exact search scores them;
    - without (`embeddings=None`), gathered blocks carry none and the model takes the
      searcher's scores as the relevance logits (OpenQAModel.retrieve): a ScaNN searcher
      already holds its own quantized copy of every embedding, and a float16 one is 2P
      bytes more per block in every loaded version.
  """

  def __init__(self, embeddings, block_ids: np.ndarray, texts: BlockTexts,
               tokenizer: Tokenizer, block_seq_length: int, body_length: int,
               version: Optional[int] = None, searcher: Optional[Searcher] = None,
               embedding_dtype: str = "float32", name: str = "served_index"):
    super().__init__(name=name)
    """embeddings: [N, P] in row order: an array; a RowBlocks to serve as it is (a
    KnowledgeIndex's, so evaluation and the export share one copy); or None with a
    searcher (see the class docstring)."""
    if embedding_dtype not in ("float32", "float16"):
      raise ValueError(f"embedding_dtype must be float32 or float16, got {embedding_dtype!r}")
    block_ids = np.asarray(block_ids, np.int64)
    if embeddings is None and searcher is None:
      raise ValueError("a ServedIndex without embeddings needs a searcher (it scores)")
    if embeddings is not None and (len(embeddings.shape) != 2
                                   or embeddings.shape[0] != len(block_ids)):
      raise ValueError(f"embeddings {tuple(embeddings.shape)} do not match {len(block_ids)} "
                       f"blocks")
    if texts.num_blocks != len(block_ids):
      raise ValueError(f"the text store holds {texts.num_blocks} blocks, the index "
                       f"{len(block_ids)}")
    if len(block_ids) > 1 and np.any(block_ids[1:] <= block_ids[:-1]):
      raise ValueError("block ids must be ascending in row order (rows() searches them)")
    if searcher is not None and searcher.num_blocks != len(block_ids):
      raise ValueError(f"the searcher covers {searcher.num_blocks} blocks, the index "
                       f"{len(block_ids)}")
    self.num_blocks = len(block_ids)
    self.dimension = int(embeddings.shape[1] if embeddings is not None else searcher.dimension)
    self.version = version
    # Variables, not constants: a SavedModel stores them once, in its checkpoint, and no
    # graph meets protobuf's 2 GB limit. Row blocks: see realm_tf.retrieval.row_blocks.
    if embeddings is None or isinstance(embeddings, RowBlocks):
      self.embeddings = embeddings
    else:
      self.embeddings = RowBlocks.from_array(np.asarray(embeddings), embedding_dtype)
    self.block_ids = tf.Variable(block_ids, trainable=False, name="block_ids")
    self.texts = texts
    self.tokenizer = tokenizer
    self.block_seq_length = int(block_seq_length)
    self.body_length = int(body_length)
    self.searcher = searcher

  def rows(self, block_ids: tf.Tensor) -> tf.Tensor:
    """Rows of block ids (any shape); ids must be in the index."""
    flat = tf.reshape(tf.cast(block_ids, tf.int64), [1, -1])  # [1, n]
    rows = tf.searchsorted(tf.convert_to_tensor(self.block_ids)[None, :], flat)  # [1, n]
    rows = tf.minimum(rows, self.num_blocks - 1)
    return tf.reshape(tf.cast(rows, tf.int32), tf.shape(block_ids))

  def search(self, queries: tf.Tensor, k: int) -> SearchResult:
    """The k blocks with the largest inner product with each query [B, P]."""
    if not 1 <= k <= self.num_blocks:
      raise ValueError(f"k={k} is not within the {self.num_blocks} blocks of the index")
    queries = tf.cast(queries, tf.float32)
    if self.searcher is not None:
      fetch = k if self.embeddings is None else rescored_candidates(
          k, self.num_blocks, scann_index.bound_options().reorder_num_neighbors)
      found = self.searcher.search(queries, fetch)
      # ScaNN's ops give no static shapes; the gathers downstream need the rank.
      block_ids = tf.reshape(found.block_ids, [-1, fetch])  # [B, fetch]
      scores = tf.reshape(found.scores, [-1, fetch])
      rows = self.rows(block_ids)
      if self.embeddings is None:
        return SearchResult(block_ids, scores, rows)
      candidates = tf.cast(self.embeddings.take(rows), tf.float32)  # [B, fetch, P]
      exact = tf.einsum("bp,bfp->bf", queries, candidates)
      # A searcher pads a short result with the lowest score: keep such padding last.
      exact = tf.where(scores > tf.float32.min, exact, tf.float32.min)
      top = tf.math.top_k(exact, k=k)  # [B, k]
      return SearchResult(tf.gather(block_ids, top.indices, batch_dims=1), top.values,
                          tf.gather(rows, top.indices, batch_dims=1))
    scores, rows = self.embeddings.top_k(queries, k)  # [B, k] each
    # Gathers from the read value, not the variable: see exact_top_k on copy-on-read.
    return SearchResult(tf.gather(tf.convert_to_tensor(self.block_ids), rows), scores, rows)

  def gather(self, rows: tf.Tensor) -> ServedBlocks:
    """The blocks at `rows` [B, K]: strings from the store, tokens made from them."""
    titles, texts = self.texts.lookup(rows)  # [B, K] each
    document, body_ids, body_lengths = block_texts_lib.block_inputs(
        titles, texts, self.tokenizer, self.block_seq_length, self.body_length)
    embeddings = None
    if self.embeddings is not None:
      embeddings = tf.cast(self.embeddings.take(rows), tf.float32)  # [B, K, P]
    return ServedBlocks(document, body_ids, body_lengths, embeddings, titles, texts)


def served_index_from(index, tokenizer: Tokenizer, texts_dir: str = "",
                      searcher: Optional[Searcher] = None,
                      embedding_dtype: Optional[str] = "float32",
                      blocks_per_chunk: int = block_texts_lib.BLOCKS_PER_CHUNK,
                      release_index: bool = False) -> ServedIndex:
  """The ServedIndex of a loaded exact-search KnowledgeIndex (its corpus and embeddings).

  An index in the text layout (built over a block text store, as evaluation and the
  exports build it) lends its store and, for float32, its embedding variable: nothing is
  copied or written again. An index with token tables has its corpus written as a store.

  Args:
    index: a KnowledgeIndex with embeddings (swap / set_embeddings), on one replica.
    tokenizer: the tokenizer the index's blocks were tokenized with.
    texts_dir: tables layout: where the text store is written; default a temporary
      directory that lives as long as the returned index.
    searcher: an in-graph Searcher over the same blocks (the ScaNN variant).
    embedding_dtype: float32 (scores as evaluated) or float16 (half the memory); with a
      searcher, the copy that re-scores its candidates, or None: no embeddings, the
      searcher's scores (ServedIndex).
    blocks_per_chunk: tables layout: blocks per compressed chunk of the text store.
    release_index: the index's embeddings are given up once the served index has what
      it needs of them (its own copy, or none: RowBlocks.release), for a caller whose last
      use of the index this is; the index then holds no version until a swap. Not with
      float32 served as they are (they are the index's own).

  Returns:
    The ServedIndex, with the KnowledgeIndex's version.

  Raises:
    ValueError: the index is not an exact-search index on one replica with embeddings,
      or no embedding_dtype without a searcher.
  """
  if index.backend != "exact":
    raise ValueError("the QA export searches in graph: build the KnowledgeIndex with "
                     "backend 'exact' and pass a ScaNN searcher for the ScaNN variant")
  if index.version is None:
    raise ValueError("the knowledge index holds no embeddings (set_embeddings / swap)")
  if index.num_replicas != 1:
    raise ValueError("a QA export is built from an index on one replica")
  store = index.store
  texts = index.texts
  if texts is None:
    owner = None
    if not texts_dir:
      owner = tempfile.TemporaryDirectory(prefix="realm-block-texts-")
      texts_dir = os.path.join(owner.name, "store")
    block_texts_lib.store_from_blocks(texts_dir, store, blocks_per_chunk)
    texts = BlockTexts(texts_dir)
    texts._owner = owner  # removes a temporary directory with the store  # pylint: disable=protected-access
  if embedding_dtype is None and searcher is None:
    raise ValueError("a served index without embeddings needs a searcher: exact search "
                     "scans the embeddings")
  embeddings = None
  version = index.version
  blocks = index.embedding_blocks
  if embedding_dtype is not None:
    if embedding_dtype == "float32" and blocks.dtype == tf.float32:
      if release_index:
        raise ValueError("float32 embeddings are served as the index holds them: they "
                         "cannot be released")
      embeddings = blocks  # evaluation's variables, served as they are
    else:
      embeddings = blocks.cast(embedding_dtype, release=release_index)
  if release_index:
    blocks.release()  # all of it, where the cast had none to make
    index.version = None
  return ServedIndex(embeddings, store.block_ids, texts, tokenizer,
                     index.block_seq_length, index.body_length, version, searcher,
                     embedding_dtype or "float32")
