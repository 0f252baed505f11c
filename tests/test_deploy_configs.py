"""deploy/: every config parses with TF Serving's protos, serving/ starts with them and
answers through their labels, the SSL config script writes an SSLConfig from PEM files, and
the Dockerfile's image is the TF Serving release of the pinned TensorFlow, whose ops the
allow-list holds. A wrong field name or value in any of them fails here."""
import dataclasses
import json
import os
import pathlib
import re
import ssl
import subprocess
import urllib.request

import grpc
import pytest
import tensorflow as tf
from google.protobuf import text_format
from prometheus_client.parser import text_string_to_metric_families

from realm_tf.export import model_server_ops
from serving import config as config_lib
from serving.server import ModelServer, parse_flags
from tests import serving_models
from tests.serving_harness import RPC_TIMEOUT, outputs_of, prediction_stub, predict_request

DEPLOY = pathlib.Path(__file__).resolve().parent.parent / "deploy"
MODELS = DEPLOY / "models.config"
BATCHING = DEPLOY / "batching.config"
MONITORING = DEPLOY / "monitoring.config"
SSL_SCRIPT = DEPLOY / "ssl_config.sh"


def _parse(path: pathlib.Path, message):
  text_format.Parse(path.read_text(), message)
  return message


def test_model_config_serves_two_versions_with_a_label_each():
  config = config_lib.read_model_server_config(str(MODELS))  # the official proto
  [model] = config.model_config_list.config
  assert model.name == "realm_qa" and model.model_platform == "tensorflow"
  versions = sorted(model.model_version_policy.specific.versions)
  assert len(versions) >= 2
  assert dict(model.version_labels) == {"stable": versions[0], "canary": versions[1]}
  # serving/'s own checks of the config (paths, labels, policy) pass too.
  [spec] = config_lib.validate_model_server_config(config, str(MODELS), [])
  assert spec.version_labels == (("canary", versions[1]), ("stable", versions[0]))


def test_batching_config_is_batching_parameters():
  params = _parse(BATCHING, config_lib.BatchingParameters())
  assert params.max_batch_size.value == 8
  options = config_lib.read_batching_parameters(str(BATCHING))  # serving/'s checks too
  assert options.allowed_batch_sizes == (1, 2, 4, 8)
  assert options.max_batch_size == params.max_batch_size.value


def test_monitoring_config_is_monitoring_config():
  config = _parse(MONITORING, config_lib.MonitoringConfig())
  assert config.prometheus_config.enable
  assert config.prometheus_config.path == "/monitoring/prometheus/metrics"


def _certificate(tmp_path: pathlib.Path) -> tuple:
  """A self-signed key and certificate (PEM files) made here, valid for 127.0.0.1."""
  key, cert = tmp_path / "server.key", tmp_path / "server.crt"
  subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                  str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                  "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                 check=True, capture_output=True)
  return key, cert


def test_ssl_config_script_writes_an_ssl_config_of_the_pem_files(tmp_path):
  key, cert = _certificate(tmp_path)
  written = subprocess.run(["bash", str(SSL_SCRIPT), str(key), str(cert), str(cert), "true"],
                           check=True, capture_output=True, text=True).stdout
  config = text_format.Parse(written, config_lib.SSLConfig())
  assert config.server_key == key.read_text()
  assert config.server_cert == cert.read_text() == config.custom_ca
  assert config.client_verify


@pytest.mark.parametrize("args, error", [
    (["{key}", "{missing}"], "cannot read"),
    (["{not_pem}", "{cert}"], "is not a PEM file"),
    (["{key}", "{cert}", "", "yes"], "CLIENT_VERIFY must be true or false"),
    (["{key}"], "usage"),
])
def test_ssl_config_script_refuses_bad_input_writing_nothing(tmp_path, args, error):
  key, cert = _certificate(tmp_path)
  not_pem = tmp_path / "notes.txt"
  not_pem.write_text('a "quoted" line\n')
  paths = dict(key=key, cert=cert, missing=tmp_path / "absent.crt", not_pem=not_pem)
  result = subprocess.run(["bash", str(SSL_SCRIPT)] + [a.format(**paths) for a in args],
                          capture_output=True, text=True)
  assert result.returncode != 0 and error in result.stderr
  assert result.stdout == ""


def test_serving_starts_with_the_deploy_configs_and_answers_by_label(tmp_path):
  """models.config with its base_path moved under tmp_path (nothing else changed),
  batching.config and monitoring.config as they are, and the SSL config ssl_config.sh
  writes, given on serving/'s command line as to the binary: answered over TLS by label,
  and Prometheus text served over HTTPS where monitoring.config says."""
  config = config_lib.read_model_server_config(str(MODELS))
  model = config.model_config_list.config[0]
  model.base_path = str(tmp_path / "models" / "realm_qa")
  for version in model.model_version_policy.specific.versions:
    built = serving_models.save_fake_realm_qa(str(tmp_path / f"built{version}"), f"v{version}")
    serving_models.publish(built, model.base_path, version)
  moved = tmp_path / "models.config"
  moved.write_text(text_format.MessageToString(config))
  key, cert = _certificate(tmp_path)
  ssl_config = tmp_path / "ssl.config"
  ssl_config.write_text(subprocess.run(["bash", str(SSL_SCRIPT), str(key), str(cert)],
                                       check=True, capture_output=True, text=True).stdout)
  options = parse_flags(["serving.server", "--port=0", "--rest_api_port=8501",
                         f"--model_config_file={moved}",
                         "--enable_batching", f"--batching_parameters_file={BATCHING}",
                         f"--monitoring_config_file={MONITORING}",
                         f"--ssl_config_file={ssl_config}",
                         f"--model_root={tmp_path / 'models'}"])
  # A free port for REST instead of the command line's 8501 (on the flag, 0 disables REST).
  server = ModelServer(dataclasses.replace(options, rest_api_port=0)).start()
  channel = grpc.secure_channel(
      f"127.0.0.1:{server.port}", grpc.ssl_channel_credentials(cert.read_bytes()))
  try:
    assert server.batcher.options == config_lib.read_batching_parameters(str(BATCHING))
    stub = prediction_stub(channel)
    for label, version in model.version_labels.items():
      request = predict_request("realm_qa", question=tf.constant(["who wrote it?"]))
      request.model_spec.version_label = label
      response = stub.Predict(request, timeout=RPC_TIMEOUT)
      assert response.model_spec.version.value == version
      assert outputs_of(response)["answer"][0].decode() == f"v{version}:WHO WROTE IT?"
    path = config_lib.read_monitoring_config(str(MONITORING)).prometheus_path
    with urllib.request.urlopen(f"https://127.0.0.1:{server.rest_port}{path}",
                                timeout=RPC_TIMEOUT,
                                context=ssl.create_default_context(cafile=str(cert))) as r:
      families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    answered = [s for s in families[":tensorflow:serving:request_count"].samples
                if s.name.endswith("_total") and s.labels.get("status") == "OK"]
    assert sum(s.value for s in answered) == len(model.version_labels)
  finally:
    channel.close()
    server.stop(grace=0.5)


def test_dockerfile_serves_with_the_pinned_tensorflows_release_and_deploy_files():
  dockerfile = (DEPLOY / "Dockerfile").read_text()
  [tag] = re.findall(r"^FROM tensorflow/serving:(\S+)$", dockerfile, re.MULTILINE)
  # The image's release is the installed (pinned) TensorFlow's, and the allow-list's.
  assert tag == tf.__version__, (tag, tf.__version__)
  assert f"tensorflow/serving {tag}" in model_server_ops.ALLOW_LIST.read_text()
  copied = re.search(r"^COPY ((?:.|\\\n)+?) /etc/realm_qa/$", dockerfile, re.MULTILINE)
  files = copied.group(1).replace("\\\n", " ").split()
  assert all((DEPLOY / name).is_file() for name in files), files
  entrypoint = (DEPLOY / "entrypoint.sh").read_text()
  for name in ("models.config", "batching.config", "monitoring.config", "ssl_config.sh"):
    assert name in files and f"$CONFIG_DIR/{name}" in entrypoint, name


@pytest.mark.parametrize("reader_xla", [False, True])
def test_entrypoint_enables_xla_exactly_when_a_served_export_needs_it(tmp_path, reader_xla):
  """entrypoint.sh adds --xla_cpu_compilation_enabled=true when a version's provenance says
  reader_xla (an export the binary refuses without it), and not otherwise; a stand-in
  tensorflow_model_server on PATH prints the arguments it is given."""
  extra = tmp_path / "models" / "7" / "assets.extra"
  extra.mkdir(parents=True)
  (extra / "realm_provenance.json").write_text(json.dumps({"reader_xla": reader_xla},
                                                          indent=2))
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  fake = bin_dir / "tensorflow_model_server"
  fake.write_text('#!/bin/bash\nprintf "%s\\n" "$@"\n')
  fake.chmod(0o755)
  env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", CONFIG_DIR=str(DEPLOY),
             MODELS_DIR=str(tmp_path / "models"))
  args = subprocess.run(["bash", str(DEPLOY / "entrypoint.sh"), "--extra=1"], env=env,
                        check=True, capture_output=True, text=True).stdout.split()
  assert f"--model_config_file={DEPLOY}/models.config" in args and args[-1] == "--extra=1"
  assert ("--xla_cpu_compilation_enabled=true" in args) == reader_xla
