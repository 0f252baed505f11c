"""serving.server and serving.grpc_service over a real gRPC channel on 127.0.0.1 with the
official TF Serving stubs: Predict, metadata, status, health, what is not implemented,
message limits, the bound address, flags, and the server as a program."""
import ipaddress
import os
import signal
import subprocess
import sys
import threading

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1 import health_pb2_grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import classification_pb2
from tensorflow_serving.apis import get_model_metadata_pb2
from tensorflow_serving.apis import get_model_status_pb2
from tensorflow_serving.apis import inference_pb2
from tensorflow_serving.apis import regression_pb2

from serving import client
from serving import config as config_lib
from serving.server import parse_flags
from tests import serving_models
from tests.serving_harness import (
    AVAILABLE, RPC_TIMEOUT, model_service_stub, model_status, outputs_of, predict_request,
    prediction_stub, rpc_error)

QUESTIONS = ["who wrote the iliad?", "", "what is the capital of France?"]




def test_predict_equals_in_process_savedmodel(qa_server):
  server, channel, root = qa_server
  response = prediction_stub(channel).Predict(
      predict_request("realm_qa", question=np.array([q.encode() for q in QUESTIONS], dtype=object)),
      timeout=RPC_TIMEOUT)
  assert response.model_spec.name == "realm_qa"
  assert response.model_spec.version.value == 1
  assert response.model_spec.signature_name == "serving_default"
  got = outputs_of(response)
  in_process = tf.saved_model.load(str(root / "realm_qa" / "1")).signatures["serving_default"]
  want = {k: v.numpy() for k, v in in_process(question=tf.constant(QUESTIONS)).items()}
  assert sorted(got) == sorted(want) == sorted(
      ["answer", "score", "answer_block", "block_ids", "block_titles", "block_texts",
       "retrieval_probs"])
  for name in want:
    assert got[name].dtype == want[name].dtype, name
    np.testing.assert_array_equal(got[name], want[name], err_msg=name)

  answers = client.ask(prediction_stub(channel), QUESTIONS, model="realm_qa", timeout=RPC_TIMEOUT)
  for row, answer in enumerate(answers):
    assert answer["answer"] == want["answer"][row].decode()
    assert answer["model"] == {"name": "realm_qa", "version": 1,
                               "signature": "serving_default"}
    assert [b["title"] for b in answer["blocks"]] == [
        t.decode() for t in want["block_titles"][row]]
    assert [b["block_id"] for b in answer["blocks"]] == want["block_ids"][row].tolist()
    np.testing.assert_allclose([b["retrieval_prob"] for b in answer["blocks"]],
                               want["retrieval_probs"][row])
    assert [b["is_answer_block"] for b in answer["blocks"]].index(True) == (
        want["answer_block"][row])


def test_output_filter(qa_server):
  _, channel, _ = qa_server
  request = predict_request("realm_qa", question=np.array([b"q"], dtype=object))
  request.output_filter.extend(["answer", "score"])
  assert sorted(prediction_stub(channel).Predict(request, timeout=RPC_TIMEOUT).outputs) == [
      "answer", "score"]
  request.output_filter.append("no_such_output")
  error = rpc_error(prediction_stub(channel).Predict, request)
  assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
  assert "no_such_output" in error.details()


def test_oversized_message_is_resource_exhausted(qa_server):
  _, channel, _ = qa_server
  padding = np.array([b"x" * (2 << 20)], dtype=object)  # 2 MiB > the 1 MiB limit
  request = predict_request("realm_qa", question=np.array([b"q"], dtype=object), padding=padding)
  error = rpc_error(prediction_stub(channel).Predict, request)
  assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
  assert "Received message larger than max" in error.details()


def test_unknown_model_version_label_and_signature(qa_server):
  _, channel, _ = qa_server
  stub, question = prediction_stub(channel), np.array([b"q"], dtype=object)
  error = rpc_error(stub.Predict, predict_request("no_such_model", question=question))
  assert error.code() == grpc.StatusCode.NOT_FOUND and "no_such_model" in error.details()
  error = rpc_error(stub.Predict, predict_request("realm_qa", version=7, question=question))
  assert error.code() == grpc.StatusCode.NOT_FOUND and "version 7" in error.details()
  request = predict_request("realm_qa", question=question)
  request.model_spec.version_label = "canary"
  error = rpc_error(stub.Predict, request)
  assert error.code() == grpc.StatusCode.NOT_FOUND and "'canary'" in error.details()
  error = rpc_error(stub.Predict, predict_request("realm_qa", signature="nope", question=question))
  assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "'nope'" in error.details()
  assert stub.Predict(predict_request("realm_qa", version=1, question=question),
                     timeout=RPC_TIMEOUT).model_spec.version.value == 1


def test_classify_regress_multi_inference_are_unimplemented(qa_server):
  _, channel, _ = qa_server
  stub = prediction_stub(channel)
  for method, request in ((stub.Classify, classification_pb2.ClassificationRequest()),
                          (stub.Regress, regression_pb2.RegressionRequest()),
                          (stub.MultiInference, inference_pb2.MultiInferenceRequest())):
    error = rpc_error(method, request)
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED


def test_get_model_metadata_lists_signatures(qa_server):
  _, channel, _ = qa_server
  request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
  request.model_spec.name = "numeric"
  response = prediction_stub(channel).GetModelMetadata(request, timeout=RPC_TIMEOUT)
  assert response.model_spec.version.value == 1
  signatures = get_model_metadata_pb2.SignatureDefMap()
  response.metadata["signature_def"].Unpack(signatures)
  assert sorted(signatures.signature_def) == ["scale", "serving_default"]
  assert sorted(signatures.signature_def["scale"].inputs) == ["factor", "x"]
  assert sorted(signatures.signature_def["serving_default"].outputs) == [
      "calls", "seen_batch", "y"]

  request.model_spec.name = "realm_qa"
  response = prediction_stub(channel).GetModelMetadata(request, timeout=RPC_TIMEOUT)
  response.metadata["signature_def"].Unpack(signatures)
  question = signatures.signature_def["serving_default"].inputs["question"]
  assert question.dtype == tf.string.as_datatype_enum
  assert [d.size for d in question.tensor_shape.dim] == [-1]

  request.ClearField("metadata_field")
  error = rpc_error(prediction_stub(channel).GetModelMetadata, request)
  assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "metadata_field" in error.details()


def test_get_model_status(qa_server):
  _, channel, _ = qa_server
  assert model_status(channel, "realm_qa") == {1: (AVAILABLE, "")}
  request = get_model_status_pb2.GetModelStatusRequest()
  request.model_spec.name = "realm_qa"
  request.model_spec.version.value = 5
  assert rpc_error(model_service_stub(channel).GetModelStatus, request).code() == (
      grpc.StatusCode.NOT_FOUND)
  request.model_spec.name = "nope"
  assert rpc_error(model_service_stub(channel).GetModelStatus, request).code() == (
      grpc.StatusCode.NOT_FOUND)


def test_health_check_reports_serving(qa_server):
  _, channel, _ = qa_server
  stub = health_pb2_grpc.HealthStub(channel)
  for service in ("", "realm_qa", "numeric"):
    response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT)
    assert response.status == health_pb2.HealthCheckResponse.SERVING, service
  error = rpc_error(stub.Check, health_pb2.HealthCheckRequest(service="nope"))
  assert error.code() == grpc.StatusCode.NOT_FOUND


def _kernel_address(hex_address: str) -> ipaddress.IPv4Address:
  """An address from /proc/net/tcp(6): 32-bit words in host (little-endian) order."""
  raw = b"".join(bytes.fromhex(hex_address[i:i + 8])[::-1]
                 for i in range(0, len(hex_address), 8))
  address = ipaddress.ip_address(raw)
  return getattr(address, "ipv4_mapped", None) or address


def _listening_addresses(port: int) -> list:
  """Local addresses listening on `port`, from the kernel's socket tables."""
  found = []
  for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    if not os.path.exists(table):
      continue
    with open(table) as f:
      for line in f.readlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
          found.append(_kernel_address(address))
  return found


def test_binds_only_to_loopback_by_default(qa_server):
  server, _, _ = qa_server
  assert server.options.host == "127.0.0.1"
  for port in (server.port, server.rest_port):
    assert _listening_addresses(port) == [ipaddress.ip_address("127.0.0.1")], port


def test_flags_have_tensorflow_model_server_names():
  options = parse_flags(["serving.server", "--port=9000", "--rest_api_port=0",
                         "--model_name=realm_qa", "--model_base_path=/m/realm_qa",
                         "--enable_batching", "--batching_parameters_file=/b.config",
                         "--file_system_poll_wait_seconds=5", "--grpc_max_threads=3",
                         "--rest_api_num_threads=2", "--rest_api_timeout_in_ms=1000",
                         "--max_concurrent_requests=7", "--request_timeout_seconds=2.5"])
  assert (options.port, options.rest_api_port, options.model_name, options.enable_batching,
          options.file_system_poll_wait_seconds, options.grpc_max_threads,
          options.max_concurrent_requests, options.host) == (
              9000, None, "realm_qa", True, 5.0, 3, 7, "127.0.0.1")
  with pytest.raises(config_lib.ConfigError, match="not both"):
    parse_flags(["s", "--model_config_file=/c", "--model_base_path=/m"])


def test_server_as_a_subprocess_answers_the_client(built, tmp_path, repo_dir):
  serving_models.publish(built["qa"], str(tmp_path / "realm_qa"), 2)
  config_file = tmp_path / "models.config"
  config_file.write_text(f'model_config_list {{ config {{ name: "realm_qa" base_path: '
                         f'"{tmp_path / "realm_qa"}" model_platform: "tensorflow" }} }}')
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(repo_dir))
  process = subprocess.Popen(
      [sys.executable, "-m", "serving.server", "--port=0", f"--model_config_file={config_file}"],
      cwd=str(repo_dir), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    line = _read_line(process, timeout=60)
    assert line.startswith("serving.server: gRPC 127.0.0.1:"), line
    address = line.split()[2]
    with grpc.insecure_channel(address) as channel:
      answers = client.ask(prediction_stub(channel), ["who wrote the iliad?"], timeout=RPC_TIMEOUT)
    assert answers[0]["answer"] == "v1:WHO WROTE THE ILIAD?"
    assert answers[0]["model"]["version"] == 2
  finally:
    process.send_signal(signal.SIGTERM)
    try:
      process.wait(timeout=30)
    finally:
      if process.poll() is None:
        process.kill()
  assert process.returncode == 0, process.stderr.read()[-2000:]


def _read_line(process, timeout: float) -> str:
  lines = []
  reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()), daemon=True)
  reader.start()
  reader.join(timeout)
  if not lines or not lines[0]:
    process.kill()
    raise AssertionError(f"the server printed nothing: {process.stderr.read()[-3000:]}")
  return lines[0].strip()


@pytest.mark.parametrize("given, expected", [(None, "0"), ("1", "1")])
def test_server_program_turns_onednn_off_unless_told(given, expected, repo_dir):
  """Run as a program the server defaults TF_ENABLE_ONEDNN_OPTS to 0 before TensorFlow loads
  (oneDNN's arena keeps retired versions' memory); an explicit setting is kept."""
  env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
  if given is not None:
    env["TF_ENABLE_ONEDNN_OPTS"] = given
  # A meta-path hook records the variable at the moment TensorFlow is first imported.
  probe = ("import os, runpy, sys\n"
           "seen = []\n"
           "class Hook:\n"
           "  def find_spec(self, name, path=None, target=None):\n"
           "    if name == 'tensorflow' and not seen:\n"
           "      seen.append(os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset'))\n"
           "    return None\n"
           "sys.meta_path.insert(0, Hook())\n"
           "sys.argv = ['serving.server', '--help']\n"
           "try:\n"
           "  runpy.run_module('serving.server', run_name='__main__')\n"
           "except SystemExit:\n"
           "  pass\n"
           "print('ONEDNN_AT_TF_IMPORT=' + (seen[0] if seen else 'tf-not-imported'))\n")
  out = subprocess.run([sys.executable, "-c", probe], env=dict(env, TF_CPP_MIN_LOG_LEVEL="2"),
                       cwd=repo_dir, capture_output=True, text=True, timeout=300, check=True).stdout
  assert f"ONEDNN_AT_TF_IMPORT={expected}" in out
