"""serving.server over a real gRPC channel on 127.0.0.1 with the official TF Serving stubs."""
import contextlib
import ipaddress
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from unittest import mock

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1 import health_pb2_grpc
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.framework import tensor_pb2
from tensorflow_serving.apis import classification_pb2
from tensorflow_serving.apis import get_model_metadata_pb2
from tensorflow_serving.apis import get_model_status_pb2
from tensorflow_serving.apis import inference_pb2
from tensorflow_serving.apis import model_management_pb2
from tensorflow_serving.apis import model_service_pb2_grpc
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc
from tensorflow_serving.apis import regression_pb2
from tensorflow_serving.config import model_server_config_pb2

from realm_tf.export.serving_warmup import write_warmup_requests
from serving import client
from serving import config as config_lib
from serving import servable as servable_lib
from serving.server import ModelServer, ServerOptions, parse_flags
from serving.servable import release_free_memory, resident_bytes
from tests import serving_models

AVAILABLE = get_model_status_pb2.ModelVersionStatus.AVAILABLE
UNLOADING = get_model_status_pb2.ModelVersionStatus.UNLOADING
END = get_model_status_pb2.ModelVersionStatus.END
RPC_TIMEOUT = 10.0
WAIT_SECONDS = 60.0  # for a state a test waits on: generous, as the machine may be loaded
QUESTIONS = ["who wrote the iliad?", "", "what is the capital of France?"]


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  """Each tiny model built once; tests publish copies as versions."""
  root = tmp_path_factory.mktemp("built")
  return {
      "qa": serving_models.save_fake_realm_qa(str(root / "qa"), "v1"),
      "numeric": serving_models.save_numeric(str(root / "numeric")),
      "slow1": serving_models.save_slow(str(root / "slow1"), delay_ms=30, offset=1.0),
      "slow2": serving_models.save_slow(str(root / "slow2"), delay_ms=30, offset=2.0),
      "slower": serving_models.save_slow(str(root / "slower"), delay_ms=700, offset=0.0),
  }


def _config(**models) -> model_server_config_pb2.ModelServerConfig:
  """{name: base_path or (base_path, policy text)} → ModelServerConfig."""
  config = model_server_config_pb2.ModelServerConfig()
  for name, value in models.items():
    base_path, extra = (value, "") if isinstance(value, str) else value
    text_format.Parse(f'name: "{name}" base_path: "{base_path}" model_platform: "tensorflow" '
                      f'{extra}', config.model_config_list.config.add())
  return config


@contextlib.contextmanager
def running(config, **options):
  options.setdefault("port", 0)
  options.setdefault("file_system_poll_wait_seconds", 0)
  server = ModelServer(ServerOptions(model_server_config=config, **options)).start()
  channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
  try:
    yield server, channel
  finally:
    channel.close()
    server.stop(grace=0.5)


def _prediction(channel):
  return prediction_service_pb2_grpc.PredictionServiceStub(channel)


def _models(channel):
  return model_service_pb2_grpc.ModelServiceStub(channel)


def _request(model, signature="", version=None, **inputs) -> predict_pb2.PredictRequest:
  request = predict_pb2.PredictRequest()
  request.model_spec.name = model
  request.model_spec.signature_name = signature
  if version is not None:
    request.model_spec.version.value = version
  for name, value in inputs.items():
    proto = value if isinstance(value, tensor_pb2.TensorProto) else tf.make_tensor_proto(value)
    request.inputs[name].CopyFrom(proto)
  return request


def _numeric_request(rows, **kwargs):
  return _request("numeric", x=np.asarray(rows, np.float32), **kwargs)


def _outputs(response) -> dict:
  return {name: tf.make_ndarray(proto) for name, proto in response.outputs.items()}


def _status(channel, model) -> dict:
  request = get_model_status_pb2.GetModelStatusRequest()
  request.model_spec.name = model
  response = _models(channel).GetModelStatus(request, timeout=RPC_TIMEOUT)
  return {s.version: (s.state, s.status.error_message) for s in response.model_version_status}


def _rpc_error(call, *args, **kwargs) -> grpc.RpcError:
  with pytest.raises(grpc.RpcError) as info:
    call(*args, timeout=kwargs.pop("timeout", RPC_TIMEOUT), **kwargs)
  return info.value


def _wait_for(condition, timeout=WAIT_SECONDS, what="condition"):
  end = time.monotonic() + timeout
  while time.monotonic() < end:
    if condition():
      return
    time.sleep(0.05)
  raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class HeldModelCalls:
  """Every model call (Signature.run) waits at its start until `release()`, so a request
  is provably still computing while the test looks at the server, however slow the
  machine; a model that sleeps a fixed time only makes that likely."""

  def __init__(self):
    self._cond = threading.Condition()
    self._released = False
    self.started = 0
    self.finished = 0

  def wrap(self, run):
    def held_run(signature, inputs):
      with self._cond:
        self.started += 1
        self._cond.notify_all()
        if not self._cond.wait_for(lambda: self._released, WAIT_SECONDS):
          raise AssertionError(f"a model call was held {WAIT_SECONDS:.0f} s, never released")
      try:
        return run(signature, inputs)
      finally:
        with self._cond:
          self.finished += 1
    return held_run

  def wait_started(self, count: int) -> None:
    with self._cond:
      if not self._cond.wait_for(lambda: self.started >= count, WAIT_SECONDS):
        raise AssertionError(f"{self.started} model calls started in {WAIT_SECONDS:.0f} s, "
                             f"not {count}")

  def release(self) -> None:
    with self._cond:
      self._released = True
      self._cond.notify_all()


@contextlib.contextmanager
def held_model_calls():
  """HeldModelCalls over every model in this process; released (then unpatched) on exit,
  before a server around it stops."""
  held = HeldModelCalls()
  with mock.patch.object(servable_lib.Signature, "run", held.wrap(servable_lib.Signature.run)):
    try:
      yield held
    finally:
      held.release()


@pytest.fixture(scope="module")
def qa_server(built, tmp_path_factory):
  """realm_qa and numeric, version 1 each, REST on; requests capped at 8 rows / 1 MiB."""
  root = tmp_path_factory.mktemp("models")
  serving_models.publish(built["qa"], str(root / "realm_qa"), 1)
  serving_models.publish(built["numeric"], str(root / "numeric"), 1)
  config = _config(realm_qa=str(root / "realm_qa"), numeric=str(root / "numeric"))
  with running(config, rest_api_port=0, max_batch_size=8, max_message_bytes=1 << 20) as (
      server, channel):
    yield server, channel, root


# ------------------------------------------------------------------------------ Predict


def test_predict_equals_in_process_savedmodel(qa_server):
  server, channel, root = qa_server
  response = _prediction(channel).Predict(
      _request("realm_qa", question=np.array([q.encode() for q in QUESTIONS], dtype=object)),
      timeout=RPC_TIMEOUT)
  assert response.model_spec.name == "realm_qa"
  assert response.model_spec.version.value == 1
  assert response.model_spec.signature_name == "serving_default"
  got = _outputs(response)
  in_process = tf.saved_model.load(str(root / "realm_qa" / "1")).signatures["serving_default"]
  want = {k: v.numpy() for k, v in in_process(question=tf.constant(QUESTIONS)).items()}
  assert sorted(got) == sorted(want) == sorted(
      ["answer", "score", "answer_block", "block_ids", "block_titles", "block_texts",
       "retrieval_probs"])
  for name in want:
    assert got[name].dtype == want[name].dtype, name
    np.testing.assert_array_equal(got[name], want[name], err_msg=name)

  answers = client.ask(_prediction(channel), QUESTIONS, model="realm_qa", timeout=RPC_TIMEOUT)
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
  request = _request("realm_qa", question=np.array([b"q"], dtype=object))
  request.output_filter.extend(["answer", "score"])
  assert sorted(_prediction(channel).Predict(request, timeout=RPC_TIMEOUT).outputs) == [
      "answer", "score"]
  request.output_filter.append("no_such_output")
  error = _rpc_error(_prediction(channel).Predict, request)
  assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
  assert "no_such_output" in error.details()


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
        lambda: _request("realm_qa", questions=np.array([b"q"], dtype=object)), "'questions'"),
    "missing input": (lambda: _request("realm_qa"), "'question' is missing"),
    "wrong dtype": (lambda: _request("realm_qa", question=np.array([1, 2], np.int32)),
                    "dtype int32"),
    "wrong rank": (lambda: _request("realm_qa", question=np.array([[b"q"]], dtype=object)),
                   "rank 1"),
    "wrong dimension": (lambda: _numeric_request(np.zeros([2, 4])),
                        "dimension 1 must be 3"),
    "empty batch": (lambda: _request("realm_qa", question=np.array([], dtype=object)),
                    "'question' is an empty batch"),
    "oversized batch": (lambda: _request("realm_qa", question=np.array([b"q"] * 9, dtype=object)),
                        "batch of 9, more than the maximum 8"),
    "truncated tensor": (lambda: _request("numeric", x=_truncated()),
                         "'x': malformed TensorProto"),
    "decompression bomb": (lambda: _request("numeric", x=_bomb()), "'x': decoding would take"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_request_is_invalid_argument_naming_the_problem(qa_server, case):
  _, channel, _ = qa_server
  make_request, expected = MALFORMED[case]
  error = _rpc_error(_prediction(channel).Predict, make_request())
  assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
  assert expected in error.details()


def test_malformed_requests_never_reach_the_model(qa_server):
  """The numeric model counts its calls: refused requests must not add to the count."""
  _, channel, _ = qa_server
  stub = _prediction(channel)

  def calls():
    return int(_outputs(stub.Predict(_numeric_request([[1, 2, 3]]), timeout=RPC_TIMEOUT))
               ["calls"][0])

  before = calls()
  for case in ("wrong dimension", "truncated tensor", "decompression bomb"):
    _rpc_error(stub.Predict, MALFORMED[case][0]())
  _rpc_error(stub.Predict, _numeric_request(np.zeros([9, 3])))  # oversized batch
  _rpc_error(stub.Predict, _request("numeric", x=np.zeros([2, 3], np.float64)))  # dtype
  assert calls() == before + 1


def test_oversized_message_is_resource_exhausted(qa_server):
  _, channel, _ = qa_server
  padding = np.array([b"x" * (2 << 20)], dtype=object)  # 2 MiB > the 1 MiB limit
  request = _request("realm_qa", question=np.array([b"q"], dtype=object), padding=padding)
  error = _rpc_error(_prediction(channel).Predict, request)
  assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
  assert "Received message larger than max" in error.details()


def test_unknown_model_version_label_and_signature(qa_server):
  _, channel, _ = qa_server
  stub, question = _prediction(channel), np.array([b"q"], dtype=object)
  error = _rpc_error(stub.Predict, _request("no_such_model", question=question))
  assert error.code() == grpc.StatusCode.NOT_FOUND and "no_such_model" in error.details()
  error = _rpc_error(stub.Predict, _request("realm_qa", version=7, question=question))
  assert error.code() == grpc.StatusCode.NOT_FOUND and "version 7" in error.details()
  request = _request("realm_qa", question=question)
  request.model_spec.version_label = "canary"
  error = _rpc_error(stub.Predict, request)
  assert error.code() == grpc.StatusCode.NOT_FOUND and "'canary'" in error.details()
  error = _rpc_error(stub.Predict, _request("realm_qa", signature="nope", question=question))
  assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "'nope'" in error.details()
  assert _prediction(channel).Predict(_request("realm_qa", version=1, question=question),
                                      timeout=RPC_TIMEOUT).model_spec.version.value == 1


def test_classify_regress_multi_inference_are_unimplemented(qa_server):
  _, channel, _ = qa_server
  stub = _prediction(channel)
  for method, request in ((stub.Classify, classification_pb2.ClassificationRequest()),
                          (stub.Regress, regression_pb2.RegressionRequest()),
                          (stub.MultiInference, inference_pb2.MultiInferenceRequest())):
    error = _rpc_error(method, request)
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED


# ------------------------------------------------------------------ metadata, status, health


def test_get_model_metadata_lists_signatures(qa_server):
  _, channel, _ = qa_server
  request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
  request.model_spec.name = "numeric"
  response = _prediction(channel).GetModelMetadata(request, timeout=RPC_TIMEOUT)
  assert response.model_spec.version.value == 1
  signatures = get_model_metadata_pb2.SignatureDefMap()
  response.metadata["signature_def"].Unpack(signatures)
  assert sorted(signatures.signature_def) == ["scale", "serving_default"]
  assert sorted(signatures.signature_def["scale"].inputs) == ["factor", "x"]
  assert sorted(signatures.signature_def["serving_default"].outputs) == [
      "calls", "seen_batch", "y"]

  request.model_spec.name = "realm_qa"
  response = _prediction(channel).GetModelMetadata(request, timeout=RPC_TIMEOUT)
  response.metadata["signature_def"].Unpack(signatures)
  question = signatures.signature_def["serving_default"].inputs["question"]
  assert question.dtype == tf.string.as_datatype_enum
  assert [d.size for d in question.tensor_shape.dim] == [-1]

  request.ClearField("metadata_field")
  error = _rpc_error(_prediction(channel).GetModelMetadata, request)
  assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "metadata_field" in error.details()


def test_get_model_status(qa_server):
  _, channel, _ = qa_server
  assert _status(channel, "realm_qa") == {1: (AVAILABLE, "")}
  request = get_model_status_pb2.GetModelStatusRequest()
  request.model_spec.name = "realm_qa"
  request.model_spec.version.value = 5
  assert _rpc_error(_models(channel).GetModelStatus, request).code() == (
      grpc.StatusCode.NOT_FOUND)
  request.model_spec.name = "nope"
  assert _rpc_error(_models(channel).GetModelStatus, request).code() == (
      grpc.StatusCode.NOT_FOUND)


def test_health_check_reports_serving(qa_server):
  _, channel, _ = qa_server
  stub = health_pb2_grpc.HealthStub(channel)
  for service in ("", "realm_qa", "numeric"):
    response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT)
    assert response.status == health_pb2.HealthCheckResponse.SERVING, service
  error = _rpc_error(stub.Check, health_pb2.HealthCheckRequest(service="nope"))
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


# ------------------------------------------------------------------------------ versions


def test_new_version_under_load_is_picked_up_with_zero_failures(built, tmp_path):
  base = str(tmp_path / "slow")
  serving_models.publish(built["slow1"], base, 1)
  # Version 2 spends a while LOADING (its warm-up replays slow requests): the window in
  # which a server that retired version 1 too early would fail requests.
  staged = serving_models.publish(built["slow2"], str(tmp_path / "staging"), 2)
  write_warmup_requests(staged, [{"x": np.ones([1], np.float32)}] * 4, model_name="slow")
  with running(_config(slow=base), file_system_poll_wait_seconds=0.1) as (server, channel):
    stub = _prediction(channel)
    stop, failures, answered = threading.Event(), [], []

    def send(seed):
      x = np.array([seed, seed + 0.5], np.float32)
      while not stop.is_set():
        try:
          response = stub.Predict(_request("slow", x=x), timeout=RPC_TIMEOUT)
          version = response.model_spec.version.value
          # The answer comes from the version the response names (offset = version).
          np.testing.assert_allclose(_outputs(response)["y"], x + version)
          answered.append(version)
        except Exception as e:  # pylint: disable=broad-except
          failures.append(repr(e))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(6)]
    for thread in threads:
      thread.start()
    try:
      _wait_for(lambda: len(answered) >= 8, what="traffic on version 1")
      serving_models.publish(staged, base, 2)
      _wait_for(lambda: _status(channel, "slow") == {1: (END, ""), 2: (AVAILABLE, "")},
                what="version 2 AVAILABLE and version 1 END")
      seen = len(answered)
      _wait_for(lambda: len(answered) >= seen + 8, what="traffic on version 2")
    finally:
      stop.set()
      for thread in threads:
        thread.join(RPC_TIMEOUT)
    assert failures == []
    assert set(answered) == {1, 2}
    assert answered[-1] == 2


def test_retired_version_finishes_requests_in_flight(built, tmp_path):
  base = str(tmp_path / "slow")
  serving_models.publish(built["slower"], base, 1)  # 0.7 s per request
  with running(_config(slow=base)) as (server, channel), held_model_calls() as held:
    results = []
    thread = threading.Thread(target=lambda: results.append(_prediction(channel).Predict(
        _request("slow", version=1, x=np.array([3.0], np.float32)), timeout=RPC_TIMEOUT)))
    thread.start()
    _wait_for(lambda: _in_flight(server, "slow", 1) == 1, what="the request to start")
    serving_models.publish(built["slow1"], base, 2)
    server.manager.poll()  # loads 2, retires 1 while its request still runs
    assert _status(channel, "slow")[1][0] == UNLOADING
    assert _status(channel, "slow")[2][0] == AVAILABLE
    held.release()
    thread.join(RPC_TIMEOUT)
    assert results[0].model_spec.version.value == 1
    np.testing.assert_allclose(_outputs(results[0])["y"], [3.0])
    server.manager.wait_for_retirements(RPC_TIMEOUT)
    assert _status(channel, "slow")[1][0] == END
    error = _rpc_error(_prediction(channel).Predict,
                       _request("slow", version=1, x=np.array([3.0], np.float32)))
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_resource_preserving_policy_retires_the_old_version_before_loading(built, tmp_path):
  """--aspired_version_policy=resource_preserving: the old version is END (its request in
  flight answered) before the new one loads, so one version is resident at a time; a new
  version that fails to load hands the model back to the old one."""
  base = str(tmp_path / "slow")
  serving_models.publish(built["slower"], base, 1)  # 0.7 s per request
  with running(_config(slow=base), aspired_version_policy="resource_preserving") as (
      server, channel), held_model_calls() as held:
    results = []
    thread = threading.Thread(target=lambda: results.append(_prediction(channel).Predict(
        _request("slow", x=np.array([3.0], np.float32)), timeout=RPC_TIMEOUT)))
    thread.start()
    _wait_for(lambda: _in_flight(server, "slow", 1) == 1, what="the request to start")
    staged = serving_models.publish(built["slow2"], str(tmp_path / "staging"), 2)
    loaded_while = []
    original = type(server.manager)._load  # pylint: disable=protected-access

    def recording_load(manager, model, version_dir):
      loaded_while.append({v: s.state.name for v, s in model.records.items()})
      return original(manager, model, version_dir)

    type(server.manager)._load = recording_load  # pylint: disable=protected-access
    try:
      serving_models.publish(staged, base, 2)
      poller = threading.Thread(target=server.manager.poll)
      poller.start()
      _wait_for(lambda: _status(channel, "slow")[1][0] == UNLOADING, what="version 1 retiring")
      assert loaded_while == []  # version 2 waits for version 1's request
      held.release()
      poller.join(WAIT_SECONDS)
    finally:
      type(server.manager)._load = original  # pylint: disable=protected-access
    thread.join(RPC_TIMEOUT)
    assert results[0].model_spec.version.value == 1
    assert loaded_while == [{1: "END"}]
    assert _status(channel, "slow") == {1: (END, ""), 2: (AVAILABLE, "")}
    response = _prediction(channel).Predict(_request("slow", x=np.array([1.0], np.float32)),
                                            timeout=RPC_TIMEOUT)
    assert response.model_spec.version.value == 2
    broken = os.path.join(base, "3")
    os.makedirs(broken)
    with open(os.path.join(broken, "saved_model.pb"), "wb") as f:
      f.write(b"not a saved model")
    server.manager.poll()  # 2 retired, 3 fails, 2 loads again
    assert _status(channel, "slow")[2][0] == AVAILABLE
    assert _status(channel, "slow")[3][0] == END
  with pytest.raises(config_lib.ConfigError, match="aspired_version_policy"):
    ServerOptions(aspired_version_policy="newest_first")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_trim")
def test_memory_freed_after_a_retirement_goes_back_to_the_os():
  """What release() adds to dropping the model: freed heap pages leave the process.

  Interleaved small blocks (below glibc's mmap threshold) with every 16th kept pin the
  heap, so freeing the rest does not lower RSS until the pages are trimmed.
  """
  chunks = [bytearray(96 * 1024) for _ in range(2000)]
  for chunk in chunks:
    chunk[::4096] = b"x" * len(chunk[::4096])  # touch every page: resident
  kept = chunks[::16]
  del chunks
  before = resident_bytes()
  freed = release_free_memory()
  assert freed > 60 * 2**20, (before, freed)
  assert resident_bytes() < before - 60 * 2**20
  del kept


def _in_flight(server, name, version) -> int:
  servable = server.manager._models[name].records[version]  # pylint: disable=protected-access
  return servable.in_flight


def test_broken_version_never_replaces_the_serving_one(built, tmp_path, caplog):
  base = tmp_path / "numeric"
  serving_models.publish(built["numeric"], str(base), 1)
  with running(_config(numeric=str(base))) as (server, channel):
    stub = _prediction(channel)

    def serving_version():
      response = stub.Predict(_numeric_request([[1, 2, 3]]), timeout=RPC_TIMEOUT)
      return response.model_spec.version.value

    serving_models.publish_broken(str(base), 2)
    server.manager.poll()
    status = _status(channel, "numeric")
    assert status[1][0] == AVAILABLE and status[2][0] == END
    assert "/2" in status[2][1] and status[2][1]
    assert serving_version() == 1

    bad_warmup = serving_models.publish(built["numeric"], str(base), 3)
    serving_models.write_raw_warmup(bad_warmup, {"wrong": np.zeros([1, 3], np.float32)})
    server.manager.poll()
    status = _status(channel, "numeric")
    assert status[3][0] == END
    assert "tf_serving_warmup_requests: record 0" in status[3][1] and "'wrong'" in status[3][1]
    assert serving_version() == 1

    outside = tmp_path / "elsewhere"
    serving_models.publish(built["numeric"], str(outside), 1)
    os.symlink(str(outside / "1"), str(base / "4"))
    (base / "latest").mkdir()  # not an integer: not a version
    server.manager.poll()
    status = _status(channel, "numeric")
    assert status[4][0] == END and "outside the base path" in status[4][1]
    assert set(status) == {1, 2, 3, 4}
    assert serving_version() == 1

    caplog.set_level(logging.INFO, logger="serving.model_manager")
    caplog.clear()
    server.manager.poll()  # failed versions are not retried while unchanged
    assert _status(channel, "numeric") == status
    assert not [r for r in caplog.records if "loading version" in r.getMessage()]

    serving_models.publish(built["numeric"], str(base), 5)
    server.manager.poll()
    assert [r for r in caplog.records if "loading version 5" in r.getMessage()]
    server.manager.wait_for_retirements(RPC_TIMEOUT)
    status = _status(channel, "numeric")
    assert status[5][0] == AVAILABLE and status[1][0] == END
    assert serving_version() == 5

    # A policy naming only a broken version does not take the serving one away either.
    _models(channel).HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(
        config=_config(numeric=(str(base), "model_version_policy { specific { versions: 2 } }"))),
        timeout=RPC_TIMEOUT)
    assert serving_version() == 5


def test_version_policies_and_labels_by_config_reload(built, tmp_path):
  base = str(tmp_path / "numeric")
  for version in (1, 2, 3):
    serving_models.publish(built["numeric"], base, version)
  with running(_config(numeric=base)) as (server, channel):
    def available():
      server.manager.wait_for_retirements(RPC_TIMEOUT)
      return sorted(v for v, (state, _) in _status(channel, "numeric").items()
                    if state == AVAILABLE)

    def reload(policy):
      request = model_management_pb2.ReloadConfigRequest(config=_config(numeric=(base, policy)))
      return _models(channel).HandleReloadConfigRequest(request, timeout=RPC_TIMEOUT)

    assert available() == [3]  # TF Serving's default: latest 1
    reload("model_version_policy { latest { num_versions: 2 } }")
    assert available() == [2, 3]
    reload("model_version_policy { specific { versions: 1 versions: 3 } } "
           'version_labels { key: "stable" value: 1 }')
    assert available() == [1, 3]
    request = _numeric_request([[1, 2, 3]])
    request.model_spec.version_label = "stable"
    assert _prediction(channel).Predict(request, timeout=RPC_TIMEOUT).model_spec.version.value == 1
    assert _prediction(channel).Predict(_numeric_request([[1, 2, 3]]), timeout=RPC_TIMEOUT
                                        ).model_spec.version.value == 3
    reload("model_version_policy { all {} }")
    assert available() == [1, 2, 3]
    response = _prediction(channel).Predict(_numeric_request([[1, 2, 3]], version=2),
                                            timeout=RPC_TIMEOUT)
    assert response.model_spec.version.value == 2


def test_reload_config_adds_and_removes_models_inside_the_model_root(built, tmp_path):
  models = tmp_path / "models"
  serving_models.publish(built["numeric"], str(models / "numeric"), 1)
  serving_models.publish(built["qa"], str(models / "realm_qa"), 4)
  outside = tmp_path / "outside"
  serving_models.publish(built["qa"], str(outside / "realm_qa"), 1)
  with running(_config(numeric=str(models / "numeric"))) as (server, channel):
    stub = _models(channel)

    def reload(**config):
      request = model_management_pb2.ReloadConfigRequest(config=_config(**config))
      return stub.HandleReloadConfigRequest(request, timeout=RPC_TIMEOUT)

    reload(numeric=str(models / "numeric"), realm_qa=str(models / "realm_qa"))
    answers = client.ask(_prediction(channel), ["q"], timeout=RPC_TIMEOUT)
    assert answers[0]["model"]["version"] == 4
    health = health_pb2_grpc.HealthStub(channel)
    assert health.Check(health_pb2.HealthCheckRequest(service="realm_qa"),
                        timeout=RPC_TIMEOUT).status == health_pb2.HealthCheckResponse.SERVING

    reload(realm_qa=str(models / "realm_qa"))  # numeric removed
    error = _rpc_error(_prediction(channel).Predict, _numeric_request([[1, 2, 3]]))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert health.Check(health_pb2.HealthCheckRequest(service="numeric"),
                        timeout=RPC_TIMEOUT).status == health_pb2.HealthCheckResponse.NOT_SERVING

    for bad_path, message in ((str(outside / "realm_qa"), "outside the allowed model roots"),
                              (str(models / ".." / "outside" / "realm_qa"), "'..'")):
      error = _rpc_error(stub.HandleReloadConfigRequest,
                         model_management_pb2.ReloadConfigRequest(config=_config(evil=bad_path)))
      assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and message in error.details()
    assert server.manager.model_names() == ["realm_qa"]  # a refused config changes nothing

    error = _rpc_error(stub.HandleReloadConfigRequest, model_management_pb2.ReloadConfigRequest(
        config=_config(realm_qa=str(models / "realm_qa"), empty=str(models / "empty"))))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "'empty'" in error.details()


def test_warmup_requests_are_replayed_before_a_version_serves(built, tmp_path):
  version_dir = serving_models.publish(built["numeric"], str(tmp_path / "numeric"), 1)
  requests = [{"x": np.ones([n, 3], np.float32)} for n in (1, 2, 3)]
  path = write_warmup_requests(version_dir, requests, model_name="numeric")
  assert path == os.path.join(version_dir, "assets.extra", "tf_serving_warmup_requests")
  with pytest.raises(ValueError, match="'wrong'"):
    write_warmup_requests(version_dir, [{"wrong": np.ones([1, 3], np.float32)}], "numeric")
  with pytest.raises(ValueError, match="float64"):
    write_warmup_requests(version_dir, [{"x": np.ones([1, 3])}], "numeric")
  with running(_config(numeric=str(tmp_path / "numeric"))) as (_, channel):
    response = _prediction(channel).Predict(_numeric_request([[1, 2, 3]]), timeout=RPC_TIMEOUT)
    assert _outputs(response)["calls"].tolist() == [4]  # 3 warm-up calls came first


# ------------------------------------------------------------------------------ limits


# A deadline the held model call outlives; long enough for the request to reach its model
# on a loaded machine (it is refused before it does once it has expired).
DEADLINE = 2.0


def test_concurrency_limit_and_deadlines(built, tmp_path):
  base = str(tmp_path / "slow")
  serving_models.publish(built["slow1"], base, 1)
  with running(_config(slow=base), max_concurrent_requests=1,
               request_timeout_seconds=DEADLINE) as (_, channel), held_model_calls() as held:
    stub, x = _prediction(channel), np.array([1.0], np.float32)
    error = _rpc_error(stub.Predict, _request("slow", x=x))
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "--request_timeout_seconds" in error.details()
    assert held.finished == 0  # answered at its deadline, not when the model returned
    # The timed-out computation still holds the only slot until the model returns.
    held.wait_started(1)
    error = _rpc_error(stub.Predict, _request("slow", x=x))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "too many concurrent requests" in error.details()
  with running(_config(slow=base), max_concurrent_requests=2) as (_, channel), \
      held_model_calls() as held:
    stub = _prediction(channel)
    error = _rpc_error(stub.Predict, _request("slow", x=x), timeout=0.2)  # the client's deadline
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    held.release()
    _wait_for(lambda: _try_predict(stub, x), what="the slot to be released")


def _try_predict(stub, x) -> bool:
  try:
    stub.Predict(_request("slow", x=x), timeout=RPC_TIMEOUT)
    return True
  except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
    return False


# ------------------------------------------------------------------------------ batching


def test_batching_merges_concurrent_requests_and_splits_results(built, tmp_path):
  base = str(tmp_path / "numeric")
  version_dir = serving_models.publish(built["numeric"], base, 1)
  batching_file = tmp_path / "batching.config"
  # The batch runs once full; its timeout (60 s) only bounds one that never fills.
  batching_file.write_text("max_batch_size { value: 6 }\nbatch_timeout_micros { value: 60000000 }\n"
                           "num_batch_threads { value: 1 }\nmax_enqueued_batches { value: 4 }\n")
  rows = [np.random.RandomState(i).randn(1 + i % 2, 3).astype(np.float32) for i in range(4)]
  in_process = tf.saved_model.load(version_dir).signatures["serving_default"]
  with running(_config(numeric=base), enable_batching=True,
               batching_parameters_file=str(batching_file)) as (server, channel):
    stub, barrier, results = _prediction(channel), threading.Barrier(len(rows)), {}

    def send(i):
      barrier.wait(RPC_TIMEOUT)
      results[i] = _outputs(stub.Predict(_numeric_request(rows[i]), timeout=RPC_TIMEOUT))

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

    error = _rpc_error(stub.Predict, _numeric_request(np.zeros([7, 3])))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_batch_size 6" in error.details()
    scaled = stub.Predict(_request("numeric", signature="scale", x=np.ones([2, 3], np.float32),
                                   factor=np.float32(3.0)), timeout=RPC_TIMEOUT)
    np.testing.assert_allclose(_outputs(scaled)["y"], np.full([2, 3], 3.0))  # not batchable


def test_batching_queue_bound_is_resource_exhausted(built, tmp_path):
  base = str(tmp_path / "slow")
  serving_models.publish(built["slow1"], base, 1)
  options = config_lib.BatchingOptions(max_batch_size=1, batch_timeout_micros=0,
                                       max_enqueued_batches=1, num_batch_threads=1)
  with running(_config(slow=base), enable_batching=True, batching_options=options) as (
      server, channel), held_model_calls() as held:
    stub, results = _prediction(channel), []

    def send():
      results.append(stub.Predict(_request("slow", x=np.array([1.0], np.float32)),
                                  timeout=RPC_TIMEOUT))

    running_one = threading.Thread(target=send)
    running_one.start()
    held.wait_started(1)  # now running on the only batch thread
    queued_one = threading.Thread(target=send)
    queued_one.start()
    _wait_for(lambda: server.batcher.enqueued_batches == 1,
              what="the one batch allowed in the queue")
    error = _rpc_error(stub.Predict, _request("slow", x=np.array([1.0], np.float32)))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_enqueued_batches=1" in error.details()
    held.release()
    running_one.join(RPC_TIMEOUT)
    queued_one.join(RPC_TIMEOUT)
    assert len(results) == 2


def test_client_deadline_drops_a_request_still_queued_for_a_batch(built, tmp_path):
  base = str(tmp_path / "slow")
  serving_models.publish(built["slow1"], base, 1)
  options = config_lib.BatchingOptions(max_batch_size=1, batch_timeout_micros=0,
                                       max_enqueued_batches=4, num_batch_threads=1)
  with running(_config(slow=base), enable_batching=True, batching_options=options) as (
      server, channel), held_model_calls() as held:
    stub, x = _prediction(channel), np.array([1.0], np.float32)
    first = threading.Thread(target=lambda: stub.Predict(_request("slow", x=x),
                                                         timeout=RPC_TIMEOUT))
    first.start()
    held.wait_started(1)  # the first request occupies the only batch thread
    error = _rpc_error(stub.Predict, _request("slow", x=x), timeout=DEADLINE)
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert server.batcher.enqueued_batches == 1  # it reached the queue, and waits there
    # The server gives the request up at its own copy of the deadline (its version's
    # in-flight count drops); only then may the batch thread come to it.
    _wait_for(lambda: _in_flight(server, "slow", 1) == 1, what="the server to drop it")
    held.release()
    first.join(RPC_TIMEOUT)
    stub.Predict(_request("slow", x=x), timeout=RPC_TIMEOUT)
    # The expired request was dropped from the queue, never run: 2 batches, not 3.
    assert server.batcher.batches_run == 2


# ------------------------------------------------------------------------------ files and flags


def test_config_files_are_parsed_with_the_official_formats_and_errors_name_them(tmp_path):
  config_file = tmp_path / "models.config"
  config_file.write_text('model_config_list { config { name: "a" base_path: "/m/a" '
                         'model_platform: "tensorflow" model_version_policy { all {} } } }')
  config = config_lib.read_model_server_config(str(config_file))
  (spec,) = config_lib.validate_model_server_config(config, "x", [])
  assert (spec.name, spec.base_path, spec.policy.kind) == ("a", "/m/a", "all")

  config_file.write_text("model_config_list { config { nam: 'a' } }")
  with pytest.raises(config_lib.ConfigError, match=str(config_file)):
    config_lib.read_model_server_config(str(config_file))
  batching = tmp_path / "batching.config"
  batching.write_text("max_batch_size { value: 4 } allowed_batch_sizes: 2 "
                      "allowed_batch_sizes: 4 num_batch_threads { value: 2 }")
  options = config_lib.read_batching_parameters(str(batching))
  assert (options.max_batch_size, options.allowed_batch_sizes, options.num_batch_threads,
          options.max_enqueued_batches) == (4, (2, 4), 2, 10)
  for text, message in (("max_batch_size: 4", "not a BatchingParameters"),
                        ("pad_variable_length_inputs: true", "pad_variable_length_inputs"),
                        ("max_batch_size { value: 4 } allowed_batch_sizes: 2", "must equal")):
    batching.write_text(text)
    with pytest.raises(config_lib.ConfigError, match=message) as info:
      config_lib.read_batching_parameters(str(batching))
    assert str(batching) in str(info.value)
  for extra, message in (('model_platform: "pytorch"', "model_platform"),
                         ('model_version_policy { specific {} }', "lists no versions"),
                         ('base_path: "/m/../etc"', "'..'")):
    config = text_format.Parse(
        f'model_config_list {{ config {{ name: "a" {extra} }} }}',
        model_server_config_pb2.ModelServerConfig())
    if "base_path" not in extra:
      config.model_config_list.config[0].base_path = "/m/a"
    with pytest.raises(config_lib.ConfigError, match=message):
      config_lib.validate_model_server_config(config, "models.config", [])


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
      answers = client.ask(_prediction(channel), ["who wrote the iliad?"], timeout=RPC_TIMEOUT)
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


def test_client_command_line_prints_answers_and_provenance(qa_server, capsys):
  server, _, _ = qa_server
  address = f"127.0.0.1:{server.port}"
  assert client.main(["--server", address, "--top_blocks", "2", "who wrote the iliad?"]) == 0
  printed = capsys.readouterr().out
  assert printed.startswith("Q: who wrote the iliad?\nA: v1:WHO WROTE THE ILIAD? (score ")
  assert "p(z|x)=" in printed and "← answer" in printed and "Title " in printed
  assert client.main(["--server", address, "--json", "a", "b"]) == 0
  answers = json.loads(capsys.readouterr().out)
  assert [a["question"] for a in answers] == ["a", "b"]
  assert client.main(["--server", address, "--model", "nope", "a"]) == 1
  assert "NOT_FOUND" in capsys.readouterr().err


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
