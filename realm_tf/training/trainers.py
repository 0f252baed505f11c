"""One orbit trainer and evaluator, driven by per-mode step functions (ICT, pre-training).

Each step runs under `strategy.run`; losses are divided by the *global* number of items
(`losses.global_mean`) and gradients are summed across replicas by the optimizer, so any
number of replicas computes the single-device update.
"""
import functools
from typing import Callable, Optional

import orbit
import tensorflow as tf
import tf_keras

from realm_tf.modeling import losses

# Features that stay on the host (strings, bookkeeping): never sent to replicas.
HOST_ONLY = ("doc_uid", "candidate_block_ids", "block_id_host")


def _device_features(features: dict) -> dict:
  return {k: v for k, v in features.items() if k not in HOST_ONLY}


def _sub(features: dict, prefix: str) -> dict:
  return {k: features[f"{prefix}_{k}"]
          for k in ("input_word_ids", "input_mask", "input_type_ids")}


def _apply(optimizer, tape, loss, variables):
  grads = tape.gradient(loss, variables)
  # Variables a step does not use (e.g. BERT's pooler under 'cls' pooling) get None.
  pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
  optimizer.apply_gradients(pairs)


class _Metrics:
  """Named tf_keras Mean metrics, created under the strategy scope."""

  def __init__(self, names):
    self.metrics = {n: tf_keras.metrics.Mean(n, dtype=tf.float32) for n in names}

  def update(self, name, value, weight=None):
    self.metrics[name].update_state(value, sample_weight=weight)

  def reset(self):
    for m in self.metrics.values():
      m.reset_state()

  def result(self) -> dict:
    return {n: m.result() for n, m in self.metrics.items()}


def _ict_step(retriever, features, metrics: _Metrics, training: bool, optimizer=None):
  with tf.GradientTape() as tape:
    q = retriever.embed_queries(_sub(features, "query"), training=training)  # [B, P]
    d = retriever.embed_documents(_sub(features, "block"), training=training)  # [B, P]
    out = losses.ict_loss(q, d, features["block_id"])
    loss = losses.global_mean(out["loss_sum"], out["count"])
  if optimizer is not None:
    _apply(optimizer, tape, loss, retriever.trainable_variables)
  metrics.update("loss", out["loss_sum"] / out["count"], out["count"])
  metrics.update("accuracy", out["correct"] / out["count"], out["count"])


ICT_METRICS = ["loss", "accuracy"]


PRETRAIN_METRICS = ["loss", "mlm_accuracy", "retrieval_utility", "null_document_probability",
                    "candidates_padded"]


def _pretrain_step(model, features, metrics: _Metrics, training: bool, optimizer=None):
  weights = tf.cast(features["masked_lm_weights"], tf.float32)  # [B, M]
  with tf.GradientTape() as tape:
    out = model(features, training=training)
    loss_sum, weight_sum = losses.masked_lm_marginal_loss(
        out["retrieval_logits"], out["token_log_probs"], weights)
    loss = losses.global_mean(loss_sum, weight_sum)
  if optimizer is not None:
    _apply(optimizer, tape, loss, model.trainable_variables)
  correct = tf.cast(tf.equal(out["mlm_predictions"], features["masked_lm_ids"]), tf.float32)
  metrics.update("loss", loss_sum / tf.maximum(weight_sum, 1.0), weight_sum)
  metrics.update("mlm_accuracy", tf.reduce_sum(correct * weights) / tf.maximum(weight_sum, 1.0),
                 weight_sum)
  metrics.update("retrieval_utility", losses.retrieval_utility(
      out["token_log_probs"], weights, out["retrieval_logits"], null_index=0))
  metrics.update("null_document_probability",
                 tf.nn.softmax(out["retrieval_logits"], axis=-1)[:, 0])
  if "candidate_mask" in features:
    metrics.update("candidates_padded", 1.0 - tf.cast(features["candidate_mask"], tf.float32))


class StepTrainer(orbit.StandardTrainer):
  """One orbit trainer for every mode: `step(features, metrics, training, optimizer)` runs
  on each replica; metrics are tf_keras Means summed across replicas on read."""

  def __init__(self, strategy, step: Callable, metric_names, optimizer, dataset_fn: Callable,
               host_metrics: Optional[Callable[[], dict]] = None):
    self.strategy = strategy
    self.step = step
    self.optimizer = optimizer
    self.host_metrics = host_metrics
    with strategy.scope():
      self.metrics = _Metrics(metric_names)
    super().__init__(strategy.distribute_datasets_from_function(dataset_fn),
                     orbit.StandardTrainerOptions(use_tf_function=True))

  def train_loop_begin(self):
    self.metrics.reset()

  def train_step(self, iterator):
    def replica_step(features):
      self.step(features, self.metrics, True, self.optimizer)
    self.strategy.run(replica_step, args=(_device_features(next(iterator)),))

  def train_loop_end(self):
    out = self.metrics.result()
    out["learning_rate"] = self.optimizer.learning_rate(self.optimizer.iterations)
    if self.host_metrics is not None:
      out.update(self.host_metrics())
    return out


class StepEvaluator(orbit.StandardEvaluator):
  """The evaluation side of StepTrainer: the same step without gradients or dropout."""

  def __init__(self, strategy, step: Callable, metric_names, dataset_fn: Callable):
    self.strategy = strategy
    self.step = step
    with strategy.scope():
      self.metrics = _Metrics(metric_names)
    super().__init__(strategy.distribute_datasets_from_function(dataset_fn))

  def eval_begin(self):
    self.metrics.reset()

  def eval_step(self, iterator):
    def replica_step(features):
      self.step(features, self.metrics, False)
    self.strategy.run(replica_step, args=(_device_features(next(iterator)),))

  def eval_end(self):
    return self.metrics.result()


def ict_step(retriever) -> Callable:
  """The StepTrainer step of ICT over `retriever`."""
  return functools.partial(_ict_step, retriever)


def pretrain_step(model) -> Callable:
  """The StepTrainer step of REALM pre-training over a RealmPretrainer."""
  return functools.partial(_pretrain_step, model)
