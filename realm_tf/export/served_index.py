"""What a QA export holds of the corpus, laid out to be served at Wikipedia scale.

At 13,353,718 blocks (REALM's Wikipedia) the training-time KnowledgeIndex cannot be saved
as is: its token tables are N x (Lc + Lb) int32 (46 GB at Lc = 288, Lb = 286) and the
block texts and titles as one string variable are ~17 GB, all resident in every loaded
version (benchmarks/scale.py measures each part). A served question needs only the k
blocks it retrieves, so an export holds:

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
# asked for and the embeddings re-score them. At two shards of 1.03M generated rows
# (benchmarks/results/scann_rescoring.md), ScaNN's int8-reordered top 5 held 0.968 of the
# exact top 5, its merged top 100 re-scored from float16 0.990 (float32 0.990, bfloat16
# 0.984), and asymmetric hashing's top 100 without int8 reordering, re-scored from
# float16, 0.984 (what a ScaNN export serves: scann_index.without_reordering): int8
# scores misorder near-ties that float16 ones do not; at REALM's 13.35M blocks in 13
# shards, 0.972 served against 0.920 (benchmarks/results/released_scale.md). Candidates
# are cheap (100 rows of 256 bytes a question), so the margin is generous.
RESCORED_PER_NEIGHBOUR = 20


class ServedIndex(tf.Module):
  """Embeddings, block ids and a BlockTexts store: the BlockIndex a QA export searches.

  Search is exact over the embeddings' row blocks (the KnowledgeIndex's exact search on one
  replica, so an export answers as evaluation does), or an attached in-graph Searcher
  (ScaNN's ops) covering the same block ids, in one of two ways:
    - with embeddings (float16 is enough), the searcher proposes RESCORED_PER_NEIGHBOUR
      candidates per neighbour and the embeddings re-score them: the top k are then ranked
      and scored by the embeddings' inner products, as exact search scores them;
    - without (`embeddings=None`), gathered blocks carry none and the model takes the
      searcher's scores as the relevance logits (OpenQAModel.retrieve): a ScaNN searcher
      already holds its own quantized copy of every embedding, and a float16 one is
      3.2 GiB more per loaded version at REALM's 13.35M blocks.
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
      fetch = k if self.embeddings is None else min(k * RESCORED_PER_NEIGHBOUR,
                                                    self.num_blocks)
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
                      embedding_dtype: str = "float32",
                      blocks_per_chunk: int = block_texts_lib.BLOCKS_PER_CHUNK
                      ) -> ServedIndex:
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
      searcher, the copy that re-scores its candidates, or 'none': no embeddings, the
      searcher's scores (ServedIndex).
    blocks_per_chunk: tables layout: blocks per compressed chunk of the text store.

  Returns:
    The ServedIndex, with the KnowledgeIndex's version.
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
  if embedding_dtype == "none" and searcher is None:
    raise ValueError("embedding_dtype 'none' needs a searcher: exact search scans the "
                     "embeddings")
  embeddings = None
  if embedding_dtype != "none":
    blocks = index.embedding_blocks
    if embedding_dtype == "float32" and blocks.dtype == tf.float32:
      embeddings = blocks  # evaluation's variables, served as they are
    else:
      embeddings = blocks.cast(embedding_dtype)
  return ServedIndex(embeddings, store.block_ids, texts, tokenizer,
                     index.block_seq_length, index.body_length, index.version, searcher,
                     "float32" if embedding_dtype == "none" else embedding_dtype)
