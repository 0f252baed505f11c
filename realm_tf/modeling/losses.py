"""REALM and ORQA objectives.

Notation: B examples, K candidate documents (the null document included where used),
M masked tokens, S spans. All inputs are float32 logits / log-probabilities.
"""
import tensorflow as tf

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


def openqa_loss(retrieval_logits: tf.Tensor, span_logits: tf.Tensor,
                span_correct: tf.Tensor) -> dict[str, tf.Tensor]:
  """The ORQA-style fine-tuning objective, per example.

  retriever_loss = −log Σ_{z has an answer} p(z|x) (softmax over the K retrieved blocks);
  reader_loss = −log Σ_{(z,s) correct} p(z,s|x), with the span softmax taken jointly over
  all spans of all K blocks. Both are zero for examples where no retrieved block contains
  the answer (nothing to learn from them), flagged by has_answer.

  Args: retrieval_logits [B, K]; span_logits [B, K, S]; span_correct [B, K, S] bool.
  Returns: dict of [B] tensors: retriever_loss, reader_loss, loss, has_answer (float).
  """
  span_correct = tf.cast(span_correct, tf.bool)
  block_has_answer = tf.reduce_any(span_correct, axis=-1)  # [B, K]
  has_answer = tf.reduce_any(block_has_answer, axis=-1)  # [B]
  retriever = -(_masked_logsumexp(retrieval_logits, block_has_answer, axis=-1)
                - tf.reduce_logsumexp(retrieval_logits, axis=-1))
  batch = tf.shape(span_logits)[0]
  flat_logits = tf.reshape(span_logits, [batch, -1])  # [B, K*S]
  flat_correct = tf.reshape(span_correct, [batch, -1])  # [B, K*S]
  reader = -(_masked_logsumexp(flat_logits, flat_correct, axis=-1)
             - tf.reduce_logsumexp(flat_logits, axis=-1))
  retriever = tf.where(has_answer, retriever, 0.0)
  reader = tf.where(has_answer, reader, 0.0)
  return dict(retriever_loss=retriever, reader_loss=reader, loss=retriever + reader,
              has_answer=tf.cast(has_answer, tf.float32))


def global_mean(loss_sum: tf.Tensor, weight_sum: tf.Tensor) -> tf.Tensor:
  """This replica's share of the global mean loss.

  Divides by the weight summed over all replicas, so that summing gradients across
  replicas (what tf.distribute does) gives exactly the gradient of the global mean,
  however unevenly masked tokens fall across replicas. Works under any strategy, the
  default one included.
  """
  context = tf.distribute.get_replica_context()
  if context is not None:
    weight_sum = context.all_reduce(tf.distribute.ReduceOp.SUM, weight_sum)
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
    all_blocks = context.all_gather(block_embeddings, axis=0)  # [B * R, P]
    all_ids = context.all_gather(block_ids, axis=0)  # [B * R]
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
