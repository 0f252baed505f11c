"""TLS for the gRPC and REST ports, from tensorflow_model_server's `--ssl_config_file`.

The file is an SSLConfig text proto (serving.config.SSLConfig) holding the PEM texts
themselves, as tensorflow_model_server reads it:

    server_key: "-----BEGIN PRIVATE KEY-----\\n...\\n-----END PRIVATE KEY-----\\n"
    server_cert: "-----BEGIN CERTIFICATE-----\\n...\\n-----END CERTIFICATE-----\\n"
    custom_ca: "-----BEGIN CERTIFICATE-----\\n...\\n-----END CERTIFICATE-----\\n"
    client_verify: true

gRPC listens with grpc's own `ssl_server_credentials` (client certificates required and
checked against custom_ca when client_verify), as tensorflow_model_server builds its
`SslServerCredentials`. The REST port serves HTTPS with the same key and certificate and
the same client check through the standard library's `ssl`; tensorflow_model_server's
REST port stays plain HTTP whatever the file says, so this is one place this server does
more than it (docs/serving.md).

Everything is checked once, at start, through `ssl` (a key that is not the certificate's,
a PEM that does not parse, an encrypted key), so a bad file is one error naming it rather
than every handshake failing later: grpc takes the PEM texts unchecked.
"""
import dataclasses
import os
import ssl
import tempfile

import grpc

from serving import config as config_lib

FLAG = "--ssl_config_file"


@dataclasses.dataclass(frozen=True)
class ServerTls:
  """A checked SSLConfig: the PEM texts for gRPC and the SSLContext for REST."""
  server_key: bytes
  server_cert: bytes
  custom_ca: bytes  # b"" when the file has none
  client_verify: bool
  ssl_context: ssl.SSLContext

  def grpc_credentials(self) -> grpc.ServerCredentials:
    """The gRPC port's credentials (tensorflow_model_server's SslServerCredentialsOptions:
    custom_ca as the root certificates, client certificates required iff client_verify)."""
    return grpc.ssl_server_credentials([(self.server_key, self.server_cert)],
                                       root_certificates=self.custom_ca or None,
                                       require_client_auth=self.client_verify)


def _refuse_encrypted_key(*_):
  # ssl asks for a password only when the key is encrypted; gRPC cannot use such a key
  # (it has no password option), and an interactive prompt must never block a server start.
  raise ValueError("server_key is encrypted; give the key unencrypted (gRPC reads it as is)")


def _rest_context(source: str, key: str, cert: str, custom_ca: str,
                  client_verify: bool) -> ssl.SSLContext:
  """The REST port's server SSLContext; a ConfigError naming `source` and the field."""
  context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
  context.minimum_version = ssl.TLSVersion.TLSv1_2  # as gRPC's own minimum
  context.set_alpn_protocols(["http/1.1"])
  # Why through files: ssl loads a certificate chain and key only from files (no in-memory
  # form in the standard library). They live a moment in a private directory (mode 0700),
  # written 0600, and are gone before this returns.
  with tempfile.TemporaryDirectory(prefix="realm-tls-") as private:
    paths = {}
    for name, text in (("server_cert", cert), ("server_key", key)):
      paths[name] = os.path.join(private, name)
      fd = os.open(paths[name], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
      with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    try:
      context.load_cert_chain(paths["server_cert"], paths["server_key"],
                              password=_refuse_encrypted_key)
    except ValueError as e:
      raise config_lib.ConfigError(f"{source}: {e}") from None
    except ssl.SSLError as e:
      what = ("server_key does not belong to server_cert" if "KEY_VALUES_MISMATCH" in str(e)
              else "server_key or server_cert is not a readable PEM")
      raise config_lib.ConfigError(f"{source}: {what}: {e}") from None
  if custom_ca:
    try:
      context.load_verify_locations(cadata=custom_ca)
    except (ssl.SSLError, ValueError) as e:
      raise config_lib.ConfigError(f"{source}: custom_ca is not a PEM certificate: "
                                   f"{e}") from None
  if client_verify:
    context.verify_mode = ssl.CERT_REQUIRED
  return context


def load_server_tls(path: str) -> ServerTls:
  """Reads and checks an --ssl_config_file.

  Args:
    path: the SSLConfig text proto.

  Returns:
    The checked ServerTls.

  Raises:
    config_lib.ConfigError: naming the file and what is wrong: unreadable, not an
      SSLConfig, server_key or server_cert missing or not PEM, a key that is not the
      certificate's, an encrypted key, a custom_ca that is not PEM, or client_verify
      without custom_ca (nothing to check client certificates against).
  """
  source = f"{FLAG} {path}"
  config = config_lib.read_ssl_config(path)
  for name in ("server_key", "server_cert", "custom_ca"):
    text = getattr(config, name)
    if not text.strip() and name != "custom_ca":
      raise config_lib.ConfigError(f"{source}: {name} is empty; it holds the PEM text "
                                   f"itself, not a file name")
    if text.strip() and "-----BEGIN " not in text:
      raise config_lib.ConfigError(f"{source}: {name} is not PEM text (it holds the PEM "
                                   f"itself, as tensorflow_model_server reads it, not a "
                                   f"file name)")
  if config.client_verify and not config.custom_ca.strip():
    # tensorflow_model_server would check clients against the system's roots; Python's
    # grpc requires explicit roots for client auth.
    raise config_lib.ConfigError(f"{source}: client_verify needs custom_ca, the CA that "
                                 f"signs the client certificates")
  context = _rest_context(source, config.server_key, config.server_cert, config.custom_ca,
                          config.client_verify)
  return ServerTls(config.server_key.encode("utf-8"), config.server_cert.encode("utf-8"),
                   config.custom_ca.encode("utf-8"), config.client_verify, context)
