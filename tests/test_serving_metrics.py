"""serving.metrics behind a running server: the Prometheus endpoint of
--monitoring_config_file, scraped and parsed with prometheus_client's own parser after good,
refused and failed requests over gRPC and REST, a version hand-over and a broken version,
each counter moving by exactly what was sent; the access log's one line per request; and
the configurations refused (monitoring without REST, a bad monitoring file, logging_config)."""
import http.client
import json
import logging
import os
from unittest import mock

import grpc
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from prometheus_client import parser
from tensorflow_serving.apis import model_management_pb2

from serving import config as config_lib
from serving import servable as servable_lib
from serving.server import ModelServer, ServerOptions, parse_flags
from tests import serving_models
from tests.serving_harness import (
    AVAILABLE, END, RPC_TIMEOUT, model_service_stub, numeric_request, predict_request,
    prediction_stub, rpc_error, running, server_config)

METRICS_PATH = "/metrics/of/realm"
MONITORING = f'prometheus_config {{ enable: true, path: "{METRICS_PATH}" }}'


def _monitoring_file(tmp_path, text=MONITORING):
  path = tmp_path / "monitoring.config"
  path.write_text(text)
  return str(path)


def _http(server, method, path, body=None, headers=None):
  """(status, body bytes, Content-Type) of one HTTP request to the REST port."""
  connection = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=RPC_TIMEOUT)
  try:
    payload = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    connection.request(method, path, body=payload, headers=headers or {})
    response = connection.getresponse()
    return response.status, response.read(), response.getheader("Content-Type")
  finally:
    connection.close()


def scrape(server, path=METRICS_PATH) -> dict:
  """{(sample name, ((label, value), ...)): value} of one scrape, parsed by prometheus_client."""
  status, body, content_type = _http(server, "GET", path)
  assert status == 200, body
  assert content_type.startswith("text/plain"), content_type
  samples = {}
  for family in parser.text_string_to_metric_families(body.decode("utf-8")):
    for sample in family.samples:
      samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
  return samples


def value(samples, name, **labels) -> float:
  return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples, name) -> float:
  """The sum of `name` over all its label sets."""
  return sum(v for (sample, _), v in samples.items() if sample == name)


def delta(before, after, name, **labels) -> float:
  return value(after, name, **labels) - value(before, name, **labels)


REQUESTS = ":tensorflow:serving:request_count_total"
BY_SIGNATURE = "realm_tf_serving_requests_total"
LATENCY_COUNT = ":tensorflow:serving:request_latency_count"
LOADS = ":tensorflow:cc:saved_model:load_attempt_count_total"
LOAD_LATENCY = ":tensorflow:cc:saved_model:load_latency_total"
WARMUP_COUNT = ":tensorflow:serving:model_warmup_latency_count"
BATCHES = ":tensorflow:serving:batching_session:wrapped_run_count_total"
QUEUED_COUNT = ":tensorflow:serving:batching_session:queuing_latency_count"
INPUT_SIZE_COUNT = ":tensorflow:serving:batching_session:input_batch_size_count"
PROCESSED_SIZE_SUM = ":tensorflow:serving:batching_session:processed_batch_size_sum"
ENQUEUED = "realm_tf_serving_batching_enqueued_batches"


def _failing_run(signature, inputs):
  raise tf.errors.InternalError(None, None, "the model failed on purpose")


def test_scrape_counts_good_refused_and_failed_requests_loads_and_batches(built, tmp_path):
  base = tmp_path / "numeric"
  serving_models.publish(built["numeric"], str(base), 1)
  batching = config_lib.BatchingOptions(max_batch_size=8, batch_timeout_micros=0,
                                        num_batch_threads=1)
  with running(server_config(numeric=str(base)), rest_api_port=0, enable_batching=True,
               batching_options=batching,
               monitoring_config_file=_monitoring_file(tmp_path)) as (server, channel):
    stub = prediction_stub(channel)
    start = scrape(server)
    path1, path2, path3 = (os.path.join(str(base), str(v)) for v in (1, 2, 3))
    assert value(start, LOADS, model_path=path1, status="success") == 1
    assert value(start, LOAD_LATENCY, model_path=path1) > 0
    assert value(start, WARMUP_COUNT, model_path=path1, status="OK") == 1
    assert value(start, REQUESTS, model_name="numeric", status="OK") == 0

    # Good: 3 gRPC (1, 2 and 1 rows) and 2 REST (1 row each) on version 1.
    for rows in ([[1, 2, 3]], [[1, 2, 3], [4, 5, 6]], [[0, 0, 0]]):
      stub.Predict(numeric_request(rows), timeout=RPC_TIMEOUT)
    for _ in range(2):
      status, body, _ = _http(server, "POST", "/v1/models/numeric:predict",
                              {"instances": [[1.0, 2.0, 3.0]]})
      assert status == 200, body
    # Refused: an unknown model, an unknown input (gRPC), a body that is not JSON (REST).
    assert rpc_error(stub.Predict, predict_request(
        "no_such_model", x=np.zeros([1, 3], np.float32))).code() == grpc.StatusCode.NOT_FOUND
    assert rpc_error(stub.Predict, predict_request(
        "numeric", wrong=np.zeros([1, 3], np.float32))).code() == (
            grpc.StatusCode.INVALID_ARGUMENT)
    assert _http(server, "POST", "/v1/models/numeric:predict", b"{not json")[0] == 400
    # Failed: the model itself fails while running (one gRPC, one REST request).
    with mock.patch.object(servable_lib.Signature, "run", _failing_run):
      assert rpc_error(stub.Predict, numeric_request([[1, 2, 3]])).code() == (
          grpc.StatusCode.INTERNAL)
      assert _http(server, "POST", "/v1/models/numeric:predict",
                   {"instances": [[1.0, 2.0, 3.0]]})[0] == 500
    # Hand-over: version 2 replaces version 1 and answers one request.
    serving_models.publish(built["numeric"], str(base), 2)
    server.manager.poll()
    server.manager.wait_for_retirements(RPC_TIMEOUT)
    assert {s.version: s.state for s in server.manager.status("numeric")} == {
        1: END, 2: AVAILABLE}
    assert stub.Predict(numeric_request([[1, 2, 3]]), timeout=RPC_TIMEOUT
                        ).model_spec.version.value == 2
    # A broken version 3 fails to load; version 2 keeps serving.
    serving_models.publish_broken(str(base), 3)
    server.manager.poll()
    end = scrape(server)

  def moved(name, **labels):
    return delta(start, end, name, **labels)

  # TF Serving's request count, by model and status (an unknown model is counted as "").
  assert moved(REQUESTS, model_name="numeric", status="OK") == 6
  assert moved(REQUESTS, model_name="numeric", status="INVALID_ARGUMENT") == 2
  assert moved(REQUESTS, model_name="numeric", status="INTERNAL") == 2
  assert moved(REQUESTS, model_name="", status="NOT_FOUND") == 1
  assert total(end, REQUESTS) - total(start, REQUESTS) == 11  # and nothing else
  # realm_tf's count, by version, signature, API and entrypoint as well.
  predict = dict(model_name="numeric", signature_name="serving_default", API="Predict")
  assert moved(BY_SIGNATURE, version="1", entrypoint="GRPC", status="OK", **predict) == 3
  assert moved(BY_SIGNATURE, version="1", entrypoint="REST", status="OK", **predict) == 2
  assert moved(BY_SIGNATURE, version="2", entrypoint="GRPC", status="OK", **predict) == 1
  assert moved(BY_SIGNATURE, version="1", entrypoint="GRPC", status="INVALID_ARGUMENT",
               **predict) == 1
  assert moved(BY_SIGNATURE, version="1", entrypoint="GRPC", status="INTERNAL", **predict) == 1
  assert moved(BY_SIGNATURE, version="1", entrypoint="REST", status="INTERNAL", **predict) == 1
  # The body that is not JSON never reached a version or signature.
  assert moved(BY_SIGNATURE, model_name="numeric", version="", signature_name="",
               API="Predict", entrypoint="REST", status="INVALID_ARGUMENT") == 1
  # Latency histograms count the answered requests, per entrypoint (as TF Serving).
  assert moved(LATENCY_COUNT, model_name="numeric", API="Predict", entrypoint="GRPC") == 4
  assert moved(LATENCY_COUNT, model_name="numeric", API="Predict", entrypoint="REST") == 2
  # Loads: version 2 loaded and warmed up once, version 3 failed once.
  assert moved(LOADS, model_path=path2, status="success") == 1
  assert moved(LOAD_LATENCY, model_path=path2) > 0
  assert moved(WARMUP_COUNT, model_path=path2, status="OK") == 1
  assert moved(LOADS, model_path=path3, status="fail") == 1
  assert moved(LOADS, model_path=path3, status="success") == 0
  # Batching: every request that reached the model ran as one batch of its own rows
  # (sent one after another): 6 good + 2 failed batches of 1+2+1+1+1+1+1+1 = 9 rows.
  assert moved(BATCHES) == 8
  assert moved(QUEUED_COUNT, thread_pool_name="batch_threads") == 8
  assert moved(INPUT_SIZE_COUNT) == 8
  assert moved(PROCESSED_SIZE_SUM) == 9
  assert value(end, ENQUEUED) == 0


def test_access_log_has_one_line_per_request_on_both_front_ends(qa_server, caplog):
  server, channel, _ = qa_server
  stub = prediction_stub(channel)
  with caplog.at_level(logging.INFO, logger="serving.access"):
    stub.Predict(predict_request("realm_qa", version=1,
                                 question=np.array([b"who?"], dtype=object)),
                 timeout=RPC_TIMEOUT)
    rpc_error(stub.Predict, predict_request("numeric", signature="no_such_signature",
                                            x=np.zeros([1, 3], np.float32)))
    assert _http(server, "GET", "/v1/models/numeric/metadata")[0] == 200
    assert _http(server, "POST", "/v1/models/numeric/labels/none:predict",
                 {"instances": [[1.0, 2.0, 3.0]]})[0] == 404
    # Without a monitoring config the metrics path is no route: refused, and logged as any.
    assert _http(server, "GET", config_lib.DEFAULT_PROMETHEUS_PATH)[0] == 404
  lines = [r.getMessage() for r in caplog.records if r.name == "serving.access"]
  assert len(lines) == 5, lines
  assert all(r.levelno == logging.INFO for r in caplog.records if r.name == "serving.access")
  assert lines[0].startswith("GRPC Predict model='realm_qa' version=1 requested_version='1' "
                             "signature='serving_default' status=OK latency_ms=")
  assert lines[1].startswith("GRPC Predict model='numeric' version=1 requested_version='' "
                             "signature='' status=FAILED_PRECONDITION latency_ms="), lines[1]
  assert lines[2].startswith("REST GetModelMetadata model='numeric' version=1 ")
  assert "status=OK" in lines[2]
  assert lines[3].startswith("REST Predict model='numeric' version=- "
                             "requested_version='label none' signature='' status=NOT_FOUND ")
  assert lines[4].startswith("REST - model='' ") and "status=NOT_FOUND" in lines[4]
  for line in lines:
    assert float(line.rsplit("latency_ms=", 1)[1]) >= 0


def test_metrics_path_defaults_and_registries_are_per_server(built, tmp_path):
  base = tmp_path / "numeric"
  serving_models.publish(built["numeric"], str(base), 1)
  monitoring = _monitoring_file(tmp_path, "prometheus_config { enable: true }")
  config = server_config(numeric=str(base))
  with running(config, rest_api_port=0, monitoring_config_file=monitoring) as (first, channel):
    prediction_stub(channel).Predict(numeric_request([[1, 2, 3]]), timeout=RPC_TIMEOUT)
    with running(config, rest_api_port=0, monitoring_config_file=monitoring) as (second, _):
      mine = scrape(first, config_lib.DEFAULT_PROMETHEUS_PATH)
      other = scrape(second, config_lib.DEFAULT_PROMETHEUS_PATH)
    assert value(mine, REQUESTS, model_name="numeric", status="OK") == 1
    assert value(other, REQUESTS, model_name="numeric", status="OK") == 0
    # OpenMetrics for a scraper that asks for it, from the same registry.
    status, body, content_type = _http(first, "GET", config_lib.DEFAULT_PROMETHEUS_PATH,
                                       headers={"Accept": "application/openmetrics-text"})
    assert status == 200 and content_type.startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")


def test_monitoring_without_rest_and_bad_monitoring_files_are_refused(built, tmp_path):
  base = tmp_path / "numeric"
  serving_models.publish(built["numeric"], str(base), 1)
  options = dict(model_server_config=server_config(numeric=str(base)), port=0)
  with pytest.raises(config_lib.ConfigError, match="--rest_api_port"):
    ModelServer(ServerOptions(monitoring_config_file=_monitoring_file(tmp_path),
                              **options)).start()
  # Disabled monitoring needs no REST port.
  disabled = _monitoring_file(tmp_path, "prometheus_config { enable: false }")
  assert config_lib.read_monitoring_config(disabled) == config_lib.MonitoringOptions(False)
  for text, message in [("prometheus_config { enable: true, port: 9 }", "port"),
                        ('prometheus_config { enable: true, path: "metrics" }', "absolute"),
                        ('prometheus_config { enable: true, path: "/v1/models/m" }', "/v1/")]:
    path = _monitoring_file(tmp_path, text)
    with pytest.raises(config_lib.ConfigError, match=message) as info:
      config_lib.read_monitoring_config(path)
    assert path in str(info.value)
  with pytest.raises(config_lib.ConfigError, match="cannot read"):
    config_lib.read_monitoring_config(str(tmp_path / "missing.config"))
  flags = parse_flags(["server", "--monitoring_config_file=/etc/m.config", "--rest_api_port=1"])
  assert flags.monitoring_config_file == "/etc/m.config"


def test_logging_config_is_refused_at_start_and_on_reload(built, tmp_path):
  base = tmp_path / "numeric"
  serving_models.publish(built["numeric"], str(base), 1)
  logged = server_config(numeric=str(base))
  text_format.Parse('log_collector_config { type: "file" filename_prefix: "/tmp/log" } '
                    'sampling_config { sampling_rate: 1.0 }',
                    logged.model_config_list.config[0].logging_config)
  config_file = tmp_path / "models.config"
  config_file.write_text(text_format.MessageToString(logged))
  with pytest.raises(config_lib.ConfigError, match="model 'numeric': logging_config") as info:
    ModelServer(ServerOptions(model_config_file=str(config_file), port=0)).start()
  assert str(config_file) in str(info.value)
  with running(server_config(numeric=str(base))) as (_, channel):
    request = model_management_pb2.ReloadConfigRequest(config=logged)
    error = rpc_error(model_service_stub(channel).HandleReloadConfigRequest, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "logging_config" in error.details() and "'numeric'" in error.details()
