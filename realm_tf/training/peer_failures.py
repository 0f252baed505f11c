"""A multi-worker job that loses or stalls on a process: the trainer's side.

Two ways a job learns that a process is gone or stuck (docs/scale_out.md, "When a worker
dies, hangs or is preempted", says what the operator sees in each case):

- TensorFlow raises in the step (a peer's connections closed, its heartbeats stopped, a
  collective timed out): the trainer names the peer (`describe_lost_peers`) in the one
  line it exits with (`lost_peer_line`), and tells its watchdog it did.
- Nothing raises (a peer stopped or starved while its runtime still heartbeats, or
  TensorFlow aborted or wedged on its error path): the watchdog, the trainer's parent
  process (realm_tf.training.watchdog), sees the heartbeat's progress stop and ends the
  job with the same kind of line. What the trainer feeds it is here: `introduce` shares
  the watchdogs' addresses through the coordination service, `counted` counts the batches
  an input pipeline delivers (a starved process delivers fewer); the checkpoint manager
  (training.train_lib) reports each save's step; realm_tf.io.heartbeat carries it all.
"""
import logging
import os
import re
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
# Internal: TensorFlow 2.20 has no public API for a peer's health check or the
# coordination service's key-value store.
from tensorflow.python.eager import context

from realm_tf.configs.experiment import ExperimentConfig, RuntimeConfig
from realm_tf.io import heartbeat, layout
from realm_tf.io.roles import HostRole
from realm_tf.training.watchdog import Peer, peers, stop_line

# A task as TensorFlow's errors name it: /job:worker/replica:0/task:1 or /job:worker/task:1.
_TASK = re.compile(r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)")
PROBE_SECONDS = 5.0
_CAUSES = ("grpc_message", "connect", "unhealthy", "abort", "reset", "unavailable")

# Errors a multi-worker step raises when another process of the job is lost.
LOST_PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError,
                    tf.errors.DeadlineExceededError)


def named_peers(message: str, candidates: Sequence[Peer]) -> list:
  """The candidates an error message names (TensorFlow names the task it lost when the
  coordination service or a failed RPC knows it)."""
  named = {(m.group(1), int(m.group(2))) for m in _TASK.finditer(message)}
  return [p for p in candidates if (p.task_type, p.index) in named]


def _answers(peer: Peer, seconds: float) -> bool:
  try:
    context.context().check_collective_ops_peer_health(peer.device,
                                                       timeout_in_ms=int(seconds * 1000))
    return True
  except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
          tf.errors.FailedPreconditionError, tf.errors.AbortedError):
    return False


def describe_lost_peers(error: Exception, strategy: tf.distribute.Strategy,
                        runtime: RuntimeConfig,
                        probe_seconds: Optional[float] = PROBE_SECONDS) -> str:
  """Which peer a failed collective lost, and how that is known, in one clause for the
  process's last line: the task TensorFlow's error names; else those that do not answer a
  health check within probe_seconds (a stopped or dead process, or the coordination
  service's host); else, after a collective timeout, every peer (alive, but one of them
  never joined); else none (the error came from elsewhere, and says so). `probe_seconds`
  None asks no peer (every peer is named when the error names none)."""
  resolver = strategy.cluster_resolver
  others = peers(resolver.cluster_spec().as_dict(), resolver.task_type, resolver.task_id)
  message = str(error)
  timed_out = "timed out" in message and "ollective" in message
  if timed_out:
    waited = (f"a collective waited {runtime.collective_timeout_seconds:.0f}s "
              f"(runtime.collective_timeout_seconds)")
  elif "heartbeat" in message.lower():
    waited = "heartbeats stopped (runtime.heartbeat_timeout_seconds)"
  else:
    # The line of TensorFlow's page of gRPC detail that says what failed.
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    detail = next((line for line in lines if any(word in line.lower() for word in _CAUSES)),
                  lines[0] if lines else "")
    waited = f"{type(error).__name__}: {detail}"
  lost = named_peers(message, others)
  if lost:
    how = "named by TensorFlow"
  elif probe_seconds is None:
    lost, how = others, "one of them, not asked which"
  else:
    lost = [p for p in others if not _answers(p, probe_seconds)]
    how = f"no answer to a health check within {probe_seconds:.0f}s"
    if not lost and not timed_out:
      return f"no peer found lost, every one answers a health check ({waited})"
    if not lost:
      lost, how = others, "all answer a health check: one is alive but stuck"
  return f"{', '.join(map(str, lost))} lost ({how}; {waited})"


def lost_peer_line(error: Exception, strategy: tf.distribute.Strategy,
                   experiment: ExperimentConfig, model_dir: str,
                   probe_seconds: Optional[float] = PROBE_SECONDS) -> str:
  """The one line a multi-worker process exits with when a step failed for a lost peer:
  which peer (describe_lost_peers), and the relaunch that resumes the run. The watchdog is
  told that the line is written (it then writes none and only bounds the exit).

  Args:
    error: the step's error (one of LOST_PEER_ERRORS).
    strategy: the multi-worker strategy.
    experiment: the run's config (its runtime section's timeouts are named).
    model_dir: the run directory (its chief checkpoint is where the relaunch resumes).
    probe_seconds: health-check the peers for this long; None asks none.

  Returns:
    The line; '' when this process's watchdog has already ended the job with its own
    (its verdict came first, and this process ran on only for its stacks).
  """
  if heartbeat.current().verdict_written():
    return ""
  lost = describe_lost_peers(error, strategy, experiment.runtime, probe_seconds)
  line = stop_line(HostRole(strategy).describe(),
                   f"another process of the job is unreachable: {lost}",
                   layout.checkpoint_step(model_dir), layout.checkpoint_dir(model_dir))
  heartbeat.current().reported_line(line)
  return line


# ------------------------------------------------------------------- feeding the watchdog


def introduce(strategy: tf.distribute.Strategy, role: HostRole, runtime: RuntimeConfig,
              model_dir: str) -> None:
  """Shares this process's watchdog address with every peer through the coordination
  service's key-value store, reads theirs, and tells the watchdog what it watches.

  Every process of a multi-worker job sets its key (empty without a watchdog), so one
  started with --nowatchdog does not keep a supervised peer waiting; each supervised one
  then waits, at most runtime.collective_timeout_seconds, for every peer's key.
  """
  resolver = strategy.cluster_resolver
  cluster = resolver.cluster_spec().as_dict()
  me = Peer(resolver.task_type, resolver.task_id, cluster[resolver.task_type][resolver.task_id])
  beat = heartbeat.current()
  ctx = context.context()
  ctx.set_config_key_value(me.watchdog_key,
                           os.environ.get(heartbeat.WATCHDOG_ADDRESS_ENV, "")
                           if beat.enabled else "")
  if not beat.enabled:
    return
  timeout_ms = int(runtime.collective_timeout_seconds * 1000)
  others = {p.name: dict(address=p.address,
                         watchdog=ctx.get_config_key_value(p.watchdog_key, timeout_ms))
            for p in peers(cluster, me.task_type, me.index)}
  beat.checkpoint_seen(layout.checkpoint_step(model_dir))
  beat.describe_job(me.name, me.address, role.describe(), runtime.progress_stall_seconds,
                    runtime.collective_timeout_seconds, layout.checkpoint_dir(model_dir),
                    others)
  if runtime.progress_stall_seconds >= runtime.collective_timeout_seconds:
    logging.warning("runtime.progress_stall_seconds (%.0f) is not below "
                    "runtime.collective_timeout_seconds (%.0f): a stuck peer is found by "
                    "TensorFlow's collective timeout first", runtime.progress_stall_seconds,
                    runtime.collective_timeout_seconds)
  logging.info("Watched by a watchdog: the job ends if it makes no progress for %.0fs "
               "(runtime.progress_stall_seconds); peers' watchdogs %s",
               runtime.progress_stall_seconds, others)


def counted(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """`dataset` with each element counted in the heartbeat as it leaves the host pipeline
  (unchanged without a watchdog). A process starved by its input pipeline has delivered
  fewer batches than its peers, which already hold the batch of the step they wait in."""
  beat = heartbeat.current()
  if not beat.enabled:
    return dataset

  def tick():
    beat.batch()
    return np.int64(0)

  def count(*element):
    done = tf.numpy_function(tick, [], tf.int64, stateful=True)
    with tf.control_dependencies([done]):
      element = tf.nest.map_structure(tf.identity, element, expand_composites=True)
    return element[0] if len(element) == 1 else element

  return dataset.map(count)


__all__ = ["LOST_PEER_ERRORS", "counted", "describe_lost_peers",
           "introduce", "lost_peer_line", "named_peers"]
