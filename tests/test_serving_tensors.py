"""serving.tensors over gRPC: a malformed Predict request is INVALID_ARGUMENT naming the
problem, and never reaches the model."""
import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2

from tests.serving_harness import (
    RPC_TIMEOUT, numeric_request, outputs_of, predict_request, prediction_stub, rpc_error)




def _bomb() -> tensor_pb2.TensorProto:
  proto = tf.make_tensor_proto(np.zeros([1, 3], np.float32))
  proto.tensor_shape.dim[0].size = 10**7  # a few bytes claiming 120 MB (limit: 8 MiB)
  proto.ClearField("tensor_content")
  proto.float_val.append(1.0)
  return proto


def _truncated() -> tensor_pb2.TensorProto:
  proto = tf.make_tensor_proto(np.zeros([2, 3], np.float32))
  proto.tensor_content = proto.tensor_content[:-3]
  return proto


MALFORMED = {
    "wrong input name": (
        lambda: predict_request("realm_qa", questions=np.array([b"q"], dtype=object)),
        "'questions'"),
    "missing input": (lambda: predict_request("realm_qa"), "'question' is missing"),
    "wrong dtype": (lambda: predict_request("realm_qa", question=np.array([1, 2], np.int32)),
                    "dtype int32"),
    "wrong rank": (lambda: predict_request("realm_qa", question=np.array([[b"q"]], dtype=object)),
                   "rank 1"),
    "wrong dimension": (lambda: numeric_request(np.zeros([2, 4])),
                        "dimension 1 must be 3"),
    "empty batch": (lambda: predict_request("realm_qa", question=np.array([], dtype=object)),
                    "'question' is an empty batch"),
    "oversized batch": (
        lambda: predict_request("realm_qa", question=np.array([b"q"] * 9, dtype=object)),
        "batch of 9, more than the maximum 8"),
    "truncated tensor": (lambda: predict_request("numeric", x=_truncated()),
                         "'x': malformed TensorProto"),
    "decompression bomb": (lambda: predict_request("numeric", x=_bomb()),
                           "'x': decoding would take"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_request_is_invalid_argument_naming_the_problem(qa_server, case):
  _, channel, _ = qa_server
  make_request, expected = MALFORMED[case]
  error = rpc_error(prediction_stub(channel).Predict, make_request())
  assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
  assert expected in error.details()


def test_malformed_requests_never_reach_the_model(qa_server):
  """The numeric model counts its calls: refused requests must not add to the count."""
  _, channel, _ = qa_server
  stub = prediction_stub(channel)

  def calls():
    return int(outputs_of(stub.Predict(numeric_request([[1, 2, 3]]), timeout=RPC_TIMEOUT))
               ["calls"][0])

  before = calls()
  for case in ("wrong dimension", "truncated tensor", "decompression bomb"):
    rpc_error(stub.Predict, MALFORMED[case][0]())
  rpc_error(stub.Predict, numeric_request(np.zeros([9, 3])))  # oversized batch
  rpc_error(stub.Predict, predict_request("numeric", x=np.zeros([2, 3], np.float64)))  # dtype
  assert calls() == before + 1
