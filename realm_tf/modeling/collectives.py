"""Cross-replica all-gather and all-reduce inside a replica function, on any strategy.

Why not `ReplicaContext.all_gather` / `all_reduce` alone: with one replica per process
(MultiWorkerMirroredStrategy on CPU hosts, or one GPU per worker), TensorFlow 2.20 hands
the collective the replica's plain tensor as its own destination, and inside a tf.function
that tensor carries no device, so the call fails with "destinations can not be empty".
Pinning the value to the replica's device first (one identity op) gives it one; with
several local replicas the values are already per-replica and nothing changes.
"""
import tensorflow as tf


def _placed(context: tf.distribute.ReplicaContext, value: tf.Tensor) -> tf.Tensor:
  value = tf.convert_to_tensor(value)
  if value.device or context.num_replicas_in_sync == 1:
    return value  # placed already; or nothing to exchange (the default strategy, say)
  devices = getattr(context.strategy.extended, "worker_devices", ())
  if len(devices) != 1:
    return value
  with tf.device(devices[0]):
    return tf.identity(value)


def all_gather(context: tf.distribute.ReplicaContext, value: tf.Tensor,
               axis: int = 0) -> tf.Tensor:
  """Every replica's `value`, concatenated along `axis` in replica order."""
  return context.all_gather(_placed(context, value), axis=axis)


def all_reduce(context: tf.distribute.ReplicaContext, reduce_op: tf.distribute.ReduceOp,
               value):
  """`value` (a tensor or a nest of tensors) reduced over every replica."""
  return context.all_reduce(
      reduce_op, tf.nest.map_structure(lambda v: _placed(context, v), value))
