"""Serve the exported realm_qa model and ask it questions over gRPC, as a user would.

`python -m serving.server` (TF Serving's PredictionService over the export) runs as a
child process on a free localhost port (--port=0; the port is read from the line it
prints once it can answer); `python -m serving.client --json` asks the questions with
the official tensorflow-serving-api stubs. The server is stopped in every case: after the
answers, on an error, or on Ctrl-C. (realm_tf never imports the `serving` entry points:
both run as commands.)
"""
import json
import os
import re
import subprocess
import threading
import time
from typing import Callable, List, Sequence

from realm_tf.demo.stages import LOG, Command, StageError, python_module, tail

_LISTENING = re.compile(r"serving\.server: gRPC (\S+):(\d+)")


class Server:
  """`python -m serving.server` on `base_path` as a child process on a free localhost port,
  for a `with` block: `ask` asks questions with serving.client; `wait_for_version` waits
  until a newly published version answers. The server is stopped when the block ends,
  however it ends. `poll_seconds` 0: the versions present at start only."""

  def __init__(self, base_path: str, directory: str, log: Callable[[str], None] = print,
               poll_seconds: float = 0.0, start_timeout: float = 600.0,
               request_timeout: float = 300.0):
    self.base_path = os.path.abspath(base_path)
    self.directory = directory
    self.log = log
    self.poll_seconds = poll_seconds
    self.start_timeout = start_timeout
    self.request_timeout = request_timeout
    self.target = ""
    self._server = None

  def __enter__(self) -> "Server":
    listening = threading.Event()
    address = {}

    def on_line(line: str):
      match = _LISTENING.search(line)
      if match:
        address["host"], address["port"] = match.group(1), int(match.group(2))
        listening.set()

    log_path = os.path.join(self.directory, LOG)
    self._server = Command(
        python_module("serving.server", "--model_name=realm_qa",
                      f"--model_base_path={self.base_path}", "--port=0",
                      f"--file_system_poll_wait_seconds={self.poll_seconds:g}"),
        log_path, "server", self.log, on_line=on_line)
    try:
      deadline = time.time() + self.start_timeout
      while not listening.wait(1.0):
        if self._server.process.poll() is not None:
          raise StageError(f"the server exited with {self._server.process.returncode} "
                           f"before serving; log: {log_path}\n{tail(log_path)}")
        if time.time() > deadline:
          raise StageError(f"the server did not start within {self.start_timeout:.0f}s; "
                           f"log: {log_path}\n{tail(log_path)}")
    except BaseException:
      self._server.stop()
      raise
    self.target = f"{address['host']}:{address['port']}"
    self.log(f"  server listening on {self.target} (pid {self._server.process.pid})")
    return self

  def __exit__(self, *exc_info) -> None:
    self._server.stop()

  def ask(self, questions: Sequence[str]) -> List[dict]:
    """serving.client's JSON answers (answer, score, model version, blocks with titles and
    p(z|x)) to `questions`."""
    client = subprocess.run(
        python_module("serving.client", "--server", self.target, "--json",
                      "--timeout", str(self.request_timeout), *questions),
        capture_output=True, text=True, timeout=self.request_timeout + 120, check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    with open(os.path.join(self.directory, "client.log"), "a", encoding="utf-8") as f:
      f.write(client.stderr)
    if client.returncode != 0:
      raise StageError(f"serving.client exited with {client.returncode}: "
                       f"{client.stderr[-2000:]}")
    return json.loads(client.stdout)

  def wait_for_version(self, version: int, question: str, timeout: float = 300.0) -> dict:
    """Asks `question` until the answer comes from `version` (a version published while
    the server runs is loaded at its next poll); returns that answer."""
    deadline = time.time() + timeout
    while True:
      answer = self.ask([question])[0]
      if int(answer["model"]["version"]) == version:
        return answer
      if time.time() > deadline:
        raise StageError(f"version {version} of {self.base_path} was not served within "
                         f"{timeout:.0f}s (still version {answer['model']['version']}); "
                         f"log: {os.path.join(self.directory, LOG)}")
      time.sleep(max(self.poll_seconds, 1.0))


def serve_and_ask(base_path: str, questions: Sequence[str], directory: str,
                  log: Callable[[str], None] = print, start_timeout: float = 600.0,
                  request_timeout: float = 300.0) -> List[dict]:
  """Answers (serving.client's JSON: answer, score, blocks with titles and p(z|x)) to
  `questions` from a server started on `base_path`, which is stopped before returning."""
  with Server(base_path, directory, log, start_timeout=start_timeout,
              request_timeout=request_timeout) as server:
    return server.ask(questions)
