"""Where ScaNN's recall@5 is lost at REALM's shard size: the leaves searched, or the
scores the candidates are ranked by.

    python -m benchmarks.scann_rescoring --generator ../scann52/generator.npz [--shards 2]

Shards of 1,027,209 rows (REALM's 13,353,718 blocks in 13 shards) drawn from the embedding
generator (benchmarks.synthetic_embeddings, whose results say how far it is validated:
shard s is blocks(rows, seed=s), as the full-size run draws them), 1,000 generated questions, exact top-5 as the reference.
Each shard is built as the export ships it (scann_params_for: a tree of about sqrt(n)
leaves, a fifth searched, asymmetric hashing, int8 reordering of 100) and, beside it,
without reordering (asymmetric hashing's scores alone). The shards are searched and merged
as a served export merges them (ShardedSearcher), at three fractions of the leaves, with
ScaNN's own scores and with the merged candidates re-scored from float16, bfloat16 and
float32 copies of the rows, as a served export re-scores them (ServedIndex.search:
served_index.RESCORED_PER_NEIGHBOUR candidates per neighbour).

Why: at 13 shards the shipped export's recall@5 was 0.930 against a 0.95 target, and
neither searching more leaves nor reordering more candidates raised it
(benchmarks/results/released_scale.md). If the misses are near-ties that int8 scores
misorder, re-scoring ScaNN's candidates in a finer dtype recovers them, and the export
should carry such a copy (served_index.RESCORED_PER_NEIGHBOUR).
"""
import argparse
import time

import numpy as np
import tensorflow as tf

from benchmarks import harness
from benchmarks.synthetic_embeddings import EmbeddingGenerator, exact_top
from realm_tf.export import served_index
from realm_tf.retrieval import scann_index
from realm_tf.retrieval.sharded import ShardedSearcher

SHARD_ROWS = 1_027_209  # ceil(13,353,718 / 13)
RESCORE_DTYPES = ("float16", "bfloat16", "float32")
LEAVES = (None, 0.1, 0.3)  # None: each shard's own (a fifth)
BUILDS = {"int8 reordering (shipped)": {}, "no reordering": dict(reorder_num_neighbors=0)}


def rounded(rows: np.ndarray, dtype: str) -> np.ndarray:
  """`rows` as a copy stored in `dtype` gives them back (float32)."""
  return tf.cast(tf.cast(rows, dtype), tf.float32).numpy()


def measure(shards: int, num_queries: int, per_neighbour: int, generator_path: str,
            log=print) -> dict:
  """Recall@5 against exact search for every build × rescoring × leaves fraction."""
  generator = EmbeddingGenerator.load(generator_path)
  parts = [generator.blocks(SHARD_ROWS, seed=s) for s in range(shards)]
  vectors = np.concatenate([p[0] for p in parts])
  clusters = np.concatenate([p[1] for p in parts])
  del parts
  queries, _ = generator.queries(vectors, clusters, num_queries, seed=99)
  start = time.time()
  # 100 questions at a time: a [Q, N] score matrix of all of them is 8 GB at two shards.
  truth = np.concatenate([exact_top(vectors, queries[i:i + 100], 5)[0]
                          for i in range(0, num_queries, 100)])
  log(f"exact top-5 of {num_queries} questions over {len(vectors):,} rows: "
      f"{time.time() - start:.0f} s")
  rows = [np.arange(s * SHARD_ROWS, (s + 1) * SHARD_ROWS) for s in range(shards)]
  copies = {dtype: rounded(vectors, dtype) for dtype in RESCORE_DTYPES}
  fetch = 5 * per_neighbour
  out = {}
  for build, overrides in BUILDS.items():
    start = time.time()
    searchers = [scann_index.ScannSearcher.build(
        vectors[r], r, params=scann_index.scann_params_for(len(r), **overrides))
        for r in rows]
    built = time.time() - start
    merged = ShardedSearcher(searchers)  # block ids are the rows here
    for fraction in LEAVES:
      start = time.time()
      with scann_index.searching_with(scann_index.SearchOptions(leaves_fraction=fraction)):
        candidates = np.concatenate([  # [Q, fetch] by ScaNN's scores, best first
            merged.search(tf.constant(queries[i:i + 100]), fetch).block_ids.numpy()
            for i in range(0, num_queries, 100)])
      searched = time.time() - start
      # What ServedIndex.search does with a searcher and embeddings: re-score, top 5.
      ranked = {"none": candidates[:, :5]}
      for dtype, copy in copies.items():
        scores = np.einsum("qp,qfp->qf", queries, copy[candidates])
        ranked[dtype] = np.take_along_axis(candidates, np.argsort(-scores, 1)[:, :5], 1)
      for dtype, top in ranked.items():
        key = f"{build} | {dtype} | {fraction or 'own'}"
        out[key] = dict(build=build, rescore=dtype, leaves_fraction=fraction or "own",
                        recall_at_5=round(harness.recall(top, truth), 4),
                        search_seconds=round(searched, 1), build_seconds=round(built))
        log(f"{key}: recall@5 {out[key]['recall_at_5']}")
    del searchers, merged
  return dict(rows=len(vectors), shards=shards, shard_rows=SHARD_ROWS, queries=num_queries,
              per_neighbour=per_neighbour, results=out)


def markdown(result: dict) -> str:
  lines = [
      "# ScaNN's recall@5: leaves searched or scores ranked by",
      "",
      f"`python -m benchmarks.scann_rescoring` (module docstring). {result['shards']} "
      f"shards of {result['shard_rows']:,} generated rows ({result['rows']:,} in all), "
      f"{result['queries']:,} generated questions, exact top-5 as the reference; "
      f"ScaNN's merged top {5 * result['per_neighbour']} ({result['per_neighbour']} per "
      f"neighbour, served_index.RESCORED_PER_NEIGHBOUR) re-scored as a served export "
      f"re-scores them. "
      f"Machine: {result['machine']}",
      "",
      "| build | candidates ranked by | leaves searched | recall@5 | search s (all questions) |",
      "|---|---|---|---:|---:|"]
  for r in result["results"].values():
    fraction = ("each shard's own (a fifth)" if r["leaves_fraction"] == "own"
                else f"{r['leaves_fraction']} of each shard's")
    ranked = ("ScaNN's scores" if r["rescore"] == "none"
              else f"re-scored from {r['rescore']} rows")
    lines.append(f"| {r['build']} | {ranked} | {fraction} | {r['recall_at_5']:.3f} | "
                 f"{r['search_seconds']} |")
  return "\n".join(lines) + "\n"


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--generator", required=True,
                      help="benchmarks.synthetic_embeddings' generator.npz")
  parser.add_argument("--shards", type=int, default=2)
  parser.add_argument("--num_queries", type=int, default=1000)
  parser.add_argument("--output", default="")
  args = parser.parse_args(argv)
  result = measure(args.shards, args.num_queries, served_index.RESCORED_PER_NEIGHBOUR,
                   args.generator)
  result["machine"] = harness.machine()
  output = (harness.output_at(args.output, markdown) if args.output
            else harness.Output("scann_rescoring", markdown))
  output.write(result)
  print(output.render())


if __name__ == "__main__":
  main()
