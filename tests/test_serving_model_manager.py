"""serving.model_manager behind a running server: versions picked up under load, retired
only after their requests in flight, either aspired-version policy, broken versions never
replacing a serving one, version policies and labels, config reloads inside the model
root."""
import logging
import os
import threading

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1 import health_pb2_grpc
import numpy as np
import pytest
from tensorflow_serving.apis import model_management_pb2

from realm_tf.export.serving_warmup import write_warmup_requests
from serving import client
from serving import config as config_lib
from serving.server import ServerOptions
from tests import serving_models
from tests.serving_harness import (
    AVAILABLE, END, RPC_TIMEOUT, UNLOADING, WAIT_SECONDS, held_model_calls, in_flight,
    model_service_stub, model_status, numeric_request, outputs_of, predict_request,
    prediction_stub, rpc_error, running, server_config, wait_for)



def test_new_version_under_load_is_picked_up_with_zero_failures(built, tmp_path):
  base = str(tmp_path / "slow")
  serving_models.publish(built["slow1"], base, 1)
  # Version 2 spends a while LOADING (its warm-up replays slow requests): the window in
  # which a server that retired version 1 too early would fail requests.
  staged = serving_models.publish(built["slow2"], str(tmp_path / "staging"), 2)
  write_warmup_requests(staged, [{"x": np.ones([1], np.float32)}] * 4, model_name="slow")
  with running(server_config(slow=base), file_system_poll_wait_seconds=0.1) as (server, channel):
    stub = prediction_stub(channel)
    stop, failures, answered = threading.Event(), [], []

    def send(seed):
      x = np.array([seed, seed + 0.5], np.float32)
      while not stop.is_set():
        try:
          response = stub.Predict(predict_request("slow", x=x), timeout=RPC_TIMEOUT)
          version = response.model_spec.version.value
          # The answer comes from the version the response names (offset = version).
          np.testing.assert_allclose(outputs_of(response)["y"], x + version)
          answered.append(version)
        except Exception as e:  # pylint: disable=broad-except
          failures.append(repr(e))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(6)]
    for thread in threads:
      thread.start()
    try:
      wait_for(lambda: len(answered) >= 8, what="traffic on version 1")
      serving_models.publish(staged, base, 2)
      wait_for(lambda: model_status(channel, "slow") == {1: (END, ""), 2: (AVAILABLE, "")},
               what="version 2 AVAILABLE and version 1 END")
      seen = len(answered)
      wait_for(lambda: len(answered) >= seen + 8, what="traffic on version 2")
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
  with running(server_config(slow=base)) as (server, channel), held_model_calls() as held:
    results = []
    thread = threading.Thread(target=lambda: results.append(prediction_stub(channel).Predict(
        predict_request("slow", version=1, x=np.array([3.0], np.float32)), timeout=RPC_TIMEOUT)))
    thread.start()
    wait_for(lambda: in_flight(server, "slow", 1) == 1, what="the request to start")
    serving_models.publish(built["slow1"], base, 2)
    server.manager.poll()  # loads 2, retires 1 while its request still runs
    assert model_status(channel, "slow")[1][0] == UNLOADING
    assert model_status(channel, "slow")[2][0] == AVAILABLE
    held.release()
    thread.join(RPC_TIMEOUT)
    assert results[0].model_spec.version.value == 1
    np.testing.assert_allclose(outputs_of(results[0])["y"], [3.0])
    server.manager.wait_for_retirements(RPC_TIMEOUT)
    assert model_status(channel, "slow")[1][0] == END
    error = rpc_error(prediction_stub(channel).Predict,
                      predict_request("slow", version=1, x=np.array([3.0], np.float32)))
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_resource_preserving_policy_retires_the_old_version_before_loading(built, tmp_path):
  """--aspired_version_policy=resource_preserving: the old version is END (its request in
  flight answered) before the new one loads, so one version is resident at a time; a new
  version that fails to load hands the model back to the old one."""
  base = str(tmp_path / "slow")
  serving_models.publish(built["slower"], base, 1)  # 0.7 s per request
  with running(server_config(slow=base), aspired_version_policy="resource_preserving") as (
      server, channel), held_model_calls() as held:
    results = []
    thread = threading.Thread(target=lambda: results.append(prediction_stub(channel).Predict(
        predict_request("slow", x=np.array([3.0], np.float32)), timeout=RPC_TIMEOUT)))
    thread.start()
    wait_for(lambda: in_flight(server, "slow", 1) == 1, what="the request to start")
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
      wait_for(lambda: model_status(channel, "slow")[1][0] == UNLOADING, what="version 1 retiring")
      assert loaded_while == []  # version 2 waits for version 1's request
      held.release()
      poller.join(WAIT_SECONDS)
    finally:
      type(server.manager)._load = original  # pylint: disable=protected-access
    thread.join(RPC_TIMEOUT)
    assert results[0].model_spec.version.value == 1
    assert loaded_while == [{1: "END"}]
    assert model_status(channel, "slow") == {1: (END, ""), 2: (AVAILABLE, "")}
    response = prediction_stub(channel).Predict(
        predict_request("slow", x=np.array([1.0], np.float32)), timeout=RPC_TIMEOUT)
    assert response.model_spec.version.value == 2
    broken = os.path.join(base, "3")
    os.makedirs(broken)
    with open(os.path.join(broken, "saved_model.pb"), "wb") as f:
      f.write(b"not a saved model")
    server.manager.poll()  # 2 retired, 3 fails, 2 loads again
    assert model_status(channel, "slow")[2][0] == AVAILABLE
    assert model_status(channel, "slow")[3][0] == END
  with pytest.raises(config_lib.ConfigError, match="aspired_version_policy"):
    ServerOptions(aspired_version_policy="newest_first")


def test_broken_version_never_replaces_the_serving_one(built, tmp_path, caplog):
  base = tmp_path / "numeric"
  serving_models.publish(built["numeric"], str(base), 1)
  with running(server_config(numeric=str(base))) as (server, channel):
    stub = prediction_stub(channel)

    def serving_version():
      response = stub.Predict(numeric_request([[1, 2, 3]]), timeout=RPC_TIMEOUT)
      return response.model_spec.version.value

    serving_models.publish_broken(str(base), 2)
    server.manager.poll()
    status = model_status(channel, "numeric")
    assert status[1][0] == AVAILABLE and status[2][0] == END
    assert "/2" in status[2][1] and status[2][1]
    assert serving_version() == 1

    bad_warmup = serving_models.publish(built["numeric"], str(base), 3)
    serving_models.write_raw_warmup(bad_warmup, {"wrong": np.zeros([1, 3], np.float32)})
    server.manager.poll()
    status = model_status(channel, "numeric")
    assert status[3][0] == END
    assert "tf_serving_warmup_requests: record 0" in status[3][1] and "'wrong'" in status[3][1]
    assert serving_version() == 1

    outside = tmp_path / "elsewhere"
    serving_models.publish(built["numeric"], str(outside), 1)
    os.symlink(str(outside / "1"), str(base / "4"))
    (base / "latest").mkdir()  # not an integer: not a version
    server.manager.poll()
    status = model_status(channel, "numeric")
    assert status[4][0] == END and "outside the base path" in status[4][1]
    assert set(status) == {1, 2, 3, 4}
    assert serving_version() == 1

    caplog.set_level(logging.INFO, logger="serving.model_manager")
    caplog.clear()
    server.manager.poll()  # failed versions are not retried while unchanged
    assert model_status(channel, "numeric") == status
    assert not [r for r in caplog.records if "loading version" in r.getMessage()]

    serving_models.publish(built["numeric"], str(base), 5)
    server.manager.poll()
    assert [r for r in caplog.records if "loading version 5" in r.getMessage()]
    server.manager.wait_for_retirements(RPC_TIMEOUT)
    status = model_status(channel, "numeric")
    assert status[5][0] == AVAILABLE and status[1][0] == END
    assert serving_version() == 5

    # A policy naming only a broken version does not take the serving one away either.
    policy = "model_version_policy { specific { versions: 2 } }"
    model_service_stub(channel).HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(
        config=server_config(numeric=(str(base), policy))), timeout=RPC_TIMEOUT)
    assert serving_version() == 5


def test_version_policies_and_labels_by_config_reload(built, tmp_path):
  base = str(tmp_path / "numeric")
  for version in (1, 2, 3):
    serving_models.publish(built["numeric"], base, version)
  with running(server_config(numeric=base)) as (server, channel):
    def available():
      server.manager.wait_for_retirements(RPC_TIMEOUT)
      return sorted(v for v, (state, _) in model_status(channel, "numeric").items()
                    if state == AVAILABLE)

    def reload(policy):
      request = model_management_pb2.ReloadConfigRequest(
          config=server_config(numeric=(base, policy)))
      return model_service_stub(channel).HandleReloadConfigRequest(request, timeout=RPC_TIMEOUT)

    assert available() == [3]  # TF Serving's default: latest 1
    reload("model_version_policy { latest { num_versions: 2 } }")
    assert available() == [2, 3]
    reload("model_version_policy { specific { versions: 1 versions: 3 } } "
           'version_labels { key: "stable" value: 1 }')
    assert available() == [1, 3]
    request = numeric_request([[1, 2, 3]])
    request.model_spec.version_label = "stable"
    stub = prediction_stub(channel)
    assert stub.Predict(request, timeout=RPC_TIMEOUT).model_spec.version.value == 1
    assert stub.Predict(numeric_request([[1, 2, 3]]), timeout=RPC_TIMEOUT
                        ).model_spec.version.value == 3
    reload("model_version_policy { all {} }")
    assert available() == [1, 2, 3]
    response = stub.Predict(numeric_request([[1, 2, 3]], version=2), timeout=RPC_TIMEOUT)
    assert response.model_spec.version.value == 2


def test_reload_config_adds_and_removes_models_inside_the_model_root(built, tmp_path):
  models = tmp_path / "models"
  serving_models.publish(built["numeric"], str(models / "numeric"), 1)
  serving_models.publish(built["qa"], str(models / "realm_qa"), 4)
  outside = tmp_path / "outside"
  serving_models.publish(built["qa"], str(outside / "realm_qa"), 1)
  with running(server_config(numeric=str(models / "numeric"))) as (server, channel):
    stub = model_service_stub(channel)

    def reload(**config):
      request = model_management_pb2.ReloadConfigRequest(config=server_config(**config))
      return stub.HandleReloadConfigRequest(request, timeout=RPC_TIMEOUT)

    reload(numeric=str(models / "numeric"), realm_qa=str(models / "realm_qa"))
    answers = client.ask(prediction_stub(channel), ["q"], timeout=RPC_TIMEOUT)
    assert answers[0]["model"]["version"] == 4
    health = health_pb2_grpc.HealthStub(channel)
    assert health.Check(health_pb2.HealthCheckRequest(service="realm_qa"),
                        timeout=RPC_TIMEOUT).status == health_pb2.HealthCheckResponse.SERVING

    reload(realm_qa=str(models / "realm_qa"))  # numeric removed
    error = rpc_error(prediction_stub(channel).Predict, numeric_request([[1, 2, 3]]))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert health.Check(health_pb2.HealthCheckRequest(service="numeric"),
                        timeout=RPC_TIMEOUT).status == health_pb2.HealthCheckResponse.NOT_SERVING

    for bad_path, message in ((str(outside / "realm_qa"), "outside the allowed model roots"),
                              (str(models / ".." / "outside" / "realm_qa"), "'..'")):
      error = rpc_error(stub.HandleReloadConfigRequest, model_management_pb2.ReloadConfigRequest(
          config=server_config(evil=bad_path)))
      assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and message in error.details()
    assert server.manager.model_names() == ["realm_qa"]  # a refused config changes nothing

    error = rpc_error(stub.HandleReloadConfigRequest, model_management_pb2.ReloadConfigRequest(
        config=server_config(realm_qa=str(models / "realm_qa"), empty=str(models / "empty"))))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "'empty'" in error.details()
