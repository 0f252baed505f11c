"""Small REALM pre-training batches built with the real tokenizer, for model tests."""
import numpy as np
import tensorflow as tf

QUERIES = ["the eiffel tower stands in paris", "william shakespeare wrote the play hamlet"]
# Wordpiece positions masked in each query ([CLS] is position 0).
MASKED = [[2], [1, 2]]
BLOCKS = [
    ("Eiffel Tower", "The Eiffel Tower is a wrought iron tower in Paris."),
    ("Hamlet", "Hamlet is a tragedy written by William Shakespeare."),
    ("Danube", "The Danube flows through ten countries."),
    ("Mount Fuji", "Mount Fuji is the highest mountain in Japan."),
]


def pretraining_features(tokenizer, config, seed=0):
  """The RealmPretrainer's feature nest: {'query': [B, Lq], 'candidates': [B, K, Lc],
  'reader': [B, K, Lr] BERT inputs, 'masked_lm': {positions, ids, weights} [B, M]}, with
  B=2, K=task.pretrain.num_candidates."""
  rng = np.random.default_rng(seed)
  m_config = config.model
  b, k = len(QUERIES), config.task.pretrain.num_candidates
  picks = [[BLOCKS[j % len(BLOCKS)] for j in rng.permutation(k)] for _ in range(b)]
  titles = [t for row in picks for t, _ in row]
  bodies = [body for row in picks for _, body in row]
  # The first candidate of each row is the null document: empty title and body.
  for i in range(b):
    titles[i * k], bodies[i * k] = "", ""
  query = tokenizer.encode(QUERIES, m_config.retriever.query_seq_length)
  cand = tokenizer.encode(titles, m_config.retriever.block_seq_length, pair_texts=bodies)
  reader = tokenizer.encode(np.repeat(QUERIES, k).tolist(), m_config.reader.seq_length,
                            pair_texts=bodies, truncation="waterfall")
  m = config.task.pretrain.max_predictions_per_seq
  positions = np.zeros([b, m], np.int32)
  weights = np.zeros([b, m], np.float32)
  for i, where in enumerate(MASKED):
    positions[i, :len(where)] = where
    weights[i, :len(where)] = 1.0
  query_ids = query.input_word_ids.numpy()
  targets = np.take_along_axis(query_ids, positions, axis=1) * (weights > 0)
  # x comes first in both packings, so the same positions are masked in query and reader.
  masked_query = query_ids.copy()
  reader_ids = reader.input_word_ids.numpy().reshape(b, k, -1)
  for i, where in enumerate(MASKED):
    masked_query[i, where] = tokenizer.mask_id
    reader_ids[i, :, where] = tokenizer.mask_id
  features = {}
  for name, packed, shape in (("query", query, [b, -1]), ("candidates", cand, [b, k, -1]),
                              ("reader", reader, [b, k, -1])):
    # [B, L] or [B, K, L]
    features[name] = {key: tf.reshape(value, shape) for key, value in packed.as_dict().items()}
  features["query"]["input_word_ids"] = tf.constant(masked_query)
  features["reader"]["input_word_ids"] = tf.constant(reader_ids)
  features["masked_lm"] = dict(positions=tf.constant(positions),
                               ids=tf.constant(targets.astype(np.int32)),
                               weights=tf.constant(weights))
  return features
