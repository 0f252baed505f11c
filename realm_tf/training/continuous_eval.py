"""A side-car evaluator: follows a training run's checkpoints and evaluates each new one.

`python -m realm_tf.train --mode continuous_eval` (tf-models' mode of the same name): one
more process, on another machine if need be, sharing the trainer's model_dir, so that the
accelerators that train never stop to evaluate.

  trainer ──► checkpoints/ckpt-<step> ──► evaluator: one Run(train=False), built once;
                                            each new checkpoint restored into it, then the
                                            task's validation
                                          ──► eval/<name>.jsonl  one JSON line per checkpoint
                                              eval/<name>/       TensorBoard summaries
                                              eval/<name>-<step>.json (Open-QA: EM, recall@k
                                                                  and the predictions)

It writes nothing of the trainer's: not params.yaml, metrics.jsonl, checkpoints,
TRAINING_DONE or retriever snapshots, and it starts no index builder. A task that retrieves
loads the run's newest committed index before each evaluation and waits for the first one
(RealmTask.side_car). The lines and summaries are its own: two processes appending to one
object on a store would race, and tf-models' validation/ is the trainer's.

Which checkpoints: the newest one each time it looks; an evaluator slower than the trainer
skips those in between (as tf-models' does). When it stops: `finished` (it has evaluated
the checkpoint at trainer.train_steps, or the one at the step TRAINING_DONE records), or
after `timeout` seconds without a new checkpoint (a trainer that died or was stopped early).
Before that, after runtime.progress_stall_seconds without a new checkpoint or snapshot, it
logs that the trainer is stalled (realm_tf.io.trainer_watch) and says so in its result, and
waits on.
"""
import logging
import os
import time
from typing import Callable, Optional

import tensorflow as tf

from realm_tf.configs.experiment import ExperimentConfig
from realm_tf.io import layout
from realm_tf.io.trainer_watch import TrainerWatch
from realm_tf.training import train_lib

POLL_SECONDS = 1.0  # as tf.train.checkpoints_iterator


def finished(evaluated_step: Optional[int], train_steps: int,
             done_step: Optional[int]) -> bool:
  """Whether the run's final checkpoint has been evaluated: the one at `train_steps`, or the
  one at `done_step` (the step TRAINING_DONE records: the trainer finished a schedule other
  than this config's). None: nothing evaluated yet, or no marker."""
  if evaluated_step is None:
    return False
  return evaluated_step >= train_steps or (done_step is not None
                                           and evaluated_step >= done_step)


class NoNewCheckpoint(TimeoutError):
  """No checkpoint newer than the last evaluated one within the timeout."""


def next_checkpoint(directory: str, last: Optional[str], timeout: float,
                    stop: Callable[[], bool], poll_seconds: float = POLL_SECONDS,
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep,
                    while_waiting: Callable[[], object] = lambda: None) -> Optional[str]:
  """The newest checkpoint in `directory` if it is not `last`; else waits for one, calling
  `while_waiting()` at every poll. None when `stop()` says the run is over first;
  NoNewCheckpoint after `timeout` seconds."""
  deadline = clock() + timeout
  while True:
    latest = tf.train.latest_checkpoint(directory)
    if latest is not None and latest != last:
      return latest
    if stop():
      return None
    if clock() >= deadline:
      raise NoNewCheckpoint(f"{directory}: no checkpoint after {last or 'none'} within "
                            f"{timeout:.0f}s")
    while_waiting()
    sleep(poll_seconds)


class SideCarEvaluator:
  """The evaluation Run of a training run, built once; `evaluate(path)` restores a
  checkpoint into it and runs the task's validation (see the module docstring).

  It writes only its own files: eval/<name>.jsonl, summaries under eval/<name>/ and the
  task's eval/<name>-<step> files; it follows the run's committed indexes read-only.

  Args:
    experiment: the training run's ExperimentConfig.
    model_dir: the training run's directory.
    strategy: the distribution strategy (default: the current one).
    name: the evaluator's name (its files' names).

  Raises:
    ValueError: validation_data.input_path is empty.
  """

  def __init__(self, experiment: ExperimentConfig, model_dir: str,
               strategy: Optional[tf.distribute.Strategy] = None,
               name: str = "continuous_eval"):
    experiment = train_lib.evaluation_config(experiment).replace(
        trainer=dict(validation_summary_subdir=layout.evaluator_summary_subdir(name)))
    self.model_dir = model_dir
    self.name = name
    self.run = train_lib.Run(experiment, model_dir, strategy, train=False, evaluate=True)
    if not self.run.evaluate_enabled:
      raise ValueError("nothing to evaluate: task validation_data.input_path is empty")
    # tf-models' eval actions save checkpoints (EMA weights into model_dir): not ours to write.
    self.run.runner.controller.eval_actions = ()
    task = self.run.task
    task.side_car = True
    task.evaluation_name = name
    task.evaluation_log = layout.evaluator_log_path(model_dir, name)
    self.steps = -1 if task.evaluates_whole_set else experiment.trainer.validation_steps

  @property
  def log_path(self) -> str:
    """<model_dir>/eval/<name>.jsonl: one JSON line per checkpoint evaluated."""
    return self.run.task.evaluation_log

  @property
  def summary_dir(self) -> str:
    """<model_dir>/eval/<name>: the evaluator's TensorBoard summaries."""
    return os.path.join(self.model_dir, layout.evaluator_summary_subdir(self.name))

  def evaluate(self, path: str) -> dict:
    """The task's metrics at checkpoint `path` (one line of log_path, summaries at its
    step).

    Args:
      path: a checkpoint of the run.

    Returns:
      The metrics plus step, checkpoint and eval_seconds.

    Raises:
      tf.errors.NotFoundError: the checkpoint was deleted before it was read.
    """
    start = time.time()
    train_lib.restore_model(self.run, path)
    metrics = self.run.evaluate(self.steps)
    metrics = dict(metrics, step=self.run.global_step, checkpoint=path,
                   eval_seconds=time.time() - start)
    logging.info("Side-car %s: step %d evaluated in %.1fs: %s", self.name, metrics["step"],
                 metrics["eval_seconds"], metrics)
    return metrics


def evaluate_continuously(experiment: ExperimentConfig, model_dir: str,
                          strategy: Optional[tf.distribute.Strategy] = None,
                          name: str = "continuous_eval", timeout: Optional[float] = None,
                          poll_seconds: float = POLL_SECONDS) -> dict:
  """`--mode continuous_eval`: evaluates each new checkpoint of the run in `model_dir` until
  the final one (finished) or `timeout` seconds without a new one (default
  trainer.continuous_eval_timeout, tf-models' field).

  Args:
    experiment: the training run's ExperimentConfig.
    model_dir: the training run's directory.
    strategy: the distribution strategy (default: the current one).
    name: the evaluator's name (see SideCarEvaluator).
    timeout: seconds to wait for a new checkpoint.
    poll_seconds: how often to look for one.

  Returns:
    {log, summaries, evaluated_steps, timed_out (with reason), finished, last (the last
    metrics), trainer (TrainerWatch.status(): whether the trainer is stalled)}.
  """
  evaluator = SideCarEvaluator(experiment, model_dir, strategy, name)
  watch = TrainerWatch(model_dir, experiment.runtime.progress_stall_seconds,
                       f"side-car evaluator {name}")
  timeout = experiment.trainer.continuous_eval_timeout if timeout is None else timeout
  train_steps = experiment.trainer.train_steps
  directory = layout.checkpoint_dir(model_dir)
  evaluated: list[int] = []
  last_path, last_step, last_metrics = None, None, {}

  def done() -> bool:
    return finished(last_step, train_steps, layout.training_done_step(model_dir))

  result = dict(log=evaluator.log_path, summaries=evaluator.summary_dir,
                evaluated_steps=evaluated, timed_out=False)
  while not done():
    try:
      path = next_checkpoint(directory, last_path, timeout, done, poll_seconds,
                             while_waiting=watch.check)
    except NoNewCheckpoint as e:
      logging.error("Side-car %s stops: %s (last evaluated step %s of %d)", name, e,
                    last_step, train_steps)
      result.update(timed_out=True, reason=str(e))
      break
    if path is None:
      break
    try:
      last_metrics = evaluator.evaluate(path)
    except tf.errors.NotFoundError as e:  # removed by the trainer's max_to_keep meanwhile
      logging.warning("Checkpoint %s went away before it was read (%s): the next one",
                      path, e)
      last_path = path
      continue
    last_path, last_step = path, last_metrics["step"]
    evaluated.append(last_step)
  watch.check(force=True)
  result.update(finished=done(), last=last_metrics, trainer=watch.status())
  return result


def evaluate_latest(experiment: ExperimentConfig, model_dir: str,
                    strategy: Optional[tf.distribute.Strategy] = None,
                    name: str = "eval") -> dict:
  """`--mode eval`: the run's newest checkpoint, once, written as a side-car writes.

  Returns:
    SideCarEvaluator.evaluate's metrics plus log and summaries.

  Raises:
    FileNotFoundError: the run has no checkpoint.
  """
  path = layout.latest_checkpoint(model_dir)
  evaluator = SideCarEvaluator(experiment, model_dir, strategy, name)
  return dict(evaluator.evaluate(path), log=evaluator.log_path,
              summaries=evaluator.summary_dir)


__all__ = ["NoNewCheckpoint", "SideCarEvaluator", "evaluate_continuously", "evaluate_latest",
           "finished", "next_checkpoint"]
