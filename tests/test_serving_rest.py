"""serving.rest: TF Serving's JSON API, answering exactly what gRPC answers."""
import base64
import http.client
import json
import threading

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc
from tensorflow_serving.config import model_server_config_pb2

from serving.server import ModelServer, ServerOptions
from tests import serving_models

TIMEOUT = 10.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
  built = tmp_path_factory.mktemp("built")
  models = tmp_path_factory.mktemp("models")
  serving_models.publish(serving_models.save_fake_realm_qa(str(built / "qa")),
                         str(models / "realm_qa"), 1)
  serving_models.publish(serving_models.save_numeric(str(built / "numeric")),
                         str(models / "numeric"), 3)
  config = model_server_config_pb2.ModelServerConfig()
  for name in ("realm_qa", "numeric"):
    model = config.model_config_list.config.add(name=name, base_path=str(models / name),
                                                model_platform="tensorflow")
    if name == "numeric":
      model.version_labels["stable"] = 3
  options = ServerOptions(model_server_config=config, port=0, rest_api_port=0,
                          file_system_poll_wait_seconds=0, max_message_bytes=1 << 20,
                          max_batch_size=8)
  with ModelServer(options) as running:
    with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
      yield running, prediction_service_pb2_grpc.PredictionServiceStub(channel)


def _http(server, method, path, body=None, raw=None, headers=None):
  connection = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=TIMEOUT)
  try:
    payload = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    connection.request(method, path, body=payload, headers=headers or {})
    response = connection.getresponse()
    return response.status, json.loads(response.read() or b"null")
  finally:
    connection.close()


def _grpc_predict(stub, model, signature="", **inputs) -> dict:
  request = predict_pb2.PredictRequest()
  request.model_spec.name = model
  request.model_spec.signature_name = signature
  for name, value in inputs.items():
    request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
  response = stub.Predict(request, timeout=TIMEOUT)
  return {name: tf.make_ndarray(proto) for name, proto in response.outputs.items()}


def _as_json_values(value):
  if isinstance(value, bytes):
    return value.decode()
  return [_as_json_values(item) for item in value]


def test_row_format_predict_matches_grpc(server):
  running, stub = server
  questions = ["who wrote the iliad?", "", "when?"]
  status, body = _http(running, "POST", "/v1/models/realm_qa:predict",
                       {"instances": questions})
  assert status == 200, body
  want = _grpc_predict(stub, "realm_qa",
                       question=np.array([q.encode() for q in questions], dtype=object))
  assert len(body["predictions"]) == len(questions)
  for row, prediction in enumerate(body["predictions"]):
    assert sorted(prediction) == sorted(want)
    for name, values in want.items():
      if values.dtype == object:
        assert prediction[name] == _as_json_values(values[row]), name
      else:
        np.testing.assert_array_equal(np.asarray(prediction[name], values.dtype), values[row])


def test_columnar_format_named_inputs_and_b64(server):
  running, stub = server
  x = np.arange(6, dtype=np.float32).reshape(2, 3) / 3
  status, body = _http(running, "POST", "/v1/models/numeric/labels/stable:predict",
                       {"signature_name": "scale", "inputs": {"x": x.tolist(), "factor": 2.5}})
  assert status == 200, body
  want = _grpc_predict(stub, "numeric", "scale", x=x, factor=np.float32(2.5))
  np.testing.assert_array_equal(np.asarray(body["outputs"], np.float32), want["y"])

  encoded = base64.b64encode("¿quién?".encode()).decode()
  status, body = _http(running, "POST", "/v1/models/realm_qa/versions/1:predict",
                       {"inputs": [{"b64": encoded}]})
  assert status == 200, body
  assert body["outputs"]["answer"] == ["v1:¿QUIéN?"]  # tf.strings.upper is ASCII-only


def test_status_and_metadata(server):
  running, _ = server
  assert _http(running, "GET", "/v1/models/numeric") == (200, {"model_version_status": [
      {"version": "3", "state": "AVAILABLE", "status": {"error_code": "OK",
                                                          "error_message": ""}}]})
  status, body = _http(running, "GET", "/v1/models/numeric/versions/3/metadata")
  assert status == 200
  assert body["model_spec"] == {"name": "numeric", "version": "3"}
  signatures = body["metadata"]["signature_def"]["signature_def"]
  assert sorted(signatures) == ["scale", "serving_default"]
  assert signatures["scale"]["inputs"]["factor"]["dtype"] == "DT_FLOAT"
  assert _http(running, "GET", "/v1/models/numeric/versions/4")[0] == 404


ERRORS = [
    ("unknown model", "POST", "/v1/models/nope:predict", {"instances": [1]}, 404, "'nope'"),
    ("unknown route", "GET", "/v2/whatever", None, 404, "no such REST route"),
    ("unknown version", "POST", "/v1/models/realm_qa/versions/9:predict",
     {"instances": ["q"]}, 404, "version 9"),
    ("no instances", "POST", "/v1/models/realm_qa:predict", {"signature_name": ""}, 400,
     "exactly one of"),
    ("wrong input name", "POST", "/v1/models/numeric:predict",
     {"inputs": {"z": [[1, 2, 3]]}}, 400, "'z'"),
    ("ragged", "POST", "/v1/models/numeric:predict", {"instances": [[1, 2, 3], [1, 2]]}, 400,
     "ragged"),
    ("strings for numbers", "POST", "/v1/models/numeric:predict",
     {"instances": [["1", "2", "3"]]}, 400, "expects float32 numbers"),
    ("numbers for strings", "POST", "/v1/models/realm_qa:predict", {"instances": [3]}, 400,
     "expects strings"),
    ("empty batch", "POST", "/v1/models/realm_qa:predict", {"inputs": []}, 400,
     "empty batch"),
    ("oversized batch", "POST", "/v1/models/realm_qa:predict", {"instances": ["q"] * 9}, 400,
     "more than the maximum 8"),
    ("unbatched input in rows", "POST", "/v1/models/numeric:predict",
     {"signature_name": "scale", "instances": [{"x": [1, 2, 3], "factor": 2.0}]}, 400,
     "'factor'"),
    ("classify", "POST", "/v1/models/numeric:classify", {"examples": []}, 501, "classify"),
]


@pytest.mark.parametrize("case", ERRORS, ids=[case[0] for case in ERRORS])
def test_errors_are_json_with_http_status(server, case):
  running, _ = server
  _, method, path, body, want_status, message = case
  status, answer = _http(running, method, path, body)
  assert status == want_status, answer
  assert message in answer["error"]


def test_body_limits(server):
  running, _ = server
  status, answer = _http(running, "POST", "/v1/models/realm_qa:predict", raw=b"{not json")
  assert status == 400 and "not JSON" in answer["error"]
  big = json.dumps({"instances": ["x" * (2 << 20)]}).encode()  # 2 MiB > 1 MiB
  status, answer = _http(running, "POST", "/v1/models/realm_qa:predict", raw=big)
  assert status == 413 and "--max_message_bytes" in answer["error"]


def test_concurrent_clients_beyond_the_threads_wait_and_are_answered(server):
  """More clients at once than --rest_api_num_threads: the excess connections wait in the
  listen backlog and are answered in turn; none is refused or reset (with the standard
  library's backlog of 5, 32 clients at once, as in benchmarks/serving.py, would be)."""
  running, _ = server
  clients = 48  # > rest_api_num_threads (4 per CPU) + the standard library's backlog of 5
  connected = threading.Barrier(clients)
  results, lock = [], threading.Lock()
  body = json.dumps({"instances": ["where is the river?"]}).encode()

  def work():
    connection = http.client.HTTPConnection("127.0.0.1", running.rest_port, timeout=30)
    try:
      connection.connect()
      # Every client holds its connection open before any sends: the server's threads
      # each wait on a request, so every other connection has to wait in the backlog.
      connected.wait(timeout=20)
      connection.request("POST", "/v1/models/realm_qa:predict", body=body)
      response = connection.getresponse()
      outcome = response.status, json.loads(response.read())
    except Exception as e:  # pylint: disable=broad-except  reported by the assertion
      outcome = repr(e), None
    finally:
      connection.close()
    with lock:
      results.append(outcome)

  threads = [threading.Thread(target=work) for _ in range(clients)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=90)
  failures = [status for status, _ in results if status != 200]
  assert len(results) == clients and not failures, failures[:3]
  assert all("predictions" in answer for _, answer in results)
