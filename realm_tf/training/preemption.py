"""SIGTERM (a preemption notice) makes a single-host trainer save a checkpoint, then exit.

tf-models' runner adds orbit's SaveCheckpointIfPreempted action (tf.distribute's
PreemptionCheckpointHandler) only when the strategy has a cluster resolver (TPU pods,
multi-worker). A trainer on one host (the default strategy or MirroredStrategy, e.g. on a
spot VM, a Kubernetes pod or a batch scheduler, which all send SIGTERM first) would die on
the signal and lose every step since its last periodic checkpoint.

`PreemptionWatch` adds the same action with no cluster resolver, which is TF's own local
mode: the handler notes the signal; after the train loop under way and one more (TF's
protocol: the step to save at is agreed one loop ahead, which keeps workers in step) it
saves a checkpoint of that step through the run's CheckpointManager and exits with TF's
restart code, 42, which a supervisor can take as "resume me". Nothing is written by hand:
the watch only decides when TF's handler is armed (while `train` runs, so a process that
builds runs for other purposes, such as a test session, keeps its own SIGTERM handling).

TF's handler does nothing on GCE CPU-only VMs (there it watches GCE maintenance events on
GPU/TPU VMs only); such runs keep the periodic checkpoints.
"""
import contextlib
import logging
import signal
import threading
from typing import Iterator

import orbit
import tensorflow as tf

RESTART_EXIT_CODE = 42  # TF's exit code after a preemption save outside GCP and Borg


class PreemptionWatch:
  """orbit's SaveCheckpointIfPreempted for strategies without a cluster resolver."""

  def __init__(self, strategy: tf.distribute.Strategy,
               checkpoint_manager: tf.train.CheckpointManager, global_step: tf.Variable,
               enabled: bool = True):
    self.action = None
    self._tf_handler = None
    if not enabled or getattr(strategy, "cluster_resolver", None) is not None:
      return  # off by config, or tf-models' own action handles it
    if threading.current_thread() is not threading.main_thread():
      logging.warning("The run is built off the main thread: SIGTERM will not save a "
                      "checkpoint (signal handlers belong to the main thread)")
      return
    previous = signal.getsignal(signal.SIGTERM)
    # The handler also restores the newest checkpoint (or calls the manager's init_fn);
    # the controller does the same right after, reading the same files.
    self.action = orbit.actions.SaveCheckpointIfPreempted(
        None, checkpoint_manager, global_step, keep_running_after_save=False)
    self._tf_handler = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)

  def __call__(self, output) -> None:
    """A train action: saves and exits once a SIGTERM has arrived (see module docstring)."""
    if self.action is not None:
      self.action(output)

  @contextlib.contextmanager
  def armed(self) -> Iterator[None]:
    """SIGTERM is TF's preemption notice inside this block (the train loops)."""
    if self.action is None:
      yield
      return
    previous = signal.signal(signal.SIGTERM, self._tf_handler)
    try:
      yield
    finally:
      signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
