"""REALM at the paper's scale, on paper: FLOPs, device memory, TPU time and Dataflow workers
from the paper's settings and what this machine measured.

    python -m benchmarks.paper_scale [--tpu_chips 64] [--tpu_chip_peak_tflops 123]
        [--num_blocks 13000000] [--worker_cores 16]

Inputs, and where each comes from:
  the paper's settings  configs/realm_paper/{bert_base,pretrain}.yaml through the project's
                        own loader (BERT-base, blocks of 288, query 96, reader 384, 128-d
                        bfloat16 embeddings, batch 512, k = 8, 200k steps, refresh every
                        500, 20 masked positions, 64 index shards)
  published             the corpus size (--num_blocks: the paper's Wikipedia is about 13M
                        blocks of 288 wordpieces), the TPU's peak (--tpu_chip_peak_tflops:
                        Google's published bfloat16 peak of a TPU v3 chip, 123 TFLOP/s,
                        two cores with 16 GiB of HBM each) and the slice (--tpu_chips: the
                        paper pre-trained on 64 TPUs)
  measured here         the utilisation of a training step (benchmarks/results/
                        train_step.json, part 'tasks': the pre-training step's model FLOPs
                        per second over the CPU's theoretical peak, XLA on) and the
                        embedding rate (benchmarks/results/embedding.json: the steady-
                        state blocks per second of beam.embed_corpus; without it mips.json,
                        'real'; turned into FLOP/s per core)
A utilisation measured on a 2-core CPU is not a TPU's: the TPU figures say what the step
would take if the TPU did as well against its peak as this CPU does against its own.
Results: benchmarks/results/paper_scale.{json,md}.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

from benchmarks import harness
from benchmarks.common import encoder_flops
from benchmarks.harness import RESULTS_DIR
from realm_tf.configs import experiments, load_config

PAPER_CONFIGS = [os.path.join(harness.REPO, "configs", "realm_paper", name)
                 for name in ("bert_base.yaml", "pretrain.yaml")]
GIB = 2.0 ** 30
# The table's order (a result's JSON keeps its keys sorted): a step's parts in the order
# they run, the index's tables as KnowledgeIndex holds them.
STEP_PARTS = ("query_tower", "document_tower", "reader", "mlm_head", "mips")
INDEX_TABLES = ("embeddings", "valid", "word_ids", "body_ids", "body_lengths",
                "block_ids (replicated)")


def _in_order(values: dict, order) -> list:
  """values' items, those named in `order` first and in that order."""
  return sorted(values.items(), key=lambda item: (
      order.index(item[0]) if item[0] in order else len(order), item[0]))


def _measured_training_utilisation() -> dict:
  """The pre-training step's FLOP/s over the CPU's peak and over the matmul limit."""
  with open(os.path.join(RESULTS_DIR, "train_step.json")) as f:
    tasks = json.load(f)["tasks"]
  row = next(r for r in tasks["rows"] if r["task"] == "pretrain" and r["xla"]
             and "failed" not in r)
  if "achieved_flops_per_second" not in row:
    raise ValueError("benchmarks/results/train_step.json has no FLOP account for its tasks: "
                     "re-run python -m benchmarks.train_step --parts tasks")
  limits = tasks["limits"]
  return dict(source="benchmarks/results/train_step.json (tasks, pretrain, XLA on, "
                     f"{tasks['machine_before']['when']})",
              achieved_flops_per_second=row["achieved_flops_per_second"],
              fraction_of_cpu_peak=row["achieved_flops_per_second"]
              / limits["cpu"]["peak_flops"],
              fraction_of_matmul_limit=row["fraction_of_matmul_limit"])


def _measured_scale(rows: int) -> dict:
  """benchmarks/results/scale.json's measurements of the trainer's index, if it has run:
  bytes per row of a real KnowledgeIndex's replica (its variables, at that benchmark's
  lengths) scaled to `rows` rows, and the time to load and swap in a version."""
  path = os.path.join(RESULTS_DIR, "scale.json")
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    scale = json.load(f)
  local = scale.get("trainer", {}).get("local", {})
  if "bytes_per_replica" not in local:
    return {}
  replica_rows = -(-local["blocks"] // local["replicas"])
  sharded = {k: v for k, v in local["bytes_per_replica"].items() if "replicated" not in k}
  swap = max(float(v["seconds"]) for v in local["swaps"].values())
  out = dict(source=f"benchmarks/results/scale.json ({scale['machine']['when']})",
             blocks=local["blocks"], replicas=local["replicas"],
             block_seq_length=scale["block_seq_length"],
             reader_seq_length=scale["reader_seq_length"],
             bytes_per_row=sum(sharded.values()) / replica_rows,
             per_core_bytes_at_paper_rows=sum(sharded.values()) / replica_rows * rows,
             swap_seconds=swap, swap_seconds_per_million_blocks=swap / local["blocks"] * 1e6)
  gcs = scale.get("trainer", {}).get("gcs", {})
  if "swaps" in gcs:
    out.update(gcs_blocks=gcs["blocks"],
               gcs_swap_seconds=max(float(v["seconds"]) for v in gcs["swaps"].values()))
  return out


def _measured_embedding_rate(demo_config) -> dict:
  """beam.embed_corpus's blocks/s as FLOP/s per core: from benchmarks/results/
  embedding.json when that benchmark has run (its steady-state rate, the pipeline's fixed
  start-up cost subtracted, measured beside a plain loop over the same export), else from
  mips.json's 'real' run (MiniLM, the demo's block length, start-up and index build
  included)."""
  path = os.path.join(RESULTS_DIR, "embedding.json")
  if os.path.exists(path):
    with open(path) as f:
      embedding = json.load(f)
    sizing, m = embedding["account"]["sizing"], embedding["machine"]
    model = sizing["measured_model"]
    return dict(source=f"benchmarks/results/embedding.json (beam.embed_corpus, "
                       f"{sizing['rate_used']}, {m['when']}, load average "
                       f"{m['load_average_1_5_15']})",
                model=f"{model['layers']}-layer {model['hidden']}-hidden",
                blocks_per_second=sizing["blocks_per_second"], cores=sizing["cores"],
                flops_per_block=model["flops_per_block"],
                flops_per_second_per_core=sizing["flops_per_second_per_core"])
  with open(os.path.join(RESULTS_DIR, "mips.json")) as f:
    mips = json.load(f)
  real = dict(mips["real"])
  # Older mips.json files record the machine once, beside the corpora.
  real.setdefault("machine", mips.get("machine"))
  e = demo_config.model.encoder
  per_block = encoder_flops(e.num_layers, e.hidden_size, e.intermediate_size, 1,
                            demo_config.model.retriever.block_seq_length, training=False)
  cores = real["machine"]["cpu_count"]
  return dict(source=f"benchmarks/results/mips.json (real: beam.embed_corpus, "
                     f"{real['machine']['when']}, load average "
                     f"{real['machine']['load_average_1_5_15']})", model="MiniLM",
              blocks_per_second=real["beam_blocks_per_second"], cores=cores,
              flops_per_block=per_block,
              flops_per_second_per_core=real["beam_blocks_per_second"] * per_block / cores)


def estimate(args) -> dict:
  c = load_config(PAPER_CONFIGS, experiment=experiments.PRETRAIN)
  demo = load_config(os.path.join(harness.REPO, "configs", "demo.yaml"))
  e, r, p = c.model.encoder, c.model.retriever, c.task.pretrain
  batch, k = p.train_data.global_batch_size, p.num_candidates
  steps, refresh = c.trainer.train_steps, p.refresh_every_steps
  n = args.num_blocks

  def bert(rows, seq, training=True):
    return encoder_flops(e.num_layers, e.hidden_size, e.intermediate_size, rows, seq,
                         training)

  # One pre-training step (as benchmarks/train_step_tasks.py counts it): query tower over
  # x, document tower over the k retrieved blocks (its gradient is REALM's), the reader over
  # k pairs, the MLM head's vocabulary projection, and the exact MIPS scores over the index.
  step = dict(query_tower=bert(batch, r.query_seq_length),
              document_tower=bert(batch * k, r.block_seq_length),
              reader=bert(batch * k, c.model.reader.seq_length),
              mlm_head=3 * 2 * e.hidden_size * e.vocab_size * batch * k
              * p.max_predictions_per_seq,
              mips=2.0 * n * r.projection_size * batch)
  step_flops = sum(step.values())
  reembed_flops = n * bert(1, r.block_seq_length, training=False)

  # Device memory of the index per shard (realm_tf.retrieval.knowledge_index: embeddings,
  # valid, word_ids, body_ids, body_lengths sharded, type ids derived; block_ids
  # replicated). Token ids are int32 on TPU (variable_token_dtype: a TPU holds no uint16).
  # Pre-training's bodies are the reader's length - 3.
  shards = c.index.num_shards
  rows = math.ceil(n / shards)
  embedding_bytes = 2 if c.index.embedding_dtype == "bfloat16" else 4
  token_bytes = np.dtype(np.int32).itemsize
  per_row = dict(embeddings=r.projection_size * embedding_bytes, valid=1,
                 word_ids=token_bytes * r.block_seq_length,
                 body_ids=token_bytes * (c.model.reader.seq_length - 3), body_lengths=4)
  memory = {name: rows * b for name, b in per_row.items()}
  memory["block_ids (replicated)"] = 8 * n
  per_core_bytes = sum(memory.values())

  training = _measured_training_utilisation()
  embedding = _measured_embedding_rate(demo)
  slice_peak = args.tpu_chips * args.tpu_chip_peak_tflops * 1e12
  utilisation = training["fraction_of_cpu_peak"]
  step_seconds = step_flops / (slice_peak * utilisation)
  # Dataflow workers so a full re-embedding takes no longer than `refresh` steps.
  per_core_bert_blocks = embedding["flops_per_second_per_core"] / bert(
      1, r.block_seq_length, training=False)
  window = refresh * step_seconds
  cores_needed = n / (per_core_bert_blocks * window)
  return dict(
      paper=dict(encoder="BERT-base", layers=e.num_layers, hidden=e.hidden_size,
                 intermediate=e.intermediate_size, batch=batch, k=k, steps=steps,
                 refresh_every_steps=refresh, query_seq=r.query_seq_length,
                 block_seq=r.block_seq_length, reader_seq=c.model.reader.seq_length,
                 masked_positions=p.max_predictions_per_seq, projection=r.projection_size,
                 embedding_dtype=c.index.embedding_dtype, index_shards=shards),
      published=dict(num_blocks=n, tpu_chips=args.tpu_chips,
                     tpu_chip_peak_flops=args.tpu_chip_peak_tflops * 1e12,
                     tpu_hbm_per_core_gib=16, dataflow_worker_cores=args.worker_cores),
      measured=dict(training=training, embedding=embedding),
      step_flops=step, step_flops_total=step_flops,
      training_flops_total=step_flops * steps, reembedding_flops=reembed_flops,
      index_memory_per_core_bytes=memory, index_memory_per_core_total_bytes=per_core_bytes,
      measured_index=_measured_scale(rows),
      tpu_step_seconds=step_seconds, tpu_training_days=step_seconds * steps / 86400,
      staleness_window_seconds=window,
      embedding_blocks_per_second_per_core_bert_base=per_core_bert_blocks,
      dataflow_cores_for_500_step_staleness=cores_needed,
      dataflow_workers_for_500_step_staleness=math.ceil(cores_needed / args.worker_cores),
      reembedding_core_hours=n / per_core_bert_blocks / 3600)


def markdown(x: dict) -> str:
  p, pub, m = x["paper"], x["published"], x["measured"]
  t, emb = m["training"], m["embedding"]
  lines = [
      "# REALM at the paper's scale, from this machine's measurements "
      "(benchmarks/paper_scale.py)", "",
      f"Paper settings (configs/realm_paper): {p['encoder']} ({p['layers']} layers, "
      f"{p['hidden']} hidden), batch {p['batch']}, k = {p['k']}, {p['steps']:,} steps, "
      f"refresh every {p['refresh_every_steps']}, query {p['query_seq']} / block "
      f"{p['block_seq']} / reader {p['reader_seq']} wordpieces, {p['masked_positions']} "
      f"masked positions, {p['projection']}-d {p['embedding_dtype']} embeddings in "
      f"{p['index_shards']} shards.",
      f"Published: {pub['num_blocks']:,} blocks; TPU v3 chip {pub['tpu_chip_peak_flops'] / 1e12:.0f} "
      f"TFLOP/s bfloat16 peak, {pub['tpu_hbm_per_core_gib']} GiB HBM per core; "
      f"{pub['tpu_chips']} chips; Dataflow workers of {pub['dataflow_worker_cores']} cores.",
      f"Measured here: training step utilisation {100 * t['fraction_of_cpu_peak']:.1f}% of the "
      f"CPU's theoretical peak ({100 * t['fraction_of_matmul_limit']:.0f}% of its measured "
      f"matmul limit), from {t['source']}; embedding {emb['flops_per_second_per_core'] / 1e9:.2f} "
      f"GFLOP/s per core ({emb['blocks_per_second']:.1f} {emb['model']} blocks/s on "
      f"{emb['cores']} cores), from {emb['source']}.", "",
      "| quantity | value |", "|---|---:|"]
  for name, flops in _in_order(x["step_flops"], STEP_PARTS):
    lines.append(f"| FLOPs per step: {name.replace('_', ' ')} | {flops / 1e12:.1f} TFLOP |")
  lines += [
      f"| FLOPs per step, total | {x['step_flops_total'] / 1e12:.1f} TFLOP |",
      f"| FLOPs of {p['steps']:,} steps | {x['training_flops_total'] / 1e18:.0f} EFLOP |",
      f"| FLOPs of one re-embedding of the corpus | {x['reembedding_flops'] / 1e15:.0f} PFLOP |"]
  for name, b in _in_order(x["index_memory_per_core_bytes"], INDEX_TABLES):
    lines.append(f"| index memory per core: {name} | {b / GIB:.3f} GiB |")
  lines += [
      f"| index memory per core, total | {x['index_memory_per_core_total_bytes'] / GIB:.2f} GiB "
      f"of {pub['tpu_hbm_per_core_gib']} |"]
  measured = x.get("measured_index") or {}
  if measured:
    lines += [
        f"| index memory per core, total, measured layout: a KnowledgeIndex replica's "
        f"variables at {measured['blocks']:,} blocks over {measured['replicas']} replicas "
        f"(block {measured['block_seq_length']}, reader {measured['reader_seq_length']}, "
        f"float32), {measured['bytes_per_row']:,.0f} bytes per row, times this shard's rows "
        f"| {measured['per_core_bytes_at_paper_rows'] / GIB:.2f} GiB |",
        f"| index hand-over (load and swap a version), measured at {measured['blocks']:,} "
        f"blocks on 2 replicas, local disk | {measured['swap_seconds']:.1f} s "
        f"({measured['swap_seconds_per_million_blocks']:.1f} s per million blocks) |"]
    if "gcs_swap_seconds" in measured:
      lines.append(f"| index hand-over from the gs:// emulator, measured at "
                   f"{measured['gcs_blocks']:,} blocks | {measured['gcs_swap_seconds']:.1f} s |")
  lines += [
      f"| step time on {pub['tpu_chips']} TPU v3 chips at the measured utilisation | "
      f"{x['tpu_step_seconds']:.2f} s |",
      f"| {p['steps']:,} steps | {x['tpu_training_days']:.1f} days |",
      f"| {p['refresh_every_steps']} steps (the staleness bound) | "
      f"{x['staleness_window_seconds'] / 60:.1f} min |",
      f"| BERT-base blocks/s per CPU core (measured FLOP/s per core) | "
      f"{x['embedding_blocks_per_second_per_core_bert_base']:.2f} |",
      f"| one re-embedding, CPU core-hours | {x['reembedding_core_hours']:,.0f} |",
      f"| Dataflow cores for a re-embedding within {p['refresh_every_steps']} steps | "
      f"{x['dataflow_cores_for_500_step_staleness']:,.0f} |",
      f"| Dataflow workers of {pub['dataflow_worker_cores']} cores | "
      f"{x['dataflow_workers_for_500_step_staleness']:,} |", "",
      "The index tables are dominated by the token tables (word and body ids, int32 on a "
      "TPU, which holds no uint16; type ids are derived), not the embeddings. Measured rows come from "
      f"{measured.get('source', 'benchmarks/scale.py, once it has run')}. The CPU utilisation is carried over to the TPU as a fraction "
      "of peak; a TPU's matrix units typically reach a higher fraction, so the TPU times "
      "are an upper bound in that respect. The paper ran its index builder on 16 TPUs, "
      "not CPUs: the Dataflow row is what the same refresh rate costs on CPU workers."]
  return "\n".join(lines) + "\n"


def parse_args(argv):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--num_blocks", type=int, default=13_000_000)
  parser.add_argument("--tpu_chips", type=int, default=64)
  parser.add_argument("--tpu_chip_peak_tflops", type=float, default=123.0)
  parser.add_argument("--worker_cores", type=int, default=16)
  return parser.parse_args(argv)


def main(argv=None) -> int:
  result = estimate(parse_args(sys.argv[1:] if argv is None else argv))
  path = harness.Output("paper_scale", markdown).write(result)
  print(markdown(result))
  print(path)
  return 0


if __name__ == "__main__":
  sys.exit(main())
