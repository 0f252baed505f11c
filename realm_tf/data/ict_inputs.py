"""Inverse Cloze Task batches: pseudo-queries and their evidence blocks.

Features (a tf.data nest of numeric tensors only; B = per-replica batch):
  {"query": BERT inputs [B, Lq], "block": BERT inputs [B, Lc], "block_id": [B] int64}
"""
from typing import Optional

import tensorflow as tf

from realm_tf.corpus import schema
from realm_tf.data.files import pipeline_records
from realm_tf.text.tokenization import Tokenizer


def ict_dataset(file_pattern: str, tokenizer: Tokenizer, batch_size: int,
                query_seq_length: int, block_seq_length: int, seed: int = 0,
                shuffle_buffer: int = 10000, repeat: bool = True, skip_batches: int = 0,
                input_context: Optional[tf.distribute.InputContext] = None,
                max_examples: int = 0, unpublished: bool = False) -> tf.data.Dataset:
  """Batches of ICT features; the corpus pipeline already removed each query from its block
  with probability 0.9. Records are sharded by input pipeline first, then repeated,
  shuffled in a fixed order per seed and batched; `skip_batches` resumes that order.

  Args:
    file_pattern: ict-* TFRecords (beam.preprocess), several patterns joined by commas.
    tokenizer: the run's Tokenizer.
    batch_size: the per-replica batch B (batches are always full).
    query_seq_length: Lq.
    block_seq_length: Lb, of `[CLS] title [SEP] text [SEP]`.
    seed: the shuffle seed.
    shuffle_buffer: 0: no shuffling.
    repeat: repeat forever (training).
    skip_batches: batches to skip (a resumed run's).
    input_context: the pipeline's InputContext (sharding), or None.
    max_examples: read at most this many records (0: all).
    unpublished: the files have no manifest (data.files.files).

  Returns:
    A tf.data.Dataset of {'query': [B, Lq] BERT inputs, 'block': [B, Lb] BERT inputs,
    'block_id': [B] int64}.
  """
  dataset = pipeline_records(file_pattern, input_context, unpublished)
  if max_examples:
    dataset = dataset.take(max_examples)
  if repeat:
    dataset = dataset.repeat()
  if shuffle_buffer:
    dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
  dataset = dataset.batch(batch_size, drop_remainder=True).skip(skip_batches)

  def pack(serialized):
    record = schema.ICT.parse(serialized)
    query = tokenizer.encode(record["query"], query_seq_length)
    block = tokenizer.encode(record["title"], block_seq_length, pair_texts=record["text"])
    return dict(query=query.as_dict(), block=block.as_dict(), block_id=record["block_id"])

  return dataset.map(pack, num_parallel_calls=tf.data.AUTOTUNE,
                     deterministic=True).prefetch(tf.data.AUTOTUNE)
