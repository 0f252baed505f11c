"""Soak test of the server: `serving.server` on localhost under sustained mixed traffic.

    python -m benchmarks.soak [--minutes 10] [--clients 8] [--rate 0]
        [--invalid_fraction 0.2] [--publish_at 0.3,0.6] [--articles 1600]
        [--model_base_path DIR] [--work_dir DIR] [--name soak]

The server runs as its own process (`python -m serving.server`, as deployed), so its
resident memory is its own. It serves a realm_qa export: by default the demo-size one of
benchmarks/serving.py (configs/demo.yaml, MiniLM warm start, the first --articles of
vital_articles embedded, as in its default run), or the newest version under
--model_base_path (copied into the work dir first: the soak publishes into its copy,
never into the source).

--clients threads, each with its own gRPC channel, send Predict requests for --minutes:
closed loop by default (--rate 0: each sends its next request when the last returns, so
the load is the highest rate the server sustains), or paced to --rate requests/s in
total. A fraction --invalid_fraction of the requests are invalid in one of the ways of
_invalid_requests (unknown model or signature, wrong input name or dtype, empty or oversized batch,
malformed or decompression-bomb tensors, an oversized message, bytes that are no
PredictRequest), each with the status it must be refused with. At each fraction of the run
in --publish_at a new version (a copy of the serving one) is published; the server loads it
and retires
the old one while the traffic goes on.

Reported: valid requests sent / answered / failed (target: 0 failed), invalid requests
refused as expected / otherwise, p50 / p99 latency of valid requests overall and per tenth
of the run, throughput, which versions answered, when the new version took over, and the
server's resident memory (VmRSS) after the warm-up and at the end (target: growth <= 10%),
with its peak and samples. Results: benchmarks/results/<name>.json and .md.
"""
import argparse
import dataclasses
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from typing import Optional

from benchmarks import harness
from benchmarks.server_process import ServerProcess

MODEL = "realm_qa"
TARGETS = dict(failed_valid_requests=0, rss_growth_fraction=0.10)
MAX_BATCH_SIZE = 32  # the server's --max_batch_size: "oversized_batch" sends more
MAX_MESSAGE_BYTES = 1 << 20  # the server's --max_message_bytes: "oversized_message" exceeds it
WINDOWS = 10


def parse_args(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--minutes", type=float, default=10.0, help="length of the soak")
  parser.add_argument("--clients", type=int, default=8, help="concurrent gRPC clients")
  parser.add_argument("--rate", type=float, default=0.0,
                      help="requests/s over all clients; 0: closed loop (highest sustained)")
  parser.add_argument("--invalid_fraction", type=float, default=0.2)
  parser.add_argument("--publish_at", default="0.3,0.6",
                      help="fractions of the run at which a new version is published "
                           "(comma-separated: several hand-overs show whether memory plateaus)")
  parser.add_argument("--warmup_seconds", type=float, default=10.0,
                      help="traffic before measuring (at most a tenth of the run)")
  parser.add_argument("--articles", type=int, default=1600,
                      help="vital_articles used for the demo-size export")
  parser.add_argument("--model_base_path", default="",
                      help="serve the newest version of this realm_qa base path instead")
  parser.add_argument("--questions", type=int, default=500)
  parser.add_argument("--work_dir", default="", help="default: a temporary directory")
  parser.add_argument("--name", default="soak", help="results file name")
  args = parser.parse_args(argv)
  if args.minutes <= 0 or args.clients < 1 or args.rate < 0:
    parser.error("--minutes and --clients must be positive, --rate >= 0")
  try:
    args.publish_at = sorted(float(x) for x in str(args.publish_at).split(",") if x.strip())
  except ValueError:
    parser.error(f"--publish_at must be comma-separated fractions, got {args.publish_at!r}")
  if (not 0 <= args.invalid_fraction < 1 or not args.publish_at
      or not all(0 < f < 1 for f in args.publish_at)):
    parser.error("--invalid_fraction must be in [0, 1) and --publish_at fractions in (0, 1)")
  return args


# ---------------------------------------------------------------------------------- model


def demo_run(work: str, articles: int):
  """The demo-size model's ServingRun over the first `articles` vital_articles, its blocks
  embedded (the same model and corpus recipe as benchmarks/serving.py)."""
  from benchmarks import serving as serving_bench  # pylint: disable=g-import-not-at-top
  from realm_tf.configs import load_config  # pylint: disable=g-import-not-at-top
  from realm_tf.export import exporter  # pylint: disable=g-import-not-at-top
  config = load_config(os.path.join(harness.REPO, "configs", "demo.yaml"),
                       ["runtime.enable_xla=false"], experiment="realm/openqa")
  blocks = serving_bench.prepare_corpus(work, articles, config.model.retriever.block_seq_length)
  run = exporter.build_run(config.replace(index=dict(blocks=blocks)))
  serving_bench.embed_corpus(run)
  return run


def build_demo_export(work: str, articles: int) -> str:
  """A realm_qa version 1 of the demo-size model (demo_run) under <work>/source/realm_qa;
  returns the base path."""
  from realm_tf.export import exporter  # pylint: disable=g-import-not-at-top
  run = demo_run(work, articles)
  out = os.path.join(work, "source")
  exporter.save_export(exporter.build_module(run, MODEL), out, MODEL, 1,
                       run.provenance(MODEL), exporter.warmup_requests(MODEL, run))
  return os.path.join(out, MODEL)


def model_source(model_base_path: str, articles: int, work: str) -> tuple[str, str]:
  """The base path to serve from and its description: --model_base_path, else the
  demo-size export built into `work`."""
  if model_base_path:
    return model_base_path, f"newest version of {model_base_path}"
  return build_demo_export(work, articles), (
      f"realm_qa of configs/demo.yaml (MiniLM warm start, no fine-tuning) over the first "
      f"{articles} vital_articles")


def stage_model(source_base: str, work: str) -> str:
  """Copies the newest version of `source_base` into <work>/models/realm_qa/1."""
  versions = harness.versions(source_base)
  if not versions:
    raise SystemExit(f"{source_base}: no version directory")
  base = os.path.join(work, "models", MODEL)
  shutil.rmtree(base, ignore_errors=True)
  os.makedirs(base)
  shutil.copytree(os.path.join(source_base, str(versions[-1])), os.path.join(base, "1"),
                  symlinks=False)
  return base


# ---------------------------------------------------------------------------------- server


def server_process(base_path: str, work: str, clients: int,
                   env: Optional[dict] = None, flags=()) -> ServerProcess:
  """serving.server over `base_path` with the soak's limits (what the invalid requests
  exceed) and room for `clients` concurrent clients; `flags`: more serving.server flags."""
  return ServerProcess(base_path, MODEL, os.path.join(work, "server.log"), flags=[
      f"--max_batch_size={MAX_BATCH_SIZE}", f"--max_message_bytes={MAX_MESSAGE_BYTES}",
      f"--max_concurrent_requests={max(64, 2 * clients)}", *flags], env=env)


# ---------------------------------------------------------------------------------- requests


def _invalid_requests():
  """name → (make request or raw bytes, the status codes that refuse it correctly)."""
  import grpc  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow.core.framework import tensor_pb2  # pylint: disable=g-import-not-at-top
  code = grpc.StatusCode

  def request(name=MODEL, signature="", **inputs):
    from tensorflow_serving.apis import predict_pb2  # pylint: disable=g-import-not-at-top
    r = predict_pb2.PredictRequest()
    r.model_spec.name, r.model_spec.signature_name = name, signature
    for key, value in inputs.items():
      r.inputs[key].CopyFrom(value if isinstance(value, tensor_pb2.TensorProto)
                             else tf.make_tensor_proto(value))
    return r

  malformed = tensor_pb2.TensorProto(dtype=tf.float32.as_datatype_enum,
                                     tensor_content=b"\x00" * 5)
  malformed.tensor_shape.dim.add(size=2)
  bomb = tensor_pb2.TensorProto(dtype=tf.string.as_datatype_enum, string_val=[b"q"])
  bomb.tensor_shape.dim.add(size=10**9)
  question = np.array([b"who wrote the iliad?"], dtype=object)
  return {
      "unknown_model": (request("no_such_model", question=question), {code.NOT_FOUND}),
      "unknown_signature": (request(signature="nope", question=question),
                            {code.FAILED_PRECONDITION}),
      "wrong_input_name": (request(questions=question), {code.INVALID_ARGUMENT}),
      "wrong_dtype": (request(question=np.array([1, 2], np.int32)), {code.INVALID_ARGUMENT}),
      "empty_batch": (request(question=np.array([], dtype=object)), {code.INVALID_ARGUMENT}),
      "oversized_batch": (request(question=np.array([b"q"] * (MAX_BATCH_SIZE + 1),
                                                    dtype=object)), {code.INVALID_ARGUMENT}),
      "malformed_tensor": (request(question=malformed), {code.INVALID_ARGUMENT}),
      "decompression_bomb": (request(question=bomb), {code.INVALID_ARGUMENT}),
      "oversized_message": (request(question=np.array([b"x" * (MAX_MESSAGE_BYTES + 1024)],
                                                      dtype=object)),
                            {code.RESOURCE_EXHAUSTED}),
      # 0xff is a field tag with wire type 7, which no protobuf message can hold.
      "not_a_predict_request": (b"\xff" * 32, {code.INTERNAL}),
  }


@dataclasses.dataclass
class Outcome:
  at: float  # seconds since the measured start (negative during the warm-up)
  latency: float  # seconds
  valid: bool
  kind: str  # "valid" or the INVALID name
  ok: bool  # valid: answered correctly; invalid: refused with an expected status
  detail: str = ""
  version: int = 0


def client_loop(address: str, questions, invalid, seed: int, args, start: float,
                stop: threading.Event, outcomes: list, lock: threading.Lock):
  """One client: its own channel; closed loop, or paced to its share of --rate."""
  import grpc  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow_serving.apis import predict_pb2  # pylint: disable=g-import-not-at-top
  from tensorflow_serving.apis import prediction_service_pb2_grpc  # pylint: disable=g-import-not-at-top
  rng = random.Random(seed)
  names = sorted(invalid)
  interval = args.clients / args.rate if args.rate else 0.0
  next_send = time.monotonic() + rng.random() * interval
  mine = []
  with grpc.insecure_channel(address) as channel:
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    raw = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
    while not stop.is_set():
      if interval:
        delay = next_send - time.monotonic()
        if delay > 0 and stop.wait(delay):
          break
        next_send = max(next_send + interval, time.monotonic() - interval)
      if rng.random() < args.invalid_fraction:
        kind = rng.choice(names)
        payload, expected = invalid[kind]
        begin = time.perf_counter()
        try:
          (raw if isinstance(payload, bytes) else stub.Predict)(payload, timeout=30)
          ok, detail = False, "answered OK"
        except grpc.RpcError as e:
          ok, detail = e.code() in expected, "" if e.code() in expected else (
              f"{e.code().name}: {e.details()}")
        mine.append(Outcome(time.monotonic() - start, time.perf_counter() - begin, False,
                            kind, ok, detail))
        continue
      question = questions[rng.randrange(len(questions))]
      request = predict_pb2.PredictRequest()
      request.model_spec.name = MODEL
      request.inputs["question"].CopyFrom(tf.make_tensor_proto(
          np.array([question.encode()], dtype=object)))
      begin = time.perf_counter()
      try:
        response = stub.Predict(request, timeout=30)
        answers = tf.make_ndarray(response.outputs["answer"])
        version = response.model_spec.version.value
        ok = answers.shape == (1,) and version > 0
        outcome = Outcome(time.monotonic() - start, time.perf_counter() - begin, True,
                          "valid", ok, "" if ok else f"answer {answers.shape}, version {version}",
                          version)
      except grpc.RpcError as e:
        outcome = Outcome(time.monotonic() - start, time.perf_counter() - begin, True,
                          "valid", False, f"{e.code().name}: {e.details()}")
      mine.append(outcome)
      if len(mine) >= 256:
        with lock:
          outcomes.extend(mine)
        mine = []
  with lock:
    outcomes.extend(mine)


# ---------------------------------------------------------------------------------- report


def summarize(outcomes: list, duration: float, invalid: dict) -> dict:
  measured = [o for o in outcomes if o.at >= 0]
  valid = [o for o in measured if o.valid]
  bad = [o for o in measured if not o.valid]
  failed = [o for o in valid if not o.ok]
  windows = []
  for w in range(WINDOWS):
    lo, hi = w * duration / WINDOWS, (w + 1) * duration / WINDOWS
    inside = [o for o in valid if lo <= o.at < hi]
    windows.append(dict(from_s=round(lo, 1), valid_per_second=round(len(inside) / (hi - lo), 2),
                        failed=sum(not o.ok for o in inside),
                        **harness.percentiles([o.latency for o in inside if o.ok])))
  by_kind = {}
  for name in sorted(invalid):
    mine = [o for o in bad if o.kind == name]
    by_kind[name] = dict(sent=len(mine), refused_as_expected=sum(o.ok for o in mine),
                         expected=sorted(c.name for c in invalid[name][1]),
                         first_unexpected=[o.detail for o in mine if not o.ok][:3])
  versions = {}
  for o in valid:
    if o.ok:
      versions[str(o.version)] = versions.get(str(o.version), 0) + 1
  return dict(
      valid=dict(sent=len(valid), answered=len(valid) - len(failed), failed=len(failed),
                 first_failures=[f"{o.at:.1f}s {o.detail}" for o in failed[:5]],
                 per_second=round(len(valid) / duration, 2),
                 latency=harness.percentiles([o.latency for o in valid if o.ok])),
      invalid=dict(sent=len(bad), refused_as_expected=sum(o.ok for o in bad),
                   unexpected=sum(not o.ok for o in bad), by_kind=by_kind,
                   latency=harness.percentiles([o.latency for o in bad])),
      requests_per_second=round(len(measured) / duration, 2),
      versions_answered=versions, windows=windows)


def markdown(result: dict) -> str:
  s, rss = result["summary"], result["rss"]
  lines = [
      "# Soak test of the server (benchmarks/soak.py)", "",
      f"Machine: {result['machine']['cpu_count']} CPUs, TF {result['machine']['tensorflow']}, "
      f"load average before {result['machine']['load_average_1_5_15']}, after "
      f"{result['machine'].get('load_average_after')}. Model: {result['model']}.", "",
      f"{result['args']['minutes']} min, {result['args']['clients']} clients, "
      + (f"paced to {result['args']['rate']} requests/s" if result['args']['rate']
         else "closed loop (the highest rate the server sustains)")
      + f", {result['args']['invalid_fraction']:.0%} invalid requests; versions published "
      + ", ".join(f"{p['version']} at {p['at_s']} s (server RSS before: {p['rss_before_mb']} MB)"
                  for p in result.get("publications", []))
      + f"; the last first answered at {result.get('new_version_first_answer_s')} s. "
      f"oneDNN: {result.get('onednn', 'not recorded')}.", "",
      "| | value |", "|---|---|",
      f"| valid requests sent / answered / failed | {s['valid']['sent']} / "
      f"{s['valid']['answered']} / {s['valid']['failed']} |",
      f"| invalid requests refused as expected / otherwise | "
      f"{s['invalid']['refused_as_expected']} / {s['invalid']['unexpected']} |",
      f"| valid p50 / p99 latency (ms) | {s['valid']['latency'].get('p50_ms')} / "
      f"{s['valid']['latency'].get('p99_ms')} |",
      f"| valid requests/s, all requests/s | {s['valid']['per_second']}, "
      f"{s['requests_per_second']} |",
      f"| versions answering (valid requests) | {s['versions_answered']} |",
      f"| server RSS after warm-up / at end / peak (MB) | {rss['start_mb']} / {rss['end_mb']} "
      f"/ {rss['peak_mb']} |",
      f"| RSS growth | {rss['growth_fraction']:.1%} |", "",
      "| tenth of the run from (s) | valid/s | p50 ms | p99 ms | failed |",
      "|---|---|---|---|---|"]
  for w in s["windows"]:
    lines.append(f"| {w['from_s']} | {w['valid_per_second']} | {w.get('p50_ms', '-')} | "
                 f"{w.get('p99_ms', '-')} | {w['failed']} |")
  lines += ["", "Targets: " + ", ".join(
      f"{k} {'met' if ok else 'MISSED'}" for k, ok in result["targets_met"].items()), ""]
  return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------- main


def run(args) -> dict:
  """The soak: the server under traffic for --minutes, versions published on the way."""
  work = args.work_dir or tempfile.mkdtemp(prefix="soak_")
  os.makedirs(work, exist_ok=True)
  source, model = model_source(args.model_base_path, args.articles, work)
  base = stage_model(source, work)
  server = server_process(base, work, args.clients)
  # TensorFlow is imported here (harness.machine, the requests) while the server starts up.
  machine = harness.machine()
  try:
    questions = harness.read_questions(args.questions)
    invalid = _invalid_requests()
    address = server.wait_listening()
    duration = args.minutes * 60.0
    warmup = min(args.warmup_seconds, duration / 10)
    outcomes, lock, stop = [], threading.Lock(), threading.Event()
    start = time.monotonic() + warmup  # outcomes before `start` are the warm-up
    threads = [threading.Thread(target=client_loop, daemon=True, args=(
        address, questions, invalid, seed, args, start, stop, outcomes, lock))
               for seed in range(args.clients)]
    for thread in threads:
      thread.start()
    time.sleep(max(start - time.monotonic(), 0.0))
    rss = [(0.0, server.rss_bytes())]
    publications = []  # (version, at seconds, server RSS just before)
    end = start + duration
    while time.monotonic() < end:
      now = time.monotonic() - start
      if (len(publications) < len(args.publish_at)
          and now >= args.publish_at[len(publications)] * duration):
        before = server.rss_bytes()
        publications.append((harness.publish_copy(base), round(now, 2), before))
      rss.append((round(now, 1), server.rss_bytes()))
      time.sleep(min(1.0, max(end - time.monotonic(), 0.0)))
    rss.append((round(time.monotonic() - start, 1), server.rss_bytes()))
    stop.set()
    for thread in threads:
      thread.join(60)
  finally:
    returncode = server.stop()
  summary = summarize(outcomes, duration, invalid)
  published_version = publications[-1][0] if publications else None
  first_new = [o.at for o in outcomes if o.valid and o.ok and o.version == published_version]
  start_mb, end_mb = rss[0][1] / 2**20, rss[-1][1] / 2**20
  growth = (end_mb - start_mb) / start_mb if start_mb else float("nan")
  step = max(1, len(rss) // 60)
  result = dict(
      machine=machine, args=vars(args), model=model, targets=TARGETS, summary=summary,
      published_version=published_version,
      published_at_s=publications[-1][1] if publications else None,
      publications=[dict(version=v, at_s=at, rss_before_mb=round(r / 2**20, 1))
                    for v, at, r in publications],
      onednn=os.environ.get("TF_ENABLE_ONEDNN_OPTS", "the server's default (off)"),
      new_version_first_answer_s=round(min(first_new), 2) if first_new else None,
      rss=dict(start_mb=round(start_mb, 1), end_mb=round(end_mb, 1),
               peak_mb=round(max(r for _, r in rss) / 2**20, 1),
               growth_fraction=round(growth, 4),
               samples_mb=[(t, round(r / 2**20, 1)) for t, r in rss[::step]]),
      server_exit_code=returncode)
  result["machine"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
  result["targets_met"] = dict(
      failed_valid_requests=summary["valid"]["failed"] == 0 and summary["valid"]["sent"] > 0,
      invalid_requests_refused=summary["invalid"]["unexpected"] == 0,
      new_version_served=bool(first_new),
      rss_growth_fraction=bool(growth <= TARGETS["rss_growth_fraction"]))
  if not args.work_dir:
    shutil.rmtree(work, ignore_errors=True)
  return result


def main(argv=None) -> int:
  args = parse_args(argv)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  result = run(args)
  path = harness.Output(args.name, markdown).write(result)
  summary = result["summary"]
  print(json.dumps(dict(valid=summary["valid"], invalid={k: v for k, v in summary["invalid"].items()
                                                          if k != "by_kind"},
                        rss=result["rss"] | dict(samples_mb="..."),
                        targets_met=result["targets_met"]), indent=2))
  print(path)
  return 0


if __name__ == "__main__":
  sys.exit(main())
