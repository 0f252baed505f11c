"""Request tensors: decoded with a size cap and checked against the signature first.

The model never sees a malformed request: names, dtypes, ranks, static dimensions and the
batch dimension are checked against the signature's `structured_input_signature` before a
call, and every error names the input.
"""
from typing import Mapping

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2

from serving import errors

# Decoded inputs may exceed the message by the varint expansion of int64 values (1 byte on
# the wire, 8 in memory); anything larger is a "zip bomb" (a tiny proto claiming a huge
# shape and relying on TensorProto's fill-with-the-last-value rule).
DECODED_BYTES_PER_MESSAGE_BYTE = 8
_STRING_ELEMENT_BYTES = 8  # a numpy object pointer per string element


def _num_elements(proto: tensor_pb2.TensorProto, name: str) -> int:
  if proto.tensor_shape.unknown_rank:
    raise errors.invalid_argument(f"input {name!r}: the TensorProto has an unknown rank")
  count = 1
  for dim in proto.tensor_shape.dim:
    if dim.size < 0:
      raise errors.invalid_argument(f"input {name!r}: the TensorProto has a negative "
                                    f"dimension {dim.size}")
    count *= dim.size
  return count


def _decoded_bytes(proto: tensor_pb2.TensorProto, dtype: tf.DType, count: int) -> int:
  if dtype == tf.string:
    values = max(len(proto.string_val), 1)
    per_value = sum(len(s) for s in proto.string_val) / values
    return count * (_STRING_ELEMENT_BYTES + int(per_value))
  return count * dtype.size


def decode_inputs(protos: Mapping[str, tensor_pb2.TensorProto], max_decoded_bytes: int
                  ) -> dict:
  """{name: ndarray} from a PredictRequest's inputs; INVALID_ARGUMENT naming a bad one."""
  arrays, total = {}, 0
  for name, proto in protos.items():
    try:
      dtype = tf.dtypes.as_dtype(proto.dtype)
    except TypeError:
      raise errors.invalid_argument(
          f"input {name!r}: the TensorProto has an invalid dtype {proto.dtype}") from None
    # Reference dtypes (DT_*_REF) name graph edges, not values, and have no numpy type.
    if dtype in (tf.resource, tf.variant) or dtype.base_dtype != dtype or proto.dtype == 0:
      raise errors.invalid_argument(f"input {name!r}: dtype {dtype.name} cannot be sent")
    count = _num_elements(proto, name)
    total += _decoded_bytes(proto, dtype, count)
    if total > max_decoded_bytes:
      raise errors.invalid_argument(
          f"input {name!r}: decoding would take more than {max_decoded_bytes} bytes "
          f"(shape {[d.size for d in proto.tensor_shape.dim]}, dtype {dtype.name})")
    try:
      array = tf.make_ndarray(proto)
    except (ValueError, TypeError, IndexError, OverflowError) as e:  # e.g. -1 as uint8
      raise errors.invalid_argument(f"input {name!r}: malformed TensorProto: {e}") from None
    arrays[name] = array
  return arrays


def dtype_of(array: np.ndarray) -> tf.DType:
  if array.dtype == object or array.dtype.kind in ("S", "U"):
    return tf.string
  return tf.dtypes.as_dtype(array.dtype)


def validate_inputs(input_specs: Mapping[str, tf.TensorSpec], inputs: Mapping[str, np.ndarray],
                    max_batch_size: int, what: str = "signature") -> int:
  """Checks `inputs` against the signature; returns the batch size (0 if none is batched).

  Batched inputs are those whose signature shape starts with None: they must agree on
  dimension 0, which must be in [1, max_batch_size].
  """
  unknown = sorted(set(inputs) - set(input_specs))
  if unknown:
    raise errors.invalid_argument(
        f"input {unknown[0]!r} is not an input of {what}; expected {sorted(input_specs)}")
  missing = sorted(set(input_specs) - set(inputs))
  if missing:
    raise errors.invalid_argument(
        f"input {missing[0]!r} is missing; {what} expects {sorted(input_specs)}")
  batch_size, batch_input = 0, None
  for name, spec in sorted(input_specs.items()):
    array = inputs[name]
    got = dtype_of(array)
    if got != spec.dtype:
      raise errors.invalid_argument(
          f"input {name!r} has dtype {got.name}; {what} expects {spec.dtype.name}")
    if spec.shape.rank is None:
      continue
    if array.ndim != spec.shape.rank:
      raise errors.invalid_argument(
          f"input {name!r} has shape {list(array.shape)} (rank {array.ndim}); {what} "
          f"expects rank {spec.shape.rank} {spec.shape}")
    for axis, (want, have) in enumerate(zip(spec.shape.as_list(), array.shape)):
      if want is not None and want != have:
        raise errors.invalid_argument(
            f"input {name!r} has shape {list(array.shape)}; {what} expects {spec.shape} "
            f"(dimension {axis} must be {want})")
    if spec.shape.rank >= 1 and spec.shape[0] is None:
      size = array.shape[0]
      if size == 0:
        raise errors.invalid_argument(f"input {name!r} is an empty batch (dimension 0 is 0)")
      if size > max_batch_size:
        raise errors.invalid_argument(
            f"input {name!r} has a batch of {size}, more than the maximum {max_batch_size}")
      if batch_input is not None and size != batch_size:
        raise errors.invalid_argument(
            f"input {name!r} has a batch of {size} but input {batch_input!r} has {batch_size}")
      batch_size, batch_input = size, name
  return batch_size


def to_tensor_proto(array: np.ndarray) -> tensor_pb2.TensorProto:
  return tf.make_tensor_proto(array)
