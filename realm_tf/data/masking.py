"""Choosing which query wordpieces to mask for REALM pre-training, in TensorFlow ops.

REALM masks one *salient span* per example (a named entity or a date, Guu et al., 2020,
section 3.4): recovering "20 July 1969" needs world knowledge, so the retriever learns to
fetch it. The paper's ablations compare BERT's random tokens and SpanBERT-like random
spans, kept here as the other two modes. Every mode runs inside `tf.data` (graph mode, no
Python per example) and draws only from stateless random ops, so a seed reproduces the
same masks on any worker, in any order, after any restart.

Inputs are one query's wordpieces with their byte offsets (tensorflow_text's
`tokenize_with_offsets`) and the salient spans' byte offsets in the same text. Masked
wordpieces are replaced by [MASK] (REALM and SpanBERT-style span masking, no 80/10/10).
"""
import tensorflow as tf

MODES = ("salient_spans", "random_tokens", "random_spans")
DEFAULT_MASK_RATE = 0.15  # BERT's share of masked tokens for the random modes
DEFAULT_MAX_SPAN_LENGTH = 10  # SpanBERT clips its geometric span lengths at 10
DEFAULT_SPAN_LENGTH_P = 0.2  # SpanBERT's geometric parameter: mean length about 3.8

# Distinct streams of randomness drawn from one example seed.
_SALIENT_STREAM, _FALLBACK_STREAM, _TOKENS_STREAM, _SPANS_STREAM = 1, 2, 3, 4


def _stream(seed: tf.Tensor, stream: int) -> tf.Tensor:
  return tf.random.experimental.stateless_fold_in(seed, stream)


def _budget(num_tokens: tf.Tensor, mask_rate: float, max_predictions: int) -> tf.Tensor:
  """How many wordpieces the random modes mask: rate * T rounded, at least 1 (if T > 0)."""
  wanted = tf.cast(tf.round(tf.cast(num_tokens, tf.float32) * mask_rate), tf.int32)
  return tf.minimum(tf.clip_by_value(wanted, 1, max_predictions), num_tokens)


def random_token_choice(num_tokens: tf.Tensor, budget: tf.Tensor, seed: tf.Tensor
                        ) -> tf.Tensor:
  """[T] bool: `budget` distinct wordpieces chosen uniformly (BERT)."""
  scores = tf.random.stateless_uniform([num_tokens], seed)  # [T]
  _, picked = tf.math.top_k(scores, k=budget)  # [budget]
  hits = tf.scatter_nd(picked[:, None], tf.ones_like(picked), [num_tokens])  # [T]
  return hits > 0


def random_span_choice(num_tokens: tf.Tensor, budget: tf.Tensor, seed: tf.Tensor,
                       max_span_length: int = DEFAULT_MAX_SPAN_LENGTH,
                       span_length_p: float = DEFAULT_SPAN_LENGTH_P) -> tf.Tensor:
  """[T] bool: contiguous spans, lengths ~ Geometric(p) clipped, until `budget` are masked.

  Each span is cut to what the budget still allows, so exactly `budget` wordpieces are
  chosen (spans may touch or overlap; the loop stops after a bounded number of draws).
  """
  positions = tf.range(num_tokens)  # [T]
  log_keep = tf.math.log(1.0 - span_length_p)
  max_draws = 8 * budget + 8

  def draw(i, chosen):
    u = tf.random.stateless_uniform([2], tf.random.experimental.stateless_fold_in(seed, i),
                                    minval=1e-6, maxval=1.0)
    length = 1 + tf.cast(tf.math.floor(tf.math.log(u[0]) / log_keep), tf.int32)
    remaining = budget - tf.reduce_sum(tf.cast(chosen, tf.int32))
    length = tf.clip_by_value(length, 1, tf.minimum(max_span_length, remaining))
    start = tf.cast(tf.math.floor(u[1] * tf.cast(num_tokens - length + 1, tf.float32)),
                    tf.int32)
    start = tf.minimum(start, num_tokens - length)
    return i + 1, chosen | ((positions >= start) & (positions < start + length))

  def unfinished(i, chosen):
    return (tf.reduce_sum(tf.cast(chosen, tf.int32)) < budget) & (i < max_draws)

  _, chosen = tf.while_loop(unfinished, draw, [tf.constant(0), tf.zeros([num_tokens], tf.bool)])
  return chosen


def salient_span_choice(token_starts: tf.Tensor, token_ends: tf.Tensor,
                        span_starts: tf.Tensor, span_ends: tf.Tensor,
                        max_predictions: int, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """([T] bool, found): every wordpiece overlapping one uniformly chosen salient span.

  Spans that cover no wordpiece (cut off by truncation) or more than max_predictions are
  not candidates; `found` is False when none is left.
  """
  token_starts = tf.cast(token_starts, tf.int64)
  token_ends = tf.cast(token_ends, tf.int64)
  span_starts = tf.cast(span_starts, tf.int64)
  span_ends = tf.cast(span_ends, tf.int64)
  covers = ((token_starts[None, :] < span_ends[:, None])
            & (token_ends[None, :] > span_starts[:, None]))  # [S, T]
  sizes = tf.reduce_sum(tf.cast(covers, tf.int32), axis=1)  # [S]
  candidates = tf.boolean_mask(covers, (sizes > 0) & (sizes <= max_predictions))  # [C, T]
  count = tf.shape(candidates)[0]
  index = tf.random.stateless_uniform([], seed, minval=0, maxval=tf.maximum(count, 1),
                                      dtype=tf.int32)
  chosen = tf.cond(count > 0, lambda: tf.gather(candidates, index),
                   lambda: tf.zeros_like(token_starts, tf.bool))
  return chosen, count > 0


def mask_query(token_ids: tf.Tensor, token_starts: tf.Tensor, token_ends: tf.Tensor,
               span_starts: tf.Tensor, span_ends: tf.Tensor, seed: tf.Tensor, *,
               mode: str, mask_id: int, max_predictions: int,
               mask_rate: float = DEFAULT_MASK_RATE,
               max_span_length: int = DEFAULT_MAX_SPAN_LENGTH,
               position_offset: int = 0) -> dict[str, tf.Tensor]:
  """Masks one query's wordpieces.

  Args:
    token_ids: [T] wordpiece ids of the query (already cut to the query length).
    token_starts, token_ends: [T] byte offsets of the wordpieces in the query text.
    span_starts, span_ends: [S] byte offsets of its salient spans (end exclusive).
    seed: [2] int seed for the stateless random ops (e.g. fold_in of a run seed and
      the example index).
    mode: 'salient_spans' (one span; random spans when the query has none, flagged by
      'has_salient_span' so a caller can skip such queries instead, as the authors did),
      'random_tokens' or 'random_spans'.
    mask_id: the [MASK] id.
    max_predictions: P, the padded number of predictions.
    position_offset: added to the returned positions (1 when the query is packed
      behind [CLS]); padding positions stay 0.

  Returns:
    input_ids [T] with [MASK] at the chosen wordpieces; masked_lm_positions [P] int32,
    masked_lm_ids [P] (the original ids) and masked_lm_weights [P] float32 (1 for a
    real prediction, 0 for padding), in increasing position order; has_salient_span []
    bool (False only in 'salient_spans' mode for a query whose spans all fell away).
  """
  if mode not in MODES:
    raise ValueError(f"masking mode must be one of {MODES}, got {mode!r}")
  if max_predictions < 1:
    raise ValueError(f"max_predictions must be positive, got {max_predictions}")
  token_ids = tf.convert_to_tensor(token_ids)
  seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
  num_tokens = tf.size(token_ids)
  budget = _budget(num_tokens, mask_rate, max_predictions)

  def spans(stream):
    return random_span_choice(num_tokens, budget, _stream(seed, stream), max_span_length)

  found = tf.constant(True)
  if mode == "random_tokens":
    chosen = random_token_choice(num_tokens, budget, _stream(seed, _TOKENS_STREAM))
  elif mode == "random_spans":
    chosen = spans(_SPANS_STREAM)
  else:
    salient, found = salient_span_choice(token_starts, token_ends, span_starts, span_ends,
                                         max_predictions, _stream(seed, _SALIENT_STREAM))
    chosen = tf.cond(found, lambda: salient, lambda: spans(_FALLBACK_STREAM))

  positions = tf.cast(tf.where(chosen)[:, 0], tf.int32)[:max_predictions]  # [M]
  masked_ids = tf.gather(token_ids, positions)  # [M]
  input_ids = tf.tensor_scatter_nd_update(
      token_ids, positions[:, None], tf.fill(tf.shape(positions), tf.cast(mask_id,
                                                                           token_ids.dtype)))
  padding = [[0, max_predictions - tf.size(positions)]]
  weights = tf.pad(tf.ones_like(positions, tf.float32), padding)  # [P]
  outputs = {
      "input_ids": input_ids,
      "masked_lm_positions": tf.pad(positions + position_offset, padding),
      "masked_lm_ids": tf.pad(masked_ids, padding),
      "masked_lm_weights": weights,
      "has_salient_span": found,
  }
  for key in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights"):
    outputs[key] = tf.ensure_shape(outputs[key], [max_predictions])
  return outputs
