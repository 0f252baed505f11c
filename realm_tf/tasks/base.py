"""What every realm_tf training mode shares, in the shape of tf-models' `base_task.Task`.

A task builds its model, its inputs, its metrics and its train/validation steps; the one
generic driver (realm_tf.training.train_lib) runs any task with tf-models' `Trainer` and an
orbit `Controller`. What realm_tf adds to tf-models' Task:
  - the whole ExperimentConfig (model, index, trainer, runtime sections are shared by tasks),
    the run's model_dir and the step a resumed run starts from (so inputs skip exactly the
    global batches already consumed);
  - `gradient_step`: the forward pass, loss and gradients of one replica's batch as one
    function compiled with `jit_compile=runtime.enable_xla` (`compiled`); the optimizer
    update stays outside it (its cross-replica merge cannot sit inside an XLA cluster);
  - `build_index`: the knowledge index a retrieval task searches, built by the driver after
    the model, under the strategy;
  - host-side hooks the driver calls between train loops (`train_actions`, `host_logs`,
    `on_train_end`), e.g. a newer index swapped in, retriever snapshots handed to the
    index builder.
"""
import logging
import math
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tf_keras
from official.core import base_task

from realm_tf.configs.experiment import ExperimentConfig, TrainerConfig
from realm_tf.io import layout
from realm_tf.io.roles import HostRole
from realm_tf.modeling import factory, optimization
from realm_tf.retrieval import refresh
from realm_tf.text.tokenization import Tokenizer


class RealmTask(base_task.Task):
  """Base of the ict / pretrain / openqa tasks (see the module docstring).

  A subclass implements tf-models' Task hooks, called by the driver
  (realm_tf.training.train_lib) in this order: `build_model`, `create_task_optimizer`
  and, when training, `create_optimizer_slots` (under the strategy's scope), `build_index`,
  `build_inputs` (per input pipeline), `initialize` (a fresh run's weights, by the
  checkpoint manager), `on_train_begin`, then
  per step `train_step` / `validation_step` (replica context, compiled), per train loop
  `train_actions` and `host_logs` (host), after each evaluation `on_evaluate_end`, and at
  the end `on_train_end` and `run_summary`.

  Args:
    params: the selected task config (experiment.task_config: IctTaskConfig,
      PretrainTaskConfig or OpenQATaskConfig); tf-models' Task keeps it as task_config.
    experiment: the whole ExperimentConfig of the run.
    model_dir: the run's directory (checkpoints, params.yaml, metrics.jsonl, index/); ''
      for a task used without a run (tests, tools).
    start_step: the global step the run resumes from; training inputs skip the batches
      already consumed.
    name: the task's name (the registry's task type).
    role: this process's part in a multi-process job (default: the only process, which
      writes).
  """

  # Names of the Mean metrics the task reports; build_metrics makes one of each.
  metric_names: Sequence[str] = ("loss",)
  # True when an evaluation must see the whole validation set (per-question scoring), so
  # trainer.validation_steps does not apply.
  evaluates_whole_set: bool = False
  # What an evaluation's files are called (eval/<name>-<step>.json); evaluate_run sets it.
  evaluation_name: str = "validation"
  # True in a side-car evaluator (realm_tf.training.continuous_eval): this process follows
  # another process's run. It loads the run's newest committed index before each
  # evaluation and writes only its own evaluation files (evaluation_log, eval/<name>-*);
  # it never exports retriever snapshots, starts an index builder or touches TRAINING_DONE.
  side_car: bool = False

  def __init__(self, params, experiment: ExperimentConfig, model_dir: str = "",
               start_step: int = 0, name: Optional[str] = None,
               role: Optional[HostRole] = None):
    super().__init__(params, logging_dir=model_dir, name=name)
    self.experiment = experiment
    self.model_dir = model_dir
    self.start_step = start_step
    # Whether this process writes the task's host-side files (evaluations, exports,
    # snapshots, the index builder): the chief of a multi-worker job; see realm_tf.io.roles.
    self.role = role or HostRole()
    # Where one JSON line per evaluation goes: the run's metrics.jsonl for the trainer's
    # in-loop evaluations; a side-car evaluator sets its own file (two processes appending
    # to one object on a store would race).
    self.evaluation_log = layout.metrics_path(model_dir) if model_dir else ""
    self._tokenizer: Optional[Tokenizer] = None
    self._compiled: dict[str, Callable] = {}

  @property
  def tokenizer(self) -> Tokenizer:
    """The WordPiece tokenizer of model.tokenizer (vocab file or the package's), built once."""
    if self._tokenizer is None:
      t = self.experiment.model.tokenizer
      self._tokenizer = Tokenizer(t.vocab_file or None, t.lower_case)
    return self._tokenizer

  @property
  def jit_compile(self) -> bool:
    """Whether the step's forward and backward pass is compiled with XLA (runtime.enable_xla)."""
    return bool(self.experiment.runtime.enable_xla)

  def create_task_optimizer(self, model=None):
    """The optimizer of `model`, built from the trainer section (realm_tf.modeling.optimization).

    Called under the strategy's scope; the optimizer's step counter is created here.

    Args:
      model: the model build_model returned; a retriever it holds under a reader (its
        `retriever` attribute) gets trainer.retriever_learning_rate_multiplier and
        trainer.retriever_frozen_steps.

    Returns:
      A tf_keras optimizer (a LossScaleOptimizer around it under mixed float16).
    """
    retriever = getattr(model, "retriever", None)
    optimizer = optimization.build_optimizer(
        self.experiment.trainer, self.experiment.runtime,
        retriever.trainable_variables if retriever is not None else ())
    # Create the step counter now (under the caller's strategy scope): a task step may read
    # it (the Open-QA gold-block stage), and a lazily created variable inside a traced
    # replica function is not one MirroredStrategy can use.
    _ = optimizer.iterations
    return optimizer

  def create_optimizer_slots(self, model, optimizer):
    """Creates `optimizer`'s variables (Adam's moments, its hyperparameters) for every
    variable a train step updates, before the first step. Called under the strategy's
    scope by a training run.

    Why: created inside the train loop's first trace, they make tf.function trace the loop
    twice (once creating variables, once more without). tf-models' multi-task trainer calls
    `optimizer.build` for the same reason; a legacy Keras optimizer's equivalent is
    `_create_all_weights`, which Keras' own checkpoint loading calls. A checkpoint restored
    afterwards fills the slots in place.

    Args:
      model: the model build_model returned.
      optimizer: the optimizer of create_task_optimizer.
    """
    variables = self.updated_variables(model, optimizer)
    if isinstance(optimizer, tf_keras.optimizers.legacy.Optimizer):
      optimizer._create_all_weights(variables)  # pylint: disable=protected-access
    else:
      optimizer.build(variables)

  def updated_variables(self, model, optimizer) -> list:
    """The variables a train step computes gradients for and applies them to: the task's
    trainable_variables less those whose learning rate is 0 for good (a variable that never
    moves needs no gradient).

    Args:
      model: the model build_model returned.
      optimizer: the optimizer of create_task_optimizer.

    Returns:
      A list of tf.Variable, in trainable_variables' order.
    """
    variables = self.trainable_variables(model)
    rates = optimization.variable_rates(optimizer)
    if rates is not None:
      variables = [v for v in variables if not rates.frozen_for_good(v)]
    return variables

  def build_metrics(self, training: bool = True):
    """One float32 Mean per name in `metric_names`.

    Args:
      training: unused; training and validation report the same metrics.

    Returns:
      A list of tf_keras.metrics.Mean, updated by the steps through `update_metrics`.
    """
    del training
    return [mean_metric(name) for name in self.metric_names]

  def compiled(self, name: str, fn: Callable) -> Callable:
    """`fn` as a tf.function compiled with XLA when runtime.enable_xla (one per name).

    Without XLA, `fn` runs inline in the caller's graph: a nested tf.function around
    cross-replica collectives (the ICT negatives, the sharded index) is not supported by
    MirroredStrategy's merge_call.

    Args:
      name: the cache key; the first `fn` given a name is the one compiled for it.
      fn: the function to compile (called in replica context).

    Returns:
      The compiled function (cached per name), or `fn` itself without XLA.
    """
    if not self.jit_compile:
      return fn
    if name not in self._compiled:
      self._compiled[name] = tf.function(fn, jit_compile=True)
    return self._compiled[name]

  @staticmethod
  def update_metrics(metrics, values: dict[str, Any], weights: Optional[dict] = None):
    """Updates the Means named in `values`; metrics named in neither are left alone.

    Args:
      metrics: the metrics build_metrics made, or None (nothing to update).
      values: metric name → value (a scalar or a tensor of per-example values).
      weights: metric name → sample weight of its value; a name absent: unweighted.
    """
    weights = weights or {}
    for metric in metrics or []:
      if metric.name in values:
        metric.update_state(values[metric.name], sample_weight=weights.get(metric.name))

  def gradient_step(self, model, optimizer, loss_and_outputs: Callable, inputs):
    """One replica's update: loss, gradients (compiled), then the optimizer (not compiled).

    `loss_and_outputs(inputs, training)` returns (this replica's share of the global mean
    loss, outputs dict). Mixed float16 scales the loss as tf-models' LossScaleOptimizer
    expects.

    Args:
      model: the model build_model returned.
      optimizer: the optimizer of create_task_optimizer.
      loss_and_outputs: the task's forward pass, (features, training) → (loss, outputs).
      inputs: one per-replica batch.

    Returns:
      (loss, outputs) of the forward pass, as `loss_and_outputs` returned them.
    """
    variables = self.updated_variables(model, optimizer)
    scaled = isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer)

    def forward_backward(features):
      with tf.GradientTape() as tape:
        loss, outputs = loss_and_outputs(features, True)
        objective = optimizer.get_scaled_loss(loss) if scaled else loss
      grads = tape.gradient(objective, variables)  # None for variables the step never used
      return loss, outputs, grads

    loss, outputs, grads = self.compiled("forward_backward", forward_backward)(inputs)
    if scaled:
      grads = optimizer.get_unscaled_gradients(grads)
    optimization.apply_gradients(optimizer, zip(grads, variables))
    return loss, outputs

  def trainable_variables(self, model) -> list:
    """The variables a train step updates (all of the model's, unless a task freezes some).

    Args:
      model: the model build_model returned.

    Returns:
      A list of tf.Variable, in a fixed order (gradients are zipped with it).
    """
    return model.trainable_variables

  # ------------------------------------------------------------------ driver hooks (host)

  def build_index(self, strategy) -> Optional[Any]:
    """The task's knowledge index, built after the model (the driver calls this for every task).

    Args:
      strategy: the run's tf.distribute strategy; the index's embedding variables are
        sharded over its replicas.

    Returns:
      A KnowledgeIndex (its embeddings not loaded yet: on_train_begin / on_evaluate_begin
      load a committed version), or None when the task searches no index (ICT: negatives
      come from the batch).
    """
    del strategy
    return None

  def run_summary(self) -> dict:
    """What the task adds to the run's summary when training ends.

    Returns:
      A JSON-serialisable dict merged into the driver's result (e.g. index refresh counts
      and staleness); {} by default.
    """
    return {}

  def train_actions(self, trainer) -> list[Callable[[dict], None]]:
    """orbit train actions to run after each train loop (host side).

    Called when the driver builds its runner, before `on_train_begin`: an action must look
    up state that on_train_begin creates (e.g. the index refresher) when it runs.

    Args:
      trainer: the driver's tf-models Trainer (its `global_step` is the step reached).

    Returns:
      Callables taking the train loop's output logs (dict); [] by default.
    """
    del trainer
    return []

  def host_logs(self, global_step: int) -> dict[str, float]:
    """Extra scalars for a train loop's logs, computed on the host.

    Args:
      global_step: the step the loop ended at.

    Returns:
      Name → float, added to the loop's logs and summaries (e.g. index staleness in
      steps); {} by default.
    """
    del global_step
    return {}

  def on_train_begin(self, model, global_step: int):
    """Host work before the first train step (e.g. load the first index, start a builder).

    Args:
      model: the model (its weights restored or initialised).
      global_step: the step training starts from.
    """
    del model, global_step

  def on_evaluate_begin(self, model, global_step: int):
    """Host work before an evaluation outside training (e.g. load or follow the index).

    Args:
      model: the model, its weights restored from the checkpoint evaluated.
      global_step: that checkpoint's step.
    """
    del model, global_step

  def on_train_end(self, model, global_step: int, reached_train_steps: bool,
                   failed: bool = False):
    """Host work after the last step (e.g. stop the index builder); runs on failure too.

    Args:
      model: the model as training left it.
      global_step: the step reached.
      reached_train_steps: whether the step reached trainer.train_steps (the schedule is
        complete, not only this job's slice of it).
      failed: training raised (a dead peer, say); the weights may be ahead of the last
        checkpoint, so nothing should be published from them.
    """
    del model, global_step, reached_train_steps, failed

  def on_evaluate_end(self, global_step: int, logs: dict):
    """After each evaluation: its scalar metrics as one `eval` line of evaluation_log.

    The lines are the curves of held-out metrics over steps (TensorBoard gets them from
    orbit too). Only the chief writes.

    Args:
      global_step: the step of the weights evaluated.
      logs: the evaluation's logs; entries that are not one number are left out.
    """
    if not self.evaluation_log or not self.role.is_chief:
      return
    scalars = {}
    for name, value in logs.items():
      value = np.asarray(value)
      if value.size == 1 and np.issubdtype(value.dtype, np.number):
        scalars[name] = float(value)
    layout.append_json_line(self.evaluation_log, dict(
        scalars, step=global_step, mode="eval", **self.evaluation_context()))

  def evaluation_context(self) -> dict:
    """What an evaluation line records besides the metrics.

    Returns:
      A JSON-serialisable dict (e.g. the version of the index searched); {} by default.
    """
    return {}

  def steps_per_loop_divisors(self) -> list[int]:
    """Intervals (in steps) a train loop must not straddle (e.g. the snapshot interval).

    Returns:
      Positive step counts; the driver's loop length divides each (`steps_per_loop`).
    """
    return []


def input_skip(start_step: int, input_context: Optional[tf.distribute.InputContext]) -> int:
  """Per-replica batches one input pipeline must skip to resume after `start_step` steps.

  Each global step takes one batch per replica, and a pipeline feeds R / P of the R
  replicas (P input pipelines).

  Args:
    start_step: global steps already trained (the resumed checkpoint's step).
    input_context: the pipeline's tf.distribute.InputContext; None for one pipeline
      feeding one replica.

  Returns:
    The number of per-replica batches to skip.
  """
  if input_context is None:
    return start_step
  per_pipeline = input_context.num_replicas_in_sync // max(1, input_context.num_input_pipelines)
  return start_step * max(1, per_pipeline)


def shard_for(dataset: tf.data.Dataset,
              input_context: Optional[tf.distribute.InputContext]) -> tf.data.Dataset:
  """One input pipeline's share of the records (multi-host TPU pods, multi-worker GPUs).

  Args:
    dataset: the records, in the same order in every pipeline.
    input_context: the pipeline's InputContext; None or one pipeline: no sharding.

  Returns:
    Every P-th record of `dataset`, from the pipeline's id on.
  """
  if input_context is not None and input_context.num_input_pipelines > 1:
    return dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
  return dataset


def per_replica_batch(global_batch_size: int,
                      input_context: Optional[tf.distribute.InputContext]) -> int:
  """The batch size one replica's input gets.

  Args:
    global_batch_size: the batch of one global step (the config's global_batch_size).
    input_context: the pipeline's InputContext; None: one replica.

  Returns:
    global_batch_size / the number of replicas in sync.

  Raises:
    ValueError: global_batch_size is not divisible by the number of replicas.
  """
  if input_context is None:
    return global_batch_size
  return input_context.get_per_replica_batch_size(global_batch_size)


def mean_metric(name: str) -> tf_keras.metrics.Mean:
  """A float32 tf_keras Mean metric called `name`."""
  return tf_keras.metrics.Mean(name, dtype=tf.float32)


def steps_per_loop(trainer: TrainerConfig, *intervals: int) -> int:
  """The largest loop length that divides every interval the driver acts on.

  Args:
    trainer: the trainer section (its steps_per_loop, summary_interval and
      checkpoint_interval).
    *intervals: further intervals in steps (the task's steps_per_loop_divisors); zero or
      negative values are ignored.

  Returns:
    The greatest common divisor of the positive intervals, or 1 if there is none.
  """
  values = [trainer.steps_per_loop, trainer.summary_interval, trainer.checkpoint_interval,
            *intervals]
  return math.gcd(*[v for v in values if v and v > 0]) or 1


def log_restore(what: str, path: str):
  """Logs that `what` was restored from checkpoint `path`."""
  logging.info("%s restored from %s", what, path)


class RetrievalTask(RealmTask):
  """A task that searches a KnowledgeIndex kept fresh by an IndexRefresher (pretrain,
  openqa). The refresher's lifecycle is here once: a task says when it starts one and with
  which settings; its logs, its summary and its stop follow."""

  refresher: Optional[refresh.IndexRefresher] = None

  @property
  def refreshes_index(self) -> bool:
    """Whether training refreshes the index: every task.refresh_every_steps steps a
    retriever snapshot goes to the index builder, and the indexes it commits are swapped
    in. Each retrieval task says under which of its settings (its one difference here)."""
    raise NotImplementedError

  def start_refresher(self, model, global_step: int, train: bool, **settings):
    """Starts an IndexRefresher over self.index and the model's retriever.

    The refresher loads the newest committed index (waiting up to
    index.first_index_timeout_seconds for one), and in training hands retriever snapshots
    to the index builder and swaps in the indexes it commits.

    Args:
      model: the task's model (its `retriever` is what snapshots export).
      global_step: the step training or evaluation starts from.
      train: whether this is a training run (an evaluation never exports snapshots).
      **settings: the RefreshSettings fields that differ per task (refresh_every_steps,
        start_builder, max_staleness_steps).
    """
    index = self.experiment.index
    self.refresher = refresh.IndexRefresher(
        self.model_dir, self.index, refresh.RefreshSettings(
            index_dir=layout.index_dir(self.model_dir, index.index_dir),
            train_steps=self.experiment.trainer.train_steps,
            first_index_timeout_seconds=index.first_index_timeout_seconds,
            poll_seconds=index.poll_seconds, read_only=self.side_car, **settings),
        retriever=model.retriever,
        build_shadow=lambda: factory.build_retriever(self.experiment.replace(
            model=dict(warm_start=dict(source="")))),
        tokenizer=self.tokenizer, config=self.experiment, role=self.role)
    self.refresher.start(global_step, training=train)

  def follow_index(self):
    """A side-car evaluator, before each evaluation: swaps in the run's newest committed
    index if it is newer than the loaded one (read-only; see RealmTask.side_car)."""
    if self.refresher is not None:
      self.refresher.poll()

  def evaluation_context(self) -> dict:
    """{'index_version': the version searched} once an index is loaded, else {}."""
    index = getattr(self, "index", None)
    if index is None or index.version is None:
      return {}
    return dict(index_version=int(index.version))

  def run_summary(self) -> dict:
    """The refresher's summary (IndexRefresher.summary), or {} without one."""
    return self.refresher.summary() if self.refresher is not None else {}

  def host_logs(self, global_step: int) -> dict[str, float]:
    """The index's version and staleness (IndexRefresher.logs), or {} without a refresher."""
    return self.refresher.logs(global_step) if self.refresher is not None else {}

  def train_actions(self, trainer) -> list[Callable[[dict], None]]:
    """When training refreshes the index: after each loop, IndexRefresher.after_loop
    (snapshot, swap)."""
    # Asked for when the runner is built, before on_train_begin makes the refresher: the
    # action looks it up when it runs (a test for it here would find none, and no snapshot
    # would ever be exported).
    if not self.refreshes_index:
      return []
    return [lambda _: self.refresher.after_loop(int(trainer.global_step.numpy()))]

  def steps_per_loop_divisors(self) -> list[int]:
    """[task.refresh_every_steps] when training refreshes the index: snapshots fall on loop
    ends."""
    return [self.task_config.refresh_every_steps] if self.refreshes_index else []

  def on_train_end(self, model, global_step: int, reached_train_steps: bool,
                   failed: bool = False):
    """Stops the refresher: TRAINING_DONE and a short wait for the builder child only when
    the schedule is complete (see IndexRefresher.stop)."""
    del failed  # the builder child is stopped either way
    if self.refresher is not None:
      self.refresher.stop(global_step, reached_train_steps)
      logging.info("Index refresh: %s", self.refresher.summary())
