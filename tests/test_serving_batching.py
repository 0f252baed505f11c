"""serving.batching behind a running server: concurrent requests merged into one batch
and split back, the queue bound, and a request dropped from the queue at its deadline.
What each test waits on is an event (a held model call, a queue's count), never the
clock; RPC_TIMEOUT only bounds a hung request."""
import threading
from unittest import mock

import grpc
import numpy as np
import tensorflow as tf

from serving import config as config_lib
from serving import prediction
from serving.limits import Deadline
from tests import serving_models
from tests.serving_harness import (
    RPC_TIMEOUT, held_model_calls, in_flight, numeric_request, outputs_of, predict_request,
    prediction_stub, rpc_error, running, server_config, wait_for)



def test_batching_merges_concurrent_requests_and_splits_results(built, tmp_path):
  base = str(tmp_path / "numeric")
  version_dir = serving_models.publish(built["numeric"], base, 1)
  batching_file = tmp_path / "batching.config"
  # The batch runs once full; its timeout (60 s) only bounds one that never fills.
  batching_file.write_text("max_batch_size { value: 6 }\nbatch_timeout_micros { value: 60000000 }\n"
                           "num_batch_threads { value: 1 }\nmax_enqueued_batches { value: 4 }\n")
  rows = [np.random.RandomState(i).randn(1 + i % 2, 3).astype(np.float32) for i in range(4)]
  in_process = tf.saved_model.load(version_dir).signatures["serving_default"]
  with running(server_config(numeric=base), enable_batching=True,
               batching_parameters_file=str(batching_file)) as (server, channel):
    stub, barrier, results = prediction_stub(channel), threading.Barrier(len(rows)), {}

    def send(i):
      barrier.wait(RPC_TIMEOUT)
      results[i] = outputs_of(stub.Predict(numeric_request(rows[i]), timeout=RPC_TIMEOUT))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(rows))]
    for thread in threads:
      thread.start()
    for thread in threads:
      thread.join(RPC_TIMEOUT)
    assert len(results) == len(rows)
    for i, x in enumerate(rows):
      np.testing.assert_allclose(results[i]["y"], in_process(x=tf.constant(x))["y"].numpy(),
                                 rtol=1e-6)
      assert results[i]["y"].shape == (len(x), 2)
    # 4 requests of 1–2 rows = 6 rows: one full batch, seen by the model at once.
    assert {int(r["seen_batch"][0]) for r in results.values()} == {6}
    assert server.batcher.largest_batch == 6

    error = rpc_error(stub.Predict, numeric_request(np.zeros([7, 3])))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_batch_size 6" in error.details()
    scaled = stub.Predict(predict_request("numeric", signature="scale",
                                          x=np.ones([2, 3], np.float32), factor=np.float32(3.0)),
                          timeout=RPC_TIMEOUT)
    np.testing.assert_allclose(outputs_of(scaled)["y"], np.full([2, 3], 3.0))  # not batchable


def test_batching_queue_bound_is_resource_exhausted(built, tmp_path):
  base = str(tmp_path / "slow")
  serving_models.publish(built["slow1"], base, 1)
  options = config_lib.BatchingOptions(max_batch_size=1, batch_timeout_micros=0,
                                       max_enqueued_batches=1, num_batch_threads=1)
  with running(server_config(slow=base), enable_batching=True, batching_options=options) as (
      server, channel), held_model_calls() as held:
    stub, results = prediction_stub(channel), []

    def send():
      results.append(stub.Predict(predict_request("slow", x=np.array([1.0], np.float32)),
                                  timeout=RPC_TIMEOUT))

    running_one = threading.Thread(target=send)
    running_one.start()
    held.wait_started(1)  # now running on the only batch thread
    queued_one = threading.Thread(target=send)
    queued_one.start()
    wait_for(lambda: server.batcher.enqueued_batches == 1,
             what="the one batch allowed in the queue")
    error = rpc_error(stub.Predict, predict_request("slow", x=np.array([1.0], np.float32)))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_enqueued_batches=1" in error.details()
    held.release()
    running_one.join(RPC_TIMEOUT)
    queued_one.join(RPC_TIMEOUT)
    assert len(results) == 2


class _PassesWhenAwaited(Deadline):
  """A request's deadline that passes the moment the server starts waiting for the result,
  the request then being in the batching queue: however long a loaded machine takes to get
  it there (a 2 s client deadline could pass first, and the request be refused before it
  is queued), it expires there, an event rather than a race with the clock."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.passed = False

  def expired(self) -> bool:
    return self.passed

  def remaining(self) -> float:  # asked once the request is handed over, for the wait
    self.passed = True
    return 0.0


def test_a_deadline_passing_drops_a_request_still_queued_for_a_batch(built, tmp_path):
  base = str(tmp_path / "slow")
  serving_models.publish(built["slow1"], base, 1)
  options = config_lib.BatchingOptions(max_batch_size=1, batch_timeout_micros=0,
                                       max_enqueued_batches=4, num_batch_threads=1)
  with running(server_config(slow=base), enable_batching=True, batching_options=options) as (
      server, channel), held_model_calls() as held:
    stub, x = prediction_stub(channel), np.array([1.0], np.float32)
    first = threading.Thread(target=lambda: stub.Predict(predict_request("slow", x=x),
                                                         timeout=RPC_TIMEOUT))
    first.start()
    held.wait_started(1)  # the first request occupies the only batch thread
    with mock.patch.object(prediction, "Deadline", _PassesWhenAwaited):
      error = rpc_error(stub.Predict, predict_request("slow", x=x))
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED, error.details()
    assert server.batcher.enqueued_batches == 1  # it reached the queue, and waits there
    # The server gave the request up at its deadline before answering (its version's
    # in-flight count dropped); only then may the batch thread come to it.
    assert in_flight(server, "slow", 1) == 1
    held.release()
    first.join(RPC_TIMEOUT)
    stub.Predict(predict_request("slow", x=x), timeout=RPC_TIMEOUT)
    # The expired request was dropped from the queue, never run: 2 batches, not 3.
    assert server.batcher.batches_run == 2
