"""Embedding benchmark: `beam.embed_corpus` (DirectRunner) against a plain tf.function loop
over the same block-encoder SavedModel and the same blocks, in one process and run; the
FLOP account of both; and the Dataflow sizing that follows for a 13M-block corpus.

    python -m benchmarks.embedding [--articles 1600] [--min_blocks 2000] [--batch_size 64]
        [--config configs/demo.yaml] [--articles_file FILE | --blocks DIR]
        [--small_blocks 64] [--num_blocks 13000000] [--worker_cores 16] [--workers 100]
        [--hours 1] [--work_dir DIR] [--name embedding]

Why: REALM re-embeds its whole corpus every few hundred training steps, and the index
builder does it with this pipeline (ReadBlocks, then RunInference over the block encoder,
then the index shards). What that costs decides how many workers keep an index fresh, so
the pipeline's rate has to be known, and known to be the model's rate rather than Beam's
overhead (record parsing, batching, RunInference's bookkeeping, grouping and writing the
shards). The reference is the least any program can do with the same export: load the
SavedModel, read the same block TFRecords and call its signature on batches of the same
size (target: the pipeline at least 0.9x that loop's blocks/s). Both are also put against
the machine's own limit: their FLOP/s (the block tower's matmuls at its padded length,
benchmarks.common.encoder_flops) over the TensorFlow matmul FLOP/s measured in the same
run, at its start and at its end (the better of the two is the limit: on a shared machine
a single measurement can land on a busy moment).

What is measured, in order, all on the same blocks (the first --articles articles of
--articles_file through the corpus pipeline, or an existing corpus with --blocks) and the
same export (configs/demo.yaml: MiniLM-L6 warm start, blocks of 128 wordpieces):
  beam, cold   embed_corpus over the first --small_blocks blocks: the first pipeline of the
               process (imports and first-use costs of Beam and TensorFlow land here);
  beam, full   embed_corpus over all blocks (embeddings only, no ScaNN), timed end to end;
  beam, small  the small run again, now warm. A DirectRunner pipeline has a fixed cost
               (construction, runner start-up, RunInference loading the model, shard
               writes and the commit): with t = fixed + n / rate, the two warm runs give
               the steady-state rate (n_full - n_small) / (t_full - t_small) and the fixed
               cost. On Dataflow the fixed cost is paid once per worker and vanishes into
               13M blocks, so the steady-state rate is the one the sizing uses;
  plain        tf.saved_model.load of the same export (timed), the blocks read from the
               same TFRecords into memory (timed: BlockStore, as the trainer reads them),
               one warm-up call, then every batch through the signature in a tf.function
               (timed); its embeddings are compared with the pipeline's, block by block.
The target compares like with like: the pipeline's steady-state rate (it reads and parses
each record as it goes) against the plain loop with its reading included; the whole-run
ratio (each side with its start-up) is reported beside it.

Dataflow sizing: per-core rate = steady-state blocks/s / the cores this process may use
(TensorFlow's intra-op pool spans them all, so the one process uses every core; on
Dataflow each core is assumed to do as well). From it: core-hours for one re-embedding of
--num_blocks blocks, hours on --workers workers of --worker_cores vCPUs, workers for a
re-embedding in --hours; for the model measured and for BERT-base at 288 wordpieces
(configs/realm_paper), scaled by FLOPs per block at the same FLOP/s per core.
Results: benchmarks/results/<name>.json and .md.
"""
import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import tensorflow as tf

from benchmarks import common, harness, serving
from benchmarks.paper_scale import PAPER_CONFIGS
from realm_tf.configs import experiments, load_config
from realm_tf.corpus import published
from realm_tf.data.block_store import BlockStore
from realm_tf.data.files import files
from realm_tf.modeling import factory
from realm_tf.pipelines.corpus_blocks import prepare_blocks
from realm_tf.pipelines.embed import EmbedConfig, embed_corpus
from realm_tf.retrieval import load_searcher
from realm_tf.retrieval.encoders import BlockEncoder, export_encoder
from realm_tf.text import Tokenizer

TARGET_RATIO = 0.9  # the pipeline's blocks/s over the plain loop's


def parse_args(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks.embedding", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default=os.path.join(harness.REPO, "configs", "demo.yaml"),
                      help="the block encoder's model and block length")
  parser.add_argument("--articles_file", default=os.path.join(
      harness.SHARED_DATA, "wikipedia", "vital_articles.jsonl"),
                      help="{title, text} JSON lines; the first --articles are taken")
  parser.add_argument("--blocks", default="",
                      help="an existing corpus (beam.preprocess output dir or blocks file "
                           "pattern) instead of --articles_file")
  parser.add_argument("--articles", type=int, default=1600)
  parser.add_argument("--min_blocks", type=int, default=2000)
  parser.add_argument("--batch_size", type=int, default=EmbedConfig.batch_size,
                      help="blocks per encoder call, both paths (the pipeline's default)")
  parser.add_argument("--small_blocks", type=int, default=64,
                      help="blocks of the small runs that measure Beam's fixed cost")
  parser.add_argument("--num_blocks", type=int, default=13_000_000,
                      help="corpus size the Dataflow sizing is for (the paper's Wikipedia)")
  parser.add_argument("--worker_cores", type=int, default=16, help="vCPUs per Dataflow worker")
  parser.add_argument("--workers", type=int, default=100)
  parser.add_argument("--hours", type=float, default=1.0)
  parser.add_argument("--matmul_n", type=int, default=1024, help="compute_limits' matrix size")
  parser.add_argument("--work_dir", default="", help="default: a temporary directory")
  parser.add_argument("--name", default="embedding", help="results file name")
  args = parser.parse_args(argv)
  if args.small_blocks < 1:
    parser.error("--small_blocks must be positive")
  return args


# --- the two paths ----------------------------------------------------------------------

def write_subset(pattern: str, num: int, directory: str) -> str:
  """The first `num` records of the block files (as stored, not re-serialised) published
  as one blocks file in `directory`; returns `directory`."""
  records = (r.numpy() for r in tf.data.TFRecordDataset(files(pattern)).take(num))
  published.publish_records(directory, dict(blocks=(records, None)),
                            dict(kind="benchmark_subset", source=pattern), overwrite=True)
  return directory


def run_pipeline(blocks: str, encoder: str, output_dir: str, batch_size: int,
                 num_shards: int) -> dict:
  """embed_corpus (DirectRunner, embeddings only), timed end to end."""
  start = time.perf_counter()
  path = embed_corpus(EmbedConfig(blocks=blocks, encoder=encoder, output_dir=output_dir,
                                  num_shards=num_shards, batch_size=batch_size,
                                  build_scann=False), ["--runner", "DirectRunner"])
  seconds = time.perf_counter() - start
  searcher = load_searcher(path, backend="exact")
  ids = np.concatenate([s.block_ids.numpy() for s in searcher.shards])
  vectors = np.concatenate([s.embeddings.numpy() for s in searcher.shards])  # [n, P]
  order = np.argsort(ids, kind="stable")
  return dict(seconds=seconds, blocks=int(len(ids)), block_ids=ids[order],
              embeddings=vectors[order].astype(np.float32), path=path)


def run_plain(blocks: str, encoder: str, batch_size: int) -> dict:
  """The same export's signature in a tf.function over the same blocks, batch by batch."""
  start = time.perf_counter()
  loaded = tf.saved_model.load(encoder)
  signature = loaded.signatures["serving_default"]
  embed = tf.function(lambda title, text: signature(title=title, text=text)["embeddings"],
                      input_signature=[tf.TensorSpec([None], tf.string)] * 2)
  load_seconds = time.perf_counter() - start

  start = time.perf_counter()
  store = BlockStore.from_tfrecords(blocks)  # sorted by block id; titles, texts as bytes
  titles, texts = list(store.titles), list(store.texts)
  read_seconds = time.perf_counter() - start

  start = time.perf_counter()
  embed(tf.constant(titles[:batch_size]), tf.constant(texts[:batch_size])).numpy()
  first_call_seconds = time.perf_counter() - start

  parts = []
  start = time.perf_counter()
  for i in range(0, len(store), batch_size):
    parts.append(embed(tf.constant(titles[i:i + batch_size]),  # [B] strings each
                       tf.constant(texts[i:i + batch_size])).numpy())  # → [B, P]
  loop_seconds = time.perf_counter() - start
  return dict(blocks=len(store), block_ids=store.block_ids, embeddings=np.concatenate(parts),
              load_seconds=load_seconds, read_seconds=read_seconds,
              first_call_seconds=first_call_seconds, loop_seconds=loop_seconds)


# --- arithmetic -------------------------------------------------------------------------

def steady_state(n_small: int, t_small: float, n_full: int, t_full: float) -> dict:
  """t = fixed + n / rate through two runs of one pipeline: the rate without the fixed
  cost, and the fixed cost. None where the runs cannot separate them (the larger run not
  slower: noise larger than the work between them)."""
  if n_full <= n_small or t_full <= t_small:
    return dict(blocks_per_second=None, fixed_seconds=None)
  rate = (n_full - n_small) / (t_full - t_small)
  return dict(blocks_per_second=rate, fixed_seconds=t_small - n_small / rate)


def dataflow_sizing(num_blocks: int, blocks_per_second_per_core: float, worker_cores: int,
                    workers: int, hours: float) -> dict:
  """One re-embedding of `num_blocks` at a per-core rate: core-hours, the hours `workers`
  workers of `worker_cores` cores take, and the workers that finish within `hours`
  (rounded up). Start-up, shuffles and stragglers are not counted."""
  core_hours = num_blocks / blocks_per_second_per_core / 3600.0
  worker_hours = core_hours / worker_cores
  return dict(num_blocks=num_blocks, blocks_per_second_per_core=blocks_per_second_per_core,
              worker_cores=worker_cores, core_hours=core_hours, worker_hours=worker_hours,
              workers=workers, hours_with_workers=worker_hours / workers,
              hours=hours, workers_for_hours=math.ceil(worker_hours / hours - 1e-9))


def block_flops(encoder_config, block_seq_length: int) -> float:
  """The block tower's matmuls over one block padded to its length (forward only)."""
  e = encoder_config
  return common.encoder_flops(e.num_layers, e.hidden_size, e.intermediate_size, 1,
                              block_seq_length, training=False)


def _rate_row(name: str, blocks: int, seconds, flops_per_block: float,
              limit: float) -> dict:
  rate = blocks / seconds if seconds else None
  return dict(name=name, blocks=blocks, seconds=seconds, blocks_per_second=rate,
              flops_per_second=rate * flops_per_block if rate else None,
              fraction_of_matmul_limit=rate * flops_per_block / limit if rate else None)


def account(config, beam_runs: dict, plain: dict, limits: dict, args, cores: int) -> dict:
  """Rates, ratios, FLOP account and the Dataflow sizing from the raw timings."""
  retriever = config.model.retriever
  per_block = block_flops(config.model.encoder, retriever.block_seq_length)
  limit = max(limits["start"]["matmul"]["flops_per_second"],
              limits["end"]["matmul"]["flops_per_second"])
  cold, full, small = beam_runs["cold"], beam_runs["full"], beam_runs["small"]
  steady = steady_state(small["blocks"], small["seconds"], full["blocks"], full["seconds"])
  n, p = plain["blocks"], plain
  seconds = dict(
      beam_cold=cold["seconds"], beam_whole=full["seconds"], beam_small=small["seconds"],
      beam_steady=((full["blocks"] - small["blocks"]) / steady["blocks_per_second"]
                   if steady["blocks_per_second"] else None),
      plain_whole=(p["load_seconds"] + p["read_seconds"] + p["first_call_seconds"]
                   + p["loop_seconds"]),
      plain_read=p["read_seconds"] + p["loop_seconds"], plain_loop=p["loop_seconds"])
  blocks = dict(beam_cold=cold["blocks"], beam_whole=full["blocks"],
                beam_small=small["blocks"], beam_steady=full["blocks"] - small["blocks"],
                plain_whole=n, plain_read=n, plain_loop=n)
  names = dict(beam_cold="beam, cold (first pipeline of the process)",
               beam_whole="beam, full run, whole", beam_small="beam, small run, warm",
               beam_steady="beam, steady state (full - small: fixed cost subtracted)",
               plain_whole="plain, whole (load + read + first call + loop)",
               plain_read="plain, read + loop", plain_loop="plain, loop only (blocks in memory)")
  rows = {k: _rate_row(names[k], blocks[k], seconds[k], per_block, limit) for k in names}
  rate = {k: r["blocks_per_second"] for k, r in rows.items()}
  beam_steady = rate["beam_steady"]
  ratios = dict(
      steady_over_plain_read=beam_steady / rate["plain_read"] if beam_steady else None,
      whole_over_plain_whole=rate["beam_whole"] / rate["plain_whole"],
      steady_over_plain_loop_only=beam_steady / rate["plain_loop"] if beam_steady else None)
  judged = "steady_over_plain_read" if beam_steady else "whole_over_plain_whole"
  target = dict(ratio=TARGET_RATIO, judged_on=judged, value=ratios[judged],
                met=bool(ratios[judged] >= TARGET_RATIO))

  # The sizing uses the steady-state rate (the whole run's when the runs could not
  # separate the fixed cost: say so).
  used = beam_steady or rate["beam_whole"]
  per_core = used / cores
  paper = load_config(PAPER_CONFIGS, experiment=experiments.PRETRAIN)
  bert_seq = paper.model.retriever.block_seq_length
  bert_per_block = block_flops(paper.model.encoder, bert_seq)
  sizing_args = (args.worker_cores, args.workers, args.hours)
  e = config.model.encoder
  sizing = dict(
      rate_used="beam steady state" if beam_steady else "beam whole run (steady state "
                "not separable)",
      cores=cores, blocks_per_second=used, blocks_per_second_per_core=per_core,
      flops_per_second_per_core=per_core * per_block,
      assumption=f"the benchmark process used all {cores} cores it may run on (TensorFlow's "
                 "intra-op pool spans them); a Dataflow vCPU embeds as fast as one of them",
      measured_model=dict(
          model=f"{os.path.basename(args.config)}: {e.num_layers} layers, {e.hidden_size} "
                f"hidden, blocks of {retriever.block_seq_length}",
          layers=e.num_layers, hidden=e.hidden_size,
          block_seq_length=retriever.block_seq_length, flops_per_block=per_block,
          **dataflow_sizing(args.num_blocks, per_core, *sizing_args)),
      bert_base=dict(
          model=f"BERT-base (configs/realm_paper): {paper.model.encoder.num_layers} layers, "
                f"{paper.model.encoder.hidden_size} hidden, blocks of {bert_seq}",
          flops_per_block=bert_per_block,
          scaling="per-core blocks/s x FLOPs per measured block / FLOPs per BERT-base "
                  "block: assumes the same FLOP/s per core",
          **dataflow_sizing(args.num_blocks, per_core * per_block / bert_per_block,
                            *sizing_args)))

  diff = float(np.max(np.abs(full["embeddings"] - plain["embeddings"])))
  scale = float(np.max(np.abs(plain["embeddings"])))
  projection = (0 if retriever.projection == "none"
                else 2 * e.hidden_size * retriever.projection_size)
  return dict(
      rows=list(rows.values()), steady_state=steady, ratios=ratios, target=target,
      flops=dict(per_block=per_block, block_seq_length=retriever.block_seq_length,
                 counted="the encoder's matmuls (benchmarks.common.encoder_flops, "
                         "training=False) at the padded block length",
                 not_counted_per_block=dict(pooling=retriever.block_seq_length * e.hidden_size,
                                            projection=projection),
                 not_counted_fraction=(retriever.block_seq_length * e.hidden_size
                                       + projection) / per_block,
                 note="pooling and projection are negligible next to the encoder; the "
                      "in-graph tokenisation costs time but no FLOPs, in both paths alike"),
      matmul_limit=dict(flops_per_second=limit, used="the better of the start and end "
                        "measurements", start=limits["start"]["matmul"]["flops_per_second"],
                        end=limits["end"]["matmul"]["flops_per_second"]),
      embeddings_agree=dict(max_abs_diff=diff, max_abs_value=scale,
                            same_block_ids=bool(np.array_equal(full["block_ids"],
                                                               plain["block_ids"]))),
      sizing=sizing)


# --- report -----------------------------------------------------------------------------

def _num(value, fmt: str) -> str:
  return "-" if value is None else format(value, fmt)


def markdown(result: dict) -> str:
  m, a = result["machine"], result["account"]
  lim = a["matmul_limit"]
  t = a["target"]
  lines = [
      "# Embedding benchmark (benchmarks/embedding.py)", "",
      f"Machine: {m['cpu_count']} CPUs ({result['limits']['start']['cpu']['model']}), TF "
      f"{m['tensorflow']}, {m['when']}; load average before {m['load_average_1_5_15']}, "
      f"after {result['machine_after']['load_average_1_5_15']}. Corpus: {result['corpus']}, "
      f"{result['num_blocks']:,} blocks; encoder {result['encoder']}; batches of "
      f"{result['batch_size']}; DirectRunner, embeddings only (no ScaNN), "
      f"{result['num_shards']} shards.", "",
      f"FLOPs per block: {a['flops']['per_block'] / 1e9:.3f} GFLOP (the encoder's matmuls at "
      f"the padded length {a['flops']['block_seq_length']}; pooling and projection "
      f"{100 * a['flops']['not_counted_fraction']:.3f}% more, not counted). TensorFlow "
      f"matmul limit {lim['flops_per_second'] / 1e9:.1f} GFLOP/s, the better of "
      f"{lim['start'] / 1e9:.1f} (start) and {lim['end'] / 1e9:.1f} (end); CPU theoretical "
      f"peak {result['limits']['start']['cpu']['peak_flops'] / 1e9:.1f} GFLOP/s.", "",
      "| path | blocks | seconds | blocks/s | GFLOP/s | x matmul limit |",
      "|---|---:|---:|---:|---:|---:|"]
  for r in a["rows"]:
    flops = r["flops_per_second"] / 1e9 if r["flops_per_second"] else None
    lines.append(f"| {r['name']} | {r['blocks']:,} | {_num(r['seconds'], '.2f')} | "
                 f"{_num(r['blocks_per_second'], '.2f')} | {_num(flops, '.1f')} | "
                 f"{_num(r['fraction_of_matmul_limit'], '.2f')} |")
  s, ratios = a["steady_state"], a["ratios"]
  p = result["plain"]
  lines += [
      "", f"Beam's fixed cost per run (from the two warm runs): "
      f"{_num(s['fixed_seconds'], '.1f')} s. The plain loop's model load "
      f"{p['load_seconds']:.1f} s, reading {p['read_seconds']:.2f} s, first call "
      f"{p['first_call_seconds']:.2f} s.", "",
      "| ratio (beam / plain) | value |", "|---|---:|",
      f"| steady state / plain read + loop (the target's) | "
      f"{_num(ratios['steady_over_plain_read'], '.3f')} |",
      f"| whole run / plain whole | {ratios['whole_over_plain_whole']:.3f} |",
      f"| steady state / plain loop only | "
      f"{_num(ratios['steady_over_plain_loop_only'], '.3f')} |", "",
      f"Target: beam / plain >= {t['ratio']} ({t['judged_on'].replace('_', ' ')}): "
      f"{t['value']:.3f}, **{'met' if t['met'] else 'MISSED'}**.", "",
      f"Embeddings of the two paths: max |difference| {a['embeddings_agree']['max_abs_diff']:.2e}"
      f" (values up to {a['embeddings_agree']['max_abs_value']:.2f}); same block ids: "
      f"{a['embeddings_agree']['same_block_ids']}.", ""]
  z = a["sizing"]
  lines += [
      f"## Dataflow sizing for {z['measured_model']['num_blocks']:,} blocks", "",
      f"From the {z['rate_used']} rate, {z['blocks_per_second']:.2f} blocks/s on {z['cores']} "
      f"cores = {z['blocks_per_second_per_core']:.2f} blocks/s per core "
      f"({z['flops_per_second_per_core'] / 1e9:.1f} GFLOP/s per core). Assumed: "
      f"{z['assumption']}. Start-up, shuffles and stragglers not counted.", "",
      f"| model | GFLOP/block | blocks/s per core | core-hours | hours on "
      f"{z['measured_model']['workers']} workers of {z['measured_model']['worker_cores']} | "
      f"workers for {z['measured_model']['hours']:g} h |", "|---|---:|---:|---:|---:|---:|"]
  for key in ("measured_model", "bert_base"):
    x = z[key]
    lines.append(f"| {x['model']} | {x['flops_per_block'] / 1e9:.3f} | "
                 f"{x['blocks_per_second_per_core']:.3f} | {x['core_hours']:,.0f} | "
                 f"{x['hours_with_workers']:.2f} | {x['workers_for_hours']:,} |")
  lines += ["", f"BERT-base: {z['bert_base']['scaling']}.", ""]
  return "\n".join(lines)


# --- main -------------------------------------------------------------------------------

def run(args) -> dict:
  """Both paths over the same blocks and export, and the account of them."""
  machine = harness.machine()
  limits = dict(start=common.compute_limits(args.matmul_n))
  work = args.work_dir or tempfile.mkdtemp(prefix="embedding_bench_")
  os.makedirs(work, exist_ok=True)
  config = load_config(args.config)
  seq = config.model.retriever.block_seq_length
  timings = {}
  try:
    start = time.perf_counter()
    if args.blocks:
      blocks = prepare_blocks(args.blocks, os.path.join(work, "corpus"), seq)
      corpus = args.blocks
    else:
      blocks = serving.prepare_corpus(work, args.articles, seq, source=args.articles_file)
      corpus = f"the first {args.articles} articles of {args.articles_file}"
    timings["corpus_s"] = time.perf_counter() - start
    num_blocks = sum(1 for _ in tf.data.TFRecordDataset(files(blocks)))
    if not args.blocks and num_blocks < args.min_blocks:
      raise SystemExit(f"{num_blocks} blocks from {args.articles} articles; raise "
                       f"--articles to reach --min_blocks {args.min_blocks}")
    if args.small_blocks >= num_blocks:
      raise SystemExit(f"--small_blocks {args.small_blocks} must be below the corpus's "
                       f"{num_blocks} blocks")
    # A reused --work_dir keeps its corpus; the export and indexes are made afresh.
    for name in ("small", "export", "index_cold", "index_full", "index_small"):
      shutil.rmtree(os.path.join(work, name), ignore_errors=True)
    small_blocks = write_subset(blocks, args.small_blocks, os.path.join(work, "small"))

    start = time.perf_counter()
    retriever = factory.build_retriever(config)
    encoder = export_encoder(
        BlockEncoder(retriever.document_embedder, Tokenizer(), seq),
        os.path.join(work, "export", "block_encoder"), step=0,
        extra=dict(config=config.model.retriever.as_dict()))
    timings["export_s"] = time.perf_counter() - start

    shards = config.index.num_shards
    beam_runs = {}
    for key, source in (("cold", small_blocks), ("full", blocks), ("small", small_blocks)):
      beam_runs[key] = run_pipeline(source, encoder, os.path.join(work, f"index_{key}"),
                                    args.batch_size, shards)
      print(json.dumps({f"beam {key}": dict(blocks=beam_runs[key]["blocks"],
                                            seconds=round(beam_runs[key]["seconds"], 2))}),
            flush=True)
    if beam_runs["full"]["blocks"] != num_blocks:
      raise RuntimeError(f"the pipeline embedded {beam_runs['full']['blocks']} of "
                         f"{num_blocks} blocks")
    plain = run_plain(blocks, encoder, args.batch_size)
    print(json.dumps({"plain": {k: round(v, 2) for k, v in plain.items()
                                if k.endswith("seconds")}}), flush=True)
    limits["end"] = common.compute_limits(args.matmul_n)
    after = harness.machine()
    cores = limits["start"]["cpu"]["cores"]
    result = dict(
        machine=machine, machine_after=after, args=vars(args), corpus=corpus,
        num_blocks=num_blocks, batch_size=args.batch_size, num_shards=shards,
        encoder=f"BlockEncoder export of {os.path.relpath(args.config, harness.REPO)} (block "
                f"length {seq}, step 0: warm start only, the weights do not change the cost)",
        pipeline=dict(runner="DirectRunner", batch_size=args.batch_size, num_shards=shards,
                      build_scann=False, small_blocks=args.small_blocks),
        threads=dict(cores=cores,
                     intra_op=tf.config.threading.get_intra_op_parallelism_threads(),
                     inter_op=tf.config.threading.get_inter_op_parallelism_threads(),
                     note="0 = TensorFlow's default, one thread per core"),
        limits=limits, timings=timings,
        beam={k: dict(blocks=v["blocks"], seconds=v["seconds"]) for k, v in beam_runs.items()},
        plain={k: v for k, v in plain.items() if k not in ("block_ids", "embeddings")},
        account=account(config, beam_runs, plain, limits, args, cores))
  finally:
    if not args.work_dir:
      shutil.rmtree(work, ignore_errors=True)
  return result


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  result = run(args)
  path = harness.Output(args.name, markdown).write(result)
  a = result["account"]
  print(json.dumps(dict(ratios=a["ratios"], target=a["target"],
                        embeddings_agree=a["embeddings_agree"]), indent=2))
  print(path)
  return 0


if __name__ == "__main__":
  sys.exit(main())
