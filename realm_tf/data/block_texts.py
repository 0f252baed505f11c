"""The block text store: every block's title and text, read only for the blocks retrieved.

One store serves evaluation (realm_tf.evaluate), the QA exports and the server, so an
evaluated answer and a served one come from the same bytes tokenized by the same rule
(`block_inputs`). At REALM's 13,353,718 Wikipedia blocks the alternatives cost tens of GB
of host memory: the texts as Python strings (~17 GB) or token tables of every block
(N x (Lc + Lb) ids). A question needs only the k blocks it retrieves, so the store is:

  <dir>/
    block_texts-00000000.z ...   zlib-compressed chunks of BLOCKS_PER_CHUNK blocks, each
                                 the concatenation title, text, title, text, ...
    block_texts_offsets.npy      [N, 3] int32: a block's start in its inflated chunk, its
                                 title's and its text's byte lengths
    block_texts_ids.npy          [N] int64: the block ids, ascending, in row order
    block_texts.json             the description (format, counts)
    manifest.json                the commit (realm_tf.io.versioned.OutputWriter): every
                                 file with size and CRC32C, written last

Two readers of one layout: `BlockTexts`, a tf.Module whose `lookup` reads and inflates the
retrieved rows' chunks with core TensorFlow ops (in a step, or in a SavedModel that a stock
model server runs; the description is a tf.saved_model.Asset, so a served version reads
the chunks copied beside it), and `HostBlockTexts`, the same rows for host code (answer
strings, recall, warm-up requests), which holds only the offsets and ids.

Training keeps per-replica token tables instead (realm_tf.retrieval.knowledge_index): an
accelerator step compiled with XLA cannot read files or run the tokenizer, and a
training corpus is re-read every step.
"""
import functools
import json
import logging
import os
import zlib
from collections.abc import Sequence
from typing import Iterable

import google_crc32c
import numpy as np
import tensorflow as tf

from realm_tf.data.block_store import BlockStore, blocks_pattern
from realm_tf.io import layout, versioned
from realm_tf.text.tokenization import Tokenizer

# The store's layout version, in its description file: a reader refuses another.
FORMAT_VERSION = 2
DESCRIPTION_FILE = "block_texts.json"
OFFSETS_FILE = "block_texts_offsets.npy"
IDS_FILE = "block_texts_ids.npy"
# Blocks per compressed chunk. A retrieved block costs reading and inflating its whole
# chunk (~340 KB of text at 256 real-length blocks: about a millisecond here), and the
# store has N / this many files (52k at 13.35M); zlib's 32 KB window means larger chunks
# compress no better.
BLOCKS_PER_CHUNK = 256
ZLIB_LEVEL = 6
# Inflated chunks HostBlockTexts keeps: one evaluation batch's retrieved blocks.
HOST_CHUNK_CACHE = 256


def chunk_name(chunk: int) -> str:
  """The file name of chunk number `chunk`."""
  return f"block_texts-{chunk:08d}.z"


def _as_bytes(value) -> bytes:
  return value if isinstance(value, bytes) else str(value).encode("utf-8")


def read_description(directory: str) -> dict:
  """A committed store's description.

  Args:
    directory: the store's directory.
  Returns:
    The description (format_version, num_blocks, blocks_per_chunk, num_chunks).
  Raises:
    FileNotFoundError: no committed store there (no manifest: absent or being written).
    ValueError: another format version.
  """
  if not tf.io.gfile.exists(os.path.join(directory, versioned.MANIFEST)):
    raise FileNotFoundError(f"{directory}: no committed block text store (no "
                            f"{versioned.MANIFEST})")
  path = os.path.join(directory, DESCRIPTION_FILE)
  with tf.io.gfile.GFile(path) as f:
    description = json.load(f)
  if description.get("format_version") != FORMAT_VERSION:
    raise ValueError(f"{path}: block text store format {description.get('format_version')!r};"
                     f" this reader reads {FORMAT_VERSION}")
  return description


def is_committed(directory: str) -> bool:
  """Whether `directory` holds a committed block text store."""
  return bool(directory) and tf.io.gfile.exists(os.path.join(directory, versioned.MANIFEST))


def _load_array(directory: str, name: str) -> np.ndarray:
  with tf.io.gfile.GFile(os.path.join(directory, name), "rb") as f:
    return np.load(f, allow_pickle=False)


def write_block_texts(directory: str, blocks: Iterable[tuple], num_blocks: int,
                      blocks_per_chunk: int = BLOCKS_PER_CHUNK,
                      overwrite: bool = False) -> "HostBlockTexts":
  """Writes (block_id, title, text) triples, in row order, as a committed store.

  Args:
    directory: a new or empty local or gs:// directory.
    blocks: `num_blocks` (block_id, title, text) triples (str or UTF-8 bytes), block ids
      ascending, streamed: one chunk is held at a time, so a corpus need not fit in memory.
    num_blocks: how many triples `blocks` yields.
    blocks_per_chunk: blocks per compressed chunk file.
    overwrite: replace what `directory` holds.

  Returns:
    The store's host reader.

  Raises:
    ValueError: another count than announced, block ids not ascending, a chunk over 2 GiB.
    FileExistsError: `directory` holds files and not `overwrite`.
  """
  if blocks_per_chunk < 1:
    raise ValueError(f"blocks_per_chunk must be positive, got {blocks_per_chunk}")
  offsets = np.zeros([num_blocks, 3], np.int32)
  ids = np.zeros([num_blocks], np.int64)
  with versioned.OutputWriter(directory, overwrite) as writer:
    tf.io.gfile.makedirs(directory)
    files, row, parts, size = [], 0, [], 0

    def write(name: str, data: bytes):
      with tf.io.gfile.GFile(os.path.join(directory, name), "wb") as f:
        f.write(data)
      files.append(dict(name=name, size=len(data),
                        crc32c=google_crc32c.Checksum(data).digest().hex()))

    def flush(chunk: int):
      write(chunk_name(chunk), zlib.compress(b"".join(parts), ZLIB_LEVEL))

    for block_id, title, text in blocks:
      if row >= num_blocks:
        raise ValueError(f"{directory}: more than the announced {num_blocks} blocks")
      if row and block_id <= ids[row - 1]:
        raise ValueError(f"{directory}: block id {block_id} at row {row} is not above the "
                         f"previous one ({ids[row - 1]}): ids must ascend in row order")
      title, text = _as_bytes(title), _as_bytes(text)
      if size + len(title) + len(text) >= 2**31:
        raise ValueError(f"block {block_id}: its chunk would pass 2 GiB; use fewer "
                         f"blocks_per_chunk")
      offsets[row] = (size, len(title), len(text))
      ids[row] = block_id
      parts += [title, text]
      size += len(title) + len(text)
      row += 1
      if row % blocks_per_chunk == 0:
        flush(row // blocks_per_chunk - 1)
        parts, size = [], 0
    if row != num_blocks:
      raise ValueError(f"{directory}: got {row} blocks, {num_blocks} announced")
    num_chunks = max(1, -(-num_blocks // blocks_per_chunk))
    if parts or num_blocks == 0:
      flush(num_chunks - 1)
    for name, array in ((OFFSETS_FILE, offsets), (IDS_FILE, ids)):
      with tf.io.gfile.GFile(os.path.join(directory, name), "wb") as f:
        np.save(f, array, allow_pickle=False)
    description = dict(format_version=FORMAT_VERSION, num_blocks=num_blocks,
                       blocks_per_chunk=blocks_per_chunk, num_chunks=num_chunks,
                       compression="zlib")
    write(DESCRIPTION_FILE, json.dumps(description, indent=2, sort_keys=True).encode())
    writer.commit(dict(kind="block_texts", num_blocks=num_blocks), files=files)
  return HostBlockTexts(directory)


class _Column(Sequence):
  """One string column of a HostBlockTexts, indexed by row (int or slice)."""

  def __init__(self, store: "HostBlockTexts", field: int):
    self.store, self.field = store, field

  def __len__(self) -> int:
    return len(self.store)

  def __getitem__(self, row):
    if isinstance(row, slice):
      return [self[r] for r in range(*row.indices(len(self)))]
    return self.store.row(int(row))[self.field]


class HostBlockTexts:
  """A committed store's rows for host code: `titles`/`texts` (and `title_strings`/
  `text_strings`, the same) index rows lazily, each read inflating its chunk (the newest
  HOST_CHUNK_CACHE kept); `block_ids` is [N] int64. Duck-types what evaluation and the
  exports read of a data.block_store.BlockStore.

  Args:
    directory: the store's directory (committed).
  """

  def __init__(self, directory: str):
    description = read_description(directory)
    self.directory = directory
    self.blocks_per_chunk = int(description["blocks_per_chunk"])
    self.num_chunks = int(description["num_chunks"])
    self.offsets = _load_array(directory, OFFSETS_FILE)  # [N, 3] int32
    self.block_ids = _load_array(directory, IDS_FILE)  # [N] int64
    if len(self.offsets) != int(description["num_blocks"]) or len(self.block_ids) != len(
        self.offsets):
      raise ValueError(f"{directory}: its tables do not hold {description['num_blocks']} "
                       f"blocks")
    self.title_strings = self.titles = _Column(self, 0)
    self.text_strings = self.texts = _Column(self, 1)
    self._chunk = functools.lru_cache(maxsize=HOST_CHUNK_CACHE)(self._read_chunk)

  def __len__(self) -> int:
    return len(self.block_ids)

  def _read_chunk(self, chunk: int) -> bytes:
    with tf.io.gfile.GFile(os.path.join(self.directory, chunk_name(chunk)), "rb") as f:
      return zlib.decompress(f.read())

  def row(self, row: int) -> tuple[str, str]:
    """(title, text) of row `row`."""
    if not 0 <= row < len(self):
      raise IndexError(f"row {row} is not in the store's {len(self)} blocks")
    start, title_length, text_length = (int(v) for v in self.offsets[row])
    data = self._chunk(row // self.blocks_per_chunk)
    middle = start + title_length
    return (data[start:middle].decode("utf-8"),
            data[middle:middle + text_length].decode("utf-8"))

  def rows(self, block_ids: np.ndarray) -> np.ndarray:
    """Rows of block ids (each must be in the store)."""
    return np.searchsorted(self.block_ids, np.asarray(block_ids, np.int64)).astype(np.int32)

  @property
  def chunk_files(self) -> list[str]:
    """Every chunk file's path (what a SavedModel of the store needs in its assets/)."""
    return [os.path.join(self.directory, chunk_name(c)) for c in range(self.num_chunks)]


class BlockTexts(tf.Module):
  """A committed store read in graph; see the module docstring.

  The chunk files sit beside the description file (a tf.saved_model.Asset): saved, the
  description is copied into the SavedModel's assets/ and `asset_files` must be linked
  there too (realm_tf.export.exporter.save_export does); loaded, the asset's path names
  the loaded directory, so a served version reads its own chunks wherever it was copied.

  Args:
    directory: the store's directory (committed).
    name: the tf.Module's name.
  """

  def __init__(self, directory: str, name: str = "block_texts"):
    super().__init__(name=name)
    description = read_description(directory)
    self.directory = directory
    self.num_blocks = int(description["num_blocks"])
    self.blocks_per_chunk = int(description["blocks_per_chunk"])
    self.num_chunks = int(description["num_chunks"])
    self.description = tf.saved_model.Asset(os.path.join(directory, DESCRIPTION_FILE))
    offsets = _load_array(directory, OFFSETS_FILE)  # [N, 3] int32
    # Per block: where its title starts in its inflated chunk, the title's and the text's
    # byte lengths (the text follows the title).
    self.starts = tf.Variable(offsets[:, 0], trainable=False, name="starts")
    self.title_lengths = tf.Variable(offsets[:, 1], trainable=False, name="title_lengths")
    self.text_lengths = tf.Variable(offsets[:, 2], trainable=False, name="text_lengths")

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


def block_inputs(titles: tf.Tensor, texts: tf.Tensor, tokenizer: Tokenizer,
                 block_seq_length: int, body_length: int) -> tuple[dict, tf.Tensor, tf.Tensor]:
  """The towers' and the reader's inputs of retrieved blocks, tokenized from their strings.

  The one rule of every block layout (knowledge_index.tokenize_blocks makes its tables by
  it): the text's wordpieces cut to `body_length` for the reader; `[CLS] title [SEP] text
  [SEP]` cut to `block_seq_length` for the document tower.

  Args:
    titles: [B, K] strings.
    texts: [B, K] strings.
    tokenizer: the run's Tokenizer.
    block_seq_length: Lc.
    body_length: Lb.

  Returns:
    (document BERT inputs [B, K, Lc] each, body_ids [B, K, Lb] int32, body_lengths [B, K]).
  """
  shape = tf.shape(titles)
  flat_titles, flat_texts = tf.reshape(titles, [-1]), tf.reshape(texts, [-1])
  pieces = tokenizer.tokenize(flat_texts)  # [B*K, (T)]
  body_lengths = tf.minimum(tf.cast(pieces.row_lengths(), tf.int32), body_length)
  body_ids = tf.cast(pieces.to_tensor(shape=[None, body_length]), tf.int32)  # [B*K, Lb]
  packed = tokenizer.encode(flat_titles, block_seq_length, pair_texts=flat_texts)
  document = {key: tf.reshape(value, tf.concat([shape, [block_seq_length]], 0))
              for key, value in packed.as_dict().items()}  # [B, K, Lc] each
  return (document, tf.reshape(body_ids, tf.concat([shape, [body_length]], 0)),
          tf.reshape(body_lengths, shape))


def store_from_blocks(directory: str, store, blocks_per_chunk: int = BLOCKS_PER_CHUNK,
                      overwrite: bool = False) -> HostBlockTexts:
  """Writes an in-memory BlockStore (row order) as a committed store.

  Args:
    directory: where the store goes.
    store: a data.block_store.BlockStore.
    blocks_per_chunk: blocks per chunk.
    overwrite: replace what `directory` holds.

  Returns:
    The store's host reader.
  """
  return write_block_texts(directory, zip(store.block_ids.tolist(), store.titles, store.texts),
                           len(store), blocks_per_chunk, overwrite)


def store_from_records(directory: str, file_pattern: str,
                       blocks_per_chunk: int = BLOCKS_PER_CHUNK,
                       overwrite: bool = False, unpublished: bool = False
                       ) -> HostBlockTexts:
  """Writes the block records of a corpus as a committed store.

  The records are read into memory once (a BlockStore sorts them by id); a corpus too
  large for that is written to a store as it is produced (realm_tf.import_released).

  Args:
    directory: where the store goes.
    file_pattern: the corpus's blocks-* files.
    blocks_per_chunk: blocks per chunk.
    overwrite: replace what `directory` holds.
    unpublished: the block records have no manifest (index.unpublished_blocks).

  Returns:
    The store's host reader.
  """
  return store_from_blocks(directory, BlockStore.from_tfrecords(file_pattern, unpublished),
                           blocks_per_chunk, overwrite)


def ensure_store(config, model_dir: str):
  """`config` with index.text_store set: as given, or the store of index.blocks under
  <model_dir>/block_texts/<hash>, written there first if no committed one exists.

  Args:
    config: an ExperimentConfig.
    model_dir: the run (or work) directory whose block_texts/ holds made stores.

  Returns:
    The config, index.text_store naming a committed store.

  Raises:
    ValueError: neither index.text_store nor index.blocks is set.
  """
  if config.index.text_store:
    read_description(config.index.text_store)  # committed, and of this format
    return config
  if not config.index.blocks:
    raise ValueError("index.blocks (or index.text_store) must name the corpus")
  pattern = blocks_pattern(config.index.blocks)
  directory = layout.block_texts_dir(model_dir, pattern)
  if not is_committed(directory):
    logging.info("Writing the block text store of %s to %s", pattern, directory)
    # Uncommitted files there are a crashed writer's: never read, replaced.
    store_from_records(directory, pattern, overwrite=True,
                       unpublished=config.index.unpublished_blocks)
  return config.replace(index=dict(text_store=directory))


__all__ = ["ensure_store", "BLOCKS_PER_CHUNK", "BlockTexts", "DESCRIPTION_FILE", "FORMAT_VERSION",
           "HostBlockTexts", "block_inputs", "chunk_name", "is_committed",
           "read_description", "store_from_blocks", "store_from_records",
           "write_block_texts"]
