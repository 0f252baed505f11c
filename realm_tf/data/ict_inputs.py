"""Inverse Cloze Task batches: pseudo-queries and their evidence blocks."""
import tensorflow as tf

from realm_tf.corpus import schema
from realm_tf.data.files import files
from realm_tf.text.tokenization import Tokenizer


def ict_dataset(file_pattern: str, tokenizer: Tokenizer, batch_size: int,
                query_seq_length: int, block_seq_length: int, seed: int = 0,
                shuffle_buffer: int = 10000, repeat: bool = True,
                start_batch: int = 0) -> tf.data.Dataset:
  """Batches of {query_* [B, Lq], block_* [B, Lc], block_id [B]}.

  The corpus pipeline already removed each query from its block with probability 0.9.
  `start_batch` skips that many batches of the deterministic order (resuming).
  """
  dataset = tf.data.TFRecordDataset(files(file_pattern))
  if repeat:
    dataset = dataset.repeat()
  if shuffle_buffer:
    dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
  dataset = dataset.batch(batch_size, drop_remainder=True).skip(start_batch)

  def pack(serialized):
    record = schema.ICT.parse(serialized)
    query = tokenizer.encode(record["query"], query_seq_length)
    block = tokenizer.encode(record["title"], block_seq_length, pair_texts=record["text"])
    features = {f"query_{k}": v for k, v in query.as_dict().items()}
    features.update({f"block_{k}": v for k, v in block.as_dict().items()})
    features["block_id"] = record["block_id"]
    return features

  return dataset.map(pack, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
