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


def serve_and_ask(base_path: str, questions: Sequence[str], directory: str,
                  log: Callable[[str], None] = print, start_timeout: float = 600.0,
                  request_timeout: float = 300.0) -> List[dict]:
  """Answers (serving.client's JSON: answer, score, blocks with titles and p(z|x)) to
  `questions` from a server started on `base_path`, which is stopped before returning."""
  listening = threading.Event()
  address = {}

  def on_line(line: str):
    match = _LISTENING.search(line)
    if match:
      address["host"], address["port"] = match.group(1), int(match.group(2))
      listening.set()

  log_path = os.path.join(directory, LOG)
  server = Command(python_module("serving.server", "--model_name=realm_qa",
                                 f"--model_base_path={os.path.abspath(base_path)}",
                                 "--port=0", "--file_system_poll_wait_seconds=0"),
                   log_path, "server", log, on_line=on_line)
  try:
    deadline = time.time() + start_timeout
    while not listening.wait(1.0):
      if server.process.poll() is not None:
        raise StageError(f"the server exited with {server.process.returncode} before "
                         f"serving; log: {log_path}\n{tail(log_path)}")
      if time.time() > deadline:
        raise StageError(f"the server did not start within {start_timeout:.0f}s; log: "
                         f"{log_path}\n{tail(log_path)}")
    target = f"{address['host']}:{address['port']}"
    log(f"  server listening on {target} (pid {server.process.pid})")
    client = subprocess.run(
        python_module("serving.client", "--server", target, "--json",
                      "--timeout", str(request_timeout), *questions),
        capture_output=True, text=True, timeout=request_timeout + 120, check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    with open(os.path.join(directory, "client.log"), "w", encoding="utf-8") as f:
      f.write(client.stderr)
    if client.returncode != 0:
      raise StageError(f"serving.client exited with {client.returncode}: "
                       f"{client.stderr[-2000:]}")
    return json.loads(client.stdout)
  finally:
    server.stop()
