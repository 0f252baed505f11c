"""`--model_config_file`, `--batching_parameters_file`, `--ssl_config_file` and
`--monitoring_config_file`, in
tensorflow_model_server's formats.

All are text protos. The model config is parsed with the official
`tensorflow_serving.config.model_server_config_pb2.ModelServerConfig`. `BatchingParameters`
(tensorflow_serving/servables/tensorflow/session_bundle_config.proto), `SSLConfig`
(tensorflow_serving/config/ssl_config.proto) and `MonitoringConfig`
(tensorflow_serving/config/monitoring_config.proto) are not shipped in the
tensorflow-serving-api 2.20 wheel, so when the official module is missing the message is
built here from its published field numbers with protobuf's descriptor API
(_message_class): a file that works
with a real tensorflow_model_server parses here identically, and unknown fields are an
error, as they are there.
"""
import dataclasses
import importlib
import os
from typing import Optional

from google.protobuf import descriptor_pb2
from google.protobuf import descriptor_pool
from google.protobuf import message_factory
from google.protobuf import text_format
from google.protobuf import wrappers_pb2
import tensorflow as tf
from tensorflow_serving.config import model_server_config_pb2

from serving import paths

DEFAULT_MODEL_PLATFORM = "tensorflow"


class ConfigError(ValueError):
  """A config file (or reload request) that cannot be served; the message names it."""


def _read_text_proto(path: str, flag: str, message):
  """Fills `message` from the text proto at `path`; a ConfigError names `flag` and the file.

  Args:
    path: the file (any file system tf.io.gfile reads).
    flag: the command-line flag that named it, for the error message.
    message: an empty proto message to fill.

  Returns:
    `message`, filled.
  """
  try:
    with tf.io.gfile.GFile(path) as f:
      text = f.read()
  except (tf.errors.OpError, OSError) as e:
    raise ConfigError(f"{flag} {path}: cannot read: {e}") from None
  try:
    text_format.Parse(text, message)
  except text_format.ParseError as e:
    raise ConfigError(f"{flag} {path}: not a {message.DESCRIPTOR.name} text proto: "
                      f"{e}") from None
  return message


def _message_class(official_module: str, file_proto: descriptor_pb2.FileDescriptorProto,
                   name: str, dependencies=()):
  """TF Serving's generated message class if the installed wheel ships it, else the same
  message built from `file_proto` (its published field numbers) in a private pool, which
  never collides with an official definition loaded later.

  Args:
    official_module: the generated module's import path (…_pb2).
    file_proto: the .proto file's descriptor, written here from the published .proto.
    name: the message's name within `file_proto`'s package.
    dependencies: generated modules of the files `file_proto` imports.

  Returns:
    The message class.
  """
  try:
    return getattr(importlib.import_module(official_module), name)
  except ImportError:
    pass
  pool = descriptor_pool.DescriptorPool()
  for module in dependencies:
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb))
  pool.Add(file_proto)
  return message_factory.GetMessageClass(
      pool.FindMessageTypeByName(f"{file_proto.package}.{name}"))


# ---------------------------------------------------------------------------------------
# Model server config.


@dataclasses.dataclass(frozen=True)
class VersionPolicy:
  """Which of the versions on disk to serve (ServableVersionPolicy)."""
  kind: str  # "latest" | "specific" | "all"
  num_versions: int = 1
  versions: tuple = ()

  def select(self, candidates) -> set:
    ordered = sorted(candidates)
    if self.kind == "latest":
      return set(ordered[-self.num_versions:]) if ordered else set()
    if self.kind == "specific":
      return set(self.versions) & set(ordered)
    return set(ordered)


@dataclasses.dataclass(frozen=True)
class ModelSpecConfig:
  """One validated ModelConfig: what the model manager serves."""
  name: str
  base_path: str  # resolved
  policy: VersionPolicy
  version_labels: tuple  # ((label, version), …)


def _policy(config: model_server_config_pb2.ModelConfig, source: str) -> VersionPolicy:
  policy = config.model_version_policy
  choice = policy.WhichOneof("policy_choice")
  if choice in (None, "latest"):
    num = policy.latest.num_versions if choice == "latest" else 0
    return VersionPolicy("latest", num_versions=num or 1)  # TF Serving: 0 means 1
  if choice == "specific":
    versions = tuple(sorted(set(policy.specific.versions)))
    if not versions:
      raise ConfigError(f"{source}: model {config.name!r}: specific policy lists no versions")
    if min(versions) < 0:
      raise ConfigError(f"{source}: model {config.name!r}: negative version in specific policy")
    return VersionPolicy("specific", versions=versions)
  return VersionPolicy("all")


def validate_model_server_config(config: model_server_config_pb2.ModelServerConfig,
                                 source: str, allowed_roots) -> list:
  """ModelSpecConfigs for every model of `config`, or a ConfigError naming `source`."""
  if config.WhichOneof("config") == "custom_model_config":
    raise ConfigError(f"{source}: custom_model_config is not supported; use model_config_list")
  specs, names = [], set()
  for index, model in enumerate(config.model_config_list.config):
    where = f"{source}: model_config_list.config[{index}]"
    if not model.name:
      raise ConfigError(f"{where}: name is empty")
    if "/" in model.name or model.name in (".", ".."):
      raise ConfigError(f"{where}: name {model.name!r} may not contain '/'")
    if model.name in names:
      raise ConfigError(f"{where}: model {model.name!r} is configured twice")
    names.add(model.name)
    if model.HasField("logging_config"):
      # Refused, as tensorflow_model_server refuses it: its request logger writes through a
      # LogCollector chosen by log_collector_config.type, and the open-source binary
      # registers no LogCollector (nor a request-logger creator), so any logging_config
      # fails there with INVALID_ARGUMENT; there is no file format to be faithful to.
      # Requests are logged one line each on the "serving.access" logger instead.
      raise ConfigError(f"{where}: model {model.name!r}: logging_config (request logging) is "
                        f"not supported, as in tensorflow_model_server, which has no log "
                        f"collector; remove it (every request is logged on the "
                        f"'serving.access' logger)")
    if model.model_platform not in ("", DEFAULT_MODEL_PLATFORM):
      raise ConfigError(f"{where}: model_platform {model.model_platform!r} is not supported "
                        f"(only {DEFAULT_MODEL_PLATFORM!r})")
    try:
      base_path = paths.resolve_base_path(model.base_path, allowed_roots, where)
    except ValueError as e:
      raise ConfigError(str(e)) from None
    labels = []
    for label, version in sorted(model.version_labels.items()):
      if not label or version < 0:
        raise ConfigError(f"{where}: bad version label {label!r} → {version}")
      labels.append((label, int(version)))
    specs.append(ModelSpecConfig(model.name, base_path, _policy(model, where), tuple(labels)))
  return specs


def read_model_server_config(path: str) -> model_server_config_pb2.ModelServerConfig:
  """Parses a --model_config_file (text proto); errors name the file."""
  return _read_text_proto(path, "--model_config_file",
                          model_server_config_pb2.ModelServerConfig())


def single_model_config(name: str, base_path: str) -> model_server_config_pb2.ModelServerConfig:
  """The config --model_name/--model_base_path stand for (latest version only)."""
  config = model_server_config_pb2.ModelServerConfig()
  model = config.model_config_list.config.add()
  model.name, model.base_path = name, base_path
  model.model_platform = DEFAULT_MODEL_PLATFORM
  return config


def default_allowed_roots(specs) -> list:
  """Without --model_root, models may live beside the ones configured at start."""
  return sorted({os.path.dirname(spec.base_path.rstrip("/")) or spec.base_path
                 for spec in specs})


# ---------------------------------------------------------------------------------------
# Batching parameters.


def _batching_parameters_file_proto() -> descriptor_pb2.FileDescriptorProto:
  field = descriptor_pb2.FieldDescriptorProto
  file_proto = descriptor_pb2.FileDescriptorProto(
      name="tensorflow_serving/servables/tensorflow/session_bundle_config.proto",
      package="tensorflow.serving", syntax="proto3",
      dependency=["google/protobuf/wrappers.proto"])
  message = file_proto.message_type.add(name="BatchingParameters")
  wrapped = [("max_batch_size", 1, "Int64Value"), ("batch_timeout_micros", 2, "Int64Value"),
             ("max_enqueued_batches", 3, "Int64Value"), ("num_batch_threads", 4, "Int64Value"),
             ("thread_pool_name", 5, "StringValue")]
  for name, number, wrapper in wrapped:
    message.field.add(name=name, number=number, label=field.LABEL_OPTIONAL,
                      type=field.TYPE_MESSAGE, type_name=f".google.protobuf.{wrapper}")
  message.field.add(name="allowed_batch_sizes", number=6, label=field.LABEL_REPEATED,
                    type=field.TYPE_INT64)
  message.field.add(name="pad_variable_length_inputs", number=7,
                    label=field.LABEL_OPTIONAL, type=field.TYPE_BOOL)
  return file_proto


BatchingParameters = _message_class(
    "tensorflow_serving.servables.tensorflow.session_bundle_config_pb2",
    _batching_parameters_file_proto(), "BatchingParameters", dependencies=(wrappers_pb2,))


@dataclasses.dataclass(frozen=True)
class BatchingOptions:
  """Validated batching parameters; defaults are TF Serving's BasicBatchScheduler's."""
  max_batch_size: int = 1000
  batch_timeout_micros: int = 0
  max_enqueued_batches: int = 10
  num_batch_threads: int = dataclasses.field(default_factory=lambda: os.cpu_count() or 1)
  thread_pool_name: str = "batch_threads"
  allowed_batch_sizes: tuple = ()

  def __post_init__(self):
    if self.max_batch_size < 1:
      raise ConfigError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
    if self.batch_timeout_micros < 0:
      raise ConfigError(f"batch_timeout_micros must be >= 0, got {self.batch_timeout_micros}")
    if self.max_enqueued_batches < 1:
      raise ConfigError(f"max_enqueued_batches must be >= 1, got {self.max_enqueued_batches}")
    if self.num_batch_threads < 1:
      raise ConfigError(f"num_batch_threads must be >= 1, got {self.num_batch_threads}")
    sizes = list(self.allowed_batch_sizes)
    if sizes:
      if sizes != sorted(set(sizes)) or sizes[0] < 1:
        raise ConfigError(f"allowed_batch_sizes must be increasing positive sizes, got {sizes}")
      if sizes[-1] != self.max_batch_size:
        raise ConfigError(f"the last allowed_batch_sizes entry ({sizes[-1]}) must equal "
                          f"max_batch_size ({self.max_batch_size})")


def batching_options_from_proto(params, source: str) -> BatchingOptions:
  if params.pad_variable_length_inputs:
    raise ConfigError(f"{source}: pad_variable_length_inputs is not supported by this "
                      f"server (requests are only merged when their non-batch shapes match)")
  values = {}
  for name in ("max_batch_size", "batch_timeout_micros", "max_enqueued_batches",
               "num_batch_threads", "thread_pool_name"):
    if params.HasField(name):
      values[name] = getattr(params, name).value
  values["allowed_batch_sizes"] = tuple(params.allowed_batch_sizes)
  try:
    return BatchingOptions(**values)
  except ConfigError as e:
    raise ConfigError(f"{source}: {e}") from None


def read_batching_parameters(path: Optional[str]) -> BatchingOptions:
  """Parses a --batching_parameters_file (text proto); none means the defaults."""
  if not path:
    return BatchingOptions()
  params = _read_text_proto(path, "--batching_parameters_file", BatchingParameters())
  return batching_options_from_proto(params, f"--batching_parameters_file {path}")


# ---------------------------------------------------------------------------------------
# SSL config.


def _ssl_config_file_proto() -> descriptor_pb2.FileDescriptorProto:
  field = descriptor_pb2.FieldDescriptorProto
  file_proto = descriptor_pb2.FileDescriptorProto(
      name="tensorflow_serving/config/ssl_config.proto", package="tensorflow.serving",
      syntax="proto3")
  message = file_proto.message_type.add(name="SSLConfig")
  for name, number, kind in (("server_key", 1, field.TYPE_STRING),
                             ("server_cert", 2, field.TYPE_STRING),
                             ("custom_ca", 3, field.TYPE_STRING),
                             ("client_verify", 4, field.TYPE_BOOL)):
    message.field.add(name=name, number=number, label=field.LABEL_OPTIONAL, type=kind)
  return file_proto


# The PEM texts themselves (not file names) go in the fields, as tensorflow_model_server
# hands them to gRPC as they are.
SSLConfig = _message_class("tensorflow_serving.config.ssl_config_pb2",
                           _ssl_config_file_proto(), "SSLConfig")


def read_ssl_config(path: str):
  """Parses an --ssl_config_file (SSLConfig text proto); errors name the file.

  Args:
    path: the file.

  Returns:
    The SSLConfig message (server_key, server_cert, custom_ca: PEM texts; client_verify).
  """
  return _read_text_proto(path, "--ssl_config_file", SSLConfig())


# ---------------------------------------------------------------------------------------
# Monitoring config.

# Where tensorflow_model_server serves Prometheus text when prometheus_config.path is empty
# (PrometheusExporter::kPrometheusPath).
DEFAULT_PROMETHEUS_PATH = "/monitoring/prometheus/metrics"


def _monitoring_config_file_proto() -> descriptor_pb2.FileDescriptorProto:
  field = descriptor_pb2.FieldDescriptorProto
  file_proto = descriptor_pb2.FileDescriptorProto(
      name="tensorflow_serving/config/monitoring_config.proto",
      package="tensorflow.serving", syntax="proto3")
  prometheus = file_proto.message_type.add(name="PrometheusConfig")
  prometheus.field.add(name="enable", number=1, label=field.LABEL_OPTIONAL,
                       type=field.TYPE_BOOL)
  prometheus.field.add(name="path", number=2, label=field.LABEL_OPTIONAL,
                       type=field.TYPE_STRING)
  monitoring = file_proto.message_type.add(name="MonitoringConfig")
  monitoring.field.add(name="prometheus_config", number=1, label=field.LABEL_OPTIONAL,
                       type=field.TYPE_MESSAGE,
                       type_name=".tensorflow.serving.PrometheusConfig")
  return file_proto


MonitoringConfig = _message_class("tensorflow_serving.config.monitoring_config_pb2",
                                  _monitoring_config_file_proto(), "MonitoringConfig")


@dataclasses.dataclass(frozen=True)
class MonitoringOptions:
  """A validated MonitoringConfig: whether, and at which REST path, Prometheus text is served."""
  prometheus_enabled: bool = False
  prometheus_path: str = DEFAULT_PROMETHEUS_PATH


def read_monitoring_config(path: str) -> MonitoringOptions:
  """Parses a --monitoring_config_file (text proto); errors name the file.

  Args:
    path: the MonitoringConfig text proto, e.g.
      `prometheus_config { enable: true, path: "/monitoring/prometheus/metrics" }`.
  Returns:
    The MonitoringOptions it asks for (an empty path means DEFAULT_PROMETHEUS_PATH).
  """
  source = f"--monitoring_config_file {path}"
  config = _read_text_proto(path, "--monitoring_config_file", MonitoringConfig())
  prometheus = config.prometheus_config
  metrics_path = prometheus.path or DEFAULT_PROMETHEUS_PATH
  # The REST routes own /v1/; a metrics path there would hide a model's route (or be hidden).
  if not metrics_path.startswith("/") or metrics_path.split("?")[0] != metrics_path or (
      metrics_path == "/v1" or metrics_path.startswith("/v1/")):
    raise ConfigError(f"{source}: prometheus_config.path {metrics_path!r} must be an absolute "
                      f"URL path without a query, outside the REST API's /v1/")
  return MonitoringOptions(prometheus.enable, metrics_path)
