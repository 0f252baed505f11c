"""REALM pre-training: masked salient spans, predicted through retrieved documents.

One step, per replica (B queries, K = k retrieved + the null document, M masked tokens):
  query tower(x)                           → q [B, P]          (live; gradient flows)
  KnowledgeIndex.search(q, k, exclude x's own block)           (stale index, sharded MIPS)
  KnowledgeIndex.gather(rows)              → block inputs [B, k, Lc], bodies [B, k, Lb]
  null document prepended                  → [B, K, ...]
  document tower(candidates)               → relevance logits q·d [B, K]  (live)
  pack [CLS] x [SEP] z_body [SEP]          → reader inputs [B, K, Lr]
  knowledge-augmented encoder              → log p(y_m | z, x) [B, K, M]
  loss = −Σ_m log Σ_z p(z|x) p(y_m|z,x) / (global number of masked tokens)
Everything between the input batch and the loss is in the compiled step; only numbers
cross between host and device.

With task.pretrain.retrieval=false every x reads the null document alone (K = 1, no index,
no retriever in the step): the no-retrieval baseline, and, with trainable=mlm_head, the
warm-up of a fresh MLM head on a frozen encoder.
"""
from typing import Optional

import numpy as np
import tensorflow as tf

from realm_tf.data import block_store, pretraining_inputs
from realm_tf.io import layout
from realm_tf.modeling import factory, losses
from realm_tf.modeling.spans import pack_reader_inputs
from realm_tf.retrieval.knowledge_index import KnowledgeIndex
from realm_tf.tasks import base


def null_block_inputs(tokenizer, seq_length: int) -> dict[str, np.ndarray]:
  """The null document `[CLS] [SEP] [SEP]` as [Lc] arrays (embedded like any block).

  Args:
    tokenizer: the run's Tokenizer.
    seq_length: Lc, the document tower's input length.

  Returns:
    Encoder input name → [Lc] numpy array.
  """
  null = tokenizer.null_block(1, seq_length)
  return {k: v.numpy()[0] for k, v in null.as_dict().items()}


def prepend_null(blocks, null: dict, batch_size):
  """[B, k, ...] retrieved blocks → [B, k+1, ...] with the null document first.

  Args:
    blocks: KnowledgeIndex.gather's result (document inputs [B, k, Lc], body_ids
      [B, k, Lb], body_lengths [B, k]).
    null: null_block_inputs' arrays.
    batch_size: B (a scalar tensor or int).

  Returns:
    (document inputs [B, k+1, Lc], body_ids [B, k+1, Lb], body_lengths [B, k+1]); the
    null document has an empty body.
  """
  def with_null(value, null_row):
    row = tf.broadcast_to(tf.constant(null_row, value.dtype),
                          tf.concat([[batch_size, 1], tf.shape(value)[2:]], 0))
    return tf.concat([row, value], axis=1)
  document = {k: with_null(v, null[k]) for k, v in blocks.document.items()}
  body_ids = with_null(blocks.body_ids, np.zeros(blocks.body_ids.shape[-1], np.int32))
  body_lengths = with_null(blocks.body_lengths, np.int32(0))
  return document, body_ids, body_lengths


class PretrainTask(base.RetrievalTask):
  """build_model → RealmPretrainer; inputs {'query', 'masked_lm', 'block_id'}."""

  metric_names = ("loss", "mlm_accuracy", "span_accuracy", "retrieval_utility",
                  "null_document_probability", "trivial_block_retrieved")

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.index: KnowledgeIndex = None

  @property
  def num_retrieved(self) -> int:
    """k, the blocks searched per masked sentence (num_candidates without the null one)."""
    if not self.task_config.retrieval:
      return 0
    return self.task_config.num_candidates - int(self.task_config.include_null_document)

  @property
  def refreshes_index(self) -> bool:
    """With retrieval (the no-retrieval baseline searches no index)."""
    return bool(self.task_config.retrieval)

  @property
  def reads_null_document(self) -> bool:
    """Whether candidate 0 is the null document (always so without retrieval)."""
    return self.task_config.include_null_document or not self.task_config.retrieval

  def build_model(self):
    """The retriever and the knowledge-augmented encoder (with its MLM head), warm-started.

    Returns:
      A RealmPretrainer.
    """
    return factory.build_realm_pretrainer(self.experiment)

  def build_inputs(self, params, input_context=None):
    """One input pipeline's batches of masked sentences.

    Args:
      params: the DataConfig (train_data or validation_data): input_path
        (pretraining-* TFRecords of the corpus pipeline), global_batch_size, is_training,
        shuffle_buffer_size, max_examples, drop_remainder (evaluation).
      input_context: the pipeline's tf.distribute.InputContext, or None.

    Returns:
      A tf.data.Dataset of {'query': [B, Lq] encoder inputs with the masks applied,
      'masked_lm': {'positions', 'ids', 'weights'} [B, M], 'block_id': [B] int64 (the
      sentence's own block, excluded from its search)}, B the per-replica batch. Training
      masks task.masking, evaluation task.validation_masking.
    """
    training = bool(params.is_training)
    c = self.task_config
    return pretraining_inputs.pretraining_dataset(
        params.input_path, self.tokenizer, self.experiment.model.retriever.query_seq_length,
        c.masking if training else c.validation_masking, c.max_predictions_per_seq,
        base.per_replica_batch(params.global_batch_size, input_context),
        seed=self.experiment.trainer.seed,
        skip_batches=base.input_skip(self.start_step, input_context) if training else 0,
        repeat=training, shuffle_buffer=params.shuffle_buffer_size if training else 0,
        input_context=input_context, max_examples=params.max_examples,
        skip_unsalient=c.salient_span_fallback == "skip",
        drop_remainder=training or params.drop_remainder,
        unpublished=params.unpublished_input)

  def build_index(self, strategy) -> Optional[KnowledgeIndex]:
    """The corpus Z as the step retrieves it (index.blocks, embeddings not yet loaded).

    Args:
      strategy: the run's strategy; the embedding variables are sharded over its replicas.

    Returns:
      The KnowledgeIndex, or None with task.retrieval=false.
    """
    m, i = self.experiment.model, self.experiment.index
    self._null = null_block_inputs(self.tokenizer, m.retriever.block_seq_length)
    if not self.task_config.retrieval:
      return None
    store = block_store.BlockStore.from_tfrecords(block_store.blocks_pattern(i.blocks),
                                                  i.unpublished_blocks)
    self.index = KnowledgeIndex(
        store, self.tokenizer, m.retriever.block_seq_length,
        body_length=m.reader.seq_length - 3,
        dimension=factory.retriever_output_size(self.experiment),  # the embedder's width
        strategy=strategy, backend=i.backend, embedding_dtype=i.embedding_dtype,
        rescore=i.rescore)
    return self.index

  # ------------------------------------------------------------------------- the step

  def forward(self, model, features, training):
    """Retrieve, read and score one replica's batch (the steps of the module docstring).

    Args:
      model: the RealmPretrainer.
      features: one batch of build_inputs.
      training: dropout on.

    Returns:
      (this replica's share of the global mean loss, outputs: retrieval_logits [B, K],
      token_log_probs [B, K, M], mlm_predictions [B, M], loss_sum, weight_sum, block_ids
      [B, k] of the retrieved blocks).
    """
    query = features["query"]
    batch = tf.shape(query["input_word_ids"])[0]
    if self.task_config.retrieval:
      q = model.retriever.embed_queries(query, training=training)  # [B, P]
      retrieved = self.index.search(q, self.num_retrieved,
                                    exclude_block_ids=features["block_id"])  # [B, k]
      block_ids = retrieved.block_ids
      blocks = self.index.gather(retrieved.rows)
      if self.task_config.include_null_document:
        document, body_ids, body_lengths = prepend_null(blocks, self._null, batch)
      else:
        document, body_ids, body_lengths = (blocks.document, blocks.body_ids,
                                            blocks.body_lengths)
    else:  # the null document alone: an empty body, no retriever
      q, document = None, None
      block_ids = tf.zeros([batch, 0], tf.int64)  # [B, 0]: nothing retrieved
      body_ids = tf.zeros([batch, 1, 1], tf.int32)  # [B, 1, Lb=1], length 0
      body_lengths = tf.zeros([batch, 1], tf.int32)
    reader = pack_reader_inputs(query["input_word_ids"], query["input_mask"], body_ids,
                                body_lengths, self.experiment.model.reader.seq_length,
                                self.tokenizer.sep_id)
    reader.pop("body_start")
    inputs = dict(reader=reader, masked_lm=features["masked_lm"])
    if document is not None:
      inputs["candidates"] = document
    out = model(inputs, query_embeddings=q, training=training)
    weights = features["masked_lm"]["weights"]  # [B, M]
    loss_sum, weight_sum = losses.masked_lm_marginal_loss(
        out.retrieval_logits, out.token_log_probs, weights)
    loss = losses.global_mean(loss_sum, weight_sum)
    return loss, dict(retrieval_logits=out.retrieval_logits,
                      token_log_probs=out.token_log_probs,
                      mlm_predictions=out.mlm_predictions, loss_sum=loss_sum,
                      weight_sum=weight_sum, block_ids=block_ids)

  def train_step(self, inputs, model, optimizer, metrics=None):
    """One update on a per-replica batch (runs in replica context).

    Args:
      inputs: one batch of build_inputs.
      model: the RealmPretrainer.
      optimizer: the optimizer of create_task_optimizer.
      metrics: build_metrics' Means, updated here.

    Returns:
      {'loss': this replica's mean loss per masked token}.
    """
    _, out = self.gradient_step(model, optimizer,
                                lambda f, t: self.forward(model, f, t), inputs)
    return self._logs(inputs, out, metrics)

  def validation_step(self, inputs, model, metrics=None):
    """The loss and accuracies of a validation batch, without dropout.

    Args:
      inputs: one batch of build_inputs (validation_data).
      model: the RealmPretrainer.
      metrics: build_metrics' Means (mlm and span accuracy, retrieval utility, ...).

    Returns:
      {'loss': this replica's mean loss per masked token}.
    """
    _, out = self.compiled("validation", lambda f: self.forward(model, f, False))(inputs)
    return self._logs(inputs, out, metrics)

  def _logs(self, features, out, metrics):
    weights = features["masked_lm"]["weights"]
    weight_sum = out["weight_sum"]
    loss = out["loss_sum"] / tf.maximum(weight_sum, 1.0)
    correct = tf.cast(tf.equal(out["mlm_predictions"], features["masked_lm"]["ids"]),
                      tf.float32)
    null = 0 if self.reads_null_document else None
    # A span is right when every one of its wordpieces is (examples with no mask skipped).
    has_mask = tf.reduce_sum(weights, axis=1) > 0  # [B]
    span_right = tf.reduce_all((correct > 0) | (weights == 0), axis=1)  # [B]
    values = dict(
        loss=loss,
        mlm_accuracy=tf.reduce_sum(correct * weights) / tf.maximum(weight_sum, 1.0),
        span_accuracy=tf.boolean_mask(tf.cast(span_right, tf.float32), has_mask),
        null_document_probability=(tf.nn.softmax(out["retrieval_logits"], -1)[:, 0]
                                   if null is not None else tf.zeros([1])),
        # 0 unless exclusion is broken: the source block must never be among the candidates.
        trivial_block_retrieved=tf.cast(tf.reduce_any(tf.equal(
            out["block_ids"], features["block_id"][:, None]), axis=1), tf.float32))
    if null is not None:
      values["retrieval_utility"] = losses.retrieval_utility(
          out["token_log_probs"], weights, out["retrieval_logits"], null_index=0)
    self.update_metrics(metrics, values, dict(loss=weight_sum, mlm_accuracy=weight_sum))
    return {self.loss: loss}

  # ------------------------------------------------------------------------- host side

  def initialize(self, model):
    """A fresh run's retriever starts from the ICT run at init_checkpoint (if set), its
    knowledge-augmented encoder (MLM head included) from the run at mlm_init_checkpoint
    (if set, e.g. the MLM-head warm-up); otherwise the encoders keep build_model's warm
    start.

    Args:
      model: the RealmPretrainer.
    """
    c = self.task_config
    if c.init_checkpoint:
      path = layout.latest_checkpoint(c.init_checkpoint)
      tf.train.Checkpoint(model=model.retriever).read(path).expect_partial()
      base.log_restore("Retriever (ICT)", path)
    if c.mlm_init_checkpoint:
      path = layout.latest_checkpoint(c.mlm_init_checkpoint)
      # The same object path as in a pre-training checkpoint (model → the pretrainer's
      # knowledge_augmented_encoder attribute), so only that subtree is read.
      tf.train.Checkpoint(model=tf.train.Checkpoint(
          knowledge_augmented_encoder=model.knowledge_augmented_encoder)).read(
              path).assert_existing_objects_matched().expect_partial()
      base.log_restore("Knowledge-augmented encoder and MLM head", path)

  def trainable_variables(self, model) -> list:
    """trainable=mlm_head: the MLM head's transform, layer norm and output bias only (its
    output matrix is the encoder's word embedding table, which stays frozen); 'all': every
    trainable variable of the model."""
    if self.task_config.trainable == "all":
      return model.trainable_variables
    encoder = model.knowledge_augmented_encoder
    frozen = {v.ref() for v in encoder.encoder.trainable_variables}
    return [v for v in encoder.masked_lm.trainable_variables if v.ref() not in frozen]

  def on_evaluate_begin(self, model, global_step: int):
    """Loads the first committed index (read-only), or a side-car follows the newest."""
    if not self.task_config.retrieval:
      return
    if self.index.version is None:
      self._start_refresher(model, global_step, train=False)
    elif self.side_car:
      self.follow_index()

  def on_train_begin(self, model, global_step: int):
    """Starts the index refresher (and the builder child with start_index_builder)."""
    if self.task_config.retrieval:
      self._start_refresher(model, global_step, train=True)

  def _start_refresher(self, model, global_step: int, train: bool):
    self.start_refresher(
        model, global_step, train,
        refresh_every_steps=self.task_config.refresh_every_steps if train else 0,
        max_staleness_steps=self.experiment.index.max_staleness_steps,
        start_builder=train and self.task_config.start_index_builder)
