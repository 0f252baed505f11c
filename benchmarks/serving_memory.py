"""The server's memory across version hand-overs: is a retired version given back?

    python -m benchmarks.serving_memory [--handovers 3] [--requests 12] [--articles 1600]
        [--model_base_path DIR] [--variants baseline,xla,onednn,xla_onednn] [--work_dir DIR]

Why: a server that does not give a retired version's memory back grows by about one model
at every new version, which the soak (benchmarks/soak.py) only shows mixed with its load.
Here `python -m serving.server` serves the demo-size realm_qa export (as the soak builds
it, once per variant's export; or the newest version of --model_base_path), and a copy is
published as the next version --handovers times. After each hand-over (new version
AVAILABLE, old one END) --requests questions are asked one at a time and the server's
VmRSS is read. Run once per served reader's variant (benchmarks/serving_variants.py: its
export, TF_ENABLE_ONEDNN_OPTS for the server process, --xla_cpu_compilation_enabled for
the XLA ones), since oneDNN's CPU allocator keeps large tensors in an arena that never
shrinks, and XLA keeps its compiled programs per loaded version.

Reported per variant: RSS with version 1 serving, after every hand-over, the growth after
the first hand-over and per later one, the total growth against the +5% rule (a variant
may ship only within it), and the p50 latency of the questions (one at a time, so it is
the model's latency, not a loaded server's). Results: benchmarks/results/
serving_memory.json and .md.
"""
import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

from benchmarks import harness, serving_variants, soak

MODEL = soak.MODEL
# A variant may ship only if the server's RSS grows by at most this over three hand-overs:
# a faster reader that leaks per version would exhaust a long-running server.
MAX_RSS_GROWTH = 0.05


def parse_args(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks.serving_memory",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--handovers", type=int, default=3)
  parser.add_argument("--requests", type=int, default=12, help="questions per version")
  parser.add_argument("--articles", type=int, default=1600,
                      help="vital_articles in the demo-size export (when it is built)")
  parser.add_argument("--model_base_path", default="",
                      help="serve the newest version of this realm_qa base path instead")
  parser.add_argument("--variants", default="baseline,xla,onednn,xla_onednn",
                      help="the served reader's variants (benchmarks/serving_variants.py)")
  parser.add_argument("--timeout", type=float, default=600.0,
                      help="seconds a version may take to become AVAILABLE")
  parser.add_argument("--work_dir", default="", help="default: a temporary directory")
  args = parser.parse_args(argv)
  if args.handovers < 1 or args.requests < 1:
    parser.error("--handovers and --requests must be positive")
  try:
    args.variants = serving_variants.parse(args.variants)
  except ValueError as e:
    parser.error(f"--variants: {e}")
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


def measure(source: str, work: str, variant: serving_variants.Variant, args) -> dict:
  """One variant: its export (`source`, a base path) served with its environment and
  flags, published again --handovers times; its RSS and latency at every version."""
  import grpc  # pylint: disable=g-import-not-at-top
  setting_dir = os.path.join(work, variant.name)
  os.makedirs(setting_dir, exist_ok=True)
  base = soak.stage_model(source, setting_dir)
  server = soak.server_process(base, setting_dir, clients=1, env=variant.env(),
                               flags=variant.server_flags())
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
        print(f"{variant.name}: version {version} serving, RSS {points[-1]['rss_mb']} MB, "
              f"p50 {points[-1]['p50_ms']} ms", flush=True)
  finally:
    server.stop()
  log = server.log()
  returned = [float(x) for x in re.findall(
      r"is END \((\d+) MB of resident memory returned", log)]
  first, second, last = points[0]["rss_mb"], points[1]["rss_mb"], points[-1]["rss_mb"]
  later = len(points) - 2
  growth = round((last - first) / first, 4)
  return dict(
      variant=variant.name, reader_xla=variant.reader_xla, onednn=variant.onednn,
      points=points, mb_returned_at_each_retirement=returned,
      growth_first_handover=round((second - first) / first, 4),
      growth_per_later_handover=round((last - second) / second / later, 4) if later else None,
      growth_total=growth, within_rss_rule=growth <= MAX_RSS_GROWTH,
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
  by_variant = all("variant" in row for row in result["settings"])
  if by_variant:  # results before the variants were one row per oneDNN setting
    lines[-2:] = ["| variant | XLA | TF_ENABLE_ONEDNN_OPTS | RSS per version serving (MB) | "
                  "after 1st hand-over | per later hand-over | total | within +"
                  f"{MAX_RSS_GROWTH:.0%} | returned at each retirement (MB) | p50 ms |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
  for row in result["settings"]:
    later = row["growth_per_later_handover"]
    label = (f"{row['variant']} | {'on' if row['reader_xla'] else 'off'} | {row['onednn']}"
             if by_variant else row["onednn"])
    verdict = (f"{'yes' if row['within_rss_rule'] else 'NO'} | " if by_variant else "")
    lines.append(
        f"| {label} | {' → '.join(str(p['rss_mb']) for p in row['points'])} | "
        f"{row['growth_first_handover']:+.1%} | "
        f"{'-' if later is None else format(later, '+.1%')} | {row['growth_total']:+.1%} | "
        f"{verdict}"
        f"{', '.join(f'{x:.0f}' for x in row['mb_returned_at_each_retirement'])} | "
        f"{row['p50_ms']} |")
  lines.append("")
  return "\n".join(lines)


def variant_sources(args, work: str) -> tuple[dict, str]:
  """{variant name: the base path it serves} and the model's description: the demo-size
  model exported once per reader_xla value the variants need (soak.demo_run,
  serving_variants.save_export), or --model_base_path for every variant, refusing those
  whose reader_xla its provenance does not have."""
  if args.model_base_path:
    from realm_tf.export import exporter  # pylint: disable=g-import-not-at-top
    newest = os.path.join(args.model_base_path,
                          str(harness.versions(args.model_base_path)[-1]))
    xla = bool(exporter.read_provenance(newest).get("reader_xla", False))
    wrong = [v.name for v in args.variants if v.reader_xla != xla]
    if wrong:
      raise SystemExit(f"{newest} has reader_xla={xla}; variants {wrong} need the other "
                       f"export (leave --model_base_path out to build both)")
    return ({v.name: args.model_base_path for v in args.variants},
            f"newest version of {args.model_base_path}")
  run = soak.demo_run(work, args.articles)
  sources, built = {}, {}
  for variant in args.variants:
    if variant.reader_xla not in built:
      out = os.path.join(work, "source", f"reader_xla_{variant.reader_xla}")
      serving_variants.save_export(run, variant, out)
      built[variant.reader_xla] = os.path.join(out, MODEL)
    sources[variant.name] = built[variant.reader_xla]
  return sources, (f"realm_qa of configs/demo.yaml (MiniLM warm start, no fine-tuning) over "
                   f"the first {args.articles} vital_articles, exported per variant")


def run(args) -> dict:
  """Every variant measured in turn."""
  work = args.work_dir or tempfile.mkdtemp(prefix="serving_memory_")
  os.makedirs(work, exist_ok=True)
  sources, model = variant_sources(args, work)
  machine = harness.machine()
  settings = [measure(sources[v.name], work, v, args) for v in args.variants]
  if not args.work_dir:
    shutil.rmtree(work, ignore_errors=True)
  return dict(machine=machine, args=dict(vars(args), variants=[v.name for v in args.variants]),
              model=model, settings=settings)


def main(argv=None) -> int:
  args = parse_args(argv)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  print(harness.Output("serving_memory", markdown).write(run(args)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
