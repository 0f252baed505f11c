"""The ScaNN QA export at N blocks, side by side with the exact export, in one run.

    python -m benchmarks.scann_scale [--blocks 13353718] [--shard_blocks 1048576]
        [--scann_overrides JSON] [--work_dir DIR] [--requests 200] [--queries 1000]
        [--answers 100] [--memory_blocks 1048576] [--tower DIR]
        [--config configs/demo.yaml] [--name scann_scale]

The 20,000-block result (scann_scale_20k.md):
    python -m benchmarks.scann_scale --blocks 20000 --shard_blocks 10000 \
        --scann_overrides '{"mode": "tree_ah_reorder"}' --requests 60 --answers 24 \
        --name scann_scale_20k

The corpus is benchmarks/scale.py's: real-length blocks (288 wordpieces of the demo's
Wikipedia leads) in the served text store, and seeded [N, 128] embeddings clustered by lead
article. With --tower (a trained run's model_dir, e.g. the demo's ICT run: its newest committed
`export/block_encoder` and `export/query_encoder`), the embeddings are that document
tower's over the same blocks, and recall queries are NQ questions embedded by
its query tower, instead of seeded ones (its width replaces 128, the model then has no
projection).

Each step runs in its own process, so one step's memory never inflates the next:
  corpus    the text store and the embeddings (.npy);
  index     the index version as the index builder publishes it: shards of --shard_blocks
            rows, each with its ScaNN state in the shipped configuration
            (scann_params_for: int8 reordering), built one shard at a time: seconds and
            the building process's peak memory;
  export    per kind (realm_qa, realm_qa_scann), the QA SavedModel as
            `python -m realm_tf.export` builds it (realm_tf.export.assembly, each kind's
            default search: the ScaNN kind serves the version's shards without their int8
            reordering and re-scores their candidates from float16; the process also
            holds the index's float32 embeddings, as the exporter's loaded run does): peak
            memory, seconds, disk, the checkpoint's parts;
  recall    recall@5 against exact search on --queries queries, per shard merged as
            served, for the shipped configuration and the REALM authors' (ORQA's
            scann_utils.py: 1,000 leaves, 100 searched, a 100,000-point training sample,
            asymmetric hashing with 2 dimensions per block, no reordering; here per shard,
            so each shard searches the same tenth of its leaves), with each searcher's
            resident bytes per block and its search time per single query;
  serve     per kind, `python -m serving.server` under availability_preserving: resident
            memory after load, p50/p99 of --requests questions at one gRPC client (the
            same questions for both kinds), and the peak while a second version replaces
            the first (benchmarks.scale.serve_phase);
  answers   per kind, --answers questions through the loaded export: how often the ScaNN
            export's answer, top-5 and p(z|x) differ from the exact export's.
Results: benchmarks/results/<name>.json and .md (benchmarks.harness.Output), rewritten
after every step; figures that grow with N are also extrapolated to 13,353,718 blocks,
labelled so.
"""
import argparse
import dataclasses
import gc
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from benchmarks import harness, scale
from benchmarks.harness import du_bytes, gib
from benchmarks.scale import DIMENSION, SEED, WIKIPEDIA_BLOCKS

KINDS = ("realm_qa", "realm_qa_scann")
POLICY = "availability_preserving"
# The targets of a full-size run (served RSS, hand-over peak, export peak in GiB; ScaNN's
# p50 as a fraction of exact's; recall@5 of the shipped configuration).
TARGETS = dict(served_gib=8.0, handover_gib=20.0, export_gib=16.0, p50_ratio=0.3,
               recall_at_5=0.95)
log = harness.logger("scann_scale")


def parse_args(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks.scann_scale",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--blocks", type=int, default=WIKIPEDIA_BLOCKS)
  parser.add_argument("--shard_blocks", type=int, default=1 << 20,
                      help="rows per index shard (the index builder's --num_shards at N)")
  parser.add_argument("--scann_overrides", default="{}",
                      help="JSON of ScannParams fields for the index's shards (default: "
                      "none, scann_params_for's choice for the shard size). A small run "
                      "sets the tree a full-size shard gets: "
                      "'{\"mode\": \"tree_ah_reorder\"}' (sqrt(n) leaves, a twentieth "
                      "searched, int8 reordering)")
  parser.add_argument("--work_dir", default="", help="default: a temporary directory, "
                      "deleted at the end (tens of GB at full size)")
  parser.add_argument("--requests", type=int, default=200,
                      help="questions asked one at a time per served export")
  parser.add_argument("--queries", type=int, default=1000, help="for recall@5")
  parser.add_argument("--answers", type=int, default=100,
                      help="questions whose answers are compared between the exports")
  parser.add_argument("--tower", default="", help="a trained run's model_dir: embeddings "
                      "from its newest committed document and query towers")
  parser.add_argument("--tower_batch", type=int, default=64)
  parser.add_argument("--memory_blocks", type=int, default=1 << 20,
                      help="rows of the one shard whose resident bytes per block are "
                      "measured (per-shard constants spoil the reading at small N)")
  parser.add_argument("--config", default=os.path.join(harness.REPO, "configs", "demo.yaml"))
  parser.add_argument("--block_seq_length", type=int, default=288)
  parser.add_argument("--reader_seq_length", type=int, default=320)
  parser.add_argument("--timeout", type=float, default=7200.0,
                      help="seconds a version may take to load")
  parser.add_argument("--name", default="scann_scale", help="results file stem")
  parser.add_argument("--reuse_corpus", action="store_true",
                      help="reuse the corpus a run left in --work_dir (same --blocks)")
  args = PHASES.parse(parser, argv)
  if args.blocks < 1000:
    parser.error("--blocks must be at least 1000")
  if args.shard_blocks < 100:
    parser.error("--shard_blocks must be at least 100")
  if args.tower and not all(os.path.isdir(os.path.join(args.tower, "export", n))
                            for n in ("block_encoder", "query_encoder")):
    parser.error(f"--tower {args.tower}: needs export/block_encoder/ and "
                 "export/query_encoder/ (a trained run's model_dir)")
  try:
    args.scann_overrides_dict = json.loads(args.scann_overrides)
  except ValueError as e:
    parser.error(f"--scann_overrides is not JSON: {e}")
  args.embedding_dtype = "float32"  # scale.corpus_phase's and serve_phase's fields
  return args


# ------------------------------------------------------------------------------- phases


def _tower(model_dir: str, name: str):
  """The newest committed encoder export `name` of a run (realm_tf.retrieval.encoders)."""
  from realm_tf.retrieval import encoders  # pylint: disable=g-import-not-at-top
  root = os.path.join(model_dir, "export", name)
  latest = encoders.latest_encoder_export(root)
  if latest is None:
    raise FileNotFoundError(f"{root}: no committed encoder export")
  return encoders.load_encoder(latest.path)


def _embeddings(work: str):
  return np.load(os.path.join(work, "embeddings.npy"), mmap_mode="r")


def corpus_phase(args, work: str) -> dict:
  """scale.corpus_phase's text store and seeded embeddings; with --tower, the embeddings
  are replaced by the tower's over the same (title, text) blocks."""
  result = scale.corpus_phase(args, work)
  if not args.tower:
    return dict(result, embeddings="seeded, clustered by lead article")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from realm_tf.text.tokenization import Tokenizer  # pylint: disable=g-import-not-at-top
  embed = _tower(args.tower, "block_encoder")
  leads = scale.LeadWords(Tokenizer(), os.path.join(work, "leads.npz"))
  start, path, vectors, row = time.time(), os.path.join(work, "embeddings.npy"), None, 0
  batch = []

  def flush():
    nonlocal vectors, row
    out = embed(title=tf.constant([t for t, _ in batch]), text=tf.constant([x for _, x in batch]))
    values = next(iter(out.values())).numpy().astype(np.float32)
    if vectors is None:
      vectors = np.lib.format.open_memmap(path, "w+", np.float32,
                                          (args.blocks, values.shape[1]))
    vectors[row:row + len(values)] = values
    row += len(values)
    batch.clear()
    if row % (100 * args.tower_batch) == 0:
      log(f"tower: {row:,} of {args.blocks:,} blocks embedded")

  for pair in leads.blocks(args.blocks, args.block_seq_length, seed=SEED):
    batch.append(pair)
    if len(batch) == args.tower_batch:
      flush()
  if batch:
    flush()
  vectors.flush()
  dimension = int(vectors.shape[1])
  del vectors
  return dict(result, embeddings=f"the document tower of {args.tower}", dimension=dimension,
              tower_seconds=round(time.time() - start, 1),
              embeddings_file_bytes=os.path.getsize(path))


def index_phase(args, work: str) -> dict:
  """The index version with a ScaNN state per shard, as the index builder writes it, one
  shard at a time (index_export.write_export, shipped ScaNN parameters)."""
  from realm_tf.io import versioned  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval import index_export  # pylint: disable=g-import-not-at-top
  vectors = _embeddings(work)
  ids = np.arange(args.blocks, dtype=np.int64)
  index_dir = os.path.join(work, "index")
  shutil.rmtree(index_dir, ignore_errors=True)
  bounds = [(s, min(args.blocks, s + args.shard_blocks))
            for s in range(0, args.blocks, args.shard_blocks)]
  start = time.time()
  with harness.PeakSampler(os.getpid()) as peak:
    path = index_export.write_export(
        index_dir, 1, [index_export.ShardData(vectors[a:b], ids[a:b]) for a, b in bounds],
        build_scann=True, scann_overrides=args.scann_overrides_dict)
  shards = versioned.latest_version(index_dir).manifest["shards"]
  return dict(shards=len(bounds), shard_blocks=args.shard_blocks,
              seconds=round(time.time() - start, 1),
              scann_build_seconds=round(sum(s.get("scann_build_seconds", 0) for s in shards), 1),
              scann_params=shards[0].get("scann"), peak_rss_bytes=max(peak.peak,
                                                                       harness.peak_rss_bytes()),
              disk_bytes=du_bytes(path))


def _config(args, dimension: int):
  from realm_tf.configs import load_config  # pylint: disable=g-import-not-at-top
  projection = (["model.retriever.projection=dense",
                 f"model.retriever.projection_size={dimension}"] if dimension == DIMENSION
                else ["model.retriever.projection=none"])
  return load_config(args.config, [
      "runtime.enable_xla=false", *projection,
      f"model.retriever.block_seq_length={args.block_seq_length}",
      f"model.reader.seq_length={args.reader_seq_length}",
      f"task.openqa.reader_seq_length={args.reader_seq_length}",
      f"model.encoder.max_position_embeddings={max(512, args.reader_seq_length)}"],
      experiment="realm/openqa")


def export_phase(args, work: str) -> dict:
  """One QA export (--kind) over the corpus and its index version, published as version 1:
  the task's model and index with the version swapped in, the module assembled by
  realm_tf.export.assembly as `python -m realm_tf.export` assembles it (realm_qa_scann:
  the version's shards, its candidates re-scored from float16; the process holds the
  index's float32 embeddings for either kind, as the exporter's loaded run does)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from realm_tf import tasks  # pylint: disable=g-import-not-at-top
  from realm_tf.export import assembly, exporter  # pylint: disable=g-import-not-at-top
  from realm_tf.io import versioned  # pylint: disable=g-import-not-at-top
  from realm_tf.modeling.factory import set_precision  # pylint: disable=g-import-not-at-top
  kind = args.kind
  start = time.time()
  config = scale.served_config(_config(args, _embeddings(work).shape[1]), work)
  set_precision(config)
  # Seeded: both kinds' exports get the same initial weights (the projection is not in the
  # pretrained encoder), so their answers differ only by their search.
  tf.keras.utils.set_random_seed(SEED)
  task = tasks.get_task(config, "")
  model = task.build_model()
  index = task.build_index(tf.distribute.get_strategy())
  index.swap(versioned.latest_version(os.path.join(work, "index")))
  # The networks' variables exist once they have run (as exporter.load_run builds them).
  assembly.served_qa_module(model, index, task.tokenizer, config).predict(
      tf.constant(["what is the capital of france?"]))
  search = exporter.DEFAULT_SEARCHES[kind]
  module = assembly.served_qa_module(model, index, task.tokenizer, config, search)
  out = os.path.join(work, "models")
  shutil.rmtree(os.path.join(out, kind), ignore_errors=True)
  warmup = [dict(question=["who wrote the iliad?"]),
            dict(question=list(exporter.WARMUP_QUESTIONS))]
  published = exporter.save_export(module, out, kind, 1, dict(
      kind=kind, benchmark="benchmarks/scann_scale.py", blocks=args.blocks,
      **search.describe()), warmup)
  return dict(kind=kind, seconds=round(time.time() - start, 1),
              export_peak_rss_bytes=harness.peak_rss_bytes(), disk_bytes=du_bytes(published),
              component_bytes=scale.saved_components(published),
              shards=len(module.scann_handles), search=search.describe())


def _queries(args, work: str, vectors) -> np.ndarray:
  """Recall queries: with a tower, NQ questions through its query tower; otherwise a
  random block's embedding plus as much noise (as a question is near its blocks)."""
  rng = np.random.default_rng(SEED + 1)
  if args.tower:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    embed = _tower(args.tower, "query_encoder")
    questions = harness.read_questions(args.queries, fill=True)
    return np.concatenate([next(iter(embed(text=tf.constant(questions[i:i + 100])).values()))
                           .numpy() for i in range(0, len(questions), 100)]).astype(np.float32)
  near = rng.choice(args.blocks, size=args.queries, replace=args.queries > args.blocks)
  return (np.asarray(vectors[np.sort(near)]) + rng.standard_normal(
      (args.queries, vectors.shape[1]), np.float32)).astype(np.float32)


def recall_phase(args, work: str) -> dict:
  """recall@5 against exact search of the shipped shards and the authors' configuration
  (per shard, merged: a ShardedSearcher, as served), each searcher's resident bytes per
  block (its state and the searcher made from it, as a served shard holds both) and time
  per query."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from realm_tf.io import versioned  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval import ScannSearcher, ShardedSearcher, load_searcher  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval.scann_index import AUTHORS_PARAMS  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval.index_export import load_shard_array  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval.row_blocks import RowBlocks  # pylint: disable=g-import-not-at-top
  vectors = _embeddings(work)
  queries = _queries(args, work, vectors)
  exact = RowBlocks.from_array(np.asarray(vectors, np.float32))
  want, exact_seconds = [], time.time()
  for i in range(0, len(queries), 100):
    want += exact.top_k(tf.constant(queries[i:i + 100]), 5)[1].numpy().tolist()
  exact_ms = (time.time() - exact_seconds) * 1000 / len(queries)
  del exact
  version = versioned.latest_version(os.path.join(work, "index"))
  infos = version.manifest["shards"]

  def authors():
    shards = []
    for info in infos:
      ids = load_shard_array(version, info["shard"], len(infos), "block_ids.npy")
      shards.append(ScannSearcher.build(np.asarray(vectors[ids], np.float32), ids,
                                        params=AUTHORS_PARAMS))
    return ShardedSearcher(shards)

  out = dict(queries=len(queries), exact_ms_per_query_batched=round(exact_ms, 3),
             authors_params=dict(AUTHORS_PARAMS.to_dict(),
                                 anisotropic_quantization_threshold="none"),
             shipped_params=infos[0].get("scann"))
  for name, make in (("shipped", lambda: load_searcher(version)), ("authors", authors)):
    gc.collect()
    before = scale.trimmed_rss()
    searcher = make()
    search = tf.function(lambda q, s=searcher: s.search(q, 5).block_ids)
    # One search builds what a searcher builds lazily (and the trace), before memory is read.
    search(tf.constant(queries[:1]))
    held = scale.trimmed_rss() - before
    begin = time.time()
    got = [search(tf.constant(q[None])).numpy()[0].tolist() for q in queries]
    out[name] = dict(recall_at_5=round(harness.recall(got, want), 4),
                     ms_per_single_query=round((time.time() - begin) * 1000 / len(queries), 3),
                     resident_bytes=held, resident_bytes_per_block=round(held / args.blocks, 1))
    del searcher, search
  return out


def memory_phase(args, work: str) -> dict:
  """Resident bytes per block of one served ScaNN shard of --memory_blocks seeded rows,
  built in the shipped configuration for that size and served as the default
  realm_qa_scann serves it (assembly.served_shards: without its int8 reordering): its
  state's variables (what the SavedModel restores) and the searcher the TensorsToScann
  op builds from them, each read as the growth of this process's trimmed RSS. One large
  shard, so that per-shard constants (graphs, codebooks, the tree) do not pass for
  per-block cost as they do at small N."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from realm_tf.export import assembly, exporter  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval import scann_index  # pylint: disable=g-import-not-at-top
  n = args.memory_blocks
  dimension = _embeddings(work).shape[1]
  # As scale.seeded_embeddings: a centroid per article plus as much noise, at this width.
  rng = np.random.default_rng(SEED)
  centroids = rng.standard_normal((5000, dimension), np.float32)
  vectors = centroids[rng.integers(0, 5000, size=n)]
  vectors += rng.standard_normal((n, dimension), np.float32)
  params = scann_index.scann_params_for(n)
  search = exporter.DEFAULT_SEARCHES["realm_qa_scann"]
  before = scale.trimmed_rss()
  # Built, serialised and the builder's searcher released, then as served: what stays is
  # the served state.
  (shard,) = assembly.served_shards([scann_index.ScannShard(
      scann_index.scann_state(vectors, params), np.arange(n, dtype=np.int64))], search)
  state = shard.state
  state_rss = scale.trimmed_rss() - before
  del vectors
  before = scale.trimmed_rss()
  searcher = scann_index.host_searcher(shard, dimension)
  searcher.search(tf.zeros([1, dimension]), 5)
  # (with its [n] int64 block ids, 8 bytes a block, which a served shard holds too)
  searcher_rss = scale.trimmed_rss() - before
  variables = sum(int(np.prod(v.shape)) * v.dtype.size for v in state.variables
                  if v.dtype != tf.string)
  return dict(blocks=n, params=params.to_dict(), served=search.describe(),
              served_layout=dataclasses.asdict(shard.layout), state_variable_bytes=variables,
              state_rss_bytes=state_rss, searcher_rss_bytes=searcher_rss,
              bytes_per_block=dict(state_variables=round(variables / n, 1),
                                   state_rss=round(state_rss / n, 1),
                                   searcher_rss=round(searcher_rss / n, 1)))


def answers_phase(args, work: str) -> dict:
  """--answers questions through the loaded export of --kind, 8 at a time."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_text  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import  (the exports' tokenizer ops)
  if args.kind == "realm_qa_scann":
    from scann.scann_ops.py import scann_ops  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import  (ScaNN's ops)
  loaded = tf.saved_model.load(os.path.join(work, "models", args.kind, "1"))
  answer = loaded.signatures["serving_default"]
  questions = harness.read_questions(args.answers, fill=True)
  rows = []
  for i in range(0, len(questions), 8):
    out = answer(question=tf.constant(questions[i:i + 8]))
    for j in range(len(questions[i:i + 8])):
      rows.append(dict(answer=out["answer"][j].numpy().decode(),
                       block_ids=[int(b) for b in out["block_ids"][j][:5].numpy()],
                       probs=[float(p) for p in out["retrieval_probs"][j][:5].numpy()]))
  return dict(kind=args.kind, questions=questions, rows=rows)


def compare_answers(exact: dict, scann: dict) -> dict:
  """How often the ScaNN export's answers differ from the exact export's."""
  pairs = list(zip(exact["rows"], scann["rows"]))
  same_top = [a["block_ids"] == b["block_ids"] for a, b in pairs]
  return dict(
      questions=len(pairs),
      answer_differs=sum(a["answer"] != b["answer"] for a, b in pairs),
      top5_differs=len(pairs) - sum(same_top),
      answer_differs_with_same_top5=sum(a["answer"] != b["answer"] for (a, b), same
                                        in zip(pairs, same_top) if same),
      max_abs_prob_difference_with_same_top5=round(max(
          [max(abs(x - y) for x, y in zip(a["probs"], b["probs"]))
           for (a, b), same in zip(pairs, same_top) if same] or [0.0]), 6))


# ----------------------------------------------------------------------------- extrapolation


def per_block(result: dict) -> dict:
  """Resident corpus bytes per block of a served version, ScaNN and exact, and each
  figure extrapolated linearly to 13,353,718 blocks.

  Two readings: from the served processes (RSS after load less the part that does not
  grow: the exact export's RSS less its corpus variables), which at small N is mostly
  noise; and from the parts (checkpoint variables, plus for ScaNN the searcher its op
  builds from them, measured resident in the recall phase), which is what extrapolates."""
  n = result["blocks"]
  serving = {row["kind"]: row for row in result.get("serving", [])}
  exports = result.get("exports", {})
  if "realm_qa" not in serving or "realm_qa" not in exports:
    return {}
  corpus_parts = ("embeddings", "block_ids", "text_offsets", "search_structure")
  exact_vars = sum(v for k, v in exports["realm_qa"]["component_bytes"].items()
                   if k in corpus_parts)
  floor = serving["realm_qa"]["rss_after_load_bytes"] - exact_vars
  out = dict(fixed_rss_bytes=floor)
  dimension = result["corpus"].get("dimension", DIMENSION)
  for kind, export in exports.items():
    held = {k: v for k, v in export["component_bytes"].items() if k in corpus_parts}
    exporting = sum(held.values())
    if kind == "realm_qa_scann":
      # The state's variables and the searcher the op builds from them, per block as
      # measured resident on one large shard (memory_phase).
      m = result["memory"]["bytes_per_block"]
      held["search_structure"] = (m["state_rss"] + m["searcher_rss"]) * n
      # The exporting process also holds the index's float32 embeddings (the loaded run).
      exporting += n * dimension * 4
    b = sum(held.values()) / n
    x = dict(from_parts_bytes_per_block=round(b, 1),
             served_rss_gib_extrapolated=gib(floor + b * WIKIPEDIA_BLOCKS),
             handover_peak_gib_extrapolated=gib(floor + 2 * b * WIKIPEDIA_BLOCKS),
             export_peak_gib_extrapolated=gib(export["export_peak_rss_bytes"]
                                              + exporting / n * (WIKIPEDIA_BLOCKS - n)))
    row = serving.get(kind)
    if row is not None:
      x["from_rss_bytes_per_block"] = round((row["rss_after_load_bytes"] - floor) / n, 1)
    out[kind] = x
  return out


# ---------------------------------------------------------------------------- the driver


def run(args, save=lambda result: None) -> dict:
  owned = not args.work_dir
  work = args.work_dir or tempfile.mkdtemp(prefix="realm-scann-scale-")
  os.makedirs(work, exist_ok=True)
  result = dict(machine=harness.machine(), blocks=args.blocks, shard_blocks=args.shard_blocks,
                scann_overrides=args.scann_overrides_dict,
                config=args.config, tower=args.tower or None, policy=POLICY, targets=TARGETS,
                requests=args.requests)
  try:
    result["corpus"] = PHASES.run(
        args, work, "corpus",
        keep=lambda corpus: args.reuse_corpus and corpus.get("blocks") == args.blocks)
    save(result)
    result["index"] = PHASES.run(args, work, "index")
    save(result)
    result["exports"] = {}
    for kind in KINDS:
      result["exports"][kind] = PHASES.run(args, work, "export", kind)
      save(result)
    result["recall"] = PHASES.run(args, work, "recall")
    save(result)
    result["memory"] = PHASES.run(args, work, "memory")
    save(result)
    result["serving"] = []
    for kind in KINDS:
      result["serving"].append(scale.serve_phase(args, work, kind, POLICY, latency=True))
      save(result)
    answers = {kind: PHASES.run(args, work, "answers", kind) for kind in KINDS}
    result["answers"] = compare_answers(answers["realm_qa"], answers["realm_qa_scann"])
    result["work_dir_bytes"] = du_bytes(work)
  finally:
    if owned:
      shutil.rmtree(work, ignore_errors=True)
  result["per_block"] = per_block(result)
  return result


def markdown(result: dict) -> str:
  n = result["blocks"]
  m = result["machine"]
  lines = [f"# ScaNN export at {n:,} blocks beside the exact export "
           "(benchmarks/scann_scale.py)", "",
           f"Measured at {n:,} blocks ({result['index']['shards'] if 'index' in result else '?'}"
           f" index shards of up to {result['shard_blocks']:,}); not a full-size run. Machine: "
           f"{m['cpu_count']} cores, load average {m['load_average_1_5_15']}, {m['when']}. "
           f"Embeddings: {result['corpus'].get('embeddings')}. Model: "
           f"{os.path.basename(result['config'])}. Hand-over policy: {result['policy']}."]
  if "index" in result:
    i = result["index"]
    lines += ["", "## Index version (as the index builder writes it)", "",
              f"{i['shards']} shards, ScaNN built shard by shard in {i['scann_build_seconds']} s "
              f"(all {i['seconds']} s), peak RSS {gib(i['peak_rss_bytes'])} GiB, "
              f"{gib(i['disk_bytes'])} GiB on disk. Shipped parameters: "
              f"`{json.dumps(i['scann_params'], sort_keys=True)}`."]
  if result.get("exports"):
    lines += ["", "## Exports (measured)", "",
              "| kind | seconds | export peak RSS GiB | disk GiB | embeddings MiB | "
              "search structure MiB | block ids MiB | shards |", "|---|" + "---:|" * 7]
    for kind, e in result["exports"].items():
      b = e["component_bytes"]
      lines.append(f"| {kind} | {e['seconds']} | {gib(e['export_peak_rss_bytes'])} | "
                   f"{gib(e['disk_bytes'])} | {b.get('embeddings', 0) / 2**20:.1f} | "
                   f"{b.get('search_structure', 0) / 2**20:.1f} | "
                   f"{b.get('block_ids', 0) / 2**20:.1f} | {e['shards']} |")
  if "recall" in result:
    r = result["recall"]
    lines += ["", f"## Recall@5 against exact search ({r['queries']} queries, per shard "
              "merged, measured)", "",
              "| configuration | recall@5 | ms per single query (search only) | searcher "
              "resident bytes per block |", "|---|---:|---:|---:|"]
    for name in ("shipped", "authors"):
      lines.append(f"| {name} | {r[name]['recall_at_5']} | {r[name]['ms_per_single_query']} | "
                   f"{r[name]['resident_bytes_per_block']} |")
    lines += ["", f"Exact search: {r['exact_ms_per_query_batched']} ms per query in batches "
              "of 100. Shipped: `" + json.dumps(r["shipped_params"], sort_keys=True) + "`; "
              "authors': `" + json.dumps(r["authors_params"], sort_keys=True) + "`."]
  if "memory" in result:
    m = result["memory"]
    served = m.get("served")  # absent from runs that measured the shard as built
    served_as = ("" if not served else "; served as realm_qa_scann serves it, " + (
        "without its reordering data" if served.get("rescore_dtype") else "as built"))
    lines += ["", f"One shipped ScaNN shard of {m['blocks']:,} seeded rows "
              f"({m['params']['mode']}, {m['params']['num_leaves']} leaves, "
              f"{m['params']['reorder_dtype']} reordering{served_as}), resident bytes per block "
              f"(measured): state variables {m['bytes_per_block']['state_rss']} "
              f"({m['bytes_per_block']['state_variables']} as stored), the searcher built "
              f"from them {m['bytes_per_block']['searcher_rss']}."]
  if result.get("serving"):
    lines += ["", "## Serving (python -m serving.server, one gRPC client, measured)", "",
              "| kind | load s | RSS after load GiB | hand-over peak GiB | p50 ms | p99 ms |",
              "|---|" + "---:|" * 5]
    for s in result["serving"]:
      lines.append(f"| {s['kind']} | {s['load_seconds']} | {gib(s['rss_after_load_bytes'])} | "
                   f"{gib(s['handover_peak_rss_bytes'])} | {s.get('p50_ms', '')} | "
                   f"{s.get('p99_ms', '')} |")
  if "answers" in result:
    a = result["answers"]
    # Runs before the export recorded its search served ScaNN's own int8-reordered scores.
    search = result.get("exports", {}).get("realm_qa_scann", {}).get("search")
    scores = ("int8-reordered scores" if not search else
              f"ScaNN's candidates re-scored from {search['rescore_dtype']} embeddings"
              if search.get("rescore_dtype") else "ScaNN's own scores")
    lines += ["", f"Answers of {a['questions']} questions, ScaNN export against exact: the "
              f"answer differs on {a['answer_differs']}, the top-5 on {a['top5_differs']}; "
              + (f"with the same top-5 the answer differs on "
                 f"{a['answer_differs_with_same_top5']} (p(z|x) within "
                 f"{a['max_abs_prob_difference_with_same_top5']}: {scores})."
                 if a["top5_differs"] < a["questions"] else
                 "no question had the same top-5 (these questions' query embeddings are "
                 "far from the seeded blocks, where the shipped tree finds few of exact's "
                 "neighbours).")]
  if result.get("per_block"):
    p = result["per_block"]
    lines += ["", "## Per block, and extrapolated linearly to 13,353,718 blocks "
              "(extrapolated, not measured)", "",
              f"Fixed part of a served process (exact RSS less its corpus variables): "
              f"{gib(p['fixed_rss_bytes'])} GiB.", "",
              "| kind | corpus bytes per block, from parts | from RSS (noisy at small N) | "
              "served GiB at 13.35M | hand-over peak GiB at 13.35M | export peak GiB at "
              "13.35M |", "|---|" + "---:|" * 5]
    for kind in KINDS:
      if kind in p:
        x = p[kind]
        lines.append(f"| {kind} | {x['from_parts_bytes_per_block']} | "
                     f"{x.get('from_rss_bytes_per_block', '')} | "
                     f"{x['served_rss_gib_extrapolated']} | "
                     f"{x['handover_peak_gib_extrapolated']} | "
                     f"{x['export_peak_gib_extrapolated']} |")
  if result.get("notes"):
    lines += ["", result["notes"]]
  return "\n".join(lines) + "\n"


# oneDNN off, as in serving.server (its arena never shrinks: RSS would mislead).
PHASES = harness.Phases("benchmarks.scann_scale", dict(
    corpus=corpus_phase, index=index_phase, export=export_phase, recall=recall_phase,
    memory=memory_phase, answers=answers_phase), env=dict(TF_ENABLE_ONEDNN_OPTS="0"), log=log)


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.phase:
    return PHASES.child(args)
  output = harness.Output(args.name, markdown)
  result = run(args, save=lambda partial: harness.write_json(
      output.json_path, dict(partial, partial=True)))
  path = output.write(result)
  print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
