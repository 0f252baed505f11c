"""The server's memory across version hand-overs: is a retired version given back?

    python -m benchmarks.serving_memory [--handovers 4] [--requests 12] [--articles 1600]
        [--model_base_path DIR] [--onednn 1,0] [--work_dir DIR]

Why: a server that does not give a retired version's memory back grows by about one model
at every new version, which the soak (benchmarks/soak.py) only shows mixed with its load.
Here `python -m serving.server` serves the demo-size realm_qa export (as the soak builds
it, or the newest version of --model_base_path), and a copy is published as the next
version --handovers times. After each hand-over (new version AVAILABLE, old one END)
--requests questions are asked one at a time and the server's VmRSS is read. Run once per
--onednn setting (TF_ENABLE_ONEDNN_OPTS for the server process; "default" leaves the
server's own default, off; TensorFlow's x86 wheels otherwise have it on), since oneDNN's
CPU allocator keeps large tensors in an arena that never shrinks.

Reported per setting: RSS with version 1 serving, after every hand-over, the growth after
the first hand-over and per later one, and the p50 latency of the questions (one at a
time, so it is the model's latency, not a loaded server's). Results:
benchmarks/results/serving_memory.json and .md.
"""
import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

from benchmarks import harness, soak

MODEL = soak.MODEL


def parse_args(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks.serving_memory",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--handovers", type=int, default=4)
  parser.add_argument("--requests", type=int, default=12, help="questions per version")
  parser.add_argument("--articles", type=int, default=1600,
                      help="vital_articles in the demo-size export (when it is built)")
  parser.add_argument("--model_base_path", default="",
                      help="serve the newest version of this realm_qa base path instead")
  parser.add_argument("--onednn", default="1,0",
                      help="comma-separated TF_ENABLE_ONEDNN_OPTS values for the server")
  parser.add_argument("--timeout", type=float, default=600.0,
                      help="seconds a version may take to become AVAILABLE")
  parser.add_argument("--work_dir", default="", help="default: a temporary directory")
  args = parser.parse_args(argv)
  args.onednn = [v.strip() for v in args.onednn.split(",") if v.strip()]
  if args.handovers < 1 or args.requests < 1 or not args.onednn:
    parser.error("--handovers and --requests must be positive, --onednn non-empty")
  return args


def _ask(channel, questions, version: int) -> list[float]:
  """Asks `questions` one at a time through serving.client; their latencies in seconds."""
  from tensorflow_serving.apis import prediction_service_pb2_grpc  # pylint: disable=g-import-not-at-top
  from serving import client  # pylint: disable=g-import-not-at-top
  service = prediction_service_pb2_grpc.PredictionServiceStub(channel)
  latencies = []
  for question in questions:
    start = time.monotonic()
    answered_by = client.ask(service, [question], model=MODEL, timeout=60)[0]["model"]["version"]
    latencies.append(time.monotonic() - start)
    if answered_by != version:
      raise SystemExit(f"answered by version {answered_by}, expected {version}")
  return latencies


def measure(source: str, work: str, onednn: str, args) -> dict:
  import grpc  # pylint: disable=g-import-not-at-top
  setting_dir = os.path.join(work, f"onednn-{onednn}")
  os.makedirs(setting_dir, exist_ok=True)
  base = soak.stage_model(source, setting_dir)
  env = {} if onednn == "default" else {"TF_ENABLE_ONEDNN_OPTS": onednn}
  server = soak.server_process(base, setting_dir, clients=1, env=env)
  questions = harness.read_questions(args.requests)
  points = []
  try:
    address = server.wait_listening()
    with grpc.insecure_channel(address) as channel:
      for version in range(1, args.handovers + 2):
        if version > 1:
          harness.publish_copy(base)
        server.wait_serving(channel, version, args.timeout)
        latencies = _ask(channel, questions, version)
        time.sleep(2.0)  # a retirement's release runs on its own thread
        points.append(dict(version=version, rss_mb=round(server.rss_bytes() / 2**20, 1),
                           p50_ms=round(1000 * statistics.median(latencies), 1)))
        print(f"oneDNN {onednn}: version {version} serving, RSS {points[-1]['rss_mb']} MB, "
              f"p50 {points[-1]['p50_ms']} ms", flush=True)
  finally:
    server.stop()
  log = server.log()
  returned = [float(x) for x in re.findall(
      r"is END \((\d+) MB of resident memory returned", log)]
  first, second, last = points[0]["rss_mb"], points[1]["rss_mb"], points[-1]["rss_mb"]
  later = len(points) - 2
  return dict(
      onednn=onednn, points=points, mb_returned_at_each_retirement=returned,
      growth_first_handover=round((second - first) / first, 4),
      growth_per_later_handover=round((last - second) / second / later, 4) if later else None,
      growth_total=round((last - first) / first, 4),
      p50_ms=round(statistics.median(p["p50_ms"] for p in points), 1))


def markdown(result: dict) -> str:
  lines = ["# Server memory across version hand-overs (benchmarks/serving_memory.py)", "",
           f"Machine: {result['machine']['cpu_count']} CPUs, TF "
           f"{result['machine']['tensorflow']}, load average before "
           f"{result['machine']['load_average_1_5_15']}. Model: {result['model']}. "
           f"{result['args']['handovers']} hand-overs, {result['args']['requests']} questions "
           "one at a time per version.", "",
           "| TF_ENABLE_ONEDNN_OPTS | RSS per version serving (MB) | after 1st hand-over | "
           "per later hand-over | total | returned at each retirement (MB) | p50 ms |",
           "|---|---|---|---|---|---|---|"]
  for row in result["settings"]:
    later = row["growth_per_later_handover"]
    lines.append(
        f"| {row['onednn']} | {' → '.join(str(p['rss_mb']) for p in row['points'])} | "
        f"{row['growth_first_handover']:+.1%} | "
        f"{'-' if later is None else format(later, '+.1%')} | {row['growth_total']:+.1%} | "
        f"{', '.join(f'{x:.0f}' for x in row['mb_returned_at_each_retirement'])} | "
        f"{row['p50_ms']} |")
  lines.append("")
  return "\n".join(lines)


def run(args) -> dict:
  """Every --onednn setting measured in turn on the same export."""
  work = args.work_dir or tempfile.mkdtemp(prefix="serving_memory_")
  os.makedirs(work, exist_ok=True)
  source, model = soak.model_source(args.model_base_path, args.articles, work)
  machine = harness.machine()
  settings = [measure(source, work, onednn, args) for onednn in args.onednn]
  if not args.work_dir:
    shutil.rmtree(work, ignore_errors=True)
  return dict(machine=machine, args=vars(args), model=model, settings=settings)


def main(argv=None) -> int:
  args = parse_args(argv)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  print(harness.Output("serving_memory", markdown).write(run(args)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
