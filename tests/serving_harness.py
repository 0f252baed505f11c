"""What the serving tests share: the tiny models built once per test process, a server on
127.0.0.1 with the official TF Serving stubs, request and status helpers, and waits on a
state (never on the clock).

  BuiltModels       tiny models by name (tests.serving_models), built on first use
  running           a ModelServer on free ports and a channel to it
  serving_qa        realm_qa and numeric, version 1 each, REST on, small request caps
  held_model_calls  every model call held at its start until the test releases it
  wait_for          polls a condition until a generous deadline
"""
import contextlib
import os
import threading
import time
import uuid
from unittest import mock

import grpc
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.framework import tensor_pb2
from tensorflow_serving.apis import get_model_status_pb2
from tensorflow_serving.apis import model_service_pb2_grpc
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc
from tensorflow_serving.config import model_server_config_pb2

from serving import servable as servable_lib
from serving.server import ModelServer, ServerOptions
from tests import serving_models

AVAILABLE = get_model_status_pb2.ModelVersionStatus.AVAILABLE
UNLOADING = get_model_status_pb2.ModelVersionStatus.UNLOADING
END = get_model_status_pb2.ModelVersionStatus.END
RPC_TIMEOUT = 10.0
WAIT_SECONDS = 60.0  # for a state a test waits on: generous, as the machine may be loaded
# A deadline a held model call outlives; long enough for the request to reach its model on
# a loaded machine (a request whose deadline has passed is refused before it does).
DEADLINE = 2.0

_BUILDERS = {
    "qa": lambda path: serving_models.save_fake_realm_qa(path, "v1"),
    "numeric": serving_models.save_numeric,
    "slow1": lambda path: serving_models.save_slow(path, delay_ms=30, offset=1.0),
    "slow2": lambda path: serving_models.save_slow(path, delay_ms=30, offset=2.0),
    "slower": lambda path: serving_models.save_slow(path, delay_ms=700, offset=0.0),
}


class BuiltModels:
  """{name: SavedModel path} for qa, numeric, slow1, slow2 (30 ms per call, offsets 1 and 2)
  and slower (700 ms, offset 0); tests publish copies as versions.

  Each is built on first use, once per test process: the modules a process runs share
  them through pytest's base temp (one per xdist worker), so a module pays only for the
  models it uses.
  """

  def __init__(self, tmp_path_factory):
    self.root = tmp_path_factory.getbasetemp() / "serving-built"

  def __getitem__(self, name: str) -> str:
    path = self.root / name
    if not path.exists():
      self.root.mkdir(exist_ok=True)
      tmp = self.root / f".tmp-{name}-{uuid.uuid4().hex}"
      _BUILDERS[name](str(tmp))
      os.rename(tmp, path)
    return str(path)


def server_config(**models) -> model_server_config_pb2.ModelServerConfig:
  """{name: base_path or (base_path, policy text)} → ModelServerConfig."""
  config = model_server_config_pb2.ModelServerConfig()
  for name, value in models.items():
    base_path, extra = (value, "") if isinstance(value, str) else value
    text_format.Parse(f'name: "{name}" base_path: "{base_path}" model_platform: "tensorflow" '
                      f'{extra}', config.model_config_list.config.add())
  return config


@contextlib.contextmanager
def running(config, channel_credentials=None, **options):
  """A ModelServer of `config` on free ports (`options`: ServerOptions' fields) and a
  channel to it: plaintext, or TLS with `channel_credentials`."""
  options.setdefault("port", 0)
  options.setdefault("file_system_poll_wait_seconds", 0)
  server = ModelServer(ServerOptions(model_server_config=config, **options)).start()
  address = f"127.0.0.1:{server.port}"
  channel = (grpc.insecure_channel(address) if channel_credentials is None
             else grpc.secure_channel(address, channel_credentials))
  try:
    yield server, channel
  finally:
    channel.close()
    server.stop(grace=0.5)


@contextlib.contextmanager
def serving_qa(built: BuiltModels, root):
  """realm_qa and numeric under `root`, version 1 each, REST on; requests capped at 8 rows
  / 1 MiB. Yields (server, channel, root)."""
  serving_models.publish(built["qa"], str(root / "realm_qa"), 1)
  serving_models.publish(built["numeric"], str(root / "numeric"), 1)
  config = server_config(realm_qa=str(root / "realm_qa"), numeric=str(root / "numeric"))
  with running(config, rest_api_port=0, max_batch_size=8, max_message_bytes=1 << 20) as (
      server, channel):
    yield server, channel, root


def prediction_stub(channel):
  return prediction_service_pb2_grpc.PredictionServiceStub(channel)


def model_service_stub(channel):
  return model_service_pb2_grpc.ModelServiceStub(channel)


def predict_request(model, signature="", version=None, **inputs) -> predict_pb2.PredictRequest:
  request = predict_pb2.PredictRequest()
  request.model_spec.name = model
  request.model_spec.signature_name = signature
  if version is not None:
    request.model_spec.version.value = version
  for name, value in inputs.items():
    proto = value if isinstance(value, tensor_pb2.TensorProto) else tf.make_tensor_proto(value)
    request.inputs[name].CopyFrom(proto)
  return request


def numeric_request(rows, **kwargs):
  return predict_request("numeric", x=np.asarray(rows, np.float32), **kwargs)


def outputs_of(response) -> dict:
  return {name: tf.make_ndarray(proto) for name, proto in response.outputs.items()}


def model_status(channel, model) -> dict:
  request = get_model_status_pb2.GetModelStatusRequest()
  request.model_spec.name = model
  response = model_service_stub(channel).GetModelStatus(request, timeout=RPC_TIMEOUT)
  return {s.version: (s.state, s.status.error_message) for s in response.model_version_status}


def rpc_error(call, *args, **kwargs) -> grpc.RpcError:
  with pytest.raises(grpc.RpcError) as info:
    call(*args, timeout=kwargs.pop("timeout", RPC_TIMEOUT), **kwargs)
  return info.value


def in_flight(server, name, version) -> int:
  servable = server.manager._models[name].records[version]  # pylint: disable=protected-access
  return servable.in_flight


def wait_for(condition, timeout=WAIT_SECONDS, what="condition"):
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


# Fixtures of every serving test module (tests/conftest.py loads this module as a pytest
# plugin): module-scoped, so each module builds the models it uses once.
@pytest.fixture(scope="module")
def built(tmp_path_factory):
  return BuiltModels(tmp_path_factory)


@pytest.fixture(scope="module")
def qa_server(built, tmp_path_factory):  # pylint: disable=redefined-outer-name
  with serving_qa(built, tmp_path_factory.mktemp("models")) as served:
    yield served
