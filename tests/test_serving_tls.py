"""--ssl_config_file: TLS on gRPC and REST, client certificates with client_verify, one
startup error for a bad file; serving.client's TLS options.

The certificates are made here: a CA, a server certificate for 127.0.0.1 and localhost,
a client certificate from the same CA, and one from another CA (a client the server must
not trust although it has a certificate).
"""
import datetime
import http.client
import ipaddress
import json
import socket
import ssl

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
import grpc
import pytest
from google.protobuf import text_format

from serving import client
from serving import config as config_lib
from serving import server as server_lib
from tests import serving_models
from tests.serving_harness import (RPC_TIMEOUT, outputs_of, prediction_stub, predict_request,
                                   rpc_error, running, server_config)

QUESTION = "who wrote the iliad?"
ANSWER = b"v1:WHO WROTE THE ILIAD?"  # the fake realm_qa's answer (tests.serving_models)


# ---------------------------------------------------------------------------------------
# Certificates.


def _name(common_name):
  return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(common_name, key, issuer_name, issuer_key, *, ca=False, usage=None,
                 addresses=()):
  """A certificate for `key`, signed by `issuer_key`, valid from an hour ago for 30 days."""
  now = datetime.datetime.now(datetime.timezone.utc)
  builder = (x509.CertificateBuilder()
             .subject_name(_name(common_name)).issuer_name(issuer_name)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(hours=1))
             .not_valid_after(now + datetime.timedelta(days=30))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
             .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                            critical=False)
             .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                 issuer_key.public_key()), critical=False))
  if ca:
    builder = builder.add_extension(x509.KeyUsage(
        digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
        key_encipherment=False, data_encipherment=False, key_agreement=False,
        encipher_only=False, decipher_only=False), critical=True)
  if usage is not None:
    builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
  if addresses:
    builder = builder.add_extension(x509.SubjectAlternativeName(
        [x509.DNSName("localhost"), *(x509.IPAddress(ipaddress.ip_address(a))
                                      for a in addresses)]), critical=False)
  return builder.sign(issuer_key, hashes.SHA256())


def _pem(certificate) -> str:
  return certificate.public_bytes(serialization.Encoding.PEM).decode("ascii")


def _key_pem(key, password=None) -> str:
  encryption = (serialization.BestAvailableEncryption(password) if password else
                serialization.NoEncryption())
  return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                           encryption).decode("ascii")


class Pki:
  """PEM texts and files: ca, server, client (signed by ca), stranger (another CA's)."""

  def __init__(self, directory):
    self.dir = directory
    self.pem, self.files, self.keys = {}, {}, {}
    for ca_name in ("ca", "other_ca"):
      key = ec.generate_private_key(ec.SECP256R1())
      cert = _certificate(f"realm_tf test {ca_name}", key, _name(f"realm_tf test {ca_name}"),
                          key, ca=True)
      self._add(ca_name, key, cert)
    for name, ca_name, usage, addresses in (
        ("server", "ca", ExtendedKeyUsageOID.SERVER_AUTH, ("127.0.0.1",)),
        ("client", "ca", ExtendedKeyUsageOID.CLIENT_AUTH, ()),
        ("stranger", "other_ca", ExtendedKeyUsageOID.CLIENT_AUTH, ())):
      key = ec.generate_private_key(ec.SECP256R1())
      cert = _certificate(f"realm_tf test {name}", key, _name(f"realm_tf test {ca_name}"),
                          self.keys[ca_name], usage=usage, addresses=addresses)
      self._add(name, key, cert)

  def _add(self, name, key, cert):
    self.keys[name] = key
    self.pem[f"{name}.pem"] = _pem(cert)
    self.pem[f"{name}.key"] = _key_pem(key)
    for suffix in ("pem", "key"):
      path = self.dir / f"{name}.{suffix}"
      path.write_text(self.pem[f"{name}.{suffix}"])
      self.files[f"{name}.{suffix}"] = str(path)

  def ssl_config(self, path, client_verify=False, **fields) -> str:
    """An --ssl_config_file at `path` (written with the SSLConfig proto's own text format):
    the server's key and certificate, custom_ca, client_verify; `fields` override."""
    values = {"server_key": self.pem["server.key"], "server_cert": self.pem["server.pem"],
              "custom_ca": self.pem["ca.pem"], "client_verify": client_verify}
    values.update(fields)
    path.write_text(text_format.MessageToString(config_lib.SSLConfig(**values)))
    return str(path)

  def channel_credentials(self, client_name=None):
    return client.channel_credentials(
        self.files["ca.pem"], client_name and self.files[f"{client_name}.pem"],
        client_name and self.files[f"{client_name}.key"])

  def https_context(self, client_name=None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=self.files["ca.pem"])
    if client_name:
      context.load_cert_chain(self.files[f"{client_name}.pem"], self.files[f"{client_name}.key"])
    return context


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
  return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def models(built, tmp_path_factory):
  root = tmp_path_factory.mktemp("models")
  serving_models.publish(built["qa"], str(root / "realm_qa"), 1)
  return server_config(realm_qa=str(root / "realm_qa"))


@pytest.fixture(scope="module")
def tls_server(pki, models, tmp_path_factory):
  """realm_qa over TLS on gRPC and REST; client certificates not asked for."""
  config = pki.ssl_config(tmp_path_factory.mktemp("tls") / "ssl.config")
  with running(models, channel_credentials=pki.channel_credentials(), rest_api_port=0,
               ssl_config_file=config) as (server, channel):
    yield server, channel


@pytest.fixture(scope="module")
def verifying_server(pki, models, tmp_path_factory):
  """realm_qa over TLS with client_verify: client certificates signed by custom_ca only."""
  config = pki.ssl_config(tmp_path_factory.mktemp("mtls") / "ssl.config", client_verify=True)
  with running(models, channel_credentials=pki.channel_credentials("client"), rest_api_port=0,
               ssl_config_file=config) as (server, channel):
    yield server, channel


# ---------------------------------------------------------------------------------------
# Requests.


def _qa_request():
  return predict_request("realm_qa", question=[QUESTION])


def _grpc_answer(channel) -> bytes:
  response = prediction_stub(channel).Predict(_qa_request(), timeout=RPC_TIMEOUT)
  return outputs_of(response)["answer"][0]


def _grpc_refusal(server, credentials=None) -> grpc.StatusCode:
  """The status of a Predict on a fresh channel: plaintext, or TLS with `credentials`."""
  address = f"127.0.0.1:{server.port}"
  channel = (grpc.insecure_channel(address) if credentials is None
             else grpc.secure_channel(address, credentials))
  with channel:
    return rpc_error(prediction_stub(channel).Predict, _qa_request()).code()


def _rest_predict(server, context=None):
  """POST :predict to the REST port: HTTPS with `context`, else plain HTTP."""
  if context is None:
    connection = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=RPC_TIMEOUT)
  else:
    connection = http.client.HTTPSConnection("127.0.0.1", server.rest_port,
                                             timeout=RPC_TIMEOUT, context=context)
  try:
    connection.request("POST", "/v1/models/realm_qa:predict",
                       body=json.dumps({"instances": [QUESTION]}),
                       headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, json.loads(response.read())
  finally:
    connection.close()


def _client_main(server, capsys, *options):
  status = client.main(["--server", f"127.0.0.1:{server.port}", *options, QUESTION])
  return status, capsys.readouterr()


# ---------------------------------------------------------------------------------------
# Tests.


def test_ssl_config_has_tf_servings_field_numbers():
  # ssl_config.proto: server_key = 1, server_cert = 2, custom_ca = 3, client_verify = 4
  # (string fields are tag 8n+2, the bool 8n+0): the wire bytes pin the numbers.
  message = config_lib.SSLConfig(server_key="k", server_cert="c", custom_ca="a",
                                 client_verify=True)
  assert message.SerializeToString() == b"\x0a\x01k\x12\x01c\x1a\x01a\x20\x01"
  assert message.DESCRIPTOR.full_name == "tensorflow.serving.SSLConfig"


def test_a_tls_client_is_answered_over_grpc_and_rest(tls_server, pki, capsys):
  server, channel = tls_server
  assert _grpc_answer(channel) == ANSWER
  status, body = _rest_predict(server, pki.https_context())
  assert status == 200 and body["predictions"][0]["answer"] == ANSWER.decode()
  status, printed = _client_main(server, capsys, "--ssl_ca_file", pki.files["ca.pem"])
  assert status == 0 and printed.out.startswith(f"Q: {QUESTION}\nA: {ANSWER.decode()}")


def test_a_plaintext_client_is_refused_over_grpc_and_rest(tls_server, pki, capsys):
  server, channel = tls_server
  assert _grpc_refusal(server) == grpc.StatusCode.UNAVAILABLE
  with pytest.raises(ConnectionError):  # the handshake fails: closed without an answer
    _rest_predict(server)
  status, printed = _client_main(server, capsys)  # the QA client without its TLS options
  assert status == 1 and "UNAVAILABLE" in printed.err
  # Refusing them broke nothing: TLS clients are still answered.
  assert _grpc_answer(channel) == ANSWER
  assert _rest_predict(server, pki.https_context())[0] == 200


def test_a_rest_client_that_never_starts_its_handshake_holds_up_no_other(tls_server, pki):
  # The handshake runs in the connection's own handler thread: were it in the accept loop,
  # the request below would wait there behind the silent connection until the REST
  # timeout (30 s), past this request's own (10 s).
  server, _ = tls_server
  with socket.create_connection(("127.0.0.1", server.rest_port), timeout=RPC_TIMEOUT):
    status, body = _rest_predict(server, pki.https_context())
  assert status == 200 and body["predictions"][0]["answer"] == ANSWER.decode()


def test_a_client_that_does_not_trust_the_servers_ca_refuses_it(tls_server, capsys):
  # The certificate the server shows is checked: with the system's roots it is untrusted.
  server, _ = tls_server
  status, printed = _client_main(server, capsys, "--tls")
  assert status == 1 and "UNAVAILABLE" in printed.err
  with pytest.raises(ssl.SSLCertVerificationError):
    _rest_predict(server, ssl.create_default_context())


def test_client_verify_answers_only_clients_with_a_certificate_of_custom_ca(
    verifying_server, pki, capsys):
  server, channel = verifying_server
  assert _grpc_answer(channel) == ANSWER  # the fixture's channel has the client certificate
  assert _grpc_refusal(server, pki.channel_credentials()) == grpc.StatusCode.UNAVAILABLE
  assert (_grpc_refusal(server, pki.channel_credentials("stranger"))
          == grpc.StatusCode.UNAVAILABLE)
  status, body = _rest_predict(server, pki.https_context("client"))
  assert status == 200 and body["predictions"][0]["answer"] == ANSWER.decode()
  for refused in (None, "stranger"):
    # TLS 1.3 ends the client's side of the handshake before the server has checked its
    # certificate: the refusal arrives as an alert or a reset on the request.
    with pytest.raises((ssl.SSLError, ConnectionError)):
      _rest_predict(server, pki.https_context(refused))
  status, printed = _client_main(server, capsys, "--ssl_ca_file", pki.files["ca.pem"])
  assert status == 1 and "UNAVAILABLE" in printed.err
  status, printed = _client_main(server, capsys, "--ssl_ca_file", pki.files["ca.pem"],
                                 "--ssl_cert_file", pki.files["client.pem"],
                                 "--ssl_key_file", pki.files["client.key"])
  assert status == 0 and printed.out.startswith(f"Q: {QUESTION}\nA: {ANSWER.decode()}")


_BAD_CONFIGS = {
    # case: (SSLConfig fields, or raw text; what the error says)
    "missing file": (None, "cannot read"),
    "unknown field": ('server_key_file: "server.key"', "not a SSLConfig text proto"),
    "no server_key": ({"server_key": ""}, "server_key is empty"),
    "a file name": ({"server_cert": "/etc/ssl/server.pem"}, "server_cert is not PEM text"),
    "another key": ({"server_key": "client.key"}, "server_key does not belong to server_cert"),
    "broken PEM": ({"server_cert": "-----BEGIN CERTIFICATE-----\nnot base64\n"
                                   "-----END CERTIFICATE-----\n"},
                   "server_key or server_cert is not a readable PEM"),
    "encrypted key": ({"server_key": "encrypted"}, "server_key is encrypted"),
    "bad custom_ca": ({"custom_ca": "-----BEGIN CERTIFICATE-----\nAAAA\n"
                                    "-----END CERTIFICATE-----\n"},
                      "custom_ca is not a PEM certificate"),
    "verify without ca": ({"custom_ca": "", "client_verify": True},
                          "client_verify needs custom_ca"),
}


@pytest.mark.parametrize("case", sorted(_BAD_CONFIGS))
def test_a_bad_ssl_config_is_one_startup_error_naming_the_file(case, pki, tmp_path, capsys):
  fields, expected = _BAD_CONFIGS[case]
  path = tmp_path / "ssl.config"
  if isinstance(fields, str):
    path.write_text(fields)
  elif isinstance(fields, dict):
    pem = {"client.key": pki.pem["client.key"],
           "encrypted": _key_pem(pki.keys["server"], password=b"secret")}
    pki.ssl_config(path, **{name: pem.get(value, value) for name, value in fields.items()})
  # The model path does not exist: the file is checked before any model is looked at.
  status = server_lib.main(["serving.server", "--port=0", f"--ssl_config_file={path}",
                            f"--model_base_path={tmp_path / 'models' / 'realm_qa'}"])
  err = capsys.readouterr().err
  assert status == 2
  assert f"serving.server: error: --ssl_config_file {path}: " in err and expected in err, err


def test_client_tls_options_are_checked(pki, tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    client.main(["--ssl_cert_file", pki.files["client.pem"], QUESTION])
  assert exit_info.value.code == 2
  assert "needs both --ssl_cert_file and --ssl_key_file" in capsys.readouterr().err
  missing = tmp_path / "absent-ca.pem"
  with pytest.raises(SystemExit) as exit_info:
    client.main(["--ssl_ca_file", str(missing), QUESTION])
  assert exit_info.value.code == 2
  assert f"--ssl_ca_file {missing}: cannot read" in capsys.readouterr().err
