"""MIPS benchmark: recall@10 against exact search, queries/s, build time, bytes per vector.

    python -m benchmarks.mips [--num_vectors 1000000] [--only synthetic|real] [--markdown_only]

Two corpora, measured in one run:
  synthetic  1M x 128 clustered vectors (realm_tf.retrieval.synthetic), queries near
             corpus points;
  real       block embeddings of the shared corpora (Wikipedia vital articles), built
             through the Beam pipelines (beam.preprocess, then beam.embed_corpus with the
             MiniLM-initialised block encoder of configs/demo.yaml), real questions
             (NQ-Open) as queries.
For each: exact search (TF matmul + top_k) and ScaNN at a few settings; batched queries/s
(batches of 256) and single-query queries/s. A setting is a build (ScannParams overrides)
and the options it is searched with (scann_index.SearchOptions: the fraction of leaves
searched, the candidates reordered), so one tree serves every leaves setting unrebuilt. Results: benchmarks/results/mips.json and
mips.md (`--markdown_only` re-renders mips.md from the committed mips.json).
"""
import argparse
import json
import os
import shutil
import tempfile
import time

import numpy as np
import tensorflow as tf

from benchmarks import harness
from benchmarks.harness import SHARED_DATA, machine
from realm_tf.retrieval import ExactSearcher, ScannSearcher, scann_index, scann_params_for
from realm_tf.retrieval.scann_index import SearchOptions
from realm_tf.retrieval.synthetic import clustered_vectors, queries_near

K = 10
BATCH = 256


def _qps(search, queries: np.ndarray, batch: int, min_seconds: float = 3.0) -> float:
  """Queries per second of `search` over `queries` in batches of `batch`."""
  search(tf.constant(queries[:batch]))  # warm up (tracing, caches)
  done, start = 0, time.perf_counter()
  while time.perf_counter() - start < min_seconds or done < batch:
    for i in range(0, len(queries) - batch + 1, batch):
      search(tf.constant(queries[i:i + batch]))
      done += batch
      if time.perf_counter() - start > min_seconds * 3:
        break
  return done / (time.perf_counter() - start)


def _dir_bytes(path: str) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path)
             for f in files)


def _scann_bytes_per_vector(searcher: ScannSearcher, num: int) -> float:
  tmp = tempfile.mkdtemp()
  try:
    tf.saved_model.save(searcher.state, tmp)
    return _dir_bytes(tmp) / num
  finally:
    shutil.rmtree(tmp)


def measure(vectors: np.ndarray, queries: np.ndarray, settings: list[dict]) -> dict:
  """Exact and ScaNN settings over one corpus.

  Args:
    vectors: [N, P] float32 corpus.
    queries: [Q, P] float32 queries.
    settings: dicts of `build` (ScannParams overrides; each distinct one built once) and
      `options` (the SearchOptions it is searched with; absent: the build's own).

  Returns:
    The corpus's sizes and one row per search (exact first).
  """
  n, dim = vectors.shape
  ids = np.arange(n, dtype=np.int64)
  exact = ExactSearcher(vectors, ids)
  exact_search = tf.function(lambda q: exact.search(q, K))
  truth = np.concatenate([exact_search(tf.constant(queries[i:i + BATCH])).block_ids.numpy()
                          for i in range(0, len(queries), BATCH)])
  exact_row = dict(name="exact", recall_at_10=1.0, build_seconds=0.0,
                   bytes_per_vector=float(vectors.itemsize * dim),
                   qps_batched=_qps(exact_search, queries, BATCH),
                   qps_single=_qps(exact_search, queries[:200], 1, min_seconds=2.0))
  rows, built = [exact_row], {}
  for setting in settings:
    params = scann_params_for(n, **setting["build"])
    key = json.dumps(params.to_dict(), sort_keys=True)
    if key not in built:
      start = time.perf_counter()
      searcher = ScannSearcher.build(vectors, ids, params=params)
      built[key] = (searcher, time.perf_counter() - start,
                    _scann_bytes_per_vector(searcher, n))
    searcher, build, size = built[key]
    options = setting.get("options", SearchOptions())
    search = _searching(searcher, options)
    got = np.concatenate([search(tf.constant(queries[i:i + BATCH])).block_ids.numpy()
                          for i in range(0, len(queries), BATCH)])
    row = dict(name=_name(params, searcher.layout, options), params=params.to_dict(),
               options=options._asdict(), recall_at_10=harness.recall(got, truth),
               build_seconds=build, bytes_per_vector=size,
               qps_batched=_qps(search, queries, BATCH),
               qps_single=_qps(search, queries[:500], 1, min_seconds=2.0))
    row["speedup_batched_vs_exact"] = row["qps_batched"] / exact_row["qps_batched"]
    row["speedup_single_vs_exact"] = row["qps_single"] / exact_row["qps_single"]
    rows.append(row)
    print(json.dumps({k: v for k, v in row.items() if k not in ("params", "options")}),
          flush=True)
  return dict(num_vectors=n, dimension=dim, num_queries=len(queries), k=K,
              query_batch=BATCH, rows=rows)


def _searching(searcher: ScannSearcher, options: SearchOptions):
  """A tf.function: queries [Q, P] → the SearchResult of `searcher` with `options`."""

  @tf.function
  def search(queries):
    with scann_index.searching_with(options):
      return searcher.search(queries, K)

  return search


def _name(params, layout: scann_index.ShardLayout, options: SearchOptions) -> str:
  """The row's name: the mode, and the reordering and leaves as searched."""
  if params.mode == "brute_force":
    return f"scann brute_force ({params.reorder_dtype})"
  reorder = options.reorder_num_neighbors or layout.reorder_num_neighbors
  name = f"scann {params.mode} reorder={reorder}"
  if params.mode == "tree_ah_reorder":
    searched = scann_index.leaves_to_search(options.leaves_fraction, layout)
    searched = layout.num_leaves_to_search if searched == -1 else searched
    name += f" leaves={layout.num_leaves} search={searched}"
  return name + f" ({params.reorder_dtype})"


def synthetic(num_vectors: int) -> dict:
  vectors = clustered_vectors(num_vectors, 128, num_clusters=2000, seed=0)
  queries = queries_near(vectors, 2048, seed=1)
  # One float32 tree searched at five settings (a fraction of its sqrt(N) leaves, and
  # candidates reordered), and the shipped int8 one at one of them.
  float32 = dict(reorder_dtype="float32")
  settings = [dict(build=float32, options=SearchOptions(fraction, reorder))
              for fraction, reorder in ((0.008, 40), (0.012, 50), (0.025, 100), (0.05, 100),
                                        (0.1, 200))]
  settings.append(dict(build=dict(reorder_dtype="int8"), options=SearchOptions(0.025, 100)))
  return measure(vectors, queries, settings)


def real(work_dir: str) -> dict:
  """Blocks of the vital articles → MiniLM block embeddings through both Beam pipelines."""
  # pylint: disable=g-import-not-at-top
  from realm_tf.io import versioned
  from realm_tf.pipelines import embed, preprocess
  # pylint: enable=g-import-not-at-top
  from realm_tf.configs import load_config  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval.encoders import BlockEncoder, QueryEncoder, export_encoder, load_encoder  # pylint: disable=g-import-not-at-top
  from realm_tf.modeling import factory  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval import load_searcher  # pylint: disable=g-import-not-at-top
  from realm_tf.text import Tokenizer  # pylint: disable=g-import-not-at-top

  corpus = os.path.join(work_dir, "corpus")
  start = time.perf_counter()
  preprocess.prepare_corpus(preprocess.PreprocessConfig(
      input_format="jsonl", input=os.path.join(SHARED_DATA, "wikipedia", "vital_articles.jsonl"),
      output_dir=corpus, max_block_length=128))
  preprocess_seconds = time.perf_counter() - start
  config = load_config(os.path.join(os.path.dirname(__file__), os.pardir, "configs",
                                    "demo.yaml"))
  retriever = factory.build_retriever(config)
  tokenizer = Tokenizer()
  block_encoder = export_encoder(
      BlockEncoder(retriever.document_embedder, tokenizer, config.model.retriever.block_seq_length),
      os.path.join(work_dir, "export", "block_encoder"), step=0)
  query_encoder = export_encoder(
      QueryEncoder(retriever.query_embedder, tokenizer, config.model.retriever.query_seq_length),
      os.path.join(work_dir, "export", "query_encoder"), step=0)
  start = time.perf_counter()
  index = embed.embed_corpus(embed.EmbedConfig(
      blocks=corpus, encoder=block_encoder, output_dir=os.path.join(work_dir, "index"),
      num_shards=2, batch_size=64))
  embed_seconds = time.perf_counter() - start
  exact = load_searcher(index, backend="exact")
  vectors = np.concatenate([s.embeddings.numpy() for s in exact.shards])
  with open(os.path.join(SHARED_DATA, "openqa", "nq_open", "train_subset.jsonl")) as f:
    questions = [json.loads(line)["question"] for _, line in zip(range(2048), f)]
  encode = load_encoder(query_encoder)
  queries = np.concatenate([encode(text=tf.constant(questions[i:i + 256]))["embeddings"]
                            .numpy() for i in range(0, len(questions), 256)])
  # Brute force (the shipped mode at this size), asymmetric hashing, and a tree (sqrt(N)
  # leaves) searching a tenth of its leaves.
  settings = [dict(build=dict()),
              dict(build=dict(mode="ah_reorder", reorder_dtype="float32")),
              dict(build=dict(mode="tree_ah_reorder", reorder_dtype="float32"),
                   options=SearchOptions(leaves_fraction=0.1))]
  result = measure(vectors, queries, settings)
  manifest = versioned.read_version(index).manifest
  result.update(corpus="wikipedia/vital_articles.jsonl", encoder="MiniLM (configs/demo.yaml)",
                preprocess_seconds=preprocess_seconds,
                beam_embed_and_index_seconds=embed_seconds,
                beam_blocks_per_second=len(vectors) / embed_seconds,
                index_build_seconds_in_pipeline=manifest["build_seconds"])
  return result


def _machine_line(machine: dict) -> str:
  load = machine.get("load_average_1_5_15")
  return (f"{machine['cpu_count']} CPUs, TF {machine['tensorflow']}, {machine['when']}"
          + (f", load average {load}" if load else ""))


def markdown(result: dict) -> str:
  """benchmarks/results/mips.md: one table per corpus measured, from mips.json."""
  titles = {"synthetic": "Synthetic: clustered vectors (realm_tf.retrieval.synthetic), "
                         "queries near corpus points",
            "real": "Real: MiniLM block embeddings of the vital articles, NQ-Open questions "
                    "as queries"}
  lines = ["# MIPS benchmark (benchmarks/mips.py)", "",
           "Exact search (TF matmul + top_k) against ScaNN settings; recall@k against exact "
           "search, queries/s batched and one query at a time, index bytes per vector and "
           "ScaNN build time.", ""]
  for corpus in ("synthetic", "real"):
    if corpus not in result:
      continue
    run = result[corpus]
    lines += [f"## {titles[corpus]}", "",
              f"Machine: {_machine_line(run.get('machine') or result['machine'])}. "
              f"{run['num_vectors']:,} x "
              f"{run['dimension']} vectors, {run['num_queries']:,} queries, k = {run['k']}, "
              f"batches of {run['query_batch']}."]
    if "beam_blocks_per_second" in run:
      lines[-1] += (f" Corpus {run['corpus']}, encoder {run['encoder']}: preprocessed in "
                    f"{run['preprocess_seconds']:.0f} s, embedded and indexed by the Beam "
                    f"pipeline in {run['beam_embed_and_index_seconds']:.0f} s "
                    f"({run['beam_blocks_per_second']:.1f} blocks/s).")
    lines += ["", "| search | recall@10 | queries/s batched (x exact) | "
              "queries/s single (x exact) | bytes/vector | build s |",
              "|---|---:|---:|---:|---:|---:|"]
    for row in run["rows"]:
      batched = f"{row['qps_batched']:,.0f}"
      single = f"{row['qps_single']:,.1f}"
      if "speedup_batched_vs_exact" in row:
        batched += f" ({row['speedup_batched_vs_exact']:.2f}x)"
        single += f" ({row['speedup_single_vs_exact']:.2f}x)"
      lines.append(f"| {row['name']} | {row['recall_at_10']:.3f} | {batched} | {single} | "
                   f"{row['bytes_per_vector']:.0f} | {row['build_seconds']:.1f} |")
    lines.append("")
  return "\n".join(lines)


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--num_vectors", type=int, default=1_000_000)
  parser.add_argument("--only", choices=["synthetic", "real"], default=None,
                      help="measure one corpus and merge it into the existing results")
  parser.add_argument("--markdown_only", action="store_true",
                      help="only re-render mips.md from the committed mips.json")
  return parser.parse_args(argv)


def run(args) -> dict:
  """The corpora of args.only (default: both), each with the machine that measured it."""
  result = {}
  if args.only in (None, "synthetic"):
    result["synthetic"] = dict(machine=machine(), **synthetic(args.num_vectors))
  if args.only in (None, "real"):
    work_dir = tempfile.mkdtemp(prefix="mips-bench-")
    try:
      result["real"] = dict(machine=machine(), **real(work_dir))
    finally:
      shutil.rmtree(work_dir, ignore_errors=True)
  return result


def main(argv=None):
  args = parse_args(argv)
  output = harness.Output("mips", markdown)
  if args.markdown_only:
    print(output.render())
    return
  # One corpus measured alone is merged into the other's committed figures.
  print(output.write(run(args), merge=args.only is not None))
  print(output.markdown_path)


if __name__ == "__main__":
  main()
