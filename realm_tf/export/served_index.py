"""What a QA export holds of the corpus, laid out to be served at Wikipedia scale.

At 13,353,718 blocks (REALM's Wikipedia) the training-time KnowledgeIndex cannot be saved
as is: its token tables are N x (Lc + Lb) int32 (46 GB at Lc = 288, Lb = 286) and the
block texts and titles as one string variable are ~17 GB, all resident in every loaded
version (benchmarks/scale.py measures each part). A served question needs only the k
blocks it retrieves, so an export holds:

  - the embeddings [N, P] (float32 as evaluated, or float16 at half the memory) and the
    block ids [N] int64, as variables: what exact search scans on every question;
  - the titles and texts in `BlockTexts`: zlib-compressed chunk files among the
    SavedModel's assets, read and inflated with core TensorFlow ops for the retrieved rows
    only, so they cost disk and page cache, not the server's resident memory;
  - no token tables: the retrieved texts are tokenized in graph (tokenize_blocks' rule:
    the text's wordpieces cut to body_length; `[CLS] title [SEP] text [SEP]` for the
    document tower), which gives the same ids the tables held.

`ServedIndex` implements the in-step half of the model's BlockIndex protocol (rows, search,
gather) over that layout, so OpenQAModel.retrieve/read run unchanged on it. Every op is a
core TensorFlow (or tf.text) op, except ScaNN's when a ScaNN searcher is attached.
"""
import json
import os
import tempfile
import zlib
from typing import Iterable, NamedTuple, Optional

import numpy as np
import tensorflow as tf

from realm_tf.retrieval.exact import exact_top_k
from realm_tf.retrieval.searcher import Searcher, SearchResult
from realm_tf.text.tokenization import Tokenizer

# The chunk store's layout version, in its description file: a reader refuses another.
FORMAT_VERSION = 1
DESCRIPTION_FILE = "block_texts.json"
# Blocks per compressed chunk. A retrieved block costs reading and inflating its whole
# chunk (~340 KB of text at 256 real-length blocks: about a millisecond here), and the
# export has N / this many files (52k at 13.35M); zlib's 32 KB window means larger chunks
# compress no better.
BLOCKS_PER_CHUNK = 256
ZLIB_LEVEL = 6


def chunk_name(chunk: int) -> str:
  return f"block_texts-{chunk:08d}.z"


def _as_bytes(value) -> bytes:
  return value if isinstance(value, bytes) else str(value).encode("utf-8")


class BlockTexts(tf.Module):
  """Titles and texts of N blocks in zlib-compressed chunk files; see the module docstring.

  The chunk files sit beside the description file (a tf.saved_model.Asset): saved, the
  description is copied into the SavedModel's assets/ and `asset_files` must be copied
  there too (exporter.save_export does); loaded, the asset's path names the loaded
  directory, so a served version reads its own chunks wherever it was copied.
  """

  def __init__(self, directory: str, name: str = "block_texts"):
    super().__init__(name=name)
    description_path = os.path.join(directory, DESCRIPTION_FILE)
    with tf.io.gfile.GFile(description_path) as f:
      description = json.load(f)
    if description.get("format_version") != FORMAT_VERSION:
      raise ValueError(f"{description_path}: block text store format "
                       f"{description.get('format_version')!r}; this reader reads "
                       f"{FORMAT_VERSION}")
    self.directory = directory
    self.num_blocks = int(description["num_blocks"])
    self.blocks_per_chunk = int(description["blocks_per_chunk"])
    self.num_chunks = int(description["num_chunks"])
    self.description = tf.saved_model.Asset(description_path)
    tables = np.load(os.path.join(directory, "block_texts_offsets.npy"),
                     allow_pickle=False)  # [N, 3] int32
    # Per block: where its title starts in its inflated chunk, the title's and the text's
    # byte lengths (the text follows the title).
    self.starts = tf.Variable(tables[:, 0], trainable=False, name="starts")
    self.title_lengths = tf.Variable(tables[:, 1], trainable=False, name="title_lengths")
    self.text_lengths = tf.Variable(tables[:, 2], trainable=False, name="text_lengths")

  @property
  def asset_files(self) -> list[str]:
    """The chunk files a SavedModel of this store needs in its assets/ directory."""
    return [os.path.join(self.directory, chunk_name(c)) for c in range(self.num_chunks)]

  def lookup(self, rows: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(titles, texts) string tensors shaped like `rows` (int32 row numbers)."""
    shape = tf.shape(rows)
    flat = tf.reshape(tf.cast(rows, tf.int32), [-1])  # [n]
    folder = tf.strings.regex_replace(self.description.asset_path, "[^/]*$", "")
    paths = tf.strings.join([folder, "block_texts-",
                             tf.strings.as_string(flat // self.blocks_per_chunk, width=8,
                                                  fill="0"), ".z"])  # [n]
    chunks = tf.map_fn(lambda path: tf.io.decode_compressed(tf.io.read_file(path), "ZLIB"),
                       paths, fn_output_signature=tf.TensorSpec([], tf.string))  # [n]
    starts = tf.gather(tf.convert_to_tensor(self.starts), flat)
    title_lengths = tf.gather(tf.convert_to_tensor(self.title_lengths), flat)
    text_lengths = tf.gather(tf.convert_to_tensor(self.text_lengths), flat)
    titles = tf.strings.substr(chunks, starts, title_lengths)
    texts = tf.strings.substr(chunks, starts + title_lengths, text_lengths)
    return tf.reshape(titles, shape), tf.reshape(texts, shape)


def write_block_texts(directory: str, blocks: Iterable[tuple], num_blocks: int,
                      blocks_per_chunk: int = BLOCKS_PER_CHUNK) -> BlockTexts:
  """Writes (title, text) pairs, in row order, as a BlockTexts store under `directory`.

  Args:
    directory: a new or empty local or gs:// directory.
    blocks: `num_blocks` (title, text) pairs (str or UTF-8 bytes), streamed: only one
      chunk is held at a time, so a corpus need not fit in memory.
    num_blocks: how many pairs `blocks` yields.
    blocks_per_chunk: blocks per compressed chunk file.

  Returns:
    The store, readable at once.
  """
  if blocks_per_chunk < 1:
    raise ValueError(f"blocks_per_chunk must be positive, got {blocks_per_chunk}")
  tf.io.gfile.makedirs(directory)
  tables = np.zeros([num_blocks, 3], np.int32)
  row, parts, size = 0, [], 0

  def flush(chunk: int):
    with tf.io.gfile.GFile(os.path.join(directory, chunk_name(chunk)), "wb") as f:
      f.write(zlib.compress(b"".join(parts), ZLIB_LEVEL))

  for title, text in blocks:
    if row >= num_blocks:
      raise ValueError(f"more than the announced {num_blocks} blocks")
    title, text = _as_bytes(title), _as_bytes(text)
    if size + len(title) + len(text) >= 2**31:
      raise ValueError(f"block {row}: its chunk would pass 2 GiB; use fewer blocks_per_chunk")
    tables[row] = (size, len(title), len(text))
    parts += [title, text]
    size += len(title) + len(text)
    row += 1
    if row % blocks_per_chunk == 0:
      flush(row // blocks_per_chunk - 1)
      parts, size = [], 0
  if row != num_blocks:
    raise ValueError(f"got {row} blocks, {num_blocks} announced")
  num_chunks = -(-num_blocks // blocks_per_chunk)
  if parts or num_chunks == 0:
    flush(num_chunks - 1 if num_chunks else 0)
  with tf.io.gfile.GFile(os.path.join(directory, "block_texts_offsets.npy"), "wb") as f:
    np.save(f, tables, allow_pickle=False)
  with tf.io.gfile.GFile(os.path.join(directory, DESCRIPTION_FILE), "w") as f:
    json.dump(dict(format_version=FORMAT_VERSION, num_blocks=num_blocks,
                   blocks_per_chunk=blocks_per_chunk, num_chunks=max(num_chunks, 1),
                   compression="zlib"), f, indent=2, sort_keys=True)
  return BlockTexts(directory)


class ServedBlocks(NamedTuple):
  """BlockInputs (what the towers and the reader need) plus the blocks' strings."""
  document: dict  # BERT inputs [B, K, Lc] for the document tower
  body_ids: tf.Tensor  # [B, K, Lb] int32 body wordpieces (zero-padded)
  body_lengths: tf.Tensor  # [B, K] int32
  embeddings: tf.Tensor  # [B, K, P] float32 indexed embeddings
  titles: tf.Tensor  # [B, K] string
  texts: tf.Tensor  # [B, K] string


class ServedIndex(tf.Module):
  """Embeddings, block ids and a BlockTexts store: the BlockIndex a QA export searches.

  Search is exact_top_k over the embeddings (the KnowledgeIndex's exact search on one
  replica, so an export answers as evaluation does), or an attached in-graph Searcher
  (ScaNN's ops) covering the same block ids.
  """

  def __init__(self, embeddings, block_ids: np.ndarray, texts: BlockTexts,
               tokenizer: Tokenizer, block_seq_length: int, body_length: int,
               version: Optional[int] = None, searcher: Optional[Searcher] = None,
               embedding_dtype: str = "float32", name: str = "served_index"):
    super().__init__(name=name)
    if embedding_dtype not in ("float32", "float16"):
      raise ValueError(f"embedding_dtype must be float32 or float16, got {embedding_dtype!r}")
    """embeddings: [N, P] in row order, an array, or a float32 tf.Variable to share (the
    ScaNN variant's searcher state holds the same dataset: one copy serves both)."""
    block_ids = np.asarray(block_ids, np.int64)
    if len(embeddings.shape) != 2 or embeddings.shape[0] != len(block_ids):
      raise ValueError(f"embeddings {embeddings.shape} do not match {len(block_ids)} blocks")
    if texts.num_blocks != len(block_ids):
      raise ValueError(f"the text store holds {texts.num_blocks} blocks, the index "
                       f"{len(block_ids)}")
    if len(block_ids) > 1 and np.any(block_ids[1:] <= block_ids[:-1]):
      raise ValueError("block ids must be ascending in row order (rows() searches them)")
    if searcher is not None and searcher.num_blocks != len(block_ids):
      raise ValueError(f"the searcher covers {searcher.num_blocks} blocks, the index "
                       f"{len(block_ids)}")
    self.num_blocks, self.dimension = (int(n) for n in embeddings.shape)
    self.version = version
    # Variables, not constants: a SavedModel stores them once, in its checkpoint, and no
    # graph meets protobuf's 2 GB limit.
    if isinstance(embeddings, tf.Variable):
      if embeddings.dtype != tf.float32:
        raise ValueError(f"a shared embedding variable must be float32, got {embeddings.dtype}")
      self.embeddings = embeddings
    else:
      self.embeddings = tf.Variable(np.asarray(embeddings, embedding_dtype), trainable=False,
                                    name="embeddings")
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
      found = self.searcher.search(queries, k)
      # ScaNN's ops give no static shapes; the gathers downstream need the rank.
      block_ids = tf.reshape(found.block_ids, [-1, k])  # [B, k]
      return SearchResult(block_ids, tf.reshape(found.scores, [-1, k]), self.rows(block_ids))
    scores, rows = exact_top_k(queries, self.embeddings, k)  # [B, k] each
    # Gathers from the read value, not the variable: see exact_top_k on copy-on-read.
    return SearchResult(tf.gather(tf.convert_to_tensor(self.block_ids), rows), scores, rows)

  def gather(self, rows: tf.Tensor) -> ServedBlocks:
    """The blocks at `rows` [B, K]: strings from the store, tokens made from them."""
    titles, texts = self.texts.lookup(rows)  # [B, K] each
    shape = tf.shape(rows)
    flat_titles, flat_texts = tf.reshape(titles, [-1]), tf.reshape(texts, [-1])
    pieces = self.tokenizer.tokenize(flat_texts)  # [B*K, (T)]
    body_lengths = tf.minimum(tf.cast(pieces.row_lengths(), tf.int32), self.body_length)
    body_ids = tf.cast(pieces.to_tensor(shape=[None, self.body_length]), tf.int32)
    packed = self.tokenizer.encode(flat_titles, self.block_seq_length, pair_texts=flat_texts)
    document = {key: tf.reshape(value, tf.concat([shape, [self.block_seq_length]], 0))
                for key, value in packed.as_dict().items()}  # [B, K, Lc] each
    embeddings = tf.gather(tf.convert_to_tensor(self.embeddings), rows)  # [B, K, P]
    return ServedBlocks(
        document, tf.reshape(body_ids, tf.concat([shape, [self.body_length]], 0)),
        tf.reshape(body_lengths, shape), tf.cast(embeddings, tf.float32), titles, texts)


def served_index_from(index, tokenizer: Tokenizer, texts_dir: str = "",
                      searcher: Optional[Searcher] = None,
                      embedding_dtype: str = "float32",
                      blocks_per_chunk: int = BLOCKS_PER_CHUNK,
                      shared_embeddings: Optional[tf.Variable] = None) -> ServedIndex:
  """The ServedIndex of a loaded exact-search KnowledgeIndex (its corpus and embeddings).

  Args:
    index: a KnowledgeIndex with embeddings (swap / set_embeddings).
    tokenizer: the tokenizer the index's tables were made with.
    texts_dir: where the text store is written; default a temporary directory that lives
      as long as the returned index.
    searcher: an in-graph Searcher over the same blocks (the ScaNN variant).
    embedding_dtype: float32 (scores as evaluated) or float16 (half the memory).
    blocks_per_chunk: blocks per compressed chunk of the text store.
    shared_embeddings: a float32 variable holding exactly the index's embeddings in row
      order (shared_dataset of the ScaNN variant's state), used instead of a copy.

  Returns:
    The ServedIndex, with the KnowledgeIndex's version.
  """
  if index.backend != "exact":
    raise ValueError("the QA export searches in graph: build the KnowledgeIndex with "
                     "backend 'exact' and pass a ScaNN searcher for the ScaNN variant")
  if index.version is None:
    raise ValueError("the knowledge index holds no embeddings (set_embeddings / swap)")
  owner = None
  if not texts_dir:
    owner = tempfile.TemporaryDirectory(prefix="realm-block-texts-")
    texts_dir = owner.name
  store = index.store
  texts = write_block_texts(texts_dir, zip(store.titles, store.texts), len(store),
                            blocks_per_chunk)
  texts._owner = owner  # removes a temporary directory with the store  # pylint: disable=protected-access
  embeddings = shared_embeddings
  if embeddings is None:
    embeddings = np.asarray(index.embeddings.read_value(), np.float32)[:index.num_blocks]
  return ServedIndex(embeddings, store.block_ids, texts, tokenizer,
                     index.block_seq_length, index.body_length, index.version, searcher,
                     embedding_dtype)
