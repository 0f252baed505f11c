"""The Inverse Cloze Task (Lee et al., 2019): the warm start of REALM's retriever.

Each pseudo-query (a sentence) must pick its own evidence block among all the blocks of the
global batch (in-batch negatives gathered across replicas, losses.ict_loss). The task ends
by exporting the retriever towers, which pre-training and the index builder start from.
"""
import logging

import tensorflow as tf

from realm_tf.data import ict_inputs
from realm_tf.io import layout
from realm_tf.modeling import factory, losses
from realm_tf.tasks import base
from realm_tf.retrieval import snapshots


class IctTask(base.RealmTask):
  """build_model → Retriever; inputs {'query', 'block', 'block_id'}; loss = ICT softmax."""

  metric_names = ("loss", "accuracy")

  def build_model(self):
    """The dual-encoder retriever of model.retriever, warm-started per model.warm_start.

    Returns:
      A Retriever (query and document towers).
    """
    return factory.build_retriever(self.experiment)

  def build_inputs(self, params, input_context=None):
    """One input pipeline's batches of ICT examples.

    Args:
      params: the DataConfig (train_data or validation_data): input_path (ict-* TFRecords
        of the corpus pipeline), global_batch_size, is_training, shuffle_buffer_size,
        max_examples.
      input_context: the pipeline's tf.distribute.InputContext, or None.

    Returns:
      A tf.data.Dataset of {'query': [B, Lq] encoder inputs, 'block': [B, Lb] encoder
      inputs (title [SEP] text), 'block_id': [B] int64}, B the per-replica batch. Training
      repeats, shuffles and skips the batches a resumed run already consumed.
    """
    r = self.experiment.model.retriever
    training = bool(params.is_training)
    return ict_inputs.ict_dataset(
        params.input_path, self.tokenizer,
        base.per_replica_batch(params.global_batch_size, input_context),
        r.query_seq_length, r.block_seq_length, seed=self.experiment.trainer.seed,
        shuffle_buffer=params.shuffle_buffer_size if training else 0, repeat=training,
        skip_batches=base.input_skip(self.start_step, input_context) if training else 0,
        input_context=input_context, max_examples=params.max_examples,
        unpublished=params.unpublished_input)

  def forward(self, retriever, features, training):
    """The ICT loss of one replica's batch against every block of the global batch.

    Args:
      retriever: the Retriever.
      features: one batch of build_inputs.
      training: dropout on.

    Returns:
      (this replica's share of the global mean loss, losses.ict_loss's outputs: loss_sum,
      correct and count over this replica's queries, among others).
    """
    q = retriever.embed_queries(features["query"], training=training)  # [B, P]
    d = retriever.embed_documents(features["block"], training=training)  # [B, P]
    out = losses.ict_loss(q, d, features["block_id"])
    loss = losses.global_mean(out["loss_sum"], out["count"])
    return loss, out

  def train_step(self, inputs, model, optimizer, metrics=None):
    """One update on a per-replica batch (runs in replica context).

    Args:
      inputs: one batch of build_inputs.
      model: the Retriever.
      optimizer: the optimizer of create_task_optimizer.
      metrics: build_metrics' Means (loss, accuracy), updated here.

    Returns:
      {'loss': this replica's mean loss over its queries}.
    """
    _, out = self.gradient_step(model, optimizer, lambda f, t: self.forward(model, f, t), inputs)
    return self._logs(out, metrics)

  def validation_step(self, inputs, model, metrics=None):
    """The loss and in-batch accuracy of a validation batch, without dropout.

    Args:
      inputs: one batch of build_inputs (validation_data).
      model: the Retriever.
      metrics: build_metrics' Means (loss, accuracy), updated here.

    Returns:
      {'loss': this replica's mean loss over its queries}.
    """
    _, out = self.compiled("validation", lambda f: self.forward(model, f, False))(inputs)
    return self._logs(out, metrics)

  def _logs(self, out, metrics):
    loss = out["loss_sum"] / out["count"]
    accuracy = out["correct"] / out["count"]
    self.update_metrics(metrics, dict(loss=loss, accuracy=accuracy),
                        dict(loss=out["count"], accuracy=out["count"]))
    return {self.loss: loss}

  def initialize(self, model):
    """A fresh run's weights: init_checkpoint, when set, restores a previous ICT run's retriever.

    Otherwise the retriever keeps model.warm_start (applied by build_model).

    Args:
      model: the Retriever.
    """
    if self.task_config.init_checkpoint:
      path = layout.latest_checkpoint(self.task_config.init_checkpoint)
      tf.train.Checkpoint(model=model).read(path).expect_partial()
      base.log_restore("Retriever", path)

  def on_train_end(self, model, global_step: int, reached_train_steps: bool,
                   failed: bool = False):
    """The chief exports the retriever towers (snapshots.export_retriever) at `global_step`.

    Pre-training and the index builder start from that export. Nothing is exported after
    a failure; see RealmTask.on_train_end for the arguments.
    """
    # After a failure the weights are past the last checkpoint (the steps since it are
    # lost): the relaunch trains them again and exports at the step it reaches.
    if failed or not self.role.is_chief:
      return
    paths = snapshots.export_retriever(self.model_dir, global_step, model, self.tokenizer,
                                       self.experiment)
    logging.info("ICT at step %d: retriever exported to %s", global_step, paths)
