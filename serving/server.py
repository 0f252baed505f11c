"""`python -m serving.server`: TF Serving's gRPC (and REST) API over SavedModel exports.

    python -m serving.server --model_config_file=models.config --port=8500 \\
        [--rest_api_port=8501] [--enable_batching --batching_parameters_file=batching.config]
    python -m serving.server --model_name=realm_qa --model_base_path=/models/realm_qa
        [--ssl_config_file=ssl.config]
    ... --rest_api_port=8501 --monitoring_config_file=monitoring.config   (Prometheus)

Flags carry tensorflow_model_server's names and meanings, so the same command line and
config files work with a real tensorflow_model_server; the realm_tf safety flags (--host,
--max_message_bytes, --max_concurrent_requests, --request_timeout_seconds,
--max_batch_size, --model_root) and --aspired_version_policy have no counterpart there
(tensorflow_model_server always preserves availability: see serving.model_manager for what
each policy costs). The server binds to 127.0.0.1 unless --host says otherwise.
--ssl_config_file puts TLS on gRPC as in tensorflow_model_server, and on REST too, which
tensorflow_model_server leaves plain (serving.tls).

In-process use (tests, benchmarks):

    with ModelServer(ServerOptions(model_base_path=..., port=0)) as server:
      channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")

XLA: --xla_cpu_compilation_enabled has tensorflow_model_server's meaning. Off (the
default, as in the binary), a signature that reaches an XLA-compiled function (an export
made with `python -m realm_tf.export --reader_xla`) answers INTERNAL "XLA compilation
disabled" and a warm-up that reaches one fails the version's load (serving.servable).

oneDNN: run as a program, the server turns TensorFlow's oneDNN CPU kernels off unless
TF_ENABLE_ONEDNN_OPTS is set (`TF_ENABLE_ONEDNN_OPTS=1 python -m serving.server ...` turns
them on). Why: oneDNN's allocator keeps a retired version's large tensors in an arena that
never shrinks, so with it the server's memory grows at every version hand-over; without it
a retired version's memory goes back to the system, for some latency per question (both,
measured: benchmarks/results/serving_memory.md). TF Serving's standard CPU build has no
oneDNN either (a oneDNN server is a separate `--config=mkl` build).
"""
import os

if __name__ == "__main__":
  # Why before the other imports: TensorFlow reads TF_ENABLE_ONEDNN_OPTS once, when its
  # library loads (tensorflow_serving.apis below imports it). Only the program's default;
  # an importing process (tests, benchmarks) keeps its own setting.
  os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

# pylint: disable=g-import-not-at-top,wrong-import-position
import concurrent.futures
import dataclasses
import logging
import signal
import sys
import threading
from typing import Optional

from absl import flags
import grpc
from grpc_health.v1 import health
from grpc_health.v1 import health_pb2
from grpc_health.v1 import health_pb2_grpc
from tensorflow_serving.apis import model_management_pb2
from tensorflow_serving.apis import model_service_pb2_grpc
from tensorflow_serving.apis import prediction_service_pb2_grpc
from tensorflow_serving.config import model_server_config_pb2

from serving import config as config_lib
from serving import errors
from serving import paths
from serving import tensors
from serving import tls
from serving.batching import BatchScheduler
from serving.grpc_service import ModelServicer, PredictionServicer
from serving.metrics import ServingMetrics
from serving.model_manager import ASPIRED_VERSION_POLICIES, ModelManager
from serving.prediction import Predictor
from serving.rest import RestApi

log = logging.getLogger(__name__)

_CPUS = os.cpu_count() or 1


@dataclasses.dataclass
class ServerOptions:
  """What a ModelServer serves and how; the flags map onto it one to one.

  Models come from `model_server_config` (a proto, in-process), else `model_config_file`,
  else `model_name` + `model_base_path`. `rest_api_port` None disables REST (the flag's 0);
  a port of 0 here binds an ephemeral port.
  """
  port: int = 8500
  rest_api_port: Optional[int] = None
  host: str = "127.0.0.1"
  model_config_file: str = ""
  model_server_config: Optional[model_server_config_pb2.ModelServerConfig] = None
  model_name: str = "default"
  model_base_path: str = ""
  model_root: str = ""
  enable_batching: bool = False
  batching_parameters_file: str = ""
  batching_options: Optional[config_lib.BatchingOptions] = None
  monitoring_config_file: str = ""
  file_system_poll_wait_seconds: float = 1.0
  grpc_max_threads: int = 4 * _CPUS
  rest_api_num_threads: int = 4 * _CPUS
  rest_api_timeout_in_ms: int = 30_000
  max_message_bytes: int = 16 << 20
  max_concurrent_requests: int = 64
  request_timeout_seconds: float = 30.0
  max_batch_size: int = 256
  aspired_version_policy: str = "availability_preserving"
  ssl_config_file: str = ""  # an SSLConfig text proto: TLS on gRPC and REST (serving.tls)
  # tensorflow_model_server's flag: off, a signature reaching an XLA-compiled function
  # (a realm_tf.export --reader_xla export's QA signatures) answers INTERNAL "XLA
  # compilation disabled", as the binary does (serving.servable.Signature).
  xla_cpu_compilation_enabled: bool = False

  def __post_init__(self):
    for name in ("grpc_max_threads", "rest_api_num_threads", "rest_api_timeout_in_ms",
                 "max_message_bytes", "max_concurrent_requests", "max_batch_size"):
      if getattr(self, name) < 1:
        raise config_lib.ConfigError(f"--{name} must be >= 1, got {getattr(self, name)}")
    if self.request_timeout_seconds <= 0:
      raise config_lib.ConfigError("--request_timeout_seconds must be > 0")
    if self.model_config_file and self.model_base_path:
      raise config_lib.ConfigError("give --model_config_file or --model_base_path, not both")
    if self.aspired_version_policy not in ASPIRED_VERSION_POLICIES:
      raise config_lib.ConfigError(f"--aspired_version_policy must be one of "
                                   f"{', '.join(ASPIRED_VERSION_POLICIES)}, got "
                                   f"{self.aspired_version_policy!r}")


def _grpc_address(host: str, port: int) -> str:
  return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class ModelServer:
  """The model manager, gRPC services, health and optional REST, started and stopped as one."""

  def __init__(self, options: ServerOptions):
    self.options = options
    self.port: Optional[int] = None
    self.rest_port: Optional[int] = None
    self.health = health.HealthServicer()
    self.max_decoded_bytes = options.max_message_bytes * tensors.DECODED_BYTES_PER_MESSAGE_BYTE
    self.metrics = ServingMetrics(lambda name: self.manager.serves(name))
    self.manager = ModelManager(options.max_batch_size, self.max_decoded_bytes,
                                on_change=self._on_model_change,
                                aspired_version_policy=options.aspired_version_policy,
                                metrics=self.metrics,
                                xla_cpu_compilation_enabled=options.xla_cpu_compilation_enabled)
    self.batcher: Optional[BatchScheduler] = None
    self.predictor: Optional[Predictor] = None
    self._grpc_server = None
    self._rest: Optional[RestApi] = None
    self._allowed_roots = []
    self._reload_lock = threading.Lock()

  # ------------------------------------------------------------------ configuration

  def _initial_config(self) -> tuple:
    options = self.options
    if options.model_server_config is not None:
      return options.model_server_config, "model_server_config"
    if options.model_config_file:
      return (config_lib.read_model_server_config(options.model_config_file),
              f"--model_config_file {options.model_config_file}")
    if options.model_base_path:
      return (config_lib.single_model_config(options.model_name, options.model_base_path),
              "--model_base_path")
    raise config_lib.ConfigError("no models: give --model_config_file or --model_name and "
                                 "--model_base_path")

  def reload_config(self, config: model_server_config_pb2.ModelServerConfig
                    ) -> model_management_pb2.ReloadConfigResponse:
    """HandleReloadConfigRequest: validates, then serves the new model list.

    Models no longer listed are retired (their running requests finish); models added are
    loaded before this returns, and one that ends up with no available version is an error
    (the rest of the config stays applied, as in TF Serving).
    """
    with self._reload_lock:
      try:
        specs = config_lib.validate_model_server_config(config, "ReloadConfigRequest",
                                                        self._allowed_roots)
      except config_lib.ConfigError as e:
        raise errors.invalid_argument(str(e)) from None
      before = set(self.manager.model_names())
      self.manager.set_config(specs)
      unavailable = []
      for spec in specs:
        if spec.name in before:
          continue
        statuses = self.manager.status(spec.name)
        if not any(s.state.name == "AVAILABLE" for s in statuses):
          reasons = "; ".join(f"version {s.version}: {s.error.message}" for s in statuses
                              if s.error is not None) or f"no version under {spec.base_path}"
          unavailable.append(f"{spec.name!r} ({reasons})")
      if unavailable:
        raise errors.failed_precondition("config applied, but these added models have no "
                                         f"available version: {', '.join(unavailable)}")
      response = model_management_pb2.ReloadConfigResponse()
      response.status.error_code = 0
      return response

  def _on_model_change(self, name: str, serving: bool) -> None:
    status = (health_pb2.HealthCheckResponse.SERVING if serving else
              health_pb2.HealthCheckResponse.NOT_SERVING)
    self.health.set(name, status)

  # ------------------------------------------------------------------ lifecycle

  def start(self) -> "ModelServer":
    """Loads the configured models, then listens; returns once requests can be answered."""
    options = self.options
    # First: a bad file fails the start before any model is loaded.
    server_tls = (tls.load_server_tls(options.ssl_config_file) if options.ssl_config_file
                  else None)
    config, source = self._initial_config()
    specs = config_lib.validate_model_server_config(
        config, source, [paths.resolve_root(options.model_root)] if options.model_root else [])
    self._allowed_roots = ([paths.resolve_root(options.model_root)] if options.model_root
                           else config_lib.default_allowed_roots(specs))
    monitoring = config_lib.MonitoringOptions()
    if options.monitoring_config_file:
      monitoring = config_lib.read_monitoring_config(options.monitoring_config_file)
    if monitoring.prometheus_enabled and options.rest_api_port is None:
      # tensorflow_model_server serves Prometheus on its HTTP port only (and without one
      # silently serves none): refused here, so enabled monitoring is never absent.
      raise config_lib.ConfigError(
          f"--monitoring_config_file {options.monitoring_config_file}: Prometheus metrics "
          f"are served on the REST port; give --rest_api_port")
    batching = None
    if options.enable_batching:
      batching = options.batching_options or config_lib.read_batching_parameters(
          options.batching_parameters_file)
    elif options.batching_parameters_file:
      log.warning("--batching_parameters_file is ignored without --enable_batching")
    for spec in specs:
      self.health.set(spec.name, health_pb2.HealthCheckResponse.NOT_SERVING)
    self.manager.set_config(specs)
    if batching is not None:
      self.batcher = BatchScheduler(batching, self.metrics)
    self.predictor = Predictor(self.manager, options.max_batch_size,
                               options.request_timeout_seconds,
                               options.max_concurrent_requests, self.batcher)
    self._grpc_server = grpc.server(
        concurrent.futures.ThreadPoolExecutor(max_workers=options.grpc_max_threads,
                                              thread_name_prefix="grpc"),
        options=[("grpc.max_receive_message_length", options.max_message_bytes),
                 ("grpc.max_send_message_length", options.max_message_bytes)],
        # Bounds RPCs waiting for a thread; Predict has its own limit (limits.py), and the
        # headroom keeps status and health answering when Predict is at its limit.
        maximum_concurrent_rpcs=options.max_concurrent_requests + options.grpc_max_threads)
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
        PredictionServicer(self.predictor, self.max_decoded_bytes, self.metrics),
        self._grpc_server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(
        ModelServicer(self.manager, self.reload_config, self.metrics), self._grpc_server)
    health_pb2_grpc.add_HealthServicer_to_server(self.health, self._grpc_server)
    address = _grpc_address(options.host, options.port)
    try:
      if server_tls is None:
        self.port = self._grpc_server.add_insecure_port(address)
      else:
        self.port = self._grpc_server.add_secure_port(address, server_tls.grpc_credentials())
    except RuntimeError as e:
      self.stop()
      raise OSError(f"cannot bind gRPC to {address}: {e}") from None
    if not self.port:
      self.stop()
      raise OSError(f"cannot bind gRPC to {address}")
    self._grpc_server.start()
    if options.rest_api_port is not None:
      self._rest = RestApi(self.predictor, options.max_message_bytes,
                           options.rest_api_timeout_in_ms / 1000, self.metrics,
                           monitoring.prometheus_path if monitoring.prometheus_enabled else None,
                           server_tls.ssl_context if server_tls else None)
      try:
        self.rest_port = self._rest.start(options.host, options.rest_api_port,
                                          options.rest_api_num_threads)
      except OSError as e:
        self.stop()
        raise OSError(f"cannot bind REST to {options.host}:{options.rest_api_port}: {e}") from None
      if monitoring.prometheus_enabled:
        log.info("Prometheus metrics on REST port %d at %s", self.rest_port,
                 monitoring.prometheus_path)
    self.manager.start_polling(options.file_system_poll_wait_seconds)
    self.health.set("", health_pb2.HealthCheckResponse.SERVING)
    log.info("serving gRPC on %s%s; models %s", _grpc_address(options.host, self.port),
             f", REST on port {self.rest_port}" if self.rest_port else "",
             self.manager.model_names())
    if server_tls is not None:
      log.info("TLS on gRPC%s%s", " and REST" if self.rest_port else "",
               "; client certificates required" if server_tls.client_verify else "")
    return self

  def stop(self, grace: float = 2.0) -> None:
    """Stops listening, lets running requests finish (up to `grace` s), frees the models."""
    self.health.enter_graceful_shutdown()
    if self._rest is not None:
      self._rest.stop()
      self._rest = None
    if self._grpc_server is not None:
      self._grpc_server.stop(grace).wait()
      self._grpc_server = None
    self.manager.stop()
    if self.batcher is not None:
      self.batcher.stop()
      self.batcher = None
    if self.predictor is not None:
      self.predictor.stop()
      self.predictor = None

  def __enter__(self) -> "ModelServer":
    return self.start()

  def __exit__(self, *exc_info) -> None:
    self.stop()


# ---------------------------------------------------------------------------------------
# Command line.


def _define_flags(flag_values: flags.FlagValues) -> None:
  """tensorflow_model_server's flags, then realm_tf's safety flags."""
  defaults = ServerOptions()
  define = dict(flag_values=flag_values)
  flags.DEFINE_integer("port", defaults.port, "gRPC port.", **define)
  flags.DEFINE_integer("rest_api_port", 0, "REST (HTTP/JSON) port; 0 disables REST.", **define)
  flags.DEFINE_string("model_config_file", "", "A ModelServerConfig text proto.", **define)
  flags.DEFINE_string("model_name", defaults.model_name,
                      "Name of the single model of --model_base_path.", **define)
  flags.DEFINE_string("model_base_path", "", "Base path of a single model (its version "
                      "directories below); ignored with --model_config_file.", **define)
  flags.DEFINE_bool("enable_batching", False, "Merge concurrent Predict requests.", **define)
  flags.DEFINE_string("batching_parameters_file", "",
                      "A BatchingParameters text proto (with --enable_batching).", **define)
  flags.DEFINE_string("monitoring_config_file", "", "A MonitoringConfig text proto; "
                      "prometheus_config { enable: true } serves Prometheus metrics on the "
                      "REST port.", **define)
  flags.DEFINE_float("file_system_poll_wait_seconds", defaults.file_system_poll_wait_seconds,
                     "Seconds between polls of the base paths for new versions; 0 loads "
                     "once at start.", **define)
  flags.DEFINE_integer("grpc_max_threads", defaults.grpc_max_threads,
                       "Threads answering gRPC requests.", **define)
  flags.DEFINE_integer("rest_api_num_threads", defaults.rest_api_num_threads,
                       "REST requests handled at once.", **define)
  flags.DEFINE_integer("rest_api_timeout_in_ms", defaults.rest_api_timeout_in_ms,
                       "Timeout of a REST request.", **define)
  flags.DEFINE_string("ssl_config_file", "", "An SSLConfig text proto (PEM texts inline): "
                      "TLS on the gRPC port, and [realm_tf] on the REST port.", **define)
  flags.DEFINE_bool("xla_cpu_compilation_enabled", False,
                    "EXPERIMENTAL in tensorflow_model_server. Run XLA-compiled functions "
                    "(jit_compile); off, a signature that reaches one answers INTERNAL "
                    "'XLA compilation disabled', as the binary does, and a version whose "
                    "warm-up reaches one fails to load.", **define)
  flags.DEFINE_string("host", defaults.host, "[realm_tf] Address to bind; 0.0.0.0 exposes "
                      "the server to the network.", **define)
  flags.DEFINE_integer("max_message_bytes", defaults.max_message_bytes,
                       "[realm_tf] Largest gRPC message / REST body accepted or sent.",
                       **define)
  flags.DEFINE_integer("max_concurrent_requests", defaults.max_concurrent_requests,
                       "[realm_tf] Predict requests computed at once; more are refused "
                       "with RESOURCE_EXHAUSTED.", **define)
  flags.DEFINE_float("request_timeout_seconds", defaults.request_timeout_seconds,
                     "[realm_tf] Deadline of a request (a shorter client deadline wins).",
                     **define)
  flags.DEFINE_integer("max_batch_size", defaults.max_batch_size,
                       "[realm_tf] Largest dimension 0 a request may send.", **define)
  flags.DEFINE_string("aspired_version_policy", defaults.aspired_version_policy,
                      "[realm_tf] How a new version replaces the old: "
                      "availability_preserving (load the new one first: no gap, both in "
                      "memory for a moment; tensorflow_model_server's only policy) or "
                      "resource_preserving (retire the old one first: one version in "
                      "memory, no answers while the new one loads).", **define)
  flags.DEFINE_string("model_root", "", "[realm_tf] Every model base path (including "
                      "those of HandleReloadConfigRequest) must be inside it; default: the "
                      "parent directories of the models configured at start.", **define)


def parse_flags(argv) -> ServerOptions:
  """ServerOptions from a command line (argv[0] is the program name)."""
  flag_values = flags.FlagValues()
  _define_flags(flag_values)
  rest = flag_values(argv)
  if len(rest) > 1:
    raise config_lib.ConfigError(f"unexpected arguments: {rest[1:]}")
  values = {name: flag_values[name].value for name in flag_values}
  values["rest_api_port"] = values["rest_api_port"] or None
  return ServerOptions(**values)


def main(argv=None) -> int:
  argv = sys.argv if argv is None else argv
  if any(arg in ("-h", "--help", "--helpfull") for arg in argv[1:]):
    flag_values = flags.FlagValues()
    _define_flags(flag_values)
    print(__doc__ + "\n" + flag_values.get_help())
    return 0
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                      "%(message)s")
  try:
    options = parse_flags(argv)
    server = ModelServer(options).start()
  except (flags.Error, ValueError, OSError) as e:  # ConfigError is a ValueError
    print(f"serving.server: error: {e}", file=sys.stderr)
    return 2
  stop = threading.Event()
  for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, lambda *_: stop.set())
  log.info("oneDNN CPU kernels %s (TF_ENABLE_ONEDNN_OPTS=%s)",
           "off" if os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "0" else "on",
           os.environ.get("TF_ENABLE_ONEDNN_OPTS", "unset"))
  rest = f" REST {options.host}:{server.rest_port}" if server.rest_port else ""
  print(f"serving.server: gRPC {_grpc_address(options.host, server.port)}{rest}", flush=True)
  while not stop.wait(1.0):
    pass
  log.info("shutting down")
  server.stop(grace=5.0)
  return 0


if __name__ == "__main__":
  sys.exit(main())
