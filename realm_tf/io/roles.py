"""Who does the host-side work of a job, and how its processes agree: the one place that
decides.

A multi-worker job (MultiWorkerMirroredStrategy, `TF_CONFIG`) runs the same program in every
process. The steps are collective, but everything a process does on the host would happen
N times: params.yaml, metrics.jsonl, summaries, retriever snapshots and the index builder
child, TRAINING_DONE, evaluation files, exports. `HostRole` says whether this process is the
one that writes: TensorFlow's own answer, `strategy.extended.should_checkpoint`, which is
True on the `chief` task (or worker 0 when the cluster has no chief), and always True for
one-process strategies. On Cloud TPU one Python client drives every host of the slice (the
TPU workers run TensorFlow servers, not this program), so it is the chief there too.

What must stay the same on every process (the committed index version a step searches, a
timeout that ends a wait) is agreed by a collective: `chief_value` gives every process the
chief's value and `any_process` whether any process raised a flag. Every process must call
them at the same point, the same number of times (between train loops, on the host), as it
does the steps themselves. With one process they are plain returns.
"""
import logging
from typing import Optional

import tensorflow as tf


def _num_processes(strategy: tf.distribute.Strategy) -> int:
  """Processes that run this program: the chief and workers of a multi-worker cluster; one
  for every other strategy (TPUStrategy's hosts run TF servers driven by one client)."""
  if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
    return 1
  resolver = strategy.cluster_resolver
  spec = resolver.cluster_spec() if resolver is not None else None
  if spec is None or not spec.jobs:
    return 1
  return sum(spec.num_tasks(job) for job in spec.jobs if job in ("chief", "worker"))


class HostRole:
  """This process's part in its job (see the module docstring)."""

  def __init__(self, strategy: Optional[tf.distribute.Strategy] = None):
    self.strategy = strategy or tf.distribute.get_strategy()
    self.num_processes = _num_processes(self.strategy)
    self.is_chief = bool(self.strategy.extended.should_checkpoint)
    resolver = getattr(self.strategy, "cluster_resolver", None)
    self.task = (f"{resolver.task_type}:{resolver.task_id}"
                 if self.num_processes > 1 and resolver is not None else "")

  @property
  def multi_process(self) -> bool:
    """Whether the job has more than one process (multi-worker, TPU pod hosts)."""
    return self.num_processes > 1

  def describe(self) -> str:
    """This process's part, for log lines ('the only process', '<task> of N processes,
    chief ...')."""
    if not self.multi_process:
      return "the only process"
    return (f"{self.task} of {self.num_processes} processes, "
            f"{'chief (writes host-side files)' if self.is_chief else 'non-chief'}")

  def _all_reduce_sum(self, values: list[int]) -> list[int]:
    """Σ over every replica of every process of this process's `values` (int64): one
    all-reduce (tf.distribute reduces by SUM or MEAN only)."""
    mine = tf.constant(values, tf.int64)
    per_replica = self.strategy.experimental_distribute_values_from_function(lambda _: mine)
    total = self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
    return [int(v) for v in total.numpy()]

  def chief_value(self, value: int) -> int:
    """The chief's `value`, on every process (a collective when there are several)."""
    if not self.multi_process:
      return int(value)
    # Each replica of the chief contributes (value, 1), the others (0, 0): the quotient of
    # the sums is the chief's value, exactly, whatever the replicas per process.
    summed, chief_replicas = self._all_reduce_sum(
        [int(value), 1] if self.is_chief else [0, 0])
    return summed // max(chief_replicas, 1)

  def any_process(self, flag: bool) -> bool:
    """True on every process if `flag` is True on any (a collective when there are
    several)."""
    if not self.multi_process:
      return bool(flag)
    return self._all_reduce_sum([int(bool(flag))])[0] > 0

  def barrier(self, what: str) -> None:
    """Every process waits here until all have arrived (e.g. the chief has set a damaged
    checkpoint aside before any process reads the newest one)."""
    if self.multi_process:
      self.any_process(False)
      logging.info("Barrier passed: %s", what)


__all__ = ["HostRole"]
