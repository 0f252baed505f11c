"""REALM pre-training batches: masked queries only; retrieval happens in the step.

  records ─ (shard by input pipeline) ─ mask a salient span ─ batch ─ skip (resume)

Features (a tf.data nest of numeric tensors only, so a TPU can take the whole batch; B =
per-replica batch, M = max predictions):
  query      BERT inputs [B, Lq]   [CLS] masked x [SEP]
  masked_lm  positions [B, M] int32 (into the query, [CLS] counted), ids [B, M] int32,
             weights [B, M] float32 (0 for padding)
  block_id   [B] int64             the block x came from: never retrieved for x (REALM's
                                   "no trivial retrievals")
The record's document uid (a string) stays in the dataset function: it is not needed once
exclusion is by block id, and no string may reach an accelerator.

Salient-span masking skips sentences with no salient span by default (the authors did:
a random span of such a sentence rarely needs world knowledge, so it teaches retrieval
nothing); `skip_unsalient=False` masks random spans there instead. Queries are numbered
before the filter, so a seed gives the same masks whatever is skipped.
"""
from typing import Optional

import tensorflow as tf

from realm_tf.corpus import schema
from realm_tf.data import masking
from realm_tf.data.files import files, pipeline_records
from realm_tf.text.tokenization import Tokenizer


def mask_seed(seed: int, epoch: tf.Tensor, serialized: tf.Tensor) -> tf.Tensor:
  """[2] int64 stateless seed of one record's mask: the run's seed and epoch, and the
  record's own fingerprint. Not its position in the stream, which depends on how many input
  pipelines share the files: the same record gets the same mask in a single-process run
  and in a multi-worker one, and a new mask each epoch."""
  fingerprint = tf.strings.to_hash_bucket_fast(serialized, 2**62)
  return tf.stack([tf.cast(seed, tf.int64) * 1_000_003 + tf.cast(epoch, tf.int64),
                   fingerprint])


def masked_query_dataset(file_pattern: str, tokenizer: Tokenizer, query_seq_length: int,
                         masking_mode: str, max_predictions: int, seed: int,
                         repeat: bool = True, shuffle_buffer: int = 10000,
                         input_context: Optional[tf.distribute.InputContext] = None,
                         max_examples: int = 0, skip_unsalient: bool = True,
                         unpublished: bool = False) -> tf.data.Dataset:
  """One example at a time: the query packed and masked (deterministic per record and epoch:
  mask_seed)."""
  # Resolved (and checked against the manifest) once, here, where a refusal is a Python
  # error, not inside flat_map's traced function.
  paths = files(file_pattern, unpublished)

  def one_epoch(epoch):
    records = pipeline_records(paths, input_context)
    if max_examples:
      records = records.take(max_examples)
    return records.map(lambda serialized: (epoch, serialized))

  # Epochs counted explicitly (rather than .repeat()) so a record's mask can depend on them.
  epochs = tf.data.Dataset.counter() if repeat else tf.data.Dataset.range(1)
  dataset = epochs.flat_map(one_epoch)
  if shuffle_buffer:
    dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
  spec = schema.PRETRAINING.feature_spec()

  def mask(epoch, serialized):
    record = tf.io.parse_single_example(serialized, spec)
    ids, starts, ends = tokenizer.tokenize_with_offsets(record["text"][None])
    keep = query_seq_length - 2  # room for [CLS] and [SEP]
    masked = masking.mask_query(
        ids[0][:keep], starts[0][:keep], ends[0][:keep],
        record["salient_span_starts"], record["salient_span_ends"],
        seed=mask_seed(seed, epoch, serialized), mode=masking_mode,
        mask_id=tokenizer.mask_id, max_predictions=max_predictions, position_offset=1)
    query = tokenizer.join_bert([tf.RaggedTensor.from_tensor(masked["input_ids"][None])],
                                query_seq_length)
    return dict(
        query={k: v[0] for k, v in query.as_dict().items()},  # [Lq] each
        masked_lm=dict(positions=tf.cast(masked["masked_lm_positions"], tf.int32),
                       ids=tf.cast(masked["masked_lm_ids"], tf.int32),
                       weights=tf.cast(masked["masked_lm_weights"], tf.float32)),
        block_id=record["block_id"]), masked["has_salient_span"]

  dataset = dataset.map(mask, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  if skip_unsalient and masking_mode == "salient_spans":
    dataset = dataset.filter(lambda features, salient: salient)
  return dataset.map(lambda features, salient: features)


def pretraining_dataset(file_pattern: str, tokenizer: Tokenizer, query_seq_length: int,
                        masking_mode: str, max_predictions: int, batch_size: int, seed: int,
                        skip_batches: int = 0, repeat: bool = True, shuffle_buffer: int = 10000,
                        input_context: Optional[tf.distribute.InputContext] = None,
                        max_examples: int = 0, skip_unsalient: bool = True,
                        drop_remainder: bool = True, unpublished: bool = False
                        ) -> tf.data.Dataset:
  """Batches of pre-training features; `skip_batches` resumes the deterministic order.

  Args:
    file_pattern: pretraining-* TFRecords (beam.preprocess), several joined by commas.
    tokenizer: the run's Tokenizer.
    query_seq_length: Lq.
    masking_mode: 'salient_spans', 'random_tokens' or 'random_spans'.
    max_predictions: M, masked wordpieces per sentence at most.
    batch_size: the per-replica batch B.
    seed: the shuffle and masking seed (a record's mask depends on it and the epoch).
    skip_batches: batches to skip (a resumed run's).
    repeat: repeat forever (training).
    shuffle_buffer: 0: no shuffling.
    input_context: the pipeline's InputContext (sharding), or None.
    max_examples: read at most this many records per epoch (0: all).
    skip_unsalient: with salient-span masking, drop sentences that have no salient span.
    drop_remainder: drop a last partial batch.
    unpublished: the files have no manifest (data.files.files).

  Returns:
    A tf.data.Dataset of {'query': [B, Lq] BERT inputs (masked), 'masked_lm':
    {'positions', 'ids' int32, 'weights' float32} [B, M], 'block_id': [B] int64}.
  """
  dataset = masked_query_dataset(file_pattern, tokenizer, query_seq_length, masking_mode,
                                 max_predictions, seed, repeat, shuffle_buffer, input_context,
                                 max_examples, skip_unsalient, unpublished)
  dataset = dataset.batch(batch_size, drop_remainder=drop_remainder).skip(skip_batches)
  return dataset.prefetch(tf.data.AUTOTUNE)
