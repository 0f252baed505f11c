"""The knowledge corpus as a training step sees it: dense wordpiece tables and a fixed index.

Fine-tuning retrieves inside the step (ORQA): the question is embedded with the live query
tower, searched against the fixed block embeddings, and the retrieved blocks' wordpieces are
gathered from tables held beside the model, so no host round trip sits inside a step.

Memory: the tables hold N x (Lb + 2 Lc) int32 and the index N x P float32 (10k blocks at
the demo lengths: about 20 MB). English Wikipedia's 13M blocks at the paper's lengths need
tens of GB: that wants ScaNN for the search and a host-placed table, which these classes
accept (build them under a host device scope) but this repository has only tested on CPU.
"""
import logging
import os
from typing import Optional

import numpy as np
import tensorflow as tf

from realm_tf.data.block_store import BlockStore
from realm_tf.io import versioned
from realm_tf.retrieval import ExactSearcher, IndexExport, SearchResult, load_searcher
from realm_tf.retrieval.index_export import load_npy, shard_name
from realm_tf.text.tokenization import Tokenizer

JSONL_SUFFIXES = (".jsonl", ".json")


def prepare_blocks(corpus: str, work_dir: str, max_block_length: int) -> str:
  """The blocks file pattern of `corpus`.

  `corpus` is a `beam.preprocess` output directory, a blocks file pattern, or a JSON lines
  file of {title, text} documents, which is run through `beam.preprocess` once into
  `work_dir` (reused while its manifest names the same input and block length).
  """
  if corpus.endswith(JSONL_SUFFIXES) and tf.io.gfile.exists(corpus) \
      and not tf.io.gfile.isdir(corpus):
    manifest_path = os.path.join(work_dir, "manifest.json")
    if tf.io.gfile.exists(manifest_path):
      made = versioned.read_json(manifest_path).get("config", {})
      if (made.get("input") != corpus
          or made.get("max_block_length") != max_block_length):
        raise ValueError(f"{work_dir} holds blocks of {made.get('input')} with "
                         f"max_block_length {made.get('max_block_length')}, not {corpus} "
                         f"with {max_block_length}: use another model_dir")
      logging.info("Reusing the blocks of %s in %s", corpus, work_dir)
    else:
      from beam import preprocess  # pylint: disable=g-import-not-at-top
      logging.info("Preprocessing %s into blocks in %s", corpus, work_dir)
      # Titles keep beam.preprocess's 64-wordpiece limit unless the blocks are short.
      preprocess.main(["--input_format", "jsonl", "--input", corpus, "--output_dir",
                       work_dir, "--max_block_length", str(max_block_length),
                       "--max_title_length", str(min(64, max_block_length // 2))])
    return os.path.join(work_dir, "blocks-*")
  if tf.io.gfile.isdir(corpus):
    return os.path.join(corpus, "blocks-*")
  if not tf.io.gfile.glob(corpus):
    raise FileNotFoundError(f"--corpus {corpus}: no such directory, JSON lines file or "
                            f"blocks file pattern")
  return corpus


class BlockTable(tf.Module):
  """Block id → body wordpieces (reader) and packed `[CLS] title [SEP] body [SEP]` inputs
  (document tower, only when it trains), as dense non-trainable variables in the
  BlockStore's row order (ascending block id)."""

  def __init__(self, store: BlockStore, tokenizer: Tokenizer, body_length: int,
               block_seq_length: int = 0, batch_size: int = 1024, name: str = "block_table"):
    super().__init__(name=name)
    self.store = store
    self.body_length = body_length
    n = len(store)
    texts, titles = store.text_strings, store.title_strings
    body = np.zeros([n, body_length], np.int32)
    lengths = np.zeros([n], np.int32)
    word_ids = np.zeros([n, max(block_seq_length, 1)], np.int32)
    type_ids = np.zeros_like(word_ids)
    for start in range(0, n, batch_size):
      end = min(n, start + batch_size)
      pieces = tokenizer.tokenize(tf.constant(texts[start:end]))  # [b, (T)]
      lengths[start:end] = np.minimum(pieces.row_lengths().numpy(), body_length)
      body[start:end] = pieces.to_tensor(shape=[end - start, body_length]).numpy()
      if block_seq_length:
        packed = tokenizer.encode(tf.constant(titles[start:end]), block_seq_length,
                                  pair_texts=tf.constant(texts[start:end]))
        word_ids[start:end] = packed.input_word_ids.numpy()
        type_ids[start:end] = packed.input_type_ids.numpy()
    self.block_ids = tf.Variable(store.block_ids, trainable=False, name="block_ids")  # [N]
    self.body_ids = tf.Variable(body, trainable=False, name="body_ids")  # [N, Lb]
    self.body_lengths = tf.Variable(lengths, trainable=False, name="body_lengths")  # [N]
    self.has_block_inputs = bool(block_seq_length)
    self.block_word_ids = tf.Variable(word_ids, trainable=False, name="block_word_ids")
    self.block_type_ids = tf.Variable(type_ids, trainable=False, name="block_type_ids")

  @property
  def num_blocks(self) -> int:
    return len(self.store)

  def rows(self, block_ids: tf.Tensor) -> tf.Tensor:
    """Row numbers of block ids (any shape); ids must be in the table."""
    flat = tf.reshape(tf.cast(block_ids, tf.int64), [1, -1])  # [1, n]
    rows = tf.searchsorted(self.block_ids[None, :], flat)  # [1, n]
    rows = tf.minimum(rows, self.num_blocks - 1)
    return tf.reshape(tf.cast(rows, tf.int32), tf.shape(block_ids))

  def bodies(self, rows: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """[B, K] rows → body wordpieces [B, K, Lb] and their lengths [B, K]."""
    return tf.gather(self.body_ids, rows), tf.gather(self.body_lengths, rows)

  def block_inputs(self, rows: tf.Tensor) -> dict[str, tf.Tensor]:
    """[B, K] rows → the document tower's BERT inputs [B, K, Lc]."""
    if not self.has_block_inputs:
      raise ValueError("BlockTable built without block_seq_length: no document inputs")
    word_ids = tf.gather(self.block_word_ids, rows)
    return dict(input_word_ids=word_ids,
                input_mask=tf.cast(word_ids > 0, tf.int32),
                input_type_ids=tf.gather(self.block_type_ids, rows))


def row_ordered_embeddings(export: IndexExport, block_ids: np.ndarray) -> np.ndarray:
  """[N, P] the export's embeddings in the order of `block_ids` (sorted); an error if the
  index and the corpus disagree on which blocks exist."""
  ids, vectors = [], []
  shards = export.manifest["shards"]
  for info in shards:
    if not info["num_blocks"]:
      continue
    path = os.path.join(export.path, shard_name(info["shard"], len(shards)))
    ids.append(load_npy(os.path.join(path, "block_ids.npy")))
    vectors.append(load_npy(os.path.join(path, "embeddings.npy")).astype(np.float32))
  ids = np.concatenate(ids)
  vectors = np.concatenate(vectors)
  order = np.argsort(ids, kind="stable")
  ids, vectors = ids[order], vectors[order]
  if ids.shape != block_ids.shape or np.any(ids != block_ids):
    raise ValueError(f"index {export.path} covers {len(ids)} blocks that are not the "
                     f"corpus's {len(block_ids)}: rebuild it from these blocks")
  return vectors


class DocumentIndex(tf.Module):
  """Top-k table rows for query embeddings, in-graph, over one committed index export.

  backend 'exact': one matmul and top_k (ExactSearcher over row numbers); a refresh assigns
  the new embeddings in place. 'scann': the export's ScaNN shards (CPU ops); a refresh
  loads new searchers, so a compiled step must be traced again (`swap` says so).
  Relevance of the retrieved rows is always the exact inner product with `embeddings`.
  """

  def __init__(self, table: BlockTable, export: IndexExport, backend: str = "exact",
               rescore: bool = False, name: str = "document_index"):
    super().__init__(name=name)
    if backend not in ("exact", "scann"):
      raise ValueError(f"index backend must be 'exact' or 'scann', got {backend!r}")
    self.table = table
    self.backend = backend
    self.rescore = rescore
    vectors = row_ordered_embeddings(export, table.store.block_ids)
    self.exact = ExactSearcher(vectors, np.arange(len(vectors), dtype=np.int64))
    self.embeddings = self.exact.embeddings  # [N, P], rows as in the table
    self.scann = load_searcher(export, "scann", rescore) if backend == "scann" else None
    self.version = export.version

  def search(self, queries: tf.Tensor, k: int) -> SearchResult:
    """[B, P] → SearchResult with block_ids holding table rows [B, k] (int32)."""
    if self.scann is None:
      found = self.exact.search(queries, k)
      return SearchResult(tf.cast(found.block_ids, tf.int32), found.scores)
    found = self.scann.search(queries, k)
    return SearchResult(self.table.rows(found.block_ids), found.scores)

  def document_embeddings(self, rows: tf.Tensor) -> tf.Tensor:
    """[B, K] rows → [B, K, P] indexed embeddings (fixed: no gradient)."""
    return tf.gather(self.embeddings, rows)

  def swap(self, export: IndexExport) -> bool:
    """Loads a newer export; True when a compiled step must be traced again."""
    self.embeddings.assign(row_ordered_embeddings(export, self.table.store.block_ids))
    self.version = export.version
    if self.scann is None:
      return False
    self.scann = load_searcher(export, "scann", self.rescore)
    return True


class Corpus:
  """What a fine-tuning step retrieves from: the table, and the dense index unless the
  retrieval is BM25 (whose top-k arrive as features)."""

  def __init__(self, table: BlockTable, index: Optional[DocumentIndex] = None):
    self.table = table
    self.index = index

  @property
  def store(self) -> BlockStore:
    return self.table.store
