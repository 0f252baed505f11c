"""The knowledge corpus Z in host memory: block id → (document uid, title, body).

Retrieval returns block ids; the input pipeline needs each block's text to build the
retriever and reader inputs, and its document uid to drop trivial retrievals. Held as
sorted numpy arrays (about the size of the text itself; ~20 GB for all of English
Wikipedia's 13M blocks, which a TPU host holds).
"""
import functools

import numpy as np
import tensorflow as tf

from realm_tf.corpus import schema
from realm_tf.data.files import BLOCKS, corpus_files, files


def blocks_pattern(path: str) -> str:
  """The blocks files of a corpus dir, or `path` when it is already a pattern."""
  return corpus_files(path, BLOCKS)


def _decoded(values) -> list[str]:
  return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]


class BlockStore:
  """Lookup of blocks by id, vectorised with searchsorted."""

  def __init__(self, block_ids, doc_uids, titles, texts):
    block_ids = np.asarray(block_ids, np.int64)
    order = np.argsort(block_ids, kind="stable")
    self.block_ids = block_ids[order]
    if len(self.block_ids) and np.any(self.block_ids[1:] == self.block_ids[:-1]):
      dup = self.block_ids[1:][self.block_ids[1:] == self.block_ids[:-1]][0]
      raise ValueError(f"duplicate block id {dup} in the block store")
    self.doc_uids = np.asarray(doc_uids, object)[order]
    self.titles = np.asarray(titles, object)[order]
    self.texts = np.asarray(texts, object)[order]

  def __len__(self) -> int:
    return len(self.block_ids)

  @functools.cached_property
  def title_strings(self) -> list[str]:
    """Titles as str, in row order (decoded once; the arrays hold TFRecord bytes)."""
    return _decoded(self.titles)

  @functools.cached_property
  def text_strings(self) -> list[str]:
    """Block bodies as str, in row order (decoded once)."""
    return _decoded(self.texts)

  @classmethod
  def from_tfrecords(cls, file_pattern: str, unpublished: bool = False) -> "BlockStore":
    """Every block of the corpus's block records.

    Args:
      file_pattern: blocks-* files of a published corpus (see data.files.files).
      unpublished: the files have no manifest (index.unpublished_blocks).

    Returns:
      The BlockStore.

    Raises:
      versioned.UnpublishedError: the corpus is not published, or its manifest does not
        match its files (unless `unpublished`).
      ValueError: no blocks.
    """
    dataset = tf.data.TFRecordDataset(files(file_pattern, unpublished)).batch(4096).map(
        schema.BLOCK.parse)
    columns = {k: [] for k in ("block_id", "doc_uid", "title", "text")}
    for batch in dataset.as_numpy_iterator():
      for key in columns:
        columns[key].append(batch[key])
    if not columns["block_id"]:
      raise ValueError(f"{file_pattern}: no blocks")
    return cls(*(np.concatenate(columns[k]) for k in ("block_id", "doc_uid", "title", "text")))

  def rows(self, block_ids: np.ndarray) -> np.ndarray:
    """Row numbers of `block_ids` (any shape); KeyError naming an unknown id."""
    block_ids = np.asarray(block_ids, np.int64)
    rows = np.searchsorted(self.block_ids, block_ids)
    rows = np.minimum(rows, len(self.block_ids) - 1)
    missing = self.block_ids[rows] != block_ids
    if np.any(missing):
      raise KeyError(f"block ids not in the block store: {block_ids[missing][:5].tolist()}")
    return rows
