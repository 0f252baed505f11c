"""One driver for every task: tf-models' Trainer and orbit runner around a RealmTask.

  params.yaml ─ task = registry[task.type] ─ model, optimizer (under strategy.scope())
             ─ index (pre-training / Open-QA: corpus Z sharded over the replicas)
             ─ datasets (numeric nests only; resumed runs skip exactly the consumed batches)
             ─ tf-models base_trainer.Trainer + OrbitExperimentRunner:
                 CheckpointManager(init_fn=task.initialize) resuming from the newest
                 checkpoint that reads back whole (checkpoints.refuse_damaged),
                 orbit.Controller, tf-models' recovery / preemption actions (SIGTERM saves a
                 checkpoint on one host too: preemption.py), the task's host actions, a
                 progress line
             ─ task.on_train_begin (first index) ─ train [and evaluate] ─ task.on_train_end

Everything a run is lives in its ExperimentConfig, saved as <model_dir>/params.yaml before
the first step; the command line only chooses the config, overrides and where to stop.
"""
import logging
import tempfile
import time
import uuid
from typing import Optional

import numpy as np
import tensorflow as tf
import tf_keras
import yaml
from official.core import base_trainer, train_lib as tfm_train_lib

from realm_tf import tasks
from realm_tf.configs.experiment import ExperimentConfig
from realm_tf.io import heartbeat, layout
from realm_tf.io.roles import HostRole
from realm_tf.modeling.factory import set_precision
from realm_tf.tasks.base import RealmTask, steps_per_loop
from realm_tf.training import checkpoints, peer_failures, preemption
from realm_tf.training.progress import ProgressReporter


def save_params(config: ExperimentConfig, model_dir: str):
  """<model_dir>/params.yaml: what the run is (read back by the index builder and
  evaluation). Written through a temporary object, named for this writer, so a reader never
  sees half of it. Only the chief of a multi-worker job calls it."""
  tf.io.gfile.makedirs(model_dir)
  path = layout.params_path(model_dir)
  tmp = f"{path}.tmp-{uuid.uuid4().hex}"
  with tf.io.gfile.GFile(tmp, "w") as f:
    yaml.safe_dump(config.as_dict(), f, sort_keys=True)
  tf.io.gfile.rename(tmp, path, overwrite=True)


class RealmTrainer(base_trainer.Trainer):
  """tf-models' Trainer plus the task's host-side scalars (index staleness, ...) in every
  train loop's logs. Datasets are built by the driver and passed in (the config's task is a
  one-of, so tf-models' check for config.task.train_data does not apply)."""

  def _validate_params(self, config, check_train_data=True, check_validation_data=True):
    del check_train_data, check_validation_data
    if not hasattr(config, "trainer") or not hasattr(config, "task"):
      raise AttributeError("the experiment config needs trainer and task sections")

  def train_loop_begin(self):
    """tf-models' loop start; the watchdog's heartbeat counts the loop."""
    heartbeat.current().loop_begun("train")
    super().train_loop_begin()

  def train_loop_end(self):
    """tf-models' loop logs plus the task's host_logs."""
    logs = super().train_loop_end()
    step = int(self.global_step.numpy())
    heartbeat.current().loop_ended("train", step)
    logs.update(self.task.host_logs(step))
    return logs

  def eval_begin(self):
    """tf-models' evaluation start; the watchdog's heartbeat counts the loop."""
    heartbeat.current().loop_begun("evaluate")
    super().eval_begin()

  def eval_end(self, aggregated_logs=None):
    """tf-models' evaluation logs, handed to the task's on_evaluate_end."""
    logs = super().eval_end(aggregated_logs)
    step = int(self.global_step.numpy())
    heartbeat.current().loop_ended("evaluate", step)
    self.task.on_evaluate_end(step, logs)
    return logs


class _CheckpointManager(tf.train.CheckpointManager):
  """tf.train.CheckpointManager that tells the watchdog's heartbeat the step of each save:
  the step a relaunch resumes from, which the watchdog's exit line names."""

  def __init__(self, checkpoint, directory, step_counter=None, **kwargs):
    super().__init__(checkpoint, directory, step_counter=step_counter, **kwargs)
    self.global_step = step_counter

  def save(self, checkpoint_number=None, check_interval=True, options=None):
    path = super().save(checkpoint_number, check_interval=check_interval, options=options)
    if path is not None and self.global_step is not None:
      heartbeat.current().checkpoint_seen(int(self.global_step.numpy()))
    return path


class _EvaluationCheckpointManager(tf.train.CheckpointManager):
  """Restores the model only: an evaluation-only run creates no optimizer slots, and the
  stock restore would log one warning per slot variable left in the checkpoint (thousands
  per evaluation) when its status is dropped. Saving is unchanged."""

  def restore_or_initialize(self):
    if self.latest_checkpoint is None:
      return super().restore_or_initialize()
    self.checkpoint.restore(self.latest_checkpoint).expect_partial()
    return self.latest_checkpoint


class _WorkerCheckpointManager(_CheckpointManager):
  """A non-chief worker's manager, as tf-models builds it: every worker takes part in a
  save (variables may synchronise on read), so non-chief workers save into a temporary
  directory of their own, keeping one. What tf-models leaves out is the resume: a worker
  restores the chief's newest checkpoint (the job's state), not its own empty directory."""

  def __init__(self, checkpoint, chief_directory: str, **kwargs):
    super().__init__(checkpoint, directory=tempfile.mkdtemp(prefix="realm-worker-ckpt-"),
                     **dict(kwargs, max_to_keep=1))
    self.chief_directory = chief_directory
    logging.info("Non-chief worker: checkpoints are saved to %s (discarded) and restored "
                 "from the chief's %s", self.directory, chief_directory)

  def restore_or_initialize(self):
    chief_latest = tf.train.latest_checkpoint(self.chief_directory)
    if chief_latest is None:
      return super().restore_or_initialize()
    self.checkpoint.restore(chief_latest)
    return chief_latest


class RealmExperimentRunner(tfm_train_lib.OrbitExperimentRunner):
  """tf-models' runner with checkpoints in <model_dir>/checkpoints (realm_tf.io.layout);
  under a multi-worker strategy only the chief writes there (see _WorkerCheckpointManager)
  and only the chief writes summaries."""

  def __init__(self, strategy, task, mode, params, model_dir, role: HostRole, **kwargs):
    self.role = role
    super().__init__(strategy, task, mode, params, model_dir,
                     save_summary=role.is_chief, **kwargs)

  def _maybe_build_checkpoint_manager(self):
    settings = dict(max_to_keep=self.params.trainer.max_to_keep,
                    step_counter=self.trainer.global_step,
                    checkpoint_interval=self.params.trainer.checkpoint_interval,
                    init_fn=self.trainer.initialize)
    directory = layout.checkpoint_dir(self.model_dir)
    if not self.role.is_chief:
      return _WorkerCheckpointManager(self.trainer.checkpoint, directory, **settings)
    manager = _CheckpointManager if "train" in self._mode else _EvaluationCheckpointManager
    return manager(self.trainer.checkpoint, directory=directory, **settings)

  def _build_controller(self, trainer, evaluator, save_summary=True, train_actions=None,
                        eval_actions=None, **kwargs):
    """Adds the single-host SIGTERM save (preemption.PreemptionWatch) after the other train
    actions, so the last loop's progress line is written before the process exits."""
    self.preemption = preemption.PreemptionWatch(
        self.strategy, self.checkpoint_manager, self.trainer.global_step,
        enabled=trainer is not None and self.params.trainer.preemption_on_demand_checkpoint)
    if self.preemption.action is not None:
      train_actions = list(train_actions or []) + [self.preemption]
    return super()._build_controller(trainer, evaluator, save_summary=save_summary,
                                     train_actions=train_actions, eval_actions=eval_actions,
                                     **kwargs)


def distribute(strategy, task: RealmTask, data_config):
  """The task's dataset for `data_config`, one pipeline per host; only numbers reach the
  devices (the nest is checked: a string or variant component is an error)."""
  dataset = strategy.distribute_datasets_from_function(
      lambda context: peer_failures.counted(task.build_inputs(data_config, context)))
  check_numeric(dataset.element_spec, data_config.input_path)
  return dataset


def check_numeric(element_spec, source: str):
  """Checks that a dataset sends the devices numbers only (TPUs take no strings).

  Args:
    element_spec: the dataset's element_spec.
    source: what to name in the error (the input path).

  Raises:
    TypeError: a component is neither floating, integer nor bool.
  """
  for spec in tf.nest.flatten(element_spec, expand_composites=True):
    if not (spec.dtype.is_floating or spec.dtype.is_integer or spec.dtype.is_bool):
      raise TypeError(f"{source}: the input pipeline sends a {spec.dtype.name} tensor to the "
                      f"devices ({spec}); TPUs take numbers only")


def check_xla_placement(experiment: ExperimentConfig, strategy: tf.distribute.Strategy):
  """XLA maps every logical CPU device to one XLA CPU device, so a MirroredStrategy over
  several CPU devices cannot run jit-compiled steps (TPUs and GPUs can)."""
  if not experiment.runtime.enable_xla or strategy.num_replicas_in_sync < 2:
    return
  devices = getattr(strategy.extended, "worker_devices", ())
  if devices and all("CPU" in d.upper() for d in devices):
    raise ValueError("runtime.enable_xla with several CPU replicas is not supported by XLA "
                     "(one XLA CPU device): set runtime.enable_xla=false for this strategy")


class Run:
  """A built experiment: task, trainer, runner (controller), ready to train or evaluate.

  Building it sets the seed and precision, sets a damaged newest checkpoint aside (the
  chief, when training), builds the task's model, optimizer, index and datasets under the
  strategy, and the tf-models Trainer and orbit runner (restoring the newest checkpoint).

  Args:
    experiment: the run's ExperimentConfig.
    model_dir: the run's directory.
    strategy: the distribution strategy (default: the current one).
    train: build for training (the train dataset, train actions, resumption).
    evaluate: build the validation dataset (only if validation_data.input_path is set).

  Raises:
    ValueError: runtime.enable_xla with several CPU replicas.
  """

  def __init__(self, experiment: ExperimentConfig, model_dir: str,
               strategy: Optional[tf.distribute.Strategy] = None, train: bool = True,
               evaluate: bool = True):
    self.experiment = experiment
    self.model_dir = model_dir
    self.strategy = strategy or tf.distribute.get_strategy()
    self.role = HostRole(self.strategy)
    logging.info("This process: %s", self.role.describe())
    check_xla_placement(experiment, self.strategy)
    tf_keras.utils.set_random_seed(experiment.trainer.seed)
    set_precision(experiment)
    if train and self.role.is_chief:  # a damaged newest checkpoint is set aside first
      checkpoints.refuse_damaged(layout.checkpoint_dir(model_dir),
                                 outage_seconds=experiment.runtime.storage_outage_seconds)
    self.role.barrier("the chief's checkpoints are checked")
    self.start_step = layout.checkpoint_step(model_dir) if train else 0
    self.task = tasks.get_task(experiment, model_dir, self.start_step, role=self.role)
    task_config = experiment.task_config
    with self.strategy.scope():
      model = self.task.build_model()
      optimizer = self.task.create_task_optimizer(model)
      if train:  # before the first step, so the train loop is traced once
        self.task.create_optimizer_slots(model, optimizer)
    self.task.build_index(self.strategy)
    train_dataset = distribute(self.strategy, self.task, task_config.train_data) \
        if train else None
    evaluate = evaluate and bool(task_config.validation_data.input_path)
    validation_dataset = distribute(self.strategy, self.task, task_config.validation_data) \
        if evaluate else None
    loop = steps_per_loop(experiment.trainer, *self.task.steps_per_loop_divisors(),
                          experiment.trainer.validation_interval if evaluate else 0)
    self.params = experiment.replace(trainer=dict(steps_per_loop=loop))
    with self.strategy.scope():
      self.trainer = RealmTrainer(self.params, self.task, model, optimizer, train=train,
                                  evaluate=evaluate, train_dataset=train_dataset,
                                  validation_dataset=validation_dataset)
    actions = []
    if train:
      actions = self.task.train_actions(self.trainer) + [ProgressReporter(
          model_dir, self.trainer.global_step, experiment.trainer.train_steps,
          task_config.train_data.global_batch_size, experiment.task.type,
          write_metrics=self.role.is_chief)]
    self.evaluate_enabled = evaluate
    self.runner = RealmExperimentRunner(
        self.strategy, self.task, "train_and_eval" if train else "eval", self.params,
        model_dir, self.role, trainer=self.trainer, train_actions=actions)

  @property
  def model(self):
    """The task's model (the Trainer's)."""
    return self.trainer.model

  @property
  def global_step(self) -> int:
    """The step reached (the Trainer's global_step)."""
    return int(self.trainer.global_step.numpy())

  def train(self, stop_at_step: Optional[int] = None) -> dict:
    """Trains to trainer.train_steps, evaluating every validation_interval if built to.

    Args:
      stop_at_step: stop at this step of the schedule instead (a job slice on a
        preemptible machine; the next run resumes from the checkpoint).

    Returns:
      The run's summary: task, step, start_step, reached_train_steps, checkpoint,
      train_seconds, last_train_loop (the last metrics.jsonl line) and the task's
      run_summary.
    """
    t = self.experiment.trainer
    steps = t.train_steps if stop_at_step is None else min(t.train_steps, stop_at_step)
    start = time.time()
    if self.role.is_chief:  # a new slice: the run is done again only once it reaches the end
      layout.clear_training_done(self.model_dir)
    self.task.on_train_begin(self.model, self.global_step)
    reached = failed = False
    try:
      controller = self.runner.controller
      with self.strategy.scope(), self.runner.preemption.armed():
        if self.evaluate_enabled:
          eval_steps = -1 if self.task.evaluates_whole_set else t.validation_steps
          controller.train_and_evaluate(train_steps=steps, eval_steps=eval_steps,
                                        eval_interval=t.validation_interval)
        else:
          controller.train(steps=steps)
      reached = self.global_step >= t.train_steps
    except BaseException:
      failed = True
      raise
    finally:
      # TRAINING_DONE (which stops index builders) only when the schedule is complete.
      self.task.on_train_end(self.model, self.global_step, reached, failed=failed)
    if reached and self.role.is_chief:  # every task's, not only those with an index refresher
      layout.mark_training_done(self.model_dir, self.global_step)
    result = dict(task=self.experiment.task.type, step=self.global_step,
                  start_step=self.start_step, reached_train_steps=reached,
                  checkpoint=self.runner.checkpoint_manager.latest_checkpoint,
                  train_seconds=time.time() - start)
    history = [r for r in layout.read_metrics(self.model_dir)
               if r.get("mode") == self.experiment.task.type]
    if history:
      result["last_train_loop"] = history[-1]
    result.update(self.task.run_summary())
    return result

  def evaluate(self, steps: int = -1) -> dict:
    """One pass of the task's validation.

    Args:
      steps: batches to evaluate; -1: all of validation_data.

    Returns:
      The evaluation's metrics as Python scalars.
    """
    self.task.on_evaluate_begin(self.model, self.global_step)
    with self.strategy.scope():
      logs = self.runner.controller.evaluate(steps=steps)
    return {k: _scalar(v) for k, v in (logs or {}).items()}


def _scalar(value):
  try:
    return np.asarray(value).item()
  except (TypeError, ValueError):
    return value


def evaluate_checkpoint(experiment: ExperimentConfig, model_dir: str, checkpoint: str = "",
                        strategy: Optional[tf.distribute.Strategy] = None,
                        name: str = "evaluation") -> tuple[dict, Run]:
  """Evaluates a run's checkpoint (its newest, or `checkpoint`) on the task's
  validation_data.

  Args:
    experiment: the run's ExperimentConfig (warm starts are switched off).
    model_dir: the run's directory.
    checkpoint: a checkpoint path (default: the run's newest).
    strategy: the distribution strategy (default: the current one).
    name: names the files written (e.g. eval/<name>-<step>.json).

  Returns:
    (metrics plus step and checkpoint, the Run: its task holds the predictions).

  Raises:
    ValueError: validation_data.input_path is empty.
    FileNotFoundError: the run has no checkpoint.
  """
  run = Run(evaluation_config(experiment), model_dir, strategy, train=False, evaluate=True)
  if not run.evaluate_enabled:
    raise ValueError("nothing to evaluate: task validation_data.input_path is empty")
  run.task.evaluation_name = name
  path = checkpoint or layout.latest_checkpoint(model_dir)
  restore_model(run, path)
  metrics = run.evaluate()
  return dict(metrics, step=run.global_step, checkpoint=path), run


def evaluation_config(experiment: ExperimentConfig) -> ExperimentConfig:
  """`experiment` for evaluating checkpoints: the weights come from the checkpoint, so no
  warm start and no initial checkpoint is read."""
  experiment = experiment.replace(model=dict(warm_start=dict(source="")))
  if experiment.task.type == "openqa":
    experiment = experiment.replace(task=dict(openqa=dict(init_from="warm_start")))
  return experiment


# The most variable bytes `restore_model` reads in one go (a BERT-base tower is ~0.44 GB).
RESTORE_PART_BYTES = 512 << 20


def restore_model(run: Run, path: str):
  """The model and step of checkpoint `path` into an evaluation Run (no optimizer slots:
  it has none); an object of the model missing from the checkpoint is an error.

  Why part by part: one checkpoint read restores every tensor it reads before it assigns
  any, and that transient stays resident afterwards (measured: 1.47 GB of weights read at
  once left the process 1.08 GB larger; the same in four reads, 0.13 GB). REALM's three
  BERT-base towers would hold ~1.7 GB more through an evaluation beside a 6.4 GiB index.
  Each part (`model_parts`) is read through proxies that name its checkpoint path.
  """
  with run.strategy.scope():
    read_in_parts(path, RESTORE_PART_BYTES, model=run.model,
                  global_step=run.trainer.global_step)


def read_in_parts(path: str, max_bytes: int, **objects):
  """Reads checkpoint `path` into `objects` (the checkpoint's root edges, e.g. model=...)
  one part of at most `max_bytes` of variables at a time (`model_parts`).

  Args:
    path: a checkpoint path.
    max_bytes: the most variable bytes read at once where the graph can be cut so.
    **objects: the root's edges and the objects they name.

  Raises:
    AssertionError: an object of `objects` is not in the checkpoint.
  """
  for edge, root in objects.items():
    for names, part in model_parts(root, max_bytes, (edge,)):
      for name in reversed(names):  # proxies naming the part's path from the root
        part = tf.train.Checkpoint(**{name: part})
      status = part.read(path)
      status.expect_partial()
      status.assert_existing_objects_matched()


def model_parts(root, max_bytes: int, names: tuple = ()) -> list[tuple[tuple, object]]:
  """`root`'s object graph cut into parts of at most `max_bytes` of variables where it can
  be: [(the edge names from `root`, the object)]; an object holding more is replaced by its
  children (a single variable larger than that stays one part).

  Args:
    root: a trackable (a Keras model).
    max_bytes: the most variable bytes a part should hold.
    names: the edge names leading to `root` (for the recursion).

  Returns:
    The parts; together they hold every object below `root`.
  """
  view = tf.train.TrackableView(root)
  size = sum(v.shape.num_elements() * v.dtype.size for v in view.descendants()
             if isinstance(v, tf.Variable))
  children = view.children(root)
  if size <= max_bytes or not children or isinstance(root, tf.Variable):
    return [(names, root)]
  return [part for name, child in children.items()
          for part in model_parts(child, max_bytes, names + (name,))]


def run_experiment(experiment: ExperimentConfig, model_dir: str,
                   strategy: Optional[tf.distribute.Strategy] = None,
                   stop_at_step: Optional[int] = None, evaluate: bool = True) -> dict:
  """`python -m realm_tf.train`: saves params.yaml (the chief does), then trains the
  configured task, evaluating it every trainer.validation_interval steps unless `evaluate`
  is False (--mode train: a side-car evaluator does it, realm_tf.training.continuous_eval).

  Args:
    experiment: the run's ExperimentConfig.
    model_dir: the run's directory (params.yaml, checkpoints, metrics.jsonl, ...).
    strategy: the distribution strategy (default: the current one).
    stop_at_step: stop at this step of the schedule (see Run.train).
    evaluate: evaluate in the training loop.

  Returns:
    Run.train's summary.
  """
  if HostRole(strategy).is_chief:
    save_params(experiment, model_dir)
  run = Run(experiment, model_dir, strategy, evaluate=evaluate)
  logging.info("Task %s from step %d (%d replicas)", experiment.task.type, run.start_step,
               run.strategy.num_replicas_in_sync)
  return run.train(stop_at_step)


__all__ = ["Run", "RealmTrainer", "check_numeric", "evaluate_checkpoint", "evaluation_config",
           "model_parts", "read_in_parts", "restore_model", "run_experiment", "save_params"]

