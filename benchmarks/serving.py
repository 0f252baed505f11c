"""Serving benchmark: the realm_qa exports behind `serving.server`, over gRPC and REST.

    python -m benchmarks.serving [--articles 1600] [--min_blocks 2000] [--seconds 8]
        [--clients 1,8,32] [--kinds realm_qa,realm_qa_scann] [--max_batch_size 32]
        [--batch_timeout_micros 2000] [--num_batch_threads 1] [--work_dir DIR]

The demo-size model (configs/demo.yaml: MiniLM warm start for both towers and the reader,
no fine-tuning: latency does not depend on the weights) over real blocks: the first
--articles of ../shared/data/wikipedia/vital_articles.jsonl run through the corpus
pipeline (at least --min_blocks blocks), embedded with the document tower. Both exports
(exact search with stock ops; ScaNN ops) are published as TF Serving versions and served
by serving.server.ModelServer on localhost, without and with batching; closed-loop
clients (each its own gRPC channel, one question per Predict, real NQ-Open questions) run
for --seconds per cell at each --clients level.

Reported per cell: p50 / p99 latency (ms) and queries/s; per export, the in-process time
of the same SavedModel signature called directly (one client, same questions), and the
gRPC overhead = (gRPC p50 at one client, no batching − in-process p50) / in-process p50;
the same cells (every --clients level, without and with batching) through the REST front
end (JSON over HTTP, a connection per request).
Targets: p50 ≤ 100 ms at 1 client; gRPC overhead ≤ 10%; batching ≥ 1.5× the
queries/s of no batching at 8 clients; p50 at 1 client ≤ 1.25× the arithmetic floor.

Why a request of B questions may cost more per question than B requests of one, measured
in the same run: the cost per block of the reader's encoder alone (the model's own
encoder config, no XLA as served) in passes of N = 5 ... 160 blocks, and the in-process
cost per question at B = 1 ... 32 of the export as published (at most
--max_blocks_per_pass blocks per reader pass, realm_tf.export's default) and of the same
model exported with one pass for the whole request.

The served reader's variants side by side (--variants; benchmarks/serving_variants.py:
baseline as shipped, full_length, xla, onednn, xla_onednn), each exported from the same
model and measured in its own process (oneDNN is fixed when TensorFlow loads): the
encoder's cost per block at --variant_pass_blocks (XLA-compiled for the XLA variants, as
their exports run it), one question's in-process p50 and gRPC p50 at one client (no
batching; the server with --xla_cpu_compilation_enabled for the XLA variants), and an op
breakdown (TensorFlow's profiler, self time by op type) of the encoder's 5-block pass and
of one question. Targets per variant: encoder >= 0.75x the matmul limit at 5 blocks,
in-process p50 <= 1.4x and gRPC p50 <= 1.6x the arithmetic floor; the Markdown says which
variant ships (serving_variants.shipped) and which is fastest. Which may ship also takes
benchmarks/serving_memory.py's +5% RSS rule over three hand-overs.
Results: benchmarks/results/serving.json and .md.
"""
import argparse
import json
import os
import shutil
import tempfile
import threading
import time

import subprocess
import sys

import numpy as np

from benchmarks import common, harness
from benchmarks import serving_variants

TARGETS = dict(p50_ms_at_1_client=100.0, grpc_overhead_fraction=0.10,
               batching_speedup_at_8_clients=1.5, p50_over_floor_at_1_client=1.25)
# targets_met's keys in the Markdown's order (a result's JSON keeps its keys sorted).
TARGETS_MET = ("p50_ms_at_1_client", "grpc_overhead_fraction", "batching_speedup_at_8_clients",
               "p50_within_1.25x_floor")
# The served reader's targets, evaluated per variant.
VARIANT_TARGETS = dict(encoder_fraction_of_matmul_at_5_blocks=0.75,
                       in_process_p50_over_floor=1.4, grpc_p50_over_floor=1.6)
# The line of a variant's process that carries its result.
_VARIANT_RESULT = "VARIANT_RESULT "


def parse_args(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks.serving", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--articles", type=int, default=1600)
  parser.add_argument("--min_blocks", type=int, default=2000)
  parser.add_argument("--seconds", type=float, default=8.0, help="measured time per cell")
  parser.add_argument("--clients", default="1,8,32")
  parser.add_argument("--kinds", default="realm_qa,realm_qa_scann")
  parser.add_argument("--questions", type=int, default=200)
  parser.add_argument("--max_batch_size", type=int, default=32)
  parser.add_argument("--batch_timeout_micros", type=int, default=2000)
  parser.add_argument("--num_batch_threads", type=int, default=1)
  parser.add_argument("--in_process_calls", type=int, default=60)
  parser.add_argument("--max_blocks_per_pass", type=int, default=-1,
                      help="the exports' reader pass (-1: realm_tf.export's default)")
  parser.add_argument("--reader_length_step", type=int, default=-1,
                      help="the exports' reader length step (-1: realm_tf.export's default)")
  parser.add_argument("--pass_blocks", default="5,10,20,40,80,160",
                      help="reader passes (blocks) whose cost per block is measured")
  parser.add_argument("--batch_sizes", default="1,2,4,8,32",
                      help="questions per call of the in-process cost per question")
  parser.add_argument("--work_dir", default="", help="default: a temporary directory")
  parser.add_argument("--name", default="serving", help="results file name")
  parser.add_argument("--variants", default=",".join(serving_variants.VARIANTS),
                      help="the served reader's variants measured side by side "
                           "(benchmarks/serving_variants.py; empty: none)")
  parser.add_argument("--variant_pass_blocks", default="5,20",
                      help="reader passes (blocks) whose cost per block each variant measures")
  parser.add_argument("--profile_steps", type=int, default=3,
                      help="calls profiled per op breakdown")
  parser.add_argument("--measure_variant", default="", help=argparse.SUPPRESS)
  return parser.parse_args(argv)


def prepare_corpus(work_dir: str, articles: int, block_seq_length: int,
                   source: str = "") -> str:
  """The first `articles` {title, text} JSON lines of `source` (default: the shared vital
  articles) through the corpus pipeline into `work_dir`; returns the blocks file pattern."""
  from realm_tf.pipelines.corpus_blocks import prepare_blocks  # pylint: disable=g-import-not-at-top
  vital = os.path.join(harness.SHARED_DATA, "wikipedia", "vital_articles.jsonl")
  source = source or vital
  # Named by the source, so one work_dir never mistakes another file's blocks for these.
  stem = ("" if source == vital
          else os.path.splitext(os.path.basename(source))[0] + "_")
  sample = os.path.join(work_dir, f"{stem or 'vital_'}{articles}.jsonl")
  with open(source) as f, open(sample, "w") as out:
    for i, line in enumerate(f):
      if i >= articles:
        break
      out.write(line)
  return prepare_blocks(sample, os.path.join(work_dir, f"corpus_{stem}{articles}"),
                        block_seq_length)


def embed_corpus(run, batch_size: int = 64) -> float:
  """Embeds every block with the document tower into the index (version 1); seconds."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval.knowledge_index import type_ids_of  # pylint: disable=g-import-not-at-top
  index = run.index
  start = time.time()
  word_ids = tf.cast(index.word_ids.read_value()[:index.num_blocks], tf.int32)
  embed = tf.function(lambda inputs: run.model.retriever.embed_documents(inputs,
                                                                         training=False))
  parts = []
  for i in range(0, index.num_blocks, batch_size):
    ids = word_ids[i:i + batch_size]
    parts.append(embed(dict(input_word_ids=ids, input_mask=tf.cast(ids > 0, tf.int32),
                            input_type_ids=type_ids_of(ids, index.sep_id))).numpy())
  index.set_embeddings(np.concatenate(parts).astype(np.float32), version=1)
  return time.time() - start


def in_process(path: str, questions: list[str], calls: int,
               batch_sizes=(1, 8, 32)) -> dict:
  """The SavedModel's serving signature called directly, one question at a time; then its
  cost per question in calls of B questions."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  loaded = tf.saved_model.load(path)
  signature = loaded.signatures["serving_default"]
  for q in questions[:3]:
    signature(question=tf.constant([q]))
  latencies = []
  for i in range(calls):
    start = time.perf_counter()
    signature(question=tf.constant([questions[i % len(questions)]]))
    latencies.append(time.perf_counter() - start)
  result = harness.percentiles(latencies)
  # Cost per question of one call with B questions: what batching can gain at best.
  per_question = {}
  for batch in batch_sizes:
    batch_questions = tf.constant([questions[i % len(questions)] for i in range(batch)])
    signature(question=batch_questions)
    times = []
    for _ in range(3):
      start = time.perf_counter()
      signature(question=batch_questions)
      times.append(time.perf_counter() - start)
    per_question[str(batch)] = round(1000.0 * float(np.median(times)) / batch, 2)
  result["ms_per_question_at_batch_size"] = per_question
  return result


def encoder_pass(config, jit_compile: bool = False):
  """The reader's encoder alone (this config's, random weights: the cost does not depend on
  them) as a tf.function of [N, L] word ids → [N, L, H], XLA-compiled or not (as the
  export's reader_xla runs it, or not)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from realm_tf.modeling.networks import build_encoder  # pylint: disable=g-import-not-at-top
  encoder = build_encoder(config.model.encoder)
  return tf.function(lambda ids: encoder(dict(
      input_word_ids=ids, input_mask=tf.ones_like(ids),
      input_type_ids=tf.zeros_like(ids)))["sequence_output"], jit_compile=jit_compile)


def cost_per_block(config, seq_length: int, pass_blocks, repeats: int = 3,
                   jit_compile: bool = False) -> dict:
  """The reader's encoder alone (encoder_pass; not XLA-compiled unless `jit_compile`, as
  in the baseline's served graph) over passes of N blocks of `seq_length`: ms per block
  and FLOP/s at each N."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  e = config.model.encoder
  forward = encoder_pass(config, jit_compile)
  rows = {}
  for n in pass_blocks:
    ids = tf.fill([n, seq_length], 1000)  # [N, L]
    forward(ids).numpy()
    times = []
    for _ in range(max(repeats, 40 // n)):
      start = time.perf_counter()
      forward(ids).numpy()
      times.append(time.perf_counter() - start)
    seconds = float(np.median(times))
    flops = common.encoder_flops(e.num_layers, e.hidden_size, e.intermediate_size, n,
                                 seq_length, training=False)
    rows[str(n)] = dict(ms_per_block=round(1000.0 * seconds / n, 2),
                        flops_per_second=flops / seconds)
  return rows


def grpc_asker(port: int, model: str):
  """One gRPC client (its own channel): (ask(question), close)."""
  import grpc  # pylint: disable=g-import-not-at-top
  from tensorflow_serving.apis import prediction_service_pb2_grpc  # pylint: disable=g-import-not-at-top
  from serving import client  # pylint: disable=g-import-not-at-top
  channel = grpc.insecure_channel(f"127.0.0.1:{port}")
  stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

  def ask(question: str):
    client.ask(stub, [question], model=model, timeout=60)
  return ask, channel.close


def rest_asker(port: int, model: str):
  """One REST client: POST /v1/models/<model>:predict, one question, a connection each
  (as curl or a plain HTTP client would): (ask(question), close)."""
  import urllib.request  # pylint: disable=g-import-not-at-top
  url = f"http://127.0.0.1:{port}/v1/models/{model}:predict"

  def ask(question: str):
    body = json.dumps({"inputs": {"question": [question]}}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
      answer = json.loads(response.read())["outputs"]["answer"]
    if len(answer) != 1:
      raise ValueError(f"REST answered {len(answer)} answers to one question")
  return ask, lambda: None


def load_test(make_asker, questions: list[str], clients: int, seconds: float) -> dict:
  """Closed loop: `clients` threads, each its own client (make_asker() -> (ask, close)),
  one question per request, for `seconds` after every client has answered one warm-up."""
  latencies, errors = [], []
  lock = threading.Lock()
  start_barrier = threading.Barrier(clients + 1)
  stop = threading.Event()

  warmup_errors = []

  def work(worker: int):
    ask, close = make_asker()
    try:
      try:
        ask(questions[worker % len(questions)])
      except Exception as e:  # pylint: disable=broad-except  re-raised by the caller
        warmup_errors.append(repr(e)[:200])
        start_barrier.abort()
        return
      try:
        start_barrier.wait()
      except threading.BrokenBarrierError:  # another client's warm-up failed
        return
      i = worker
      mine = []
      while not stop.is_set():
        q = questions[i % len(questions)]
        i += clients
        begin = time.perf_counter()
        try:
          ask(q)
          mine.append(time.perf_counter() - begin)
        except Exception as e:  # pylint: disable=broad-except  counted, not hidden
          with lock:
            errors.append(repr(e)[:200])
      with lock:
        latencies.extend(mine)
    finally:
      close()

  threads = [threading.Thread(target=work, args=(w,), daemon=True) for w in range(clients)]
  for t in threads:
    t.start()
  try:
    start_barrier.wait()
  except threading.BrokenBarrierError:
    for t in threads:
      t.join(timeout=120)
    raise RuntimeError(f"a client's warm-up request failed (is the model served?): "
                       f"{warmup_errors[0]}") from None
  began = time.perf_counter()
  time.sleep(seconds)
  stop.set()
  for t in threads:
    t.join(timeout=120)
  elapsed = time.perf_counter() - began
  result = harness.percentiles(latencies)
  result.update(clients=clients, queries_per_second=round(len(latencies) / elapsed, 2),
                errors=len(errors), first_errors=errors[:3])
  return result


def serve(base_path: str, model: str, batching, options):
  from serving.server import ModelServer, ServerOptions  # pylint: disable=g-import-not-at-top
  return ModelServer(ServerOptions(
      port=0, rest_api_port=0, model_name=model, model_base_path=base_path,
      enable_batching=batching is not None,
      batching_options=batching, max_concurrent_requests=options.get("max_concurrent", 64),
      max_batch_size=max(256, options.get("max_batch_size", 32)),
      xla_cpu_compilation_enabled=options.get("xla", False))).start()


# op_breakdown's entry for the calls' time no TensorFlow op accounts for.
OUTSIDE_OPS = "(outside TensorFlow ops: XLA programs, framework)"


def op_breakdown(call, steps: int, top: int = 12) -> list[dict]:
  """Where `call()`'s time goes: TensorFlow's profiler over `steps` calls, self time summed
  by op type, the `top` largest with their share of the calls' time: the larger of their
  wall time and the ops' summed self time (ops of two threads overlap). An XLA-compiled
  function's program runs outside TensorFlow's op statistics: its time is in the
  OUTSIDE_OPS entry (wall time no op accounts for), with the framework's own.

  Why TensorFlow's private profiler plugin: tf.profiler writes an XSpace, and only the
  profiler's own converter (what TensorBoard's profile plugin calls) turns it into per-op
  statistics; the installed TensorFlow ships it, no other package does it offline.
  """
  import glob  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow.python.profiler.internal import _pywrap_profiler_plugin  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  call()
  logdir = tempfile.mkdtemp(prefix="serving_profile_")
  try:
    tf.profiler.experimental.start(logdir)
    try:
      began = time.perf_counter()
      for _ in range(steps):
        call()
      wall_us = 1e6 * (time.perf_counter() - began)
    finally:
      tf.profiler.experimental.stop()
    paths = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
    data, ok = _pywrap_profiler_plugin.xspace_to_tools_data(paths, "framework_op_stats", {})
    if not ok:
      raise RuntimeError(f"the profiler's op statistics failed: {data[:200]!r}")
  finally:
    shutil.rmtree(logdir, ignore_errors=True)
  table = json.loads(data)[0]
  columns = [c["id"] for c in table["cols"]]
  by_type = {}
  for row in table["rows"]:
    cell = dict(zip(columns, (c.get("v") for c in row["c"])))
    if cell["type"] == "IDLE":
      continue
    kind = cell["type"] or cell["operation"].rstrip("0123456789_")
    by_type[kind] = by_type.get(kind, 0.0) + float(cell["total_self_time"])
  by_type = {kind: us for kind, us in by_type.items() if us > 0}
  counted = sum(by_type.values())
  if wall_us > counted:
    by_type[OUTSIDE_OPS] = wall_us - counted
  total = max(wall_us, counted) or 1.0
  return [dict(op=kind, ms_per_call=round(us / 1000.0 / steps, 2),
               fraction=round(us / total, 3))
          for kind, us in sorted(by_type.items(), key=lambda item: -item[1])[:top]]


def measure_variant(spec: dict) -> dict:
  """One variant in this process (run_variant starts it with the variant's environment):
  the encoder's cost per block and op breakdown, the export's in-process p50 and op
  breakdown of one question, its gRPC p50 at one client.

  Args:
    spec: reader_xla, export (a realm_qa base path), pass_blocks, questions, calls,
      seconds, profile_steps.

  Returns:
    The variant's measurements (JSON values).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from realm_tf.configs import load_config  # pylint: disable=g-import-not-at-top
  config = load_config(os.path.join(harness.REPO, "configs", "demo.yaml"),
                       ["runtime.enable_xla=false"], experiment="realm/openqa")
  xla = spec["reader_xla"]
  seq = config.task.openqa.reader_seq_length
  questions = harness.read_questions(spec["questions"])
  e = config.model.encoder
  result = dict(onednn=os.environ.get("TF_ENABLE_ONEDNN_OPTS", "unset"),
                cost_per_block=cost_per_block(config, seq, spec["pass_blocks"],
                                              jit_compile=xla),
                gemm_limit_at_5_blocks=common.encoder_gemm_limit(
                    e.hidden_size, e.intermediate_size, e.num_attention_heads, 5, seq,
                    jit_compile=xla))
  forward = encoder_pass(config, xla)
  ids = tf.fill([min(spec["pass_blocks"]), seq], 1000)  # [N, L]
  result["encoder_profile"] = op_breakdown(lambda: forward(ids).numpy(),
                                           spec["profile_steps"])
  version = os.path.join(spec["export"], str(max(harness.versions(spec["export"]))))
  result["in_process"] = in_process(version, questions, spec["calls"], batch_sizes=(1,))
  signature = tf.saved_model.load(version).signatures["serving_default"]
  one = tf.constant(questions[:1])
  result["question_profile"] = op_breakdown(
      lambda: signature(question=one)["answer"].numpy(), spec["profile_steps"])
  server = serve(spec["export"], "realm_qa", None, dict(xla=xla))
  try:
    result["grpc"] = load_test(lambda: grpc_asker(server.port, "realm_qa"), questions, 1,
                               spec["seconds"])
  finally:
    server.stop(grace=1.0)
  return result


def run_variant(variant: serving_variants.Variant, export: str, args) -> dict:
  """measure_variant in a fresh `python -m benchmarks.serving` with the variant's
  environment; its result."""
  spec = dict(reader_xla=variant.reader_xla, export=export,
              pass_blocks=[int(n) for n in args.variant_pass_blocks.split(",") if n],
              questions=args.questions, calls=args.in_process_calls, seconds=args.seconds,
              profile_steps=args.profile_steps)
  env = dict(os.environ, PYTHONPATH=harness.REPO, TF_CPP_MIN_LOG_LEVEL="2", **variant.env())
  done = subprocess.run([sys.executable, "-m", "benchmarks.serving", "--measure_variant",
                         json.dumps(spec)], cwd=harness.REPO, env=env, capture_output=True,
                        text=True, check=False)
  lines = [line for line in done.stdout.splitlines() if line.startswith(_VARIANT_RESULT)]
  if done.returncode or not lines:
    raise RuntimeError(f"variant {variant.name} failed (exit {done.returncode}): "
                       f"{(done.stderr or done.stdout)[-2000:]}")
  return json.loads(lines[-1][len(_VARIANT_RESULT):])


def variant_verdicts(result: dict) -> None:
  """Each measured variant against VARIANT_TARGETS (the run's matmul limit and arithmetic
  floor, as with_floor sets them); the shipped and the fastest variant named.

  Adds to each result["variants"][name]: encoder_fraction_of_matmul_at_5_blocks,
  in_process_p50_over_floor, grpc_p50_over_floor, targets_met; and result["shipped_variant"],
  result["fastest_variant"] (lowest gRPC p50).
  """
  variants = result.get("variants")
  if not variants:
    return
  matmul = result["limits"]["matmul"]["flops_per_second"]
  floor_ms = result["floor_ms"]
  for measured in variants.values():
    at_5 = measured["cost_per_block"].get("5")
    grpc_p50 = measured["grpc"].get("p50_ms")
    gemm = measured.get("gemm_limit_at_5_blocks", {}).get("flops_per_second")
    measured.update(
        encoder_fraction_of_matmul_at_5_blocks=(
            round(at_5["flops_per_second"] / matmul, 3) if at_5 else None),
        gemm_limit_fraction_of_matmul=round(gemm / matmul, 3) if gemm else None,
        encoder_fraction_of_gemm_limit_at_5_blocks=(
            round(at_5["flops_per_second"] / gemm, 3) if at_5 and gemm else None),
        in_process_p50_over_floor=round(measured["in_process"]["p50_ms"] / floor_ms, 2),
        grpc_p50_over_floor=round(grpc_p50 / floor_ms, 2) if grpc_p50 else None)
    measured["targets_met"] = {
        name: bool(measured[name] is not None and (
            measured[name] >= target if name.startswith("encoder") else
            measured[name] <= target))
        for name, target in VARIANT_TARGETS.items()}
  result["shipped_variant"] = serving_variants.shipped().name
  timed = {name: v["grpc"]["p50_ms"] for name, v in variants.items() if v["grpc"].get("p50_ms")}
  result["fastest_variant"] = min(timed, key=timed.get) if timed else None


def _by_number(values: dict) -> dict:
  """values with its keys (numbers, as a JSON object's keys are strings) in numeric order:
  a result read back from JSON has them sorted as text."""
  return dict(sorted(values.items(), key=lambda item: int(item[0])))


def markdown(result: dict) -> str:
  lines = ["# Serving benchmark (benchmarks/serving.py)", "",
           f"Machine: {result['machine']['cpu_count']} CPUs, TF "
           f"{result['machine']['tensorflow']}, load average before "
           f"{result['machine']['load_average_1_5_15']}. Corpus: {result['num_blocks']} "
           f"blocks of vital_articles; model {result['model']}; "
           f"{result['num_retrieved']} retrieved, {result['num_read']} read per question.",
           "", "| export | front end | batching | clients | p50 ms | p99 ms | queries/s | "
           "errors |", "|---|---|---|---|---|---|---|---|"]
  for kind, per_kind in result["exports"].items():
    for transport, prefix in (("gRPC", ""), ("REST", "rest_")):
      for mode in ("no_batching", "batching"):
        for cell in per_kind.get(prefix + mode, []):
          lines.append(f"| {kind} | {transport} | {mode.replace('_', ' ')} | "
                       f"{cell['clients']} | {cell.get('p50_ms', '-')} | "
                       f"{cell.get('p99_ms', '-')} | {cell['queries_per_second']} | "
                       f"{cell['errors']} |")
  lines += ["", "| export | in-process p50 ms | gRPC p50 ms (1 client) | gRPC overhead | "
            "REST p50 ms (1 client) | REST overhead | batching speed-up at 8 clients, gRPC "
            "| REST |", "|---|---|---|---|---|---|---|---|"]
  for kind, per_kind in result["exports"].items():
    s = per_kind["summary"]
    rest = (f"{s['rest_p50_ms_1']} | {s['rest_overhead_fraction']:.1%}"
            if s.get("rest_p50_ms_1") else "- | -")
    lines.append(f"| {kind} | {per_kind['in_process']['p50_ms']} | {s['grpc_p50_ms_1']} | "
                 f"{s['grpc_overhead_fraction']:.1%} | {rest} | "
                 f"{s['batching_speedup_at_8'] if s['batching_speedup_at_8'] else '-'}x | "
                 f"{s.get('rest_batching_speedup_at_8') or '-'}x |")
  if "cost_per_block" in result:
    cost = result["cost_per_block"]
    matmul = result["limits"]["matmul"]["flops_per_second"]
    seq = result.get("reader_positions", {}).get(
        "reader_seq_length", result["flops_per_question"]["reader_seq_length"])
    lines += ["", f"Why a large pass costs more per question: the reader's encoder alone (no "
              f"XLA, as served), cost per block in one pass of N blocks of {seq} "
              f"wordpieces:", "",
              "| N blocks per pass | ms per block | GFLOP/s | x matmul limit |",
              "|---|---|---|---|"]
    for n, row in _by_number(cost).items():
      lines.append(f"| {n} | {row['ms_per_block']} | {row['flops_per_second'] / 1e9:.1f} | "
                   f"{row['flops_per_second'] / matmul:.2f} |")
  lines += ["", f"In-process cost per question of one call with B questions (ms), the exports "
            f"as published (at most {result.get('max_blocks_per_pass', 0) or 'all'} blocks per "
            f"reader pass, reader length steps of {result.get('reader_length_step', 0)}): " +
            "; ".join(
                f"{kind} " + ", ".join(
                    f"B={b}: {ms}" for b, ms in
                    _by_number(per_kind["in_process"]["ms_per_question_at_batch_size"]).items())
                for kind, per_kind in result["exports"].items()) + ". Batching can only help "
            "as much as this falls with B."]
  one_pass = result["exports"].get("realm_qa", {}).get("in_process_one_pass")
  if one_pass:
    lines += ["", f"The same realm_qa model exported to read a whole request in one pass at "
              f"the full reader length (as before both): in-process p50 "
              f"{one_pass['p50_ms']} ms at one question; per question " +
              ", ".join(f"B={b}: {ms}" for b, ms in
                        _by_number(one_pass["ms_per_question_at_batch_size"]).items()) + " ms."]
  if "reader_positions" in result:
    r = result["reader_positions"]
    lines += ["", f"Reader input used: {r['mean_used']} of {r['reader_seq_length']} positions "
              f"on average ({r['fraction_used']:.0%}; {r['fraction_of_pairs_full']:.0%} of "
              f"question-block pairs fill all {r['reader_seq_length']}): padding only as far "
              f"as a batch needs could save at most {1 - r['fraction_used']:.0%} of the "
              f"reader's work."]
  if "floor_ms" in result:
    f, lim = result["flops_per_question"], result["limits"]
    lines += ["", f"FLOP account of one question (as served: query "
              f"{f['query_seq_length']}, reader {f['reader_seq_length']} on average x "
              f"{f['num_read']} read; questions read at each length: "
              f"{_by_number(f['reader_lengths_read']) if 'reader_lengths_read' in f else '-'}): query tower {f['query_tower'] / 1e9:.2f}, search "
              f"{f['search'] / 1e9:.4f}, readers {f['readers'] / 1e9:.2f}, total "
              f"{f['total'] / 1e9:.2f} GFLOP (at the full reader length "
              f"{f.get('full_length_total', f['total']) / 1e9:.2f}). TensorFlow matmul "
              f"measured in the same run: "
              f"{lim['matmul']['flops_per_second'] / 1e9:.1f} GFLOP/s (CPU theoretical peak "
              f"{lim['cpu']['peak_flops'] / 1e9:.1f}); the arithmetic floor of a question is "
              f"{result['floor_ms']} ms."]
    if result["exports"]:  # a run of the variants alone (--kinds "") has none
      lines += ["", "| export | in-process p50 / floor | gRPC p50 / floor (1 client) | "
                "REST p50 / floor (1 client) | x matmul limit, in-process at B = " +
                ", ".join(_by_number(next(iter(result["exports"].values()))["in_process"][
                    "ms_per_question_at_batch_size"])) + " |", "|---|---|---|---|---|"]
    for kind, per_kind in result["exports"].items():
      s = per_kind["summary"]
      lines.append(f"| {kind} | {s['in_process_p50_over_floor']} | "
                   f"{s['grpc_p50_over_floor']} | {s.get('rest_p50_over_floor', '-')} | "
                   + ", ".join(
                       str(v) for v in
                       _by_number(s["fraction_of_matmul_limit_at_batch_size"]).values())
                   + " |")
  lines += ["", "Targets: " + ", ".join(f"{k} {v}" for k, v in TARGETS.items()), ""]
  for kind, per_kind in result["exports"].items():
    met = sorted(per_kind["targets_met"].items(), key=lambda item: (
        TARGETS_MET.index(item[0]) if item[0] in TARGETS_MET else len(TARGETS_MET), item[0]))
    lines.append(f"- {kind}: " + ", ".join(f"{k} {'met' if ok else 'MISSED'}" for k, ok in met))
  if result.get("variants"):
    lines += variants_markdown(result)
  return "\n".join(lines) + "\n"


def _ops(profile: list) -> str:
  return ", ".join(f"{p['op']} {p['fraction']:.0%}" for p in profile[:6])


def variants_markdown(result: dict) -> list[str]:
  """The variants' table, verdicts, which ships and why, and the profiles of the misses."""
  variants = result["variants"]
  blocks = sorted({n for v in variants.values() for n in v["cost_per_block"]}, key=int)
  matmul = result["limits"]["matmul"]["flops_per_second"]
  lines = ["", "## The served reader's variants (benchmarks/serving_variants.py)", "",
           f"Each variant is the same model exported its way and measured in its own process "
           f"(oneDNN is fixed when TensorFlow loads): the encoder alone in passes of N "
           f"blocks of {result['reader_positions']['reader_seq_length']} wordpieces (the "
           f"full reader length), one question in process and over gRPC (one client, no "
           f"batching). "
           f"Matmul limit {matmul / 1e9:.1f} GFLOP/s, arithmetic floor "
           f"{result['floor_ms']} ms. Targets: " + ", ".join(
               f"{k} {'>=' if k.startswith('encoder') else '<='} {v}"
               for k, v in VARIANT_TARGETS.items()) + ".", "",
           "The limit an encoder of these shapes could reach: its layers' matmuls alone "
           "at a 5-block pass (benchmarks.common.encoder_gemm_limit, the variant's XLA "
           "and oneDNN), against the matmul limit, and the encoder's own rate against it.",
           "",
           "| variant | XLA | oneDNN | length step | " + " | ".join(
               f"encoder x matmul at {n}" for n in blocks) +
           " | its matmuls alone at 5, x matmul | encoder x its matmuls at 5 "
           "| in-process p50 ms | / floor | gRPC p50 ms | / floor | targets |",
           "|---|---|---|---|" + "---|" * len(blocks) + "---|---|---|---|---|---|---|"]
  for name, v in variants.items():
    fractions = [f"{v['cost_per_block'][n]['flops_per_second'] / matmul:.2f}"
                 if n in v["cost_per_block"] else "-" for n in blocks]
    met = v["targets_met"]
    verdict = ("all met" if all(met.values()) else
               "MISSED " + ", ".join(k for k, ok in met.items() if not ok))
    lines.append(f"| {name} | {'on' if v['reader_xla'] else 'off'} | "
                 f"{'on' if v['onednn'] == '1' else 'off'} | {v['reader_length_step']} | "
                 + " | ".join(fractions) +
                 f" | {v.get('gemm_limit_fraction_of_matmul', '-')} | "
                 f"{v.get('encoder_fraction_of_gemm_limit_at_5_blocks', '-')}"
                 f" | {v['in_process']['p50_ms']} | "
                 f"{v['in_process_p50_over_floor']} | {v['grpc'].get('p50_ms', '-')} | "
                 f"{v['grpc_p50_over_floor']} | {verdict} |")
  shipped, fastest = result["shipped_variant"], result["fastest_variant"]
  lines += ["", f"Ships: **{shipped}** (realm_tf.export.assembly.READER_XLA and the "
            f"server's oneDNN default, off). Fastest over gRPC: **{fastest}**" + (
                "." if fastest == shipped else
                "; it ships only once benchmarks/results/serving_memory.md shows it within "
                "+5% RSS over three hand-overs, by flipping READER_XLA (XLA) or the "
                "server's oneDNN default."), "",
            "Where the time goes (TensorFlow profiler, self time by op type; an "
            "XLA-compiled function is one entry), for each variant that misses a target:", ""]
  for name, v in variants.items():
    if all(v["targets_met"].values()):
      continue
    lines += [f"- {name}: encoder 5-block pass: {_ops(v['encoder_profile'])}; one "
              f"question: {_ops(v['question_profile'])}"]
  return lines


def reader_lengths_run(run, path: str, questions: list[str], step: int) -> list[int]:
  """The reader length the export reads each question at when asked alone: the shortest of
  realm_tf.export.qa.reader_lengths holding its [CLS] question [SEP] body [SEP] for every
  block it reads (the blocks the export itself retrieves)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from realm_tf.export.qa import reader_lengths  # pylint: disable=g-import-not-at-top
  full = run.config.task.openqa.reader_seq_length
  query_seq = run.config.task.openqa.query_seq_length
  lengths = reader_lengths(full, query_seq, step)
  from realm_tf.modeling.spans import packed_lengths  # pylint: disable=g-import-not-at-top
  signature = tf.saved_model.load(path).signatures["serving_default"]
  read = np.concatenate([signature(question=tf.constant(questions[i:i + 20]))[
      "block_ids"].numpy()[:, :run.num_read] for i in range(0, len(questions), 20)])  # [Q, K]
  row_of = {int(b): r for r, b in enumerate(np.asarray(run.index.store.block_ids))}
  body = np.asarray(run.index.body_lengths.read_value())
  rows = np.vectorize(row_of.get)(read)  # [Q, K]
  mask = run.tokenizer.encode(tf.constant(questions), query_seq).input_mask
  _, used = packed_lengths(mask, body[rows], full)  # [Q, K]
  needed = used.numpy().max(axis=1)  # [Q]
  return [next(n for n in lengths if n >= x) for x in needed]


def flop_account(run, reader_seq_lengths=None) -> dict:
  """FLOPs of one question as the export runs it: the query tower over the padded question,
  the exact scores against every block, and num_read reader passes at the reader length
  each question is read at (`reader_seq_lengths`, one per question: the mean of their
  FLOPs; default the configured length, to which an export without length steps pads)."""
  c = run.config
  e = c.model.encoder
  query_seq = c.task.openqa.query_seq_length
  full_seq = c.task.openqa.reader_seq_length
  lengths = list(reader_seq_lengths or [full_seq])
  reader_seq = round(float(np.mean(lengths)), 1)

  def forward(seq):
    return common.encoder_flops(e.num_layers, e.hidden_size, e.intermediate_size, 1, seq,
                                training=False)

  parts = dict(query_tower=forward(query_seq),
               search=2.0 * run.index.num_blocks * run.index.dimension,
               readers=run.num_read * float(np.mean([forward(n) for n in lengths])))
  return dict(parts, total=sum(parts.values()), query_seq_length=query_seq,
              reader_seq_length=reader_seq, num_read=run.num_read,
              reader_lengths_read={str(n): lengths.count(n) for n in sorted(set(lengths))},
              full_length_total=parts["query_tower"] + parts["search"]
              + run.num_read * forward(full_seq))


def reader_positions_used(run, questions: list[str]) -> dict:
  """How much of the reader's padded input is text: [CLS] question [SEP] body [SEP] over
  reader_seq_length, for these questions against every block of the corpus (the blocks a
  question retrieves are a sample of them). What reading only as far as the batch needs
  could save at most."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from realm_tf.modeling.spans import packed_lengths  # pylint: disable=g-import-not-at-top
  seq = run.config.task.openqa.reader_seq_length
  query = run.tokenizer.encode(tf.constant(questions),
                               run.config.task.openqa.query_seq_length)
  body = np.asarray(run.index.body_lengths.read_value())[:run.index.num_blocks]  # [N]
  _, used = packed_lengths(query.input_mask,
                           np.broadcast_to(body, (len(questions), len(body))), seq)
  used = used.numpy()  # [Q, N]
  return dict(reader_seq_length=seq, mean_used=round(float(used.mean()), 1),
              fraction_used=round(float(used.mean()) / seq, 3),
              fraction_of_pairs_full=round(float((used == seq).mean()), 3))


def with_floor(result: dict, limits: dict):
  """Each export's latencies as multiples of the arithmetic floor (a question's FLOPs at the
  measured matmul throughput) and its in-process FLOP/s as a fraction of that throughput."""
  matmul = limits["matmul"]["flops_per_second"]
  flops = result["flops_per_question"]["total"]
  floor_ms = 1000.0 * flops / matmul
  result["floor_ms"] = round(floor_ms, 2)
  for per_kind in result["exports"].values():
    inproc = per_kind["in_process"]
    grpc_p50 = per_kind["summary"]["grpc_p50_ms_1"]
    rest_p50 = per_kind["summary"].get("rest_p50_ms_1")
    per_kind["summary"].update(
        in_process_p50_over_floor=round(inproc["p50_ms"] / floor_ms, 2),
        grpc_p50_over_floor=round(grpc_p50 / floor_ms, 2) if grpc_p50 else None,
        rest_p50_over_floor=round(rest_p50 / floor_ms, 2) if rest_p50 else None,
        in_process_fraction_of_matmul_limit=round(floor_ms / inproc["p50_ms"], 3),
        fraction_of_matmul_limit_at_batch_size={
            b: round(floor_ms / ms, 3) for b, ms in
            inproc["ms_per_question_at_batch_size"].items()})
    per_kind["targets_met"]["p50_within_1.25x_floor"] = bool(
        grpc_p50 and grpc_p50 <= TARGETS["p50_over_floor_at_1_client"] * floor_ms)


def run(args) -> dict:
  """Both exports served and measured, cell by cell; the result."""
  from realm_tf.configs import load_config  # pylint: disable=g-import-not-at-top
  from realm_tf.export import exporter  # pylint: disable=g-import-not-at-top
  from serving.config import BatchingOptions  # pylint: disable=g-import-not-at-top

  machine = harness.machine()
  limits = common.compute_limits()
  work = args.work_dir or tempfile.mkdtemp(prefix="serving_bench_")
  os.makedirs(work, exist_ok=True)
  config = load_config(os.path.join(harness.REPO, "configs", "demo.yaml"),
                       ["runtime.enable_xla=false"], experiment="realm/openqa")
  timings = {}
  start = time.time()
  blocks = prepare_corpus(work, args.articles, config.model.retriever.block_seq_length)
  timings["corpus_s"] = round(time.time() - start, 1)
  config = config.replace(index=dict(blocks=blocks))
  run = exporter.build_run(config)
  if run.index.num_blocks < args.min_blocks:
    raise SystemExit(f"{run.index.num_blocks} blocks from {args.articles} articles; raise "
                     f"--articles to reach --min_blocks {args.min_blocks}")
  timings["embed_s"] = round(embed_corpus(run), 1)
  questions = harness.read_questions(args.questions)
  models_dir = os.path.join(work, "models")
  shutil.rmtree(models_dir, ignore_errors=True)
  kinds = [k for k in args.kinds.split(",") if k]
  clients = [int(c) for c in args.clients.split(",") if c]
  batching = BatchingOptions(max_batch_size=args.max_batch_size,
                             batch_timeout_micros=args.batch_timeout_micros,
                             num_batch_threads=args.num_batch_threads,
                             max_enqueued_batches=1000)
  per_pass = (exporter.MAX_BLOCKS_PER_PASS if args.max_blocks_per_pass < 0
              else args.max_blocks_per_pass)
  length_step = (exporter.READER_LENGTH_STEP if args.reader_length_step < 0
                 else args.reader_length_step)
  batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
  reader_seq = config.task.openqa.reader_seq_length
  begin = time.time()
  blocks_cost = cost_per_block(config, reader_seq,
                               [int(n) for n in args.pass_blocks.split(",") if n])
  timings["cost_per_block_s"] = round(time.time() - begin, 1)
  print(json.dumps({"cost_per_block": blocks_cost}), flush=True)
  result = dict(machine=machine, args=vars(args), num_blocks=run.index.num_blocks,
                model="configs/demo.yaml (MiniLM warm start, no fine-tuning)",
                num_retrieved=run.num_retrieved, num_read=run.num_read, targets=TARGETS,
                timings=timings, exports={}, limits=limits,
                max_blocks_per_pass=per_pass, reader_length_step=length_step,
                cost_per_block=blocks_cost,
                reader_positions=reader_positions_used(run, questions))
  variants = serving_variants.parse(args.variants) if args.variants else []
  for variant in variants:
    begin = time.time()
    base = os.path.join(work, "variants", variant.name)
    shutil.rmtree(base, ignore_errors=True)
    step = variant.length_step()
    version = serving_variants.save_export(run, variant, base)
    if "flops_per_question" not in result and step == length_step:
      result["flops_per_question"] = flop_account(
          run, reader_lengths_run(run, version, questions, length_step))
    measured = run_variant(variant, os.path.join(base, "realm_qa"), args)
    result.setdefault("variants", {})[variant.name] = dict(
        measured, reader_xla=variant.reader_xla, onednn=variant.onednn,
        reader_length_step=step)
    timings[f"variant_{variant.name}_s"] = round(time.time() - begin, 1)
    print(json.dumps({variant.name: dict(in_process_p50_ms=measured["in_process"]["p50_ms"],
                                         grpc_p50_ms=measured["grpc"].get("p50_ms"))}),
          flush=True)
  for kind in kinds:
    begin = time.time()
    path = exporter.save_export(exporter.build_module(run, kind, per_pass, length_step),
                                models_dir, kind, 1, run.provenance(kind),
                                exporter.warmup_requests(kind, run))
    if "flops_per_question" not in result:
      result["flops_per_question"] = flop_account(
          run, reader_lengths_run(run, path, questions, length_step))
    timings[f"export_{kind}_s"] = round(time.time() - begin, 1)
    per_kind = dict(in_process=in_process(path, questions, args.in_process_calls,
                                          batch_sizes))
    if (per_pass or length_step) and kind == "realm_qa":
      # The same model without either: the whole request in one pass at the full reader
      # length. What grouping and length steps change.
      one_pass_dir = os.path.join(work, "models_one_pass")
      shutil.rmtree(one_pass_dir, ignore_errors=True)
      one_pass = exporter.save_export(exporter.build_module(run, kind, 0, 0), one_pass_dir,
                                      kind, 1, run.provenance(kind),
                                      exporter.warmup_requests(kind, run))
      per_kind["in_process_one_pass"] = in_process(one_pass, questions,
                                                   args.in_process_calls, batch_sizes)
    for mode, options in (("no_batching", None), ("batching", batching)):
      server = serve(os.path.join(models_dir, kind), kind, options,
                     dict(max_batch_size=args.max_batch_size))
      try:
        per_kind[mode] = [
            load_test(lambda: grpc_asker(server.port, kind), questions, c, args.seconds)
            for c in clients]
        per_kind[f"rest_{mode}"] = [
            load_test(lambda: rest_asker(server.rest_port, kind), questions, c, args.seconds)
            for c in clients]
      finally:
        server.stop(grace=1.0)
      print(json.dumps({kind: {mode: per_kind[mode], f"rest_{mode}": per_kind[f"rest_{mode}"]}}),
            flush=True)
    def cells(mode: str) -> dict:
      return {c["clients"]: c for c in per_kind[mode]}

    def speedup_at_8(transport: str):
      on, off = cells(f"{transport}batching"), cells(f"{transport}no_batching")
      if 8 in on and 8 in off and off[8]["queries_per_second"]:
        return round(on[8]["queries_per_second"] / off[8]["queries_per_second"], 2)
      return None

    grpc_p50 = cells("no_batching").get(1, {}).get("p50_ms")
    rest_p50 = cells("rest_no_batching").get(1, {}).get("p50_ms")
    inproc = per_kind["in_process"]["p50_ms"]
    speedup = speedup_at_8("")
    overhead = (grpc_p50 - inproc) / inproc if grpc_p50 else float("nan")
    per_kind["summary"] = dict(grpc_p50_ms_1=grpc_p50, in_process_p50_ms=inproc,
                               grpc_overhead_fraction=round(overhead, 4),
                               batching_speedup_at_8=speedup, rest_p50_ms_1=rest_p50,
                               rest_overhead_fraction=(round((rest_p50 - inproc) / inproc, 4)
                                                       if rest_p50 else None),
                               rest_batching_speedup_at_8=speedup_at_8("rest_"))
    per_kind["targets_met"] = dict(
        p50_ms_at_1_client=bool(grpc_p50 and grpc_p50 <= TARGETS["p50_ms_at_1_client"]),
        grpc_overhead_fraction=bool(overhead <= TARGETS["grpc_overhead_fraction"]),
        batching_speedup_at_8_clients=bool(
            speedup and speedup >= TARGETS["batching_speedup_at_8_clients"]))
    result["exports"][kind] = per_kind
  # A single measurement can land on a busy moment of a shared machine: the better of the
  # start and end ones is the limit (both recorded).
  end = common.compute_limits()
  result["limits_end"] = end
  if end["matmul"]["flops_per_second"] > limits["matmul"]["flops_per_second"]:
    result["limits"] = limits = dict(end, used="end of the run (the better)")
  with_floor(result, limits)
  variant_verdicts(result)
  result["machine"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
  timings["total_s"] = round(time.time() - start, 1)
  if not args.work_dir:
    shutil.rmtree(work, ignore_errors=True)
  return result


def main(argv=None):
  args = parse_args(argv)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  if args.measure_variant:  # a variant's own process (run_variant)
    print(_VARIANT_RESULT + json.dumps(measure_variant(json.loads(args.measure_variant))),
          flush=True)
    return
  result = run(args)
  path = harness.Output(args.name, markdown).write(result)
  print(json.dumps({k: v["summary"] for k, v in result["exports"].items()}, indent=2))
  if result.get("variants"):
    print(json.dumps({name: v["targets_met"] for name, v in result["variants"].items()},
                     indent=2))
  print(path)


if __name__ == "__main__":
  main()
