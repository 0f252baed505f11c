"""Whether a training run is making progress, as the processes that follow it see it.

The side-car evaluator and the index builders take part in no collective of the training
job, so nothing stops them when the trainer hangs or dies: they would wait for the next
checkpoint or snapshot for as long as their own rules let them. `TrainerWatch` looks at
what the trainer publishes, its newest checkpoint and its newest retriever snapshot; either
one changing is progress, and TRAINING_DONE ends the question. After `stall_seconds`
without progress it logs a warning, and its `status()` says the trainer is stalled; the
warning is repeated every `stall_seconds` while that lasts, and one line says when progress
resumes. It never ends its process: a slow trainer is not a dead one, and each watcher's own
rule says when it stops (the evaluator's timeout, TRAINING_DONE, the builder's parent).
"""
import logging
import os
import time
from typing import Callable, Optional

import tensorflow as tf

from realm_tf.io import layout, versioned

# The most often the watch reads the run directory (a listing on an object store): at
# least this often, and ten times per stall_seconds.
MAX_LOOK_SECONDS = 30.0


class TrainerWatch:
  """Progress of the trainer of the run in `model_dir`, as seen from another process.

  Args:
    model_dir: the training run's directory.
    stall_seconds: how long without a new checkpoint or snapshot counts as stalled
      (runtime.progress_stall_seconds).
    watcher: who watches, for the log lines (e.g. "side-car evaluator continuous_eval").
    clock: seconds, monotonic (a fake one in tests).
  """

  def __init__(self, model_dir: str, stall_seconds: float, watcher: str,
               clock: Callable[[], float] = time.monotonic):
    if stall_seconds <= 0:
      raise ValueError(f"stall_seconds must be positive, got {stall_seconds}")
    self.model_dir = model_dir
    self.stall_seconds = float(stall_seconds)
    self.watcher = watcher
    self._clock = clock
    self._look_seconds = min(MAX_LOOK_SECONDS, self.stall_seconds / 10)
    self._mark: Optional[tuple] = None
    self._since = clock()  # when the trainer was last seen to make progress
    self._looked: Optional[float] = None
    self._warned: Optional[float] = None
    self.stalled = False
    self.done = False

  def _progress_mark(self) -> tuple:
    checkpoint = tf.train.latest_checkpoint(layout.checkpoint_dir(self.model_dir))
    snapshot = versioned.latest_version(layout.block_encoder_dir(self.model_dir))
    return (os.path.basename(checkpoint) if checkpoint else None,
            snapshot.version if snapshot is not None else None)

  def seconds_without_progress(self) -> float:
    return self._clock() - self._since

  def check(self, force: bool = False) -> bool:
    """Looks at the run (at most every few seconds, unless `force`) and logs a change; True
    while the trainer is stalled."""
    now = self._clock()
    if self.done or (not force and self._looked is not None
                     and now - self._looked < self._look_seconds):
      return self.stalled
    self._looked = now
    mark = self._progress_mark()
    if mark != self._mark:
      if self.stalled:
        logging.info("%s: the trainer of %s is making progress again (checkpoint %s, "
                     "snapshot %s) after %.0fs without", self.watcher, self.model_dir,
                     *mark, now - self._since)
      self._mark, self._since, self.stalled, self._warned = mark, now, False, None
      return False
    if layout.training_done(self.model_dir):
      self.done, self.stalled = True, False
      return False
    idle = now - self._since
    if idle >= self.stall_seconds:
      self.stalled = True
      if self._warned is None or now - self._warned >= self.stall_seconds:
        self._warned = now
        logging.warning(
            "%s: the trainer of %s has published no new checkpoint or retriever snapshot "
            "for %.0fs (runtime.progress_stall_seconds %.0f; newest checkpoint %s, snapshot "
            "%s): it is stalled, stuck or gone. A multi-worker job stops itself after "
            "runtime.collective_timeout_seconds; a single trainer process does not: check "
            "it. Still waiting.", self.watcher, self.model_dir, idle, self.stall_seconds,
            *self._mark)
    return self.stalled

  def status(self) -> dict:
    """What the watch knows, for the watcher's status: trainer_stalled, the newest
    checkpoint and snapshot seen, seconds_without_progress."""
    checkpoint, snapshot = self._mark if self._mark is not None else (None, None)
    return dict(trainer_stalled=self.stalled, training_done=self.done,
                newest_checkpoint=checkpoint, newest_snapshot=snapshot,
                seconds_without_progress=round(self.seconds_without_progress(), 1),
                stall_seconds=self.stall_seconds)


__all__ = ["TrainerWatch"]
