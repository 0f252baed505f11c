"""Server-side batching: concurrent Predict requests merged along dimension 0.

Written here because TF Serving's batcher (SharedBatchScheduler / BatchingSession) is C++
compiled into tensorflow_model_server and is in no Python package; tf.raw_ops.BatchFunction
would need the batching baked into each exported graph. The semantics follow TF Serving's
BatchingParameters:

  max_batch_size        a batch never holds more rows (a larger request is refused)
  batch_timeout_micros  an open batch waits at most this long for more requests
  max_enqueued_batches  batches waiting per queue; past it, RESOURCE_EXHAUSTED
  num_batch_threads     worker threads shared by all queues
  allowed_batch_sizes   a merged batch is padded up to the next allowed size

One queue per (model version, signature). A batch only merges requests whose inputs have
the same non-batch shapes (pad_variable_length_inputs is not supported). A batch is run
when it is full, when a newer batch has started behind it, or when its first request has
waited batch_timeout_micros; the oldest ready batch goes first.
"""
import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from typing import Optional

import grpc
import numpy as np

from serving import errors
from serving import metrics as metrics_lib
from serving.config import BatchingOptions
from serving.limits import Deadline
from serving.servable import ServableVersion, Signature

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Task:
  inputs: dict  # name → [size, ...] ndarray
  size: int
  deadline: Deadline
  future: concurrent.futures.Future
  enqueued: float  # time.monotonic() when it entered the queue


@dataclasses.dataclass
class _Batch:
  shape_key: tuple
  created: float
  tasks: list = dataclasses.field(default_factory=list)
  size: int = 0
  closed: bool = False


@dataclasses.dataclass
class _Queue:
  servable: ServableVersion
  signature: Signature
  batches: collections.deque = dataclasses.field(default_factory=collections.deque)


def _shape_key(inputs: dict) -> tuple:
  return tuple(sorted((name, array.shape[1:], array.dtype.str) for name, array in
                      inputs.items()))


class BatchScheduler:
  """Shared batch threads over per-(version, signature) queues."""

  def __init__(self, options: BatchingOptions,
               metrics: Optional[metrics_lib.ServingMetrics] = None):
    """Args:
      options: the batching parameters.
      metrics: where queue waits, batch sizes and batches run are counted (and the queue
        depth is exposed); a registry of its own when not given.
    """
    self.options = options
    self.metrics = metrics or metrics_lib.ServingMetrics()
    self.metrics.watch_batching_queue(lambda: self.enqueued_batches)
    self._timeout = options.batch_timeout_micros / 1e6
    self._cond = threading.Condition()
    self._queues = {}  # (servable, signature name) → _Queue
    self._stopped = False
    self.largest_batch = 0
    self._threads = [threading.Thread(target=self._work, daemon=True,
                                      name=f"{options.thread_pool_name}-{i}")
                     for i in range(options.num_batch_threads)]
    for thread in self._threads:
      thread.start()

  def stop(self) -> None:
    with self._cond:
      self._stopped = True
      self._cond.notify_all()
    for thread in self._threads:
      thread.join()

  @property
  def batches_run(self) -> int:
    """Batches run so far (the metrics' wrapped_run_count)."""
    return self.metrics.batches_run()

  @property
  def enqueued_batches(self) -> int:
    """Batches waiting for a batch thread, over every queue: how far behind the batch
    threads are, the figure max_enqueued_batches bounds per queue (for a status line, and
    for tests to know a request is queued without guessing from the clock)."""
    with self._cond:
      return sum(len(queue.batches) for queue in self._queues.values())

  def submit(self, servable: ServableVersion, signature: Signature, inputs: dict, size: int,
             deadline: Deadline) -> concurrent.futures.Future:
    """Enqueues one validated request of `size` rows; its future gets its own outputs."""
    if size > self.options.max_batch_size:
      raise errors.invalid_argument(
          f"a batch of {size} is larger than the batching max_batch_size "
          f"{self.options.max_batch_size}")
    task = _Task(inputs, size, deadline, concurrent.futures.Future(), time.monotonic())
    key = (servable, signature.name)
    shape_key = _shape_key(inputs)
    with self._cond:
      if self._stopped:
        raise errors.ServingError(grpc.StatusCode.UNAVAILABLE, "the server is stopping")
      queue = self._queues.get(key)
      if queue is None:
        queue = self._queues[key] = _Queue(servable, signature)
      last = queue.batches[-1] if queue.batches else None
      if (last is None or last.closed or last.shape_key != shape_key
          or last.size + size > self.options.max_batch_size):
        if len(queue.batches) >= self.options.max_enqueued_batches:
          raise errors.resource_exhausted(
              f"the batching queue of model {servable.model_name!r} version "
              f"{servable.version} signature {signature.name!r} is full "
              f"(max_enqueued_batches={self.options.max_enqueued_batches})")
        if last is not None:
          last.closed = True
        last = _Batch(shape_key, time.monotonic())
        queue.batches.append(last)
      last.tasks.append(task)
      last.size += size
      if last.size >= self.options.max_batch_size:
        last.closed = True
      self._cond.notify()
    self.metrics.batch_request_queued(size)
    return task.future

  # ------------------------------------------------------------------ workers

  def _next_ready(self):
    """(queue, batch) of the oldest batch that may run now, or (None, seconds to wait)."""
    now, best, wait = time.monotonic(), None, None
    for key, queue in self._queues.items():
      if not queue.batches:
        continue
      batch = queue.batches[0]
      ready_at = now if (batch.closed or len(queue.batches) > 1) else (
          batch.created + self._timeout)
      if ready_at <= now:
        if best is None or batch.created < best[1].created:
          best = (key, batch)
      else:
        wait = min(wait, ready_at - now) if wait is not None else ready_at - now
    if best is None:
      return None, wait
    key, batch = best
    queue = self._queues[key]
    queue.batches.popleft()
    if not queue.batches:
      del self._queues[key]  # no queue outlives its requests (versions get retired)
    return queue, batch

  def _work(self) -> None:
    while True:
      with self._cond:
        while True:
          if self._stopped:
            return
          queue, batch_or_wait = self._next_ready()
          if queue is not None:
            self._cond.notify()  # another batch may be ready for another thread
            break
          self._cond.wait(batch_or_wait)
      try:
        self._run(queue, batch_or_wait)
      except Exception as e:  # pylint: disable=broad-except
        # A batch thread must never die: fail this batch's requests and carry on.
        log.exception("batch of model %r failed", queue.servable.model_name)
        error = errors.ServingError(grpc.StatusCode.INTERNAL, f"batching failed: {e}")
        for task in batch_or_wait.tasks:
          if not task.future.done():
            task.future.set_exception(error)

  def _run(self, queue: _Queue, batch: _Batch) -> None:
    tasks = []
    for task in batch.tasks:
      if not task.future.set_running_or_notify_cancel():
        continue  # its caller gave up (deadline) while it waited
      if task.deadline.expired():
        task.future.set_exception(task.deadline.error())
        continue
      tasks.append(task)
    if not tasks:
      return
    total = sum(task.size for task in tasks)
    padded = next((s for s in self.options.allowed_batch_sizes if s >= total), total)
    started = time.monotonic()
    self.metrics.batch_run(self.options.thread_pool_name,
                           [started - task.enqueued for task in tasks], total, padded)
    names = list(tasks[0].inputs)
    merged = {}
    for name in names:
      merged[name] = np.concatenate([task.inputs[name] for task in tasks], axis=0)  # [total, ...]
      if padded > total:  # repeat the last row up to an allowed size: [padded, ...]
        merged[name] = np.concatenate(
            [merged[name], np.repeat(merged[name][-1:], padded - total, axis=0)], axis=0)
    try:
      outputs = queue.signature.run(merged)
      for name, value in outputs.items():
        if value.ndim == 0 or value.shape[0] != padded:
          raise errors.ServingError(
              grpc.StatusCode.INTERNAL,
              f"output {name!r} has shape {list(value.shape)}; a batch of {padded} rows "
              f"needs dimension 0 to be {padded} to split it back")
    except Exception as e:  # pylint: disable=broad-except
      error = e if isinstance(e, errors.ServingError) else errors.from_tf_error(e)
      for task in tasks:
        task.future.set_exception(error)
      return
    with self._cond:
      self.largest_batch = max(self.largest_batch, total)
    start = 0
    for task in tasks:
      end = start + task.size
      task.future.set_result({name: value[start:end] for name, value in outputs.items()})
      start = end
