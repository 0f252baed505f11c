"""ICT warm start and REALM pre-training runs, end to end."""
import logging
import math
import os
import subprocess
import sys
import time
from typing import Optional, Sequence

import orbit
import tensorflow as tf
import tf_keras

from realm_tf.configs.experiment import ExperimentConfig
from realm_tf.data import files as data_files
from realm_tf.data.block_store import BlockStore
from realm_tf.data.candidates import CandidateRetriever
from realm_tf.data.ict_inputs import ict_dataset
from realm_tf.data.pretraining_inputs import pretraining_dataset
from realm_tf.io import versioned
from realm_tf.modeling import factory
from realm_tf.text.tokenization import Tokenizer
from realm_tf.training import snapshots
from realm_tf.training.progress import ProgressReporter
from realm_tf.training.runtime import build_optimizer
from realm_tf.training.trainers import (
    ICT_METRICS, PRETRAIN_METRICS, StepEvaluator, StepTrainer, ict_step, pretrain_step)


def _tokenizer(config: ExperimentConfig) -> Tokenizer:
  return Tokenizer(config.tokenizer.vocab_file or None, config.tokenizer.lower_case)


def _steps_per_loop(config: ExperimentConfig, *intervals: int) -> int:
  t = config.trainer
  values = [t.summary_every_steps, t.checkpoint_every_steps, *intervals]
  if config.data.eval_examples:
    values.append(t.eval_every_steps)
  return math.gcd(*[v for v in values if v > 0]) or 1


def save_params(config: ExperimentConfig, model_dir: str):
  """model_dir/params.yaml: what the run was (read back by the index builder)."""
  import yaml  # pylint: disable=g-import-not-at-top
  tf.io.gfile.makedirs(model_dir)
  path = os.path.join(model_dir, "params.yaml")
  tmp = path + ".tmp"
  with tf.io.gfile.GFile(tmp, "w") as f:
    yaml.safe_dump(config.as_dict(), f, sort_keys=True)
  tf.io.gfile.rename(tmp, path, overwrite=True)


def _checkpoint(model_dir, config, global_step, **objects):
  checkpoint = tf.train.Checkpoint(global_step=global_step, **objects)
  manager = tf.train.CheckpointManager(
      checkpoint, os.path.join(model_dir, "checkpoints"),
      max_to_keep=config.trainer.max_checkpoints, step_counter=global_step,
      checkpoint_interval=config.trainer.checkpoint_every_steps)
  return checkpoint, manager


def _controller(strategy, trainer, evaluator, global_step, manager, model_dir, steps_per_loop,
                config, actions):
  return orbit.Controller(
      strategy=strategy, trainer=trainer, evaluator=evaluator, global_step=global_step,
      steps_per_loop=steps_per_loop, checkpoint_manager=manager,
      summary_interval=config.trainer.summary_every_steps,
      summary_dir=os.path.join(model_dir, "summaries", "train"),
      eval_summary_dir=os.path.join(model_dir, "summaries", "eval"), train_actions=actions)


def _run_controller(controller, config, stop_at_step: Optional[int] = None):
  """Trains to trainer.train_steps, or only to `stop_at_step` of that schedule (a job slice
  on a preemptible machine; the next run resumes from the checkpoint)."""
  steps = config.trainer.train_steps
  if stop_at_step is not None:
    steps = min(steps, stop_at_step)
  if controller.evaluator is not None:
    controller.train_and_evaluate(train_steps=steps, eval_steps=config.trainer.eval_steps,
                                  eval_interval=config.trainer.eval_every_steps)
  else:
    controller.train(steps=steps)


def run_ict(config: ExperimentConfig, model_dir: str, strategy: tf.distribute.Strategy,
            stop_at_step: Optional[int] = None) -> dict:
  """ICT warm start; ends by exporting the retriever for pre-training to start from."""
  save_params(config, model_dir)
  tf_keras.utils.set_random_seed(config.trainer.seed)
  tokenizer = _tokenizer(config)
  with strategy.scope():
    retriever = factory.build_retriever(config)
    optimizer = build_optimizer(config.trainer)
    global_step = optimizer.iterations
  checkpoint, manager = _checkpoint(model_dir, config, global_step, model=retriever,
                                    optimizer=optimizer)
  manager.restore_or_initialize()
  start = int(global_step.numpy())
  batch = config.trainer.batch_size
  r = config.retriever

  def dataset_fn(pattern, start_batch, repeat=True):
    def fn(context):
      per_replica = context.get_per_replica_batch_size(batch)
      return ict_dataset(pattern, tokenizer, per_replica, r.query_seq_length,
                         r.block_seq_length, seed=config.trainer.seed,
                         shuffle_buffer=config.data.shuffle_buffer, repeat=repeat,
                         start_batch=start_batch)
    return fn

  trainer = StepTrainer(strategy, ict_step(retriever), ICT_METRICS, optimizer, dataset_fn(
      data_files.pattern(config.data, data_files.ICT), start))
  evaluator = None
  if config.data.eval_examples:
    evaluator = StepEvaluator(strategy, ict_step(retriever), ICT_METRICS,
                              dataset_fn(config.data.eval_examples, 0))
  progress = ProgressReporter(model_dir, global_step, config.trainer.train_steps, batch, "ict")
  controller = _controller(strategy, trainer, evaluator, global_step, manager, model_dir,
                           _steps_per_loop(config), config, [progress])
  _run_controller(controller, config, stop_at_step)
  step = int(global_step.numpy())
  paths = snapshots.export_retriever(model_dir, step, retriever, tokenizer, config)
  logging.info("ICT done at step %d; retriever exported to %s", step, paths)
  return dict(step=step, exports=paths, checkpoint=manager.latest_checkpoint)


def latest_checkpoint(path: str) -> str:
  """`path` if it is a checkpoint, else the newest one of a run (its model_dir or the
  model_dir's checkpoints/); FileNotFoundError naming `path` if there is none."""
  found = path
  if tf.io.gfile.isdir(path):
    found = (tf.train.latest_checkpoint(os.path.join(path, "checkpoints"))
             or tf.train.latest_checkpoint(path))
  if not found:
    raise FileNotFoundError(f"{path}: no checkpoint")
  return found


def restore_retriever(retriever, checkpoint_path: str):
  """The retriever of an ICT run (its model_dir or one checkpoint) into `retriever`."""
  path = latest_checkpoint(checkpoint_path)
  tf.train.Checkpoint(model=retriever).read(path).expect_partial()
  logging.info("Retriever restored from %s", path)
  return path


class IndexBuilderProcess:
  """`python -m beam.index_builder` as a child process owned by the trainer."""

  def __init__(self, model_dir: str, extra_args: Sequence[str] = ()):
    self.model_dir = model_dir
    log = open(os.path.join(model_dir, "index_builder.log"), "ab")  # pylint: disable=consider-using-with
    self.process = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, "-m", "beam.index_builder", "--model_dir", model_dir, *extra_args],
        stdout=log, stderr=subprocess.STDOUT)
    logging.info("Index builder started (pid %d), log in %s/index_builder.log",
                 self.process.pid, model_dir)

  def stop(self, timeout: float = 120.0):
    try:
      self.process.wait(timeout)
    except subprocess.TimeoutExpired:
      logging.warning("Index builder still running after %.0fs: terminating it", timeout)
      self.process.terminate()
      self.process.wait(30)


def run_pretrain(config: ExperimentConfig, model_dir: str, strategy: tf.distribute.Strategy,
                 start_index_builder: bool = False, builder_args: Sequence[str] = (),
                 stop_at_step: Optional[int] = None) -> dict:
  """REALM pre-training with an index refreshed asynchronously by the index builder."""
  save_params(config, model_dir)
  tf_keras.utils.set_random_seed(config.trainer.seed)
  snapshots.clear_training_done(model_dir)
  tokenizer = _tokenizer(config)
  with strategy.scope():
    model = factory.build_realm_pretrainer(config)
    optimizer = build_optimizer(config.trainer)
    global_step = optimizer.iterations
  checkpoint, manager = _checkpoint(model_dir, config, global_step, model=model,
                                    optimizer=optimizer)
  if manager.latest_checkpoint:
    manager.restore_or_initialize()
  elif config.pretrain.retriever_checkpoint:
    restore_retriever(model.retriever, config.pretrain.retriever_checkpoint)
  start = int(global_step.numpy())

  exporter = snapshots.SnapshotExporter(
      model_dir, model.retriever, lambda: factory.build_retriever(config), tokenizer, config)
  if snapshots.latest_snapshot_step(model_dir) is None:
    # The first index needs a snapshot to embed. A resumed run keeps the snapshots and
    # index it had, so resuming does not change what the next steps retrieve.
    exporter.snapshot(start, wait=True)

  builder = IndexBuilderProcess(model_dir, builder_args) if start_index_builder else None
  store = BlockStore.from_tfrecords(data_files.pattern(config.data, data_files.BLOCKS))
  retriever = CandidateRetriever(
      store, snapshots.index_dir(model_dir, config.index.index_dir),
      snapshots.query_encoder_dir(model_dir),
      num_retrieved=config.pretrain.num_candidates - int(config.pretrain.include_null_document),
      exclusion_margin=config.pretrain.exclusion_margin, backend=config.index.backend,
      rescore=config.index.rescore, poll_seconds=config.pretrain.index_poll_seconds)
  try:
    retriever.start(timeout=config.pretrain.first_index_timeout_seconds)
    batch = config.trainer.batch_size

    def dataset_fn(pattern, start_batch):
      def fn(context):
        return pretraining_dataset(pattern, tokenizer, retriever, config,
                                   context.get_per_replica_batch_size(batch),
                                   seed=config.trainer.seed, start_batch=start_batch)
      return fn

    def host_metrics() -> dict:
      stats = retriever.stats
      step = int(global_step.numpy())
      return dict(index_version=float(stats.index_version),
                  index_staleness_steps=float(step - stats.index_encoder_step),
                  index_staleness_seconds=float(time.time() - stats.index_snapshot_time),
                  query_encoder_staleness_steps=float(step - stats.query_encoder_step),
                  index_refreshes=float(retriever.index.num_swaps - 1),
                  trivial_blocks_dropped=float(stats.trivial_dropped))

    trainer = StepTrainer(strategy, pretrain_step(model), PRETRAIN_METRICS, optimizer,
                          dataset_fn(data_files.pattern(config.data, data_files.PRETRAINING),
                                     start),
                          host_metrics=host_metrics)
    evaluator = None
    if config.data.eval_examples:
      evaluator = StepEvaluator(strategy, pretrain_step(model), PRETRAIN_METRICS,
                                dataset_fn(config.data.eval_examples, 0))
    refresh = config.pretrain.refresh_every_steps

    def snapshot_action(_):
      step = int(global_step.numpy())
      if refresh > 0 and step % refresh == 0 and step < config.trainer.train_steps:
        exporter.snapshot(step)

    progress = ProgressReporter(model_dir, global_step, config.trainer.train_steps, batch,
                                "pretrain")
    controller = _controller(strategy, trainer, evaluator, global_step, manager, model_dir,
                             _steps_per_loop(config, refresh), config,
                             [snapshot_action, progress])
    _run_controller(controller, config, stop_at_step)
    exporter.wait()
    step = int(global_step.numpy())
    return dict(step=step, checkpoint=manager.latest_checkpoint,
                snapshots_exported=list(exporter.exported),
                snapshots_skipped=list(exporter.skipped), snapshot_errors=exporter.errors,
                index_refreshes=retriever.index.num_swaps - 1)
  finally:
    retriever.stop()
    snapshots.mark_training_done(model_dir, int(global_step.numpy()))
    if builder is not None:
      builder.stop()
