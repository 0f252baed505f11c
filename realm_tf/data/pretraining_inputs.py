"""REALM pre-training batches: masked queries, retrieved candidates, reader inputs.

  records ─ mask a salient span ─ batch ─ retrieve (host: exported query encoder + index,
  trivial blocks dropped) ─ pack [null doc + retrieved] for both towers and the reader

Output features (B examples, K candidates, M predictions):
  query_*      [B, Lq]     [CLS] masked x [SEP]
  candidate_*  [B, K, Lc]  [CLS] title [SEP] body [SEP]; candidate 0 is the null document
  reader_*     [B, K, Lr]  [CLS] masked x [SEP] body [SEP] (x first, never truncated)
  candidate_mask [B, K], candidate_block_ids [B, K] (-1: null or padding)
  masked_lm_positions, masked_lm_ids [B, M] int32, masked_lm_weights [B, M] float32
"""
import tensorflow as tf

from realm_tf.configs.experiment import ExperimentConfig
from realm_tf.corpus import schema
from realm_tf.data import masking
from realm_tf.data.candidates import CandidateRetriever
from realm_tf.data.files import files
from realm_tf.text.tokenization import Tokenizer


def masked_query_dataset(file_pattern: str, tokenizer: Tokenizer, config: ExperimentConfig,
                         seed: int, repeat: bool = True) -> tf.data.Dataset:
  """One example at a time: the query packed and masked (deterministic per position)."""
  seq_length = config.retriever.query_seq_length
  if config.reader.seq_length < seq_length + 1:
    raise ValueError(f"reader.seq_length {config.reader.seq_length} cannot hold a query of "
                     f"retriever.query_seq_length {seq_length} plus a block")
  dataset = tf.data.TFRecordDataset(files(file_pattern))
  if repeat:
    dataset = dataset.repeat()
  if config.data.shuffle_buffer:
    dataset = dataset.shuffle(config.data.shuffle_buffer, seed=seed,
                              reshuffle_each_iteration=True)
  spec = schema.PRETRAINING.feature_spec()

  def mask(index, serialized):
    record = tf.io.parse_single_example(serialized, spec)
    ids, starts, ends = tokenizer.tokenize_with_offsets(record["text"][None])
    keep = seq_length - 2  # room for [CLS] and [SEP]
    masked = masking.mask_query(
        ids[0][:keep], starts[0][:keep], ends[0][:keep],
        record["salient_span_starts"], record["salient_span_ends"],
        seed=tf.stack([tf.cast(seed, tf.int64), index]), mode=config.pretrain.masking,
        mask_id=tokenizer.mask_id, max_predictions=config.pretrain.max_predictions_per_seq,
        position_offset=1)
    query = tokenizer.join_bert([tf.RaggedTensor.from_tensor(masked["input_ids"][None])],
                                seq_length)
    features = {f"query_{k}": v[0] for k, v in query.as_dict().items()}
    features.update({k: masked[k] for k in ("masked_lm_positions", "masked_lm_ids",
                                            "masked_lm_weights")})
    features["masked_lm_ids"] = tf.cast(features["masked_lm_ids"], tf.int32)
    features["doc_uid"] = record["doc_uid"]
    features["block_id"] = record["block_id"]
    return features

  return dataset.enumerate().map(mask, num_parallel_calls=tf.data.AUTOTUNE,
                                 deterministic=True)


def add_candidates(batch: dict, retriever: CandidateRetriever, tokenizer: Tokenizer,
                   config: ExperimentConfig, batch_size: int) -> dict:
  """Retrieves (host) and packs the candidates of one batch of masked queries."""
  k = config.pretrain.num_candidates
  null = 1 if config.pretrain.include_null_document else 0
  num_retrieved = k - null
  ids, titles, texts, mask = tf.numpy_function(
      retriever.retrieve,
      [batch["query_input_word_ids"], batch["query_input_mask"],
       batch["query_input_type_ids"], batch["doc_uid"]],
      [tf.int64, tf.string, tf.string, tf.float32], stateful=True, name="retrieve")
  b = batch_size
  ids.set_shape([b, num_retrieved])
  titles.set_shape([b, num_retrieved])
  texts.set_shape([b, num_retrieved])
  mask.set_shape([b, num_retrieved])
  if null:  # the null document first: empty title and body
    ids = tf.concat([tf.fill([b, 1], tf.constant(-1, tf.int64)), ids], axis=1)
    titles = tf.concat([tf.fill([b, 1], ""), titles], axis=1)
    texts = tf.concat([tf.fill([b, 1], ""), texts], axis=1)
    mask = tf.concat([tf.ones([b, 1]), mask], axis=1)
  flat_titles, flat_texts = tf.reshape(titles, [-1]), tf.reshape(texts, [-1])  # [B*K]
  candidates = tokenizer.encode(flat_titles, config.retriever.block_seq_length,
                                pair_texts=flat_texts)
  # x without its [CLS]/[SEP]: the masked query wordpieces, repeated for each candidate.
  lengths = tf.reduce_sum(batch["query_input_mask"], axis=1)
  query = tf.RaggedTensor.from_tensor(batch["query_input_word_ids"], lengths=lengths)
  x = tf.gather(query[:, 1:-1], tf.repeat(tf.range(b), k))  # [B*K, (T)]
  reader = tokenizer.join_bert([x, tokenizer.tokenize(flat_texts)], config.reader.seq_length,
                               truncation="waterfall")
  out = {key: batch[key] for key in batch if key.startswith(("query_", "masked_lm_"))}
  lc, lr = config.retriever.block_seq_length, config.reader.seq_length
  out.update({f"candidate_{key}": tf.reshape(v, [b, k, lc])  # [B*K, Lc] → [B, K, Lc]
              for key, v in candidates.as_dict().items()})
  out.update({f"reader_{key}": tf.reshape(v, [b, k, lr])  # [B*K, Lr] → [B, K, Lr]
              for key, v in reader.as_dict().items()})
  out["candidate_mask"] = tf.reshape(mask, [b, k])
  out["candidate_block_ids"] = tf.reshape(ids, [b, k])
  out["doc_uid"] = batch["doc_uid"]
  return out


def pretraining_dataset(file_pattern: str, tokenizer: Tokenizer, retriever: CandidateRetriever,
                        config: ExperimentConfig, batch_size: int, seed: int,
                        start_batch: int = 0, repeat: bool = True) -> tf.data.Dataset:
  """Batches of pre-training features; `start_batch` resumes the deterministic order."""
  dataset = masked_query_dataset(file_pattern, tokenizer, config, seed, repeat)
  dataset = dataset.batch(batch_size, drop_remainder=True).skip(start_batch)
  # Retrieval must see batches in order and one at a time (it follows live watchers).
  dataset = dataset.map(lambda b: add_candidates(b, retriever, tokenizer, config, batch_size),
                        num_parallel_calls=1, deterministic=True)
  return dataset.prefetch(2)
