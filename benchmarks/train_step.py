"""Train-step benchmark, one part at a time.

    python -m benchmarks.train_step --parts mips [--num_vectors 1000000 --dim 128
        --batch 256 --k 10 --repeats 5]
    python -m benchmarks.train_step --parts tasks [--tasks ict,pretrain,openqa
        --task_xla on,off --task_steps 3 --num_blocks 13000 --pretrain_batch 0]

Parts (--parts takes a comma-separated list of these):
  mips  The in-graph exact MIPS kernel (realm_tf.retrieval.exact.exact_top_k) on its own:
        queries/s over num_vectors x dim float32 vectors, batches of `batch` queries,
        against FAISS's exact IndexFlatIP (threads = cores) on the same vectors in the same
        run, and against a full-matrix top_k (matmul over all N, then tf.math.top_k over
        [Q, N]: what the kernel's chunking saves). The kernel is timed as a plain tf.function (float32
        and bfloat16 embeddings) and compiled with jit_compile=True. Recall@k of each is
        measured against FAISS. Target: at least 0.7x FAISS's queries/s.
        Vectors are clustered like real embeddings (realm_tf.retrieval.synthetic), with
        queries near corpus points. --num_vectors 20000 makes a smoke run.

  tasks Where each task's step time goes at configs/demo.yaml sizes: the same-size plain
        tf-models BertEncoderV2 forward+backward work, the index's retrieval and gathers,
        and the rest (heads, packing, losses); see benchmarks/train_step_tasks.py.

Results: benchmarks/results/train_step.json (one top-level key per part; a run replaces
only the keys of the parts it ran) and the Markdown table train_step.md, rendered from
the merged JSON. Times are wall seconds on a shared machine: each part records the load
average before and after.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import tensorflow as tf

from benchmarks import harness
from benchmarks.common import compute_limits
from benchmarks.harness import machine
from benchmarks.train_step_tasks import merge_task_runs, run_tasks, tasks_markdown
from realm_tf.retrieval.exact import DEFAULT_CHUNK_SIZE, GROUP_SIZE, exact_top_k
from realm_tf.retrieval.synthetic import clustered_vectors, queries_near

RESULT_NAME = "train_step"
# What FAISS exposes for flat (exact) search, swept in run_mips. faiss 1.15's
# distance_compute_blas_threshold is 128000 by default (older releases: 20): a batch of
# fewer queries than that takes its SIMD loop instead of BLAS, so its defaults are not its
# best for a batch of 256. The block sizes cut the BLAS path's [queries x database] tiles.
FAISS_KNOBS = ("distance_compute_blas_threshold", "distance_compute_blas_query_bs",
               "distance_compute_blas_database_bs")
FAISS_SETTINGS = [dict(distance_compute_blas_threshold=20, distance_compute_blas_database_bs=b)
                  for b in (1024, 4096, 16384, 65536)]
DEFAULT_KERNEL = "exact_top_k, tf.function (default)"
FAISS_TARGET_RATIO = 0.7


def _time_batches(search, batches: list, repeats: int) -> tuple[list, np.ndarray]:
  """Wall seconds of `repeats` calls, cycling over `batches`; returns the times and the
  indices [len(batches) * batch, k] found for every batch (for recall)."""
  found = [np.asarray(search(b)) for b in batches]  # also warms up (traces, compiles)
  seconds = []
  for r in range(repeats):
    start = time.perf_counter()
    np.asarray(search(batches[r % len(batches)]))  # np.asarray waits for the result
    seconds.append(time.perf_counter() - start)
  return seconds, np.concatenate(found)


def _setting_name(setting: dict) -> str:
  short = {"distance_compute_blas_threshold": "blas_threshold",
           "distance_compute_blas_query_bs": "query_bs",
           "distance_compute_blas_database_bs": "database_bs"}
  return ", ".join(f"{short[k]}={v}" for k, v in setting.items())


def run_mips(args) -> dict:
  """Queries/s of FAISS IndexFlatIP, the full-matrix top_k and exact_top_k; see module doc."""
  import faiss  # pylint: disable=import-outside-toplevel  (benchmark-only extra `bench`)

  cores = os.cpu_count()
  faiss.omp_set_num_threads(cores)
  before = machine()
  vectors = clustered_vectors(args.num_vectors, args.dim, num_clusters=2000, seed=0)
  queries = queries_near(vectors, args.batch * args.num_batches, seed=1)
  batches = [queries[i * args.batch:(i + 1) * args.batch] for i in range(args.num_batches)]
  k = args.k

  index = faiss.IndexFlatIP(args.dim)
  index.add(vectors)
  # FAISS first, all its calls together: its OpenMP threads spin for a while after each
  # call and would steal the cores from a TF call timed right after. Its defaults, then
  # every setting of FAISS_SETTINGS: the comparison that counts is with FAISS at its best.
  defaults = {name: getattr(faiss.cvar, name) for name in FAISS_KNOBS}
  faiss_runs = []
  for setting in [{}] + FAISS_SETTINGS:
    for name, value in dict(defaults, **setting).items():
      setattr(faiss.cvar, name, value)
    seconds, found = _time_batches(lambda q: index.search(q, k)[1], batches, args.repeats)
    faiss_runs.append((setting, seconds, found))
  for name, value in defaults.items():
    setattr(faiss.cvar, name, value)
  truth = faiss_runs[0][2]

  embeddings = tf.Variable(vectors, trainable=False)  # as the searchers hold them
  embeddings_bf16 = tf.Variable(tf.cast(vectors, tf.bfloat16), trainable=False)
  del vectors

  @tf.function
  def full_matrix_top_k(q):
    """All of [Q, N] at once, then one top_k: the plain search the kernel's chunks beat."""
    return tf.math.top_k(tf.matmul(q, embeddings, transpose_b=True), k=k).indices

  kernel = tf.function(lambda q: exact_top_k(q, embeddings, k)[1])
  kernel_bf16 = tf.function(lambda q: exact_top_k(q, embeddings_bf16, k)[1])
  kernel_jit = tf.function(lambda q: exact_top_k(q, embeddings, k)[1], jit_compile=True)
  methods = {
      "full-matrix top_k (one [Q, N] matmul), tf.function": full_matrix_top_k,
      DEFAULT_KERNEL: kernel,
      "exact_top_k, tf.function, bfloat16 embeddings": kernel_bf16,
      "exact_top_k, jit_compile=True": kernel_jit,
  }
  tf_batches = [tf.constant(b) for b in batches]
  timings = {}
  for name, search in methods.items():
    timings[name] = _time_batches(lambda q, s=search: s(q).numpy(), tf_batches,
                                  args.repeats)

  limits = compute_limits()
  matmul_flops = limits["matmul"]["flops_per_second"]
  batch_flops = 2.0 * args.num_vectors * args.dim * args.batch  # the scores alone

  def row(name, seconds, found, **extra):
    median = statistics.median(seconds)
    return dict(name=name, queries_per_second=args.batch / median,
                batch_seconds_median=median, batch_seconds=seconds,
                recall_at_k_vs_faiss=harness.recall(found, truth),
                flops_per_second=batch_flops / median,
                fraction_of_matmul_limit=batch_flops / median / matmul_flops, **extra)

  faiss_rows = [row("FAISS IndexFlatIP (exact), " + (_setting_name(setting) or "defaults"),
                    seconds, found, faiss_setting=dict(defaults, **setting))
                for setting, seconds, found in faiss_runs]
  best = max(faiss_rows, key=lambda r: r["queries_per_second"])
  rows = [faiss_rows[0]] + ([best] if best is not faiss_rows[0] else [])
  rows += [row(name, *timings[name]) for name in methods]
  faiss_qps = best["queries_per_second"]
  for r in rows:
    r["ratio_to_faiss"] = r["queries_per_second"] / faiss_qps
    r["ratio_to_faiss_defaults"] = r["queries_per_second"] / faiss_rows[0]["queries_per_second"]
  default_ratio = next(r["ratio_to_faiss"] for r in rows if r["name"] == DEFAULT_KERNEL)
  return dict(
      num_vectors=args.num_vectors, dimension=args.dim, query_batch=args.batch, k=k,
      repeats=args.repeats, distinct_batches=args.num_batches,
      faiss_version=faiss.__version__, faiss_threads=cores,
      faiss_sweep=[{k_: v for k_, v in r.items() if k_ != "batch_seconds"}
                   for r in faiss_rows],
      faiss_best=best["name"], limits=limits, flops_per_batch=batch_flops,
      kernel=dict(chunk_size=DEFAULT_CHUNK_SIZE, group_size=GROUP_SIZE),
      target_ratio_to_faiss=FAISS_TARGET_RATIO,
      default_meets_target=default_ratio >= FAISS_TARGET_RATIO,
      machine=before, load_average_after=[round(x, 2) for x in os.getloadavg()],
      rows=rows)


def mips_markdown(result: dict) -> list[str]:
  m = result["machine"]
  lines = [
      f"## Exact MIPS: {result['num_vectors']:,} x {result['dimension']} float32, "
      f"batches of {result['query_batch']}, k = {result['k']}",
      "",
      f"{m['cpu_count']} cores, TF {m['tensorflow']}, FAISS {result['faiss_version']} "
      f"({result['faiss_threads']} threads), {m['when']}; load average (1/5/15 min) "
      f"{m['load_average_1_5_15']} before, {result['load_average_after']} after. "
      f"Median of {result['repeats']} batches. exact_top_k: chunk "
      f"{result['kernel']['chunk_size']} rows, groups of {result['kernel']['group_size']}.",
      "",
  ]
  limits = result.get("limits")
  if limits:
    cpu = limits["cpu"]
    lines += [f"Limits measured in the same run: TensorFlow float32 matmul "
              f"{limits['matmul']['flops_per_second'] / 1e9:.1f} GFLOP/s (n = "
              f"{limits['matmul']['n']}), {100 * (limits['matmul_fraction_of_peak'] or 0):.0f}% "
              f"of the CPU's theoretical {cpu['peak_flops'] / 1e9:.1f} GFLOP/s "
              f"({cpu['cores']} cores x {cpu['fma_units_per_core_assumed']} FMA units, assumed, x "
              f"{cpu['vector_lanes_fp32']} lanes x 2 x {cpu['clock_mhz']:.0f} MHz). A batch is {result['flops_per_batch'] / 1e9:.1f} GFLOP of "
              f"scores (2 x N x d x Q).", ""]
  lines += ["| search | queries/s | GFLOP/s | x matmul limit | x FAISS best | x FAISS defaults "
            "| recall@k vs FAISS |", "|---|---:|---:|---:|---:|---:|---:|"]
  for r in result["rows"]:
    gflops = r.get("flops_per_second", 0) / 1e9
    lines.append(f"| {r['name']} | {r['queries_per_second']:.1f} | {gflops:.1f} | "
                 f"{r.get('fraction_of_matmul_limit', float('nan')):.2f} | "
                 f"{r['ratio_to_faiss']:.2f} | "
                 f"{r.get('ratio_to_faiss_defaults', float('nan')):.2f} | "
                 f"{r['recall_at_k_vs_faiss']:.4f} |")
  if result.get("faiss_sweep"):
    lines += ["", "FAISS settings tried (queries/s): " + "; ".join(
        f"{r['name'].split(', ', 1)[1]} {r['queries_per_second']:.1f}"
        for r in result["faiss_sweep"]) + "."]
  lines += ["", "Recall is against FAISS over the same float32 vectors, so the bfloat16 row's "
            "shortfall is the rounding of the embeddings to bfloat16, not the search.",
            "", f"Target: exact_top_k (default) at least {result['target_ratio_to_faiss']}x "
            f"FAISS at its best: {'met' if result['default_meets_target'] else 'NOT met'}.",
            ""]
  return lines


# Each part: how to run it and how to render its results. A part's Markdown is rendered
# from the merged JSON, so results of parts run in other invocations stay in the table.
PARTS = {"mips": (run_mips, mips_markdown), "tasks": (run_tasks, tasks_markdown)}


def markdown(payload: dict) -> str:
  lines = ["# Train-step benchmark (benchmarks/train_step.py)", ""]
  for part, (_, render) in PARTS.items():
    if part in payload:
      lines += render(payload[part])
  return "\n".join(lines)


def parse_args(argv):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--parts", default=",".join(PARTS),
                      help=f"comma-separated, of: {', '.join(PARTS)}")
  parser.add_argument("--num_vectors", type=int, default=1_000_000)
  parser.add_argument("--dim", type=int, default=128)
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--k", type=int, default=10)
  parser.add_argument("--repeats", type=int, default=5, help="timed batches per method")
  parser.add_argument("--num_batches", type=int, default=3,
                      help="distinct query batches (recall is measured over all)")
  parser.add_argument("--tasks", default="ict,pretrain,openqa",
                      help="tasks part: which tasks to time")
  parser.add_argument("--task_xla", default="on,off",
                      help="tasks part: XLA settings to time (on, off or both)")
  parser.add_argument("--task_steps", type=int, default=3, help="tasks part: timed steps")
  parser.add_argument("--num_blocks", type=int, default=13000,
                      help="tasks part: knowledge corpus size (real Wikipedia blocks)")
  parser.add_argument("--pretrain_batch", type=int, default=0,
                      help="tasks part: pre-training batch (0: the demo config's)")
  args = parser.parse_args(argv)
  args.tasks = [t for t in args.tasks.split(",") if t]
  args.task_xla = [{"on": True, "off": False}[x] for x in args.task_xla.split(",") if x]
  args.parts = [p for p in args.parts.split(",") if p]
  unknown = sorted(set(args.parts) - set(PARTS))
  if unknown or not args.parts:
    parser.error(f"--parts must list some of {sorted(PARTS)}, got {unknown or 'none'}")
  return args


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  results = {}
  for part in args.parts:
    results[part] = PARTS[part][0](args)
    print(json.dumps({part: results[part]}, indent=1, default=str), flush=True)
  output = harness.Output(RESULT_NAME, markdown)
  committed = output.read()
  if "tasks" in results and "tasks" in committed:
    results["tasks"] = merge_task_runs(committed["tasks"], results["tasks"])
  path = output.write(results, merge=True)
  print(f"wrote {path} and {output.markdown_path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
