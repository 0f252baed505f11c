"""The released blocks.tfr and titles.tfr as the run's block text store and, when asked for,
block records."""
import hashlib
import math
import os

import tensorflow as tf

from realm_tf.corpus import schema
from realm_tf.data import block_texts
from realm_tf.import_released.release import BLOCK_EMB, Progress
from realm_tf.io import versioned

READ_BATCH = 4096


def title_uid(title: bytes) -> str:
  """The released blocks carry no document text: blocks of one article share its title,
  which stands in for realm_tf's document uid (what "no trivial retrievals" compares)."""
  return hashlib.sha256(title).hexdigest()[:32]


def convert_corpus(blocks: str, titles: str, text_store: str, expected: int,
                   corpus_dir: str = "", records_per_file: int = 1_000_000) -> int:
  """Reads blocks.tfr + titles.tfr once into the run's block text store (block id =
  record number) and, with `corpus_dir`, block records too.

  The text store is what evaluation, the exports and the server read (realm_tf.data.
  block_texts: compressed, committed by its manifest once whole). Block records are for
  training and re-embedding (index.blocks): at 13.35M blocks they are about the size of
  blocks.tfr again, so they are written only when asked for, and published as a corpus
  is (manifest.json last, after one read of the records for their CRC32C).

  Args:
    blocks: blocks.tfr (one UTF-8 block per record).
    titles: titles.tfr (record i is block i's title).
    text_store: where the block text store goes.
    expected: the number of blocks (block_emb's rows).
    corpus_dir: where block records go ('' : none).
    records_per_file: block records per output file.
  Returns:
    The number of blocks written.
  Raises:
    ValueError: the two files differ in length, a record is not UTF-8, or the count is
      not `expected`.
  """
  num_files = max(1, math.ceil(expected / records_per_file))
  progress = Progress("blocks", expected)
  state = dict(count=0, writer=None, tmp="", final="")

  def close_file():
    if state["writer"] is not None:
      state["writer"].close()
      state["writer"] = None
      tf.io.gfile.rename(state["tmp"], state["final"], overwrite=True)

  def write_record(record: dict):
    count = state["count"]
    if count % records_per_file == 0:
      close_file()
      name = f"blocks-{count // records_per_file:05d}-of-{num_files:05d}.tfrecord"
      state["final"] = os.path.join(corpus_dir, name)
      state["tmp"] = os.path.join(corpus_dir, f".tmp-{name}")
      state["writer"] = tf.io.TFRecordWriter(state["tmp"])
    state["writer"].write(schema.BLOCK.serialize(record))

  def released_blocks():
    block_batches = iter(tf.data.TFRecordDataset(blocks).batch(READ_BATCH))
    title_batches = iter(tf.data.TFRecordDataset(titles).batch(READ_BATCH))
    while True:
      texts, names = next(block_batches, None), next(title_batches, None)
      if texts is None and names is None:
        return
      num_texts = 0 if texts is None else len(texts)
      num_names = 0 if names is None else len(names)
      if num_texts != num_names:
        raise ValueError(f"{blocks} and {titles} differ in length: "
                         f"{state['count'] + num_texts} and {state['count'] + num_names} "
                         f"records read so far")
      if state["count"] + num_texts > expected:
        raise ValueError(f"{blocks}: more than the {expected} rows of {BLOCK_EMB}")
      for text, title in zip(texts.numpy(), names.numpy()):
        # A bad record is refused, not set aside: every block id is a row of block_emb,
        # and the index must cover exactly the blocks the store holds.
        try:
          text_str, title_str = text.decode("utf-8"), title.decode("utf-8")
        except UnicodeDecodeError as e:
          raise ValueError(f"{blocks} / {titles}: record {state['count']} is not UTF-8 "
                           f"({e})") from e
        if corpus_dir:
          write_record(dict(block_id=state["count"], doc_uid=title_uid(title),
                            title=title_str, text=text_str))
        yield state["count"], title, text
        state["count"] += 1
      progress.update(state["count"])

  # Block records are published as a corpus is (manifest.json last, realm_tf.io.versioned
  # .OutputWriter): training and beam.embed_corpus read them only through it. The import
  # owns the directory (it refuses an output_dir that holds a committed run), so what an
  # earlier, failed import left there is replaced.
  writer = versioned.OutputWriter(corpus_dir, overwrite=True) if corpus_dir else None
  if corpus_dir:
    tf.io.gfile.makedirs(corpus_dir)
  try:
    try:
      block_texts.write_block_texts(text_store, released_blocks(), expected)
    except ValueError as e:
      if "announced" in str(e) and state["count"] < expected:  # fewer records than rows
        raise ValueError(f"{blocks}: {state['count']} blocks, but {BLOCK_EMB} has "
                         f"{expected} rows") from None
      raise
    close_file()
    if writer is not None:
      writer.commit(dict(kind="released_blocks", source=dict(blocks=blocks, titles=titles),
                         counts=dict(blocks=state["count"])))
  finally:
    if state["writer"] is not None:
      state["writer"].close()
    if writer is not None:
      writer.abort()
  progress.update(state["count"], force=True)
  return state["count"]
