"""REALM and ORQA objectives.

Notation: B examples, K candidate documents (the null document included where used),
M masked tokens, S spans. All inputs are float32 logits / log-probabilities.
"""
from typing import Optional

import tensorflow as tf

from realm_tf.modeling import collectives

OPENQA_LOSSES = ("orqa", "marginal")

# Stand-in for log(0) that keeps log-sum-exps and their gradients finite.
_LOG_ZERO = -1e9


def retrieval_log_probs(retrieval_logits: tf.Tensor) -> tf.Tensor:
  """log p(z|x): [B, K] relevance scores → log-softmax over the K candidates."""
  return tf.nn.log_softmax(retrieval_logits, axis=-1)


def marginal_log_likelihood(retrieval_logits: tf.Tensor,
                            log_likelihoods: tf.Tensor) -> tf.Tensor:
  """log p(y|x) = logsumexp_z(log p(z|x) + log p(y|z,x)).

  Args:
    retrieval_logits: [B, K].
    log_likelihoods: [B, K, ...] log p(y|z,x) (e.g. [B, K, M] per masked token).
  Returns:
    [B, ...] the marginal over the K candidates.
  """
  log_pz = retrieval_log_probs(retrieval_logits)
  extra_dims = log_likelihoods.shape.rank - 2
  log_pz = tf.reshape(log_pz, tf.concat([tf.shape(log_pz), [1] * extra_dims], 0))
  return tf.reduce_logsumexp(log_pz + log_likelihoods, axis=1)


def masked_lm_marginal_loss(retrieval_logits: tf.Tensor, token_log_probs: tf.Tensor,
                            masked_lm_weights: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """REALM's pre-training loss, −log p(y|x) averaged over masked tokens.

  Each masked token is marginalised over the K documents on its own (as the authors'
  code does). Returns (loss_sum, weight_sum) so that a distributed step can divide by the
  global number of masked tokens; loss = loss_sum / weight_sum.

  Args:
    retrieval_logits: [B, K]; token_log_probs: [B, K, M]; masked_lm_weights: [B, M]
      (0 for padding positions).
  """
  weights = tf.cast(masked_lm_weights, tf.float32)
  marginal = marginal_log_likelihood(retrieval_logits, token_log_probs)  # [B, M]
  return -tf.reduce_sum(marginal * weights), tf.reduce_sum(weights)


def retrieval_utility(token_log_probs: tf.Tensor, masked_lm_weights: tf.Tensor,
                      retrieval_logits: tf.Tensor, null_index: int = 0) -> tf.Tensor:
  """RU = log p(y|z*,x) − log p(y|null,x) for the top-scoring non-null document z*.

  log p(y|z,x) is the sum over masked tokens (p(y|z,x) is their product). Positive RU
  means the retrieved document helps predict the masked span. Returns [B].
  """
  weights = tf.cast(masked_lm_weights, tf.float32)
  per_doc = tf.reduce_sum(token_log_probs * weights[:, None, :], axis=-1)  # [B, K]
  num_docs = tf.shape(retrieval_logits)[1]
  is_null = tf.equal(tf.range(num_docs), null_index)[None, :]  # [1, K]
  top = tf.argmax(tf.where(is_null, tf.cast(_LOG_ZERO, retrieval_logits.dtype),
                           retrieval_logits), axis=1, output_type=tf.int32)  # [B]
  top_ll = tf.gather(per_doc, top, axis=1, batch_dims=1)
  return top_ll - per_doc[:, null_index]


def _masked_logsumexp(logits: tf.Tensor, mask: tf.Tensor, axis) -> tf.Tensor:
  return tf.reduce_logsumexp(tf.where(mask, logits, _LOG_ZERO), axis=axis)


def reader_log_likelihood(span_logits: tf.Tensor, span_correct: tf.Tensor) -> tf.Tensor:
  """log p(y|z,x) = logsumexp over matching spans − logsumexp over all spans of the block.

  Args: span_logits [B, K, S]; span_correct [B, K, S] bool. Returns [B, K] (about −1e9
  where a block holds no matching span).
  """
  return (_masked_logsumexp(span_logits, span_correct, axis=-1)
          - tf.reduce_logsumexp(span_logits, axis=-1))


def marginal_log_loss(logits: tf.Tensor, correct: tf.Tensor) -> tf.Tensor:
  """−log Σ_{correct} softmax(logits) over the last axis (ORQA's marginal_log_loss).

  Args: logits [..., N]; correct [..., N] bool. Returns [...] (about 1e9 where nothing is
  correct: callers mask those rows).
  """
  correct = tf.cast(correct, tf.bool)
  return -(_masked_logsumexp(logits, correct, axis=-1) - tf.reduce_logsumexp(logits, axis=-1))


def joint_reader_logits(span_logits: tf.Tensor, retrieval_logits: Optional[tf.Tensor],
                        mode: str = "orqa") -> tf.Tensor:
  """The logits an answer (z, s) is chosen from and trained on, [B, K, S].

  'orqa': span score + the block's retrieval score (Lee et al., 2019, orqa_model.read:
  `reader_logits += expand_dims(retriever_logits, -1)`), so one softmax over all spans of
  all read blocks is p(z, s|x) and the prediction weighs p(z|x). 'marginal' (REALM):
  log p(z|x) + log p(s|z,x), the span softmax taken per block. Without a trained retrieval
  score (retrieval_logits None: BM25), 'orqa' is the span score alone and 'marginal' takes
  p(z|x) uniform.

  Args: span_logits [B, K, S]; retrieval_logits [B, K] (the K read blocks) or None.
  """
  if mode not in OPENQA_LOSSES:
    raise ValueError(f"mode must be one of {OPENQA_LOSSES}, got {mode!r}")
  if mode == "orqa":
    if retrieval_logits is None:
      return span_logits
    return span_logits + tf.cast(retrieval_logits, span_logits.dtype)[:, :, None]
  log_p_span = tf.nn.log_softmax(span_logits, axis=-1)
  if retrieval_logits is None:
    num_blocks = tf.cast(tf.shape(span_logits)[1], span_logits.dtype)
    return log_p_span - tf.math.log(num_blocks)
  return log_p_span + retrieval_log_probs(tf.cast(retrieval_logits,
                                                  span_logits.dtype))[:, :, None]


def openqa_loss(beam_logits: tf.Tensor, beam_correct: tf.Tensor, reader_logits: tf.Tensor,
                span_correct: tf.Tensor, mode: str = "orqa") -> dict[str, tf.Tensor]:
  """The Open-QA fine-tuning objective, per question.

  'orqa' (orqa_model.compute_loss): retriever_loss = −log Σ_{z in the beam with an answer}
  p(z|x), the softmax over the R blocks of the retrieval beam; reader_loss = −log Σ_{(z,s)
  correct} softmax(reader_logits) over all spans of the K read blocks jointly (reader_logits
  from joint_reader_logits). Each term is zero where it has no positive (no answer in the
  beam; no correct span read), as ORQA masks them.
  'marginal' (REALM): loss = reader_loss = −log Σ_z p(z|x) Σ_{s correct} p(s|z,x) with
  reader_logits = log p(z|x) + log p(s|z,x) (already normalised), no separate retriever
  term: p(z|x) is trained through the marginal.

  Args: beam_logits [B, R]; beam_correct [B, R] bool; reader_logits [B, K, S];
    span_correct [B, K, S] bool.
  Returns: dict of [B] tensors: retriever_loss, reader_loss, loss, has_answer (a correct
    span was read, float), answer_in_beam (float).
  """
  if mode not in OPENQA_LOSSES:
    raise ValueError(f"mode must be one of {OPENQA_LOSSES}, got {mode!r}")
  span_correct = tf.cast(span_correct, tf.bool)
  beam_correct = tf.cast(beam_correct, tf.bool)
  batch = tf.shape(reader_logits)[0]
  flat_logits = tf.reshape(reader_logits, [batch, -1])  # [B, K*S]
  flat_correct = tf.reshape(span_correct, [batch, -1])  # [B, K*S]
  read_answer = tf.reduce_any(flat_correct, axis=-1)  # [B]
  in_beam = tf.reduce_any(beam_correct, axis=-1)  # [B]
  if mode == "orqa":
    reader = marginal_log_loss(flat_logits, flat_correct)
    retriever = tf.where(in_beam, marginal_log_loss(beam_logits, beam_correct), 0.0)
  else:
    reader = -_masked_logsumexp(flat_logits, flat_correct, axis=-1)
    retriever = tf.zeros_like(reader)
  reader = tf.where(read_answer, reader, 0.0)
  return dict(retriever_loss=retriever, reader_loss=reader, loss=retriever + reader,
              has_answer=tf.cast(read_answer, tf.float32),
              answer_in_beam=tf.cast(in_beam, tf.float32))


def global_mean(loss_sum: tf.Tensor, weight_sum: tf.Tensor) -> tf.Tensor:
  """This replica's share of the global mean loss.

  Divides by the weight summed over all replicas, so that summing gradients across
  replicas (what tf.distribute does) gives exactly the gradient of the global mean,
  however unevenly masked tokens fall across replicas. Works under any strategy, the
  default one included.
  """
  context = tf.distribute.get_replica_context()
  if context is not None:
    weight_sum = collectives.all_reduce(context, tf.distribute.ReduceOp.SUM, weight_sum)
  return loss_sum / tf.maximum(weight_sum, 1.0)


def ict_loss(query_embeddings: tf.Tensor, block_embeddings: tf.Tensor,
             block_ids: tf.Tensor) -> dict[str, tf.Tensor]:
  """Inverse Cloze Task: each pseudo-query against every evidence block in the batch.

  Under a tf.distribute strategy the blocks of all replicas are gathered, so negatives
  come from the global batch as on one device. Blocks that equal the query's own block
  (the same block drawn twice) are masked out rather than counted as negatives.

  Args: query_embeddings [B, P], block_embeddings [B, P], block_ids [B] (this replica's).
  Returns: loss_sum and count (for global_mean), and correct (top-1 hits), all scalars.
  """
  context = tf.distribute.get_replica_context()
  replica = 0
  all_blocks, all_ids = block_embeddings, block_ids
  if context is not None and context.num_replicas_in_sync > 1:
    all_blocks = collectives.all_gather(context, block_embeddings, axis=0)  # [B * R, P]
    all_ids = collectives.all_gather(context, block_ids, axis=0)  # [B * R]
    replica = context.replica_id_in_sync_group
  batch = tf.shape(query_embeddings)[0]
  targets = tf.range(batch) + replica * batch  # [B] column of each query's own block
  logits = tf.matmul(query_embeddings, all_blocks, transpose_b=True)  # [B, B * R]
  is_target = tf.one_hot(targets, tf.shape(all_blocks)[0], on_value=True, off_value=False)
  duplicate = tf.equal(block_ids[:, None], all_ids[None, :]) & ~is_target
  logits = tf.where(duplicate, _LOG_ZERO, logits)
  losses = tf.nn.sparse_softmax_cross_entropy_with_logits(targets, logits)  # [B]
  correct = tf.equal(tf.argmax(logits, axis=1, output_type=tf.int32), targets)
  return dict(loss_sum=tf.reduce_sum(losses), count=tf.cast(batch, tf.float32),
              correct=tf.reduce_sum(tf.cast(correct, tf.float32)))
