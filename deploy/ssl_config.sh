#!/bin/bash
# Writes TF Serving's SSLConfig (tensorflow_serving/config/ssl_config.proto), text format,
# to stdout from PEM files: the proto holds the PEM texts themselves, not paths, so the
# config is made where the certificates are (at container start, from mounted files)
# instead of being committed with a key in it.
#   ssl_config.sh SERVER_KEY SERVER_CERT [CUSTOM_CA [CLIENT_VERIFY]]
# CUSTOM_CA: the CA that signs client certificates; CLIENT_VERIFY=true refuses clients
# without one (mutual TLS). Then: tensorflow_model_server --ssl_config_file=FILE.
set -euo pipefail
if [[ $# -lt 2 || $# -gt 4 ]]; then
  echo "usage: $0 SERVER_KEY SERVER_CERT [CUSTOM_CA [CLIENT_VERIFY]]" >&2
  exit 2
fi
verify="${4:-false}"
if [[ "$verify" != true && "$verify" != false ]]; then
  echo "$0: CLIENT_VERIFY must be true or false, got $verify" >&2
  exit 2
fi
# One PEM file as a text-format string, its lines joined by \n. PEM is base64 between
# BEGIN/END lines: a quote or backslash means a wrong file, refused rather than escaped.
pem_string() {
  if [[ ! -r "$1" ]]; then
    echo "$0: cannot read $1" >&2
    exit 1
  fi
  if grep -q '["\\]' "$1" || ! grep -q -- '-----BEGIN ' "$1"; then
    echo "$0: $1 is not a PEM file" >&2
    exit 1
  fi
  awk '{ printf "%s\\n", $0 }' "$1"
}
# Read before printing: a failure inside an assignment's $(...) stops the script (set -e),
# so nothing half made is written.
key=$(pem_string "$1")
cert=$(pem_string "$2")
ca=""
if [[ $# -ge 3 && -n "$3" ]]; then
  ca=$(pem_string "$3")
fi
echo "server_key: \"$key\""
echo "server_cert: \"$cert\""
if [[ -n "$ca" ]]; then
  echo "custom_ca: \"$ca\""
fi
if [[ "$verify" == true ]]; then
  echo "client_verify: true"
fi
