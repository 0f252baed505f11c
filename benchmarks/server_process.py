"""`python -m serving.server` as a child process of a benchmark (soak, serving_memory,
scale): one way to start it, find its port, follow its versions and stop it.

Free of TensorFlow on purpose: a benchmark starts the server first and imports
TensorFlow while the server starts up.
"""
import os
import re
import subprocess
import sys
import time

from benchmarks import harness



class ServerProcess:
  """`python -m serving.server` on 127.0.0.1 with an ephemeral port, its output in a file.

  Args:
    base_path: the model's base path (--model_base_path).
    model: the model name (--model_name).
    log_path: where the server's output goes.
    flags: further serving.server flags, e.g. ["--max_batch_size=32"].
    env: extra environment variables.
  """

  def __init__(self, base_path: str, model: str, log_path: str, flags=(), env=None):
    self.model = model
    self.log_path = log_path
    self._log = open(log_path, "w")  # pylint: disable=consider-using-with
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=harness.REPO, PYTHONUNBUFFERED="1",
               **(env or {}))
    self.started = time.monotonic()
    self.process = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, "-m", "serving.server", "--port=0", f"--model_name={model}",
         f"--model_base_path={base_path}", "--file_system_poll_wait_seconds=1", *flags],
        cwd=harness.REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT)
    self.address = None

  def log(self) -> str:
    with open(self.log_path, errors="replace") as f:
      return f.read()

  def wait_listening(self, timeout: float = 600.0) -> str:
    """The server's gRPC address, once it logs that it listens.

    Raises:
      RuntimeError: the server exited first. TimeoutError: not within `timeout` seconds.
    """
    end = time.monotonic() + timeout
    while time.monotonic() < end:
      found = re.search(r"serving\.server: gRPC (\S+)", self.log())
      if found:
        self.address = found.group(1)
        return self.address
      if self.process.poll() is not None:
        raise RuntimeError(f"the server exited ({self.process.returncode}):\n"
                           f"{self.log()[-3000:]}")
      time.sleep(0.1)
    raise TimeoutError(f"the server did not listen within {timeout:.0f}s")

  def states(self, channel) -> dict:
    """{version: state name} from ModelService.GetModelStatus ({} if it cannot answer)."""
    import grpc  # pylint: disable=g-import-not-at-top
    from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc  # pylint: disable=g-import-not-at-top
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = self.model
    try:
      response = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
          request, timeout=30)
    except grpc.RpcError:
      return {}
    names = get_model_status_pb2.ModelVersionStatus.State.Name
    return {s.version: names(s.state) for s in response.model_version_status}

  def wait_serving(self, channel, version: int, timeout: float):
    """Until `version` is AVAILABLE and every older one END.

    Raises:
      RuntimeError: the server exited first. TimeoutError: not within `timeout` seconds.
    """
    end = time.monotonic() + timeout
    while time.monotonic() < end:
      states = self.states(channel)
      if states.get(version) == "AVAILABLE" and all(
          s == "END" for v, s in states.items() if v < version):
        return
      if self.process.poll() is not None:
        raise RuntimeError(f"the server exited:\n{self.log()[-3000:]}")
      time.sleep(0.1)
    raise TimeoutError(f"version {version} not serving within {timeout:.0f}s:\n"
                       f"{self.log()[-3000:]}")

  def rss_bytes(self) -> int:
    return harness.rss_bytes(self.process.pid)

  def stop(self) -> int:
    """Terminates the server (killed after 60 s); its exit code."""
    if self.process.poll() is None:
      self.process.terminate()
      try:
        self.process.wait(60)
      except subprocess.TimeoutExpired:
        self.process.kill()
        self.process.wait(30)
    self._log.close()
    return self.process.returncode
