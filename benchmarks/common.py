"""Shared benchmark plumbing: machine description and atomic JSON results."""
import json
import os
import platform
import time
import uuid

import tensorflow as tf

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SHARED_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           os.pardir, "shared", "data")


def machine() -> dict:
  # The load average says whether other work shared the CPU while measuring.
  return dict(platform=platform.platform(), processor=platform.processor(),
              cpu_count=os.cpu_count(), python=platform.python_version(),
              tensorflow=tf.__version__, when=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              load_average_1_5_15=[round(x, 2) for x in os.getloadavg()])


def write_result(name: str, payload: dict, merge: bool = False) -> str:
  """Writes benchmarks/results/<name>.json atomically (optionally merging top-level keys)."""
  os.makedirs(RESULTS_DIR, exist_ok=True)
  path = os.path.join(RESULTS_DIR, f"{name}.json")
  if merge and os.path.exists(path):
    with open(path) as f:
      payload = dict(json.load(f), **payload)
  tmp = f"{path}.tmp-{uuid.uuid4().hex}"
  with open(tmp, "w") as f:
    json.dump(payload, f, indent=2, sort_keys=True)
  os.replace(tmp, path)
  return path
