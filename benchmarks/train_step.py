"""Train-step benchmark, one part at a time.

    python -m benchmarks.train_step --parts mips [--num_vectors 1000000 --dim 128
        --batch 256 --k 10 --repeats 5]
    python -m benchmarks.train_step --parts tasks [--tasks ict,pretrain,openqa
        --task_xla on,off --task_steps 3 --num_blocks 13000 --pretrain_batch 0]

Parts (--parts takes a comma-separated list of these):
  mips  The in-graph exact MIPS kernel (realm_tf.retrieval.exact.exact_top_k) on its own:
        queries/s over num_vectors x dim float32 vectors, batches of `batch` queries,
        against FAISS's exact IndexFlatIP (threads = cores) on the same vectors in the same
        run, and against the full-matrix top_k it replaced (matmul over all N, then
        tf.math.top_k over [Q, N]). The kernel is timed as a plain tf.function (float32
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

from benchmarks.common import RESULTS_DIR, machine, write_result
from benchmarks.train_step_tasks import run_tasks, tasks_markdown
from realm_tf.retrieval.exact import DEFAULT_CHUNK_SIZE, GROUP_SIZE, exact_top_k
from realm_tf.retrieval.synthetic import clustered_vectors, queries_near

RESULT_NAME = "train_step"
DEFAULT_KERNEL = "exact_top_k, tf.function (default)"
FAISS_TARGET_RATIO = 0.7


def _recall(got: np.ndarray, want: np.ndarray) -> float:
  """Mean fraction of each query's reference top-k found in its returned top-k."""
  return float(np.mean([len(set(g) & set(w)) / len(w) for g, w in zip(got, want)]))


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
  # call and would steal the cores from a TF call timed right after.
  faiss_seconds, truth = _time_batches(lambda q: index.search(q, k)[1], batches,
                                       args.repeats)

  embeddings = tf.Variable(vectors, trainable=False)  # as the searchers hold them
  embeddings_bf16 = tf.Variable(tf.cast(vectors, tf.bfloat16), trainable=False)
  del vectors

  @tf.function
  def full_matrix_top_k(q):
    """The previous ExactSearcher.search: all of [Q, N], then one top_k."""
    return tf.math.top_k(tf.matmul(q, embeddings, transpose_b=True), k=k).indices

  kernel = tf.function(lambda q: exact_top_k(q, embeddings, k)[1])
  kernel_bf16 = tf.function(lambda q: exact_top_k(q, embeddings_bf16, k)[1])
  kernel_jit = tf.function(lambda q: exact_top_k(q, embeddings, k)[1], jit_compile=True)
  methods = {
      "full-matrix top_k (previous ExactSearcher), tf.function": full_matrix_top_k,
      DEFAULT_KERNEL: kernel,
      "exact_top_k, tf.function, bfloat16 embeddings": kernel_bf16,
      "exact_top_k, jit_compile=True": kernel_jit,
  }
  tf_batches = [tf.constant(b) for b in batches]
  timings = {}
  for name, search in methods.items():
    timings[name] = _time_batches(lambda q, s=search: s(q).numpy(), tf_batches,
                                  args.repeats)

  def row(name, seconds, found):
    median = statistics.median(seconds)
    return dict(name=name, queries_per_second=args.batch / median,
                batch_seconds_median=median, batch_seconds=seconds,
                recall_at_k_vs_faiss=_recall(found, truth))

  rows = [row("FAISS IndexFlatIP (exact)", faiss_seconds, truth)]
  rows += [row(name, *timings[name]) for name in methods]
  faiss_qps = rows[0]["queries_per_second"]
  for r in rows:
    r["ratio_to_faiss"] = r["queries_per_second"] / faiss_qps
  default_ratio = next(r["ratio_to_faiss"] for r in rows if r["name"] == DEFAULT_KERNEL)
  return dict(
      num_vectors=args.num_vectors, dimension=args.dim, query_batch=args.batch, k=k,
      repeats=args.repeats, distinct_batches=args.num_batches,
      faiss_version=faiss.__version__, faiss_threads=cores,
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
      "| search | queries/s | x FAISS | recall@k vs FAISS |",
      "|---|---:|---:|---:|",
  ]
  for r in result["rows"]:
    lines.append(f"| {r['name']} | {r['queries_per_second']:.1f} | "
                 f"{r['ratio_to_faiss']:.2f} | {r['recall_at_k_vs_faiss']:.4f} |")
  lines += ["", "Recall is against FAISS over the same float32 vectors, so the bfloat16 row's "
            "shortfall is the rounding of the embeddings to bfloat16, not the search.",
            "", f"Target: exact_top_k (default) at least {result['target_ratio_to_faiss']}x "
            f"FAISS: {'met' if result['default_meets_target'] else 'NOT met'}.", ""]
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
  path = write_result(RESULT_NAME, results, merge=True)
  with open(path) as f:
    merged = json.load(f)
  md_path = os.path.join(RESULTS_DIR, f"{RESULT_NAME}.md")
  tmp = f"{md_path}.tmp-{os.getpid()}"
  with open(tmp, "w") as f:
    f.write(markdown(merged))
  os.replace(tmp, md_path)
  print(f"wrote {path} and {md_path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
