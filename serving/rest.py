"""TF Serving's REST API (JSON) over the same models and the same Predict path as gRPC.

  GET  /v1/models/<name>[/versions/<v> | /labels/<l>]            model status
  GET  /v1/models/<name>[/versions/<v> | /labels/<l>]/metadata   signature defs
  POST /v1/models/<name>[/versions/<v> | /labels/<l>]:predict
       {"signature_name": "...", "instances": [...]}  → {"predictions": [...]}   (row format)
       {"signature_name": "...", "inputs": ...}       → {"outputs": ...}         (columnar)
  errors: {"error": "..."} with the HTTP status TF Serving uses for the gRPC code.
  GET  <prometheus_config.path>   Prometheus text, with --monitoring_config_file
       (not a model API: neither counted nor access-logged)

Strings travel as JSON strings (UTF-8), or as {"b64": "..."} for binary; an output whose
name ends in `_bytes`, or that is not valid UTF-8, is returned as {"b64": ...}. Written
on the standard library's http.server (a pool-bounded ThreadingHTTPServer) because the
server needs no web framework for five routes; with an `ssl_context` (serving.tls) it
serves HTTPS.
"""
import base64
import binascii
import http.server
import json
import logging
import re
import reprlib
import socket
import ssl
import threading
import urllib.parse
from typing import Optional

import grpc
import numpy as np
import tensorflow as tf
from google.protobuf import json_format
from tensorflow_serving.apis import get_model_metadata_pb2
from tensorflow_serving.apis import get_model_status_pb2

from serving import errors
from serving import grpc_service
from serving.metrics import REST, ServingMetrics
from serving.prediction import Predictor
from serving.servable import DEFAULT_SIGNATURE, Signature

log = logging.getLogger(__name__)

_DRAIN_FACTOR = 4
# Deeper JSON lists than any signature's rank are refused before they are walked: numpy
# allows at most 64 dimensions, and walking a list ~1000 deep would exhaust the stack.
MAX_RANK = 32
_INT64_MAX = (1 << 63) - 1
# The API each POST action is counted and logged as (gRPC's method names).
_POST_APIS = {":predict": "Predict", ":classify": "Classify", ":regress": "Regress"}
_ROUTE = re.compile(
    r"^/v1/models/(?P<name>[^/:]+)"
    r"(?:/versions/(?P<version>\d+)|/labels/(?P<label>[^/:]+))?"
    r"(?P<action>/metadata|:predict|:classify|:regress)?$")


# ---------------------------------------------------------------------------------------
# JSON ↔ ndarray.


def _describe(value) -> str:
  """A short printable form of any JSON value (reprlib bounds its length and depth)."""
  return f"{type(value).__name__} {reprlib.repr(value)[:50]}"


def _string_leaf(value, name: str) -> bytes:
  if isinstance(value, str):
    return value.encode("utf-8")
  if isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
    try:
      return base64.b64decode(value["b64"], validate=True)
    except (binascii.Error, ValueError):
      raise errors.invalid_argument(f"input {name!r}: invalid base64 in {{'b64': ...}}") from None
  raise errors.invalid_argument(f"input {name!r} expects strings; got {_describe(value)}")


def _nested_shape(value) -> tuple:
  shape = []
  while isinstance(value, list):
    shape.append(len(value))
    value = value[0] if value else None
  return tuple(shape)


def _leaves(value, shape: tuple, name: str) -> list:
  """The leaves of a rectangular nested list (row-major); INVALID_ARGUMENT if ragged."""
  flat = []

  def walk(item, depth):
    if depth < len(shape):
      if not isinstance(item, list) or len(item) != shape[depth]:
        raise errors.invalid_argument(f"input {name!r} is ragged: every list at depth {depth} "
                                      f"must have {shape[depth]} items")
      for sub in item:
        walk(sub, depth + 1)
    elif isinstance(item, list):
      raise errors.invalid_argument(f"input {name!r} is ragged: lists nested deeper than "
                                    f"{len(shape)} levels")
    else:
      flat.append(item)

  walk(value, 0)
  return flat


def _number_leaf(value, name: str, dtype: tf.DType):
  if isinstance(value, bool):
    if dtype != tf.bool:
      raise errors.invalid_argument(f"input {name!r} expects {dtype.name}; got a boolean")
  elif not isinstance(value, (int, float)) or dtype == tf.bool:
    raise errors.invalid_argument(f"input {name!r} expects {dtype.name} numbers; got "
                                  f"{_describe(value)}")
  return value


def json_to_array(value, dtype: tf.DType, name: str) -> np.ndarray:
  """One input's JSON value as an ndarray of the signature's dtype; rejects ragged lists."""
  shape = _nested_shape(value)
  if len(shape) > MAX_RANK:
    raise errors.invalid_argument(f"input {name!r} is nested {len(shape)} lists deep; at most "
                                  f"{MAX_RANK} are accepted")
  flat = _leaves(value, shape, name)
  if dtype == tf.string:
    array = np.empty(len(flat), dtype=object)
    array[:] = [_string_leaf(item, name) for item in flat]
    return array.reshape(shape)
  numbers = [_number_leaf(item, name, dtype) for item in flat]
  try:
    return np.array(numbers, dtype=dtype.as_numpy_dtype).reshape(shape)
  except (ValueError, TypeError, OverflowError) as e:
    raise errors.invalid_argument(f"input {name!r}: cannot be read as {dtype.name}: {e}") from None


def array_to_json(array: np.ndarray, name: str):
  if array.dtype == object or array.dtype.kind == "S":
    as_b64 = name.endswith("_bytes")

    def convert(item):
      if isinstance(item, list):
        return [convert(sub) for sub in item]
      if not as_b64:
        try:
          return item.decode("utf-8")
        except UnicodeDecodeError:
          pass
      return {"b64": base64.b64encode(item).decode("ascii")}

    return convert(array.tolist())
  return array.tolist()


def decode_row_format(instances, signature: Signature) -> dict:
  """{"instances": [...]}: one item per example; objects when the signature has several
  inputs (or name them), else the bare value of the single input."""
  if not isinstance(instances, list) or not instances:
    raise errors.invalid_argument("'instances' must be a non-empty list")
  specs = signature.input_specs
  named = all(isinstance(item, dict) and not set(item) == {"b64"} for item in instances)
  if named:
    keys = set(instances[0])
    for index, item in enumerate(instances):
      if set(item) != keys:
        raise errors.invalid_argument(f"instance {index} has inputs {sorted(item)}; "
                                      f"instance 0 has {sorted(keys)}")
    columns = {key: [item[key] for item in instances] for key in keys}
  else:
    if len(specs) != 1:
      raise errors.invalid_argument(f"the signature has inputs {sorted(specs)}: each instance "
                                    f"must be an object naming them")
    columns = {next(iter(specs)): instances}
  return _decode_columns(columns, specs)


def decode_columnar_format(inputs, signature: Signature) -> dict:
  specs = signature.input_specs
  if isinstance(inputs, dict) and set(inputs) != {"b64"}:
    return _decode_columns(inputs, specs)
  if len(specs) != 1:
    raise errors.invalid_argument(f"the signature has inputs {sorted(specs)}: 'inputs' must be "
                                  f"an object naming them")
  return _decode_columns({next(iter(specs)): inputs}, specs)


def _decode_columns(columns: dict, specs: dict) -> dict:
  unknown = sorted(set(columns) - set(specs))
  if unknown:
    raise errors.invalid_argument(
        f"input {unknown[0]!r} is not an input of the signature; expected {sorted(specs)}")
  return {name: json_to_array(value, specs[name].dtype, name) for name, value in
          columns.items()}


def encode_row_format(outputs: dict) -> list:
  sizes = {name: (value.shape[0] if value.ndim else None) for name, value in outputs.items()}
  if len(set(sizes.values())) != 1 or None in sizes.values():
    raise errors.invalid_argument(f"outputs do not share a batch dimension ({sizes}); ask "
                                  f"with the columnar 'inputs' format instead")
  columns = {name: array_to_json(value, name) for name, value in outputs.items()}
  if len(columns) == 1:
    return next(iter(columns.values()))
  batch = next(iter(sizes.values()))
  return [{name: column[row] for name, column in columns.items()} for row in range(batch)]


def encode_columnar_format(outputs: dict):
  columns = {name: array_to_json(value, name) for name, value in outputs.items()}
  return next(iter(columns.values())) if len(columns) == 1 else columns


# ---------------------------------------------------------------------------------------
# The HTTP server.


class _Handler(http.server.BaseHTTPRequestHandler):
  server_version = "realm_tf-serving"
  protocol_version = "HTTP/1.1"

  def log_message(self, format, *args):  # pylint: disable=redefined-builtin
    log.debug("REST %s - %s", self.address_string(), format % args)

  @property
  def api(self) -> "RestApi":
    return self.server.api

  def _send(self, status: int, payload) -> None:
    body = json.dumps(payload).encode("utf-8")
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  def _error(self, error: errors.ServingError) -> None:
    self._send(error.http_status, {"error": error.message})

  def _route(self):
    path = urllib.parse.urlsplit(self.path).path
    match = _ROUTE.match(path)
    if match is None:
      raise errors.not_found(f"no such REST route: {path}")
    name = urllib.parse.unquote(match["name"])
    version = int(match["version"]) if match["version"] else None
    if version is not None and version > _INT64_MAX:
      raise errors.invalid_argument(f"version {match['version']} does not fit in an int64")
    label = urllib.parse.unquote(match["label"]) if match["label"] else None
    return name, version, label, match["action"]

  def handle_one_request(self):
    """Any failure that is not a ServingError still gets a JSON answer (500)."""
    try:
      super().handle_one_request()
    except (ConnectionError, TimeoutError):
      self.close_connection = True
    except Exception as e:  # pylint: disable=broad-except
      log.exception("REST request %s failed", self.path)
      self.close_connection = True
      try:
        self._send(500, {"error": f"internal error: {type(e).__name__}: {e}"})
      except OSError:
        pass

  def _send_metrics(self) -> None:
    body, content_type = self.api.metrics.exposition(self.headers.get("Accept"))
    self.send_response(200)
    self.send_header("Content-Type", content_type)
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  def do_GET(self):  # pylint: disable=invalid-name
    if (self.api.metrics_path is not None
        and urllib.parse.urlsplit(self.path).path == self.api.metrics_path):
      self._send_metrics()
      return
    try:
      with self.api.metrics.request(REST) as call:
        name, version, label, action = self._route()
        call.asked_for("GetModelMetadata" if action == "/metadata" else "GetModelStatus",
                       name, version, label)
        if action == "/metadata":
          response = self.api.metadata(name, version, label)
          call.served_by(int(response["model_spec"]["version"]))
          self._send(200, response)
        elif action is None:
          self._send(200, self.api.status(name, version, label))
        else:
          raise errors.ServingError(grpc.StatusCode.UNIMPLEMENTED, f"use POST for {action}")
    except errors.ServingError as e:
      self._error(e)

  def do_POST(self):  # pylint: disable=invalid-name
    try:
      with self.api.metrics.request(REST) as call:
        name, version, label, action = self._route()
        call.asked_for(_POST_APIS.get(action, "Predict"), name, version, label)
        if action in (":classify", ":regress"):
          raise errors.ServingError(
              grpc.StatusCode.UNIMPLEMENTED,
              f"{action[1:]} is not implemented by this server; use predict")
        if action != ":predict":
          raise errors.ServingError(grpc.StatusCode.UNIMPLEMENTED, "POST is only for :predict")
        body = self._read_body()
        self._send(200, self.api.predict(name, version, label, body, on_reached=call.served_by))
    except errors.ServingError as e:
      self._error(e)

  def _discard(self, num_bytes: int) -> None:
    """Reads and drops a refused body so the client gets the 413 instead of a broken pipe
    (bounded: past _DRAIN_FACTOR times the limit the connection is just closed)."""
    while num_bytes > 0:
      chunk = self.rfile.read(min(num_bytes, 1 << 16))
      if not chunk:
        return
      num_bytes -= len(chunk)

  def _read_body(self):
    length = self.headers.get("Content-Length")
    if length is None or not length.isdigit():
      self.close_connection = True
      raise errors.ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                                "a request body needs a Content-Length", http_status=411)
    length = int(length)
    if length > self.api.max_body_bytes:
      self.close_connection = True  # the rest of the body must not be taken for a request
      self._discard(min(length, _DRAIN_FACTOR * self.api.max_body_bytes))
      raise errors.ServingError(
          grpc.StatusCode.RESOURCE_EXHAUSTED,
          f"the request body has {length} bytes, more than the limit "
          f"{self.api.max_body_bytes} (--max_message_bytes)", http_status=413)
    raw = self.rfile.read(length)
    try:
      return json.loads(raw)
    except ValueError as e:  # bad UTF-8 or JSON, or an integer past Python's digit limit
      raise errors.invalid_argument(f"the request body is not JSON: {e}") from None
    except RecursionError:
      raise errors.invalid_argument("the request body is not JSON: nested too deeply") from None


class _BoundedThreadingHTTPServer(http.server.ThreadingHTTPServer):
  """ThreadingHTTPServer with at most `num_threads` requests handled at once."""

  daemon_threads = True
  # The listen backlog: connections beyond the handler threads wait here, accepted in turn
  # (the kernel caps it at net.core.somaxconn). With socketserver's default of 5 the kernel
  # drops or resets connections past threads + 5: 32 closed-loop clients (benchmarks/
  # serving.py) would be reset where gRPC queues them.
  request_queue_size = socket.SOMAXCONN

  def __init__(self, address, handler, num_threads: int, api: "RestApi",
               ssl_context: Optional[ssl.SSLContext] = None):
    self._slots = threading.BoundedSemaphore(num_threads)
    self.api = api
    self.ssl_context = ssl_context
    super().__init__(address, handler)

  def finish_request(self, request, client_address):
    """With TLS, the handshake runs here, in the request's own thread and bounded by the
    REST timeout, not in the accept loop (wrapping the listening socket would do it there,
    so one silent client would stall every other); a failed handshake (a plaintext client,
    no or an untrusted client certificate) closes the connection."""
    if self.ssl_context is None:
      super().finish_request(request, client_address)
      return
    request.settimeout(self.api.timeout_seconds)
    try:
      tls_request = self.ssl_context.wrap_socket(request, server_side=True)
    except (ssl.SSLError, OSError) as e:  # OSError: a reset or a timeout mid-handshake
      log.info("REST %s: TLS handshake refused: %s", client_address[0], e)
      return
    try:
      super().finish_request(tls_request, client_address)
    finally:
      self.shutdown_request(tls_request)  # `request` was detached into it

  def process_request(self, request, client_address):
    self._slots.acquire()  # the accept loop waits: excess connections stay in the backlog
    try:
      super().process_request(request, client_address)
    except Exception:
      self._slots.release()
      raise

  def process_request_thread(self, request, client_address):
    try:
      super().process_request_thread(request, client_address)
    finally:
      self._slots.release()


class RestApi:
  """The REST routes' logic, over the same Predictor and manager as gRPC."""

  def __init__(self, predictor: Predictor, max_body_bytes: int, timeout_seconds: float,
               metrics: ServingMetrics, metrics_path: Optional[str] = None,
               ssl_context: Optional[ssl.SSLContext] = None):
    """Args:
      predictor: answers Predict, with the manager behind it.
      max_body_bytes: the largest request body read.
      timeout_seconds: each request's deadline (--rest_api_timeout_in_ms).
      metrics: counts and access-logs each request.
      metrics_path: where GET serves `metrics` as Prometheus text; None serves nothing.
      ssl_context: None serves plain HTTP; else HTTPS with it (serving.tls).
    """
    self.predictor = predictor
    self.max_body_bytes = max_body_bytes
    self.timeout_seconds = timeout_seconds
    self.metrics = metrics
    self.metrics_path = metrics_path
    self.ssl_context = ssl_context
    self._server: Optional[_BoundedThreadingHTTPServer] = None
    self._thread: Optional[threading.Thread] = None

  def status(self, name, version, label) -> dict:
    request = get_model_status_pb2.GetModelStatusRequest()
    _fill_spec(request.model_spec, name, version, label)
    response = grpc_service.model_status(self.predictor.manager, request)
    return json_format.MessageToDict(response, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)

  def metadata(self, name, version, label) -> dict:
    request = get_model_metadata_pb2.GetModelMetadataRequest(
        metadata_field=[grpc_service.SIGNATURE_DEF_FIELD])
    _fill_spec(request.model_spec, name, version, label)
    response = grpc_service.model_metadata(self.predictor.manager, request)
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    response.metadata[grpc_service.SIGNATURE_DEF_FIELD].Unpack(signature_map)
    return {
        "model_spec": json_format.MessageToDict(response.model_spec,
                                                preserving_proto_field_name=True),
        "metadata": {grpc_service.SIGNATURE_DEF_FIELD: json_format.MessageToDict(
            signature_map, preserving_proto_field_name=True)},
    }

  def predict(self, name, version, label, body, on_reached=None) -> dict:
    """`on_reached(version, signature_name)`: as Predictor.predict's."""
    if not isinstance(body, dict):
      raise errors.invalid_argument("the request body must be a JSON object")
    formats = [key for key in ("instances", "inputs") if key in body]
    if len(formats) != 1:
      raise errors.invalid_argument("the request body needs exactly one of 'instances' (row "
                                    "format) or 'inputs' (columnar format)")
    unknown = sorted(set(body) - {"instances", "inputs", "signature_name"})
    if unknown:
      raise errors.invalid_argument(f"unknown request field {unknown[0]!r}")
    row_format = formats[0] == "instances"
    signature_name = body.get("signature_name") or DEFAULT_SIGNATURE
    if not isinstance(signature_name, str):
      raise errors.invalid_argument("'signature_name' must be a string")
    payload = body[formats[0]]

    def decode(signature: Signature) -> dict:
      if row_format:
        return decode_row_format(payload, signature)
      return decode_columnar_format(payload, signature)

    result = self.predictor.predict(name, version, label, signature_name, decode,
                                    client_timeout=self.timeout_seconds,
                                    client_timeout_source="--rest_api_timeout_in_ms",
                                    on_reached=on_reached)
    if row_format:
      return {"predictions": encode_row_format(result.outputs)}
    return {"outputs": encode_columnar_format(result.outputs)}

  # ------------------------------------------------------------------ lifecycle

  def start(self, host: str, port: int, num_threads: int) -> int:
    handler = type("Handler", (_Handler,), {"timeout": self.timeout_seconds})
    server_class = _BoundedThreadingHTTPServer
    if ":" in host:  # an IPv6 literal
      server_class = type("V6Server", (server_class,), {"address_family": socket.AF_INET6})
    self._server = server_class((host, port), handler, num_threads, self, self.ssl_context)
    self._thread = threading.Thread(target=self._server.serve_forever, name="rest",
                                    kwargs={"poll_interval": 0.1}, daemon=True)
    self._thread.start()
    return self._server.server_address[1]

  def stop(self) -> None:
    if self._server is not None:
      self._server.shutdown()
      self._server.server_close()
      self._thread.join()
      self._server = None


def _fill_spec(spec, name, version, label):
  spec.name = name
  if version is not None:
    spec.version.value = version
  elif label:
    spec.version_label = label
