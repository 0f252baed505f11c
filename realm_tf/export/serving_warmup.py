"""Warm-up requests stored with an export, where TF Serving replays them before serving.

TF Serving reads `<export>/assets.extra/tf_serving_warmup_requests`: a TFRecord file of
`tensorflow.serving.PredictionLog` protos whose `predict_log.request` it runs through the
new version before the version becomes AVAILABLE, so the first real request does not pay
for tracing and lazy initialisation. realm_tf's own server (serving/) replays the same
file, and a request that fails there keeps the version from serving.
"""
import os
import uuid
from typing import Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_log_pb2

WARMUP_DIR = "assets.extra"
WARMUP_FILE = "tf_serving_warmup_requests"
MAX_WARMUP_RECORDS = 1000  # TF Serving refuses more


def _signature_inputs(export_dir: str, signature_name: str) -> Optional[dict]:
  """{input name: DType} of the export's signature, or None when there is no SavedModel yet."""
  if not tf.io.gfile.exists(os.path.join(export_dir, "saved_model.pb")):
    return None
  saved_model = saved_model_pb2.SavedModel()
  with tf.io.gfile.GFile(os.path.join(export_dir, "saved_model.pb"), "rb") as f:
    saved_model.ParseFromString(f.read())
  for meta_graph in saved_model.meta_graphs:
    if tf.saved_model.SERVING in meta_graph.meta_info_def.tags:
      if signature_name not in meta_graph.signature_def:
        raise ValueError(f"{export_dir}: no signature {signature_name!r} (it has "
                         f"{sorted(meta_graph.signature_def)})")
      return {name: tf.dtypes.as_dtype(info.dtype) for name, info in
              meta_graph.signature_def[signature_name].inputs.items()}
  raise ValueError(f"{export_dir}: no MetaGraph tagged {tf.saved_model.SERVING!r}")


def _as_array(value) -> np.ndarray:
  array = np.asarray(value)
  if array.dtype.kind == "U":  # Python str → UTF-8 bytes, as tf.string holds them
    array = np.vectorize(lambda s: s.encode("utf-8"), otypes=[object])(array)
  return array


def write_warmup_requests(export_dir: str, requests: Sequence[Mapping[str, np.ndarray]],
                          model_name: str,
                          signature_name: str = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
                          ) -> str:
  """Writes `requests` (each {input name: array}) as the export's warm-up file.

  When the export's saved_model.pb is already there, every request is checked against the
  signature (names and dtypes) so a bad warm-up fails here, at export time, rather than
  keeping the version from loading. The file is written under a temporary name and
  renamed into place.

  Args:
    export_dir: the SavedModel directory (the file goes to assets.extra/).
    requests: one dict per request, input name → array (Python strings allowed).
    model_name: the model name recorded in each PredictRequest.
    signature_name: the signature the requests call.

  Returns:
    The warm-up file's path.

  Raises:
    ValueError: no requests, more than TF Serving replays, an empty request, or inputs
      whose names or dtypes do not match the signature.
  """
  if not requests:
    raise ValueError("write_warmup_requests: no requests")
  if len(requests) > MAX_WARMUP_RECORDS:
    raise ValueError(f"write_warmup_requests: {len(requests)} requests; TF Serving replays "
                     f"at most {MAX_WARMUP_RECORDS}")
  expected = _signature_inputs(export_dir, signature_name)
  logs = []
  for index, inputs in enumerate(requests):
    if not inputs:
      raise ValueError(f"warm-up request {index} has no inputs")
    arrays = {name: _as_array(value) for name, value in inputs.items()}
    if expected is not None:
      if set(arrays) != set(expected):
        raise ValueError(f"warm-up request {index} has inputs {sorted(arrays)}; signature "
                         f"{signature_name!r} of {export_dir} expects {sorted(expected)}")
      for name, array in arrays.items():
        dtype = tf.string if array.dtype == object else tf.dtypes.as_dtype(array.dtype)
        if dtype != expected[name]:
          raise ValueError(f"warm-up request {index}: input {name!r} is {dtype.name}; "
                           f"the signature expects {expected[name].name}")
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = signature_name
    for name, array in arrays.items():
      request.inputs[name].CopyFrom(tf.make_tensor_proto(array))
    logs.append(prediction_log_pb2.PredictionLog(
        predict_log=prediction_log_pb2.PredictLog(request=request)))
  directory = os.path.join(export_dir, WARMUP_DIR)
  tf.io.gfile.makedirs(directory)
  path = os.path.join(directory, WARMUP_FILE)
  tmp = f"{path}.tmp-{uuid.uuid4().hex}"
  with tf.io.TFRecordWriter(tmp) as writer:
    for log in logs:
      writer.write(log.SerializeToString())
  tf.io.gfile.rename(tmp, path, overwrite=True)
  return path
