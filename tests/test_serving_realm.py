"""A fine-tuned REALM QA export served over a real gRPC channel: answers and provenance
through the official stubs equal in-process prediction, with and without batching, from
the library client and the command-line client."""
import concurrent.futures
import json
import os
import subprocess
import sys

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import get_model_metadata_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

from serving import client
from serving.config import BatchingOptions
from serving.server import ModelServer, ServerOptions
from tests.test_export_qa import TRAIN_STEPS, shared_export

RPC_TIMEOUT = 60.0


@pytest.fixture(scope="module")
def exported(tmp_path_factory, repo_dir):
  return shared_export(tmp_path_factory, repo_dir)


@pytest.fixture(scope="module")
def in_process(exported):
  """The export called in this process: what the server must return."""
  loaded = tf.saved_model.load(exported["published"]["realm_qa"])
  out = loaded.signatures["serving_default"](question=tf.constant(exported["questions"]))
  return {k: v.numpy() for k, v in out.items()}


def _serve(exported, **options):
  options.setdefault("port", 0)
  return ModelServer(ServerOptions(
      model_name="realm_qa",
      model_base_path=os.path.join(exported["out"], "realm_qa"),
      file_system_poll_wait_seconds=0, **options)).start()


def _check(answers, expected, rows):
  for answer, row in zip(answers, rows):
    assert answer["answer"] == expected["answer"][row].decode()
    assert answer["score"] == pytest.approx(float(expected["score"][row]), abs=1e-5)
    assert answer["answer_block"] == int(expected["answer_block"][row])
    assert answer["model"] == {"name": "realm_qa", "version": TRAIN_STEPS,
                               "signature": "serving_default"}
    blocks = answer["blocks"]
    assert [b["block_id"] for b in blocks] == [int(x) for x in expected["block_ids"][row]]
    assert [b["title"] for b in blocks] == [t.decode() for t in expected["block_titles"][row]]
    assert [b["text"] for b in blocks] == [t.decode() for t in expected["block_texts"][row]]
    np.testing.assert_allclose([b["retrieval_prob"] for b in blocks],
                               expected["retrieval_probs"][row], atol=1e-6)
    assert [b["is_answer_block"] for b in blocks].count(True) == 1


def test_grpc_answers_and_provenance_equal_in_process_prediction(exported, in_process):
  questions = exported["questions"]
  server = _serve(exported)
  try:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
      stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
      _check(client.ask(stub, questions, timeout=RPC_TIMEOUT), in_process,
             range(len(questions)))
      # One question per request gives the same answers as the batch of all of them.
      _check(client.ask(stub, questions[3:4], timeout=RPC_TIMEOUT), in_process, [3])
      # And they are the evaluated predictions.
      assert [a["answer"] for a in client.ask(stub, questions, timeout=RPC_TIMEOUT)] == [
          p["prediction"] for p in exported["predictions"]]
      request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=[
          "signature_def"])
      request.model_spec.name = "realm_qa"
      metadata = stub.GetModelMetadata(request, timeout=RPC_TIMEOUT)
      assert metadata.model_spec.version.value == TRAIN_STEPS
  finally:
    server.stop(grace=0.5)


def test_batched_concurrent_requests_answer_like_in_process(exported, in_process):
  questions = exported["questions"][:8]
  server = _serve(exported, enable_batching=True, batching_options=BatchingOptions(
      max_batch_size=8, batch_timeout_micros=20_000, num_batch_threads=1))
  try:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
      stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
      with concurrent.futures.ThreadPoolExecutor(len(questions)) as pool:
        answers = list(pool.map(
            lambda q: client.ask(stub, [q], timeout=RPC_TIMEOUT)[0], questions))
      _check(answers, in_process, range(len(questions)))
  finally:
    server.stop(grace=0.5)


def test_command_line_client_prints_answer_and_provenance(exported, in_process):
  server = _serve(exported)
  try:
    question = exported["questions"][0]
    result = subprocess.run(
        [sys.executable, "-m", "serving.client", "--server", f"127.0.0.1:{server.port}",
         "--json", question], capture_output=True, text=True, timeout=120, check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 0, result.stderr[-2000:]
    answers = json.loads(result.stdout[result.stdout.index("["):])
    _check(answers, in_process, [0])
  finally:
    server.stop(grace=0.5)
