#!/bin/bash
# tensorflow_model_server with deploy/'s configs: gRPC on 8500, REST (and Prometheus) on
# 8501, realm_qa's versions and labels from models.config, batching and monitoring on. With
# a server key and certificate mounted at /certs (and optionally /certs/ca.crt for client
# certificates, CLIENT_VERIFY=true to require them), both ports speak TLS only.
# Extra arguments are passed to the server.
# An export made with realm_tf.export --reader_xla (realm_tf.export.assembly.READER_XLA)
# runs its reader XLA-compiled, which the binary does only with
# --xla_cpu_compilation_enabled=true (EXPERIMENTAL in tensorflow_model_server; without it
# such a version fails its warm-up and is not served). The flag is added when a version
# under MODELS_DIR says so in its provenance when the container starts; a later version
# that needs it takes a restart (or pass the flag yourself).
set -euo pipefail
CONFIG_DIR=${CONFIG_DIR:-/etc/realm_qa}
MODELS_DIR=${MODELS_DIR:-/models/realm_qa}  # models.config's base_path
args=(
  --port=8500
  --rest_api_port=8501
  --model_config_file="$CONFIG_DIR/models.config"
  --model_config_file_poll_wait_seconds=60
  --enable_batching=true
  --batching_parameters_file="$CONFIG_DIR/batching.config"
  --monitoring_config_file="$CONFIG_DIR/monitoring.config"
)
if [[ -f /certs/server.key && -f /certs/server.crt ]]; then
  ca=""
  [[ -f /certs/ca.crt ]] && ca=/certs/ca.crt
  mkdir -p /run/realm_qa
  "$CONFIG_DIR/ssl_config.sh" /certs/server.key /certs/server.crt "$ca" \
      "${CLIENT_VERIFY:-false}" > /run/realm_qa/ssl.config
  args+=(--ssl_config_file=/run/realm_qa/ssl.config)
else
  echo "entrypoint: no /certs/server.key and /certs/server.crt: serving without TLS" >&2
fi
if grep -qs '"reader_xla": true' "$MODELS_DIR"/*/assets.extra/realm_provenance.json; then
  args+=(--xla_cpu_compilation_enabled=true)
fi
exec tensorflow_model_server "${args[@]}" "$@"
