"""serving.limits behind a running server: the concurrency limit, the server's and the
client's deadlines, and a timed-out computation holding its slot until the model returns."""
import grpc
import numpy as np

from tests import serving_models
from tests.serving_harness import (
    DEADLINE, RPC_TIMEOUT, held_model_calls, predict_request, prediction_stub, rpc_error,
    running, server_config, wait_for)



def test_concurrency_limit_and_deadlines(built, tmp_path):
  base = str(tmp_path / "slow")
  serving_models.publish(built["slow1"], base, 1)
  with running(server_config(slow=base), max_concurrent_requests=1,
               request_timeout_seconds=DEADLINE) as (_, channel), held_model_calls() as held:
    stub, x = prediction_stub(channel), np.array([1.0], np.float32)
    error = rpc_error(stub.Predict, predict_request("slow", x=x))
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "--request_timeout_seconds" in error.details()
    assert held.finished == 0  # answered at its deadline, not when the model returned
    # The timed-out computation still holds the only slot until the model returns.
    held.wait_started(1)
    error = rpc_error(stub.Predict, predict_request("slow", x=x))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "too many concurrent requests" in error.details()
  with running(server_config(slow=base), max_concurrent_requests=2) as (_, channel), \
      held_model_calls() as held:
    stub = prediction_stub(channel)
    # The client's deadline:
    error = rpc_error(stub.Predict, predict_request("slow", x=x), timeout=0.2)
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    held.release()
    wait_for(lambda: _try_predict(stub, x), what="the slot to be released")


def _try_predict(stub, x) -> bool:
  try:
    stub.Predict(predict_request("slow", x=x), timeout=RPC_TIMEOUT)
    return True
  except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
    return False
