"""Replays a version's `assets.extra/tf_serving_warmup_requests` before it serves.

The file is what TF Serving reads: a TFRecord of PredictionLog protos (written by
realm_tf.export.serving_warmup). Replaying them pays the first-call costs (tracing,
allocations, lazy table initialisation) before traffic arrives, and a record that fails
means the version is not served.
"""
import os

import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from serving import errors
from serving import tensors
from serving.servable import ServableVersion

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
MAX_WARMUP_RECORDS = 1000  # TF Serving's limit


def warmup_path(version_path: str) -> str:
  return os.path.join(version_path, WARMUP_FILE)


def replay(servable: ServableVersion, max_batch_size: int, max_decoded_bytes: int) -> int:
  """Runs every warm-up request through the same checks as a real one; returns the count."""
  path = warmup_path(servable.path)
  if not tf.io.gfile.exists(path):
    return 0
  count = 0
  for index, record in enumerate(tf.data.TFRecordDataset(path).as_numpy_iterator()):
    if index >= MAX_WARMUP_RECORDS:
      raise errors.invalid_argument(
          f"{path}: more than {MAX_WARMUP_RECORDS} warm-up records (TF Serving's limit)")
    where = f"{path}: record {index}"
    log = prediction_log_pb2.PredictionLog.FromString(record)
    kind = log.WhichOneof("log_type")
    if kind != "predict_log":
      raise errors.invalid_argument(f"{where}: {kind or 'an empty log'} cannot be replayed; "
                                    f"this server only serves Predict")
    request = log.predict_log.request
    try:
      signature = servable.signature(request.model_spec.signature_name)
      inputs = tensors.decode_inputs(request.inputs, max_decoded_bytes)
      tensors.validate_inputs(signature.input_specs, inputs, max_batch_size,
                              what=f"signature {signature.name!r}")
      outputs = signature.run(inputs)
    except errors.ServingError as e:
      raise errors.ServingError(e.code, f"{where}: {e.message}") from None
    except Exception as e:  # pylint: disable=broad-except
      error = errors.from_tf_error(e)
      raise errors.ServingError(error.code, f"{where}: {error.message}") from None
    unknown = sorted(set(request.output_filter) - set(outputs))
    if unknown:
      raise errors.invalid_argument(f"{where}: output_filter names unknown output "
                                    f"{unknown[0]!r}")
    count += 1
  return count
