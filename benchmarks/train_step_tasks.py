"""The `tasks` part of benchmarks/train_step.py: where a training step's time goes.

For each task (ict, pretrain, openqa) at configs/demo.yaml's sizes (MiniLM-L6 shapes,
random weights: timing does not depend on them), on one fixed batch (the input pipeline is
not timed) over a knowledge corpus of --num_blocks real Wikipedia blocks:
  step          the task's whole train step (forward, loss, backward, optimizer update)
  fwd+bwd       the task's compiled forward + loss + backward (no optimizer update)
  encoders      the same-size plain tf-models BertEncoderV2 forward + backward of every
                tower the step runs (query [B, Lq]; documents [B*K, Lc]; reader
                [B*K, Lr]), measured in the same run with the same XLA setting
  retrieval     the step's index work alone: sharded exact MIPS with trivial-block
                exclusion + gathering the winners' tokens and embeddings
The rest of fwd+bwd (heads: MLM over the vocabulary, span scorer, projections; packing the
reader inputs; losses) is reported as `heads, packing, losses`. Target: retrieval,
gathers and losses at most 15% of the step.
"""
import json
import os
import statistics
import tempfile
import time

import numpy as np
import tensorflow as tf

from benchmarks.common import compute_limits, encoder_flops
from benchmarks.harness import REPO, SHARED_DATA, machine
from realm_tf import tasks
from realm_tf.configs import load_config
from realm_tf.corpus import published, schema
from realm_tf.modeling.networks import build_encoder

TASK_TARGET = 0.15


def _median_seconds(fn, repeats: int, warmup: int = 2) -> float:
  for _ in range(warmup):
    tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, fn())
  seconds = []
  for _ in range(repeats):
    start = time.perf_counter()
    tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, fn())
    seconds.append(time.perf_counter() - start)
  return statistics.median(seconds)


def write_inputs(directory: str, num_blocks: int) -> dict:
  """Blocks of real Wikipedia leads (about 100 words each) plus pre-training examples, ICT
  examples and questions derived from them, in the corpus pipeline's record schemas."""
  blocks, pretraining, ict, questions = [], [], [], []
  with open(os.path.join(SHARED_DATA, "wikipedia", "vital_articles.jsonl")) as f:
    for line in f:
      article = json.loads(line)
      words = article["text"].split()
      for start in range(0, len(words), 100):
        if len(blocks) >= num_blocks:
          break
        text = " ".join(words[start:start + 100])
        block_id = len(blocks) + 1
        uid = f"{article['title']}#{start}"
        blocks.append(dict(block_id=block_id, doc_uid=uid, title=article["title"], text=text))
        sentence = " ".join(words[start:start + 30])
        span = sentence.encode()[:len(words[start].encode())]
        pretraining.append(dict(text=sentence, block_id=block_id, doc_uid=uid,
                                salient_span_starts=[0], salient_span_ends=[len(span)],
                                salient_span_labels=["MISC"]))
        ict.append(dict(query=sentence, query_removed=1, block_id=block_id, doc_uid=uid,
                        title=article["title"], text=" ".join(words[start + 30:start + 100])))
        questions.append(dict(question=f"what is {article['title']}?",
                              answer=[words[start + 1] if len(words) > start + 1 else "x"]))
      if len(blocks) >= num_blocks:
        break
  published.publish_records(
      directory, dict(blocks=(blocks, schema.BLOCK),
                      pretraining=(pretraining, schema.PRETRAINING), ict=(ict, schema.ICT)),
      dict(kind="benchmark_corpus"),
      texts={"questions.jsonl": "".join(json.dumps(q) + "\n" for q in questions)},
      overwrite=True)
  return dict(blocks=len(blocks))


def _encoder_work(config, shapes: list[list[int]], jit: bool):
  """A function running fwd+bwd of one plain BertEncoderV2 per shape [N, L]."""
  encoders = [build_encoder(config.model.encoder, name=f"plain_encoder_{i}")
              for i in range(len(shapes))]
  inputs = [dict(input_word_ids=tf.ones(s, tf.int32), input_mask=tf.ones(s, tf.int32),
                 input_type_ids=tf.zeros(s, tf.int32)) for s in shapes]
  variables = [v for e in encoders for v in e.trainable_variables]

  @tf.function(jit_compile=jit)
  def work():
    with tf.GradientTape() as tape:
      total = 0.0
      for encoder, x in zip(encoders, inputs):
        out = encoder(x, training=True)
        total += tf.reduce_sum(out["sequence_output"]) + tf.reduce_sum(out["pooled_output"])
    grads = tape.gradient(total, variables)
    return total, [g for g in grads if g is not None]

  return work


def time_task(task_type: str, data_dir: str, args, jit: bool) -> dict:
  """One row of the table; an out-of-memory failure is recorded as such, not hidden."""
  try:
    return _time_task(task_type, data_dir, args, jit)
  except tf.errors.ResourceExhaustedError as e:
    return dict(task=task_type, xla=jit, failed=f"out of memory: {str(e).splitlines()[0]}")


def _time_task(task_type: str, data_dir: str, args, jit: bool) -> dict:
  overrides = [f"task.type={task_type}", "model.warm_start.source=",
               f"index.blocks={data_dir}", f"runtime.enable_xla={str(jit).lower()}",
               f"task.ict.train_data.input_path={data_dir}/ict-*",
               f"task.pretrain.train_data.input_path={data_dir}/pretraining-*",
               f"task.openqa.train_data.input_path={data_dir}/questions.jsonl",
               "task.openqa.max_answers=1"]
  if task_type == "pretrain" and args.pretrain_batch:
    overrides.append(f"task.pretrain.train_data.global_batch_size={args.pretrain_batch}")
  config = load_config(os.path.join(REPO, "configs", "demo.yaml"), overrides)
  task = tasks.get_task(config)
  model = task.build_model()
  optimizer = task.create_task_optimizer()
  index = None
  if hasattr(task, "build_index"):  # ICT's build_index gives None: it searches no index
    index = task.build_index(tf.distribute.get_strategy())
  if index is not None:
    rng = np.random.default_rng(0)
    index.set_embeddings(rng.normal(size=[index.num_blocks, index.dimension]), version=0)
  data = config.task_config.train_data
  features = next(iter(task.build_inputs(data)))
  metrics = task.build_metrics()
  batch = data.global_batch_size
  m = config.model
  step = tf.function(lambda: task.train_step(features, model, optimizer, metrics)["loss"])
  step_seconds = _median_seconds(step, args.task_steps)
  forward = (lambda f, t: task.forward(model, f, t))
  fb_fn = task._compiled.get("forward_backward")  # pylint: disable=protected-access
  variables = model.trainable_variables

  def forward_backward(f):
    with tf.GradientTape() as tape:
      loss, _ = forward(f, True)
    return loss, [g for g in tape.gradient(loss, variables) if g is not None]

  fb_fn = fb_fn or tf.function(forward_backward)
  fb_seconds = _median_seconds(lambda: fb_fn(features)[0], args.task_steps)

  if task_type == "ict":
    shapes = [[batch, m.retriever.query_seq_length], [batch, m.retriever.block_seq_length]]
    retrieval_seconds = 0.0
    k = 0
  else:
    if task_type == "pretrain":
      k = config.task.pretrain.num_candidates
      shapes = [[batch, m.retriever.query_seq_length], [batch * k, m.retriever.block_seq_length],
                [batch * k, m.reader.seq_length]]
      searched, exclude = task.num_retrieved, features["block_id"]
    else:
      o = config.task.openqa
      k = o.num_candidates
      shapes = [[batch, o.query_seq_length], [batch * k, o.reader_seq_length]]
      searched, exclude = task.num_retrieved(True), None
    queries = tf.constant(np.random.default_rng(1).normal(
        size=[batch, m.retriever.projection_size]).astype(np.float32))

    @tf.function(jit_compile=jit)
    def retrieval():
      found = index.search(queries, searched, exclude_block_ids=exclude)
      blocks = index.gather(found.rows)
      return (tf.reduce_sum(found.scores) + tf.cast(tf.reduce_sum(blocks.body_ids), tf.float32)
              + tf.cast(tf.reduce_sum(blocks.document["input_word_ids"]), tf.float32)
              + tf.reduce_sum(blocks.embeddings))

    retrieval_seconds = _median_seconds(retrieval, args.task_steps)
  encoder_fn = _encoder_work(config, shapes, jit)
  encoder_seconds = _median_seconds(lambda: encoder_fn()[0], args.task_steps)
  outside = max(0.0, fb_seconds - encoder_seconds)
  other = max(0.0, outside - retrieval_seconds)
  e = m.encoder
  flops = sum(encoder_flops(e.num_layers, e.hidden_size, e.intermediate_size, *shape)
              for shape in shapes)
  if task_type == "pretrain":  # the MLM head's vocabulary projection, per masked position
    flops += 3 * 2 * e.hidden_size * e.vocab_size * (
        batch * k * config.task.pretrain.max_predictions_per_seq)
  return dict(
      flops_per_step=flops, flops_per_example=flops / batch,
      achieved_flops_per_second=flops / step_seconds,
      task=task_type, xla=jit, batch=batch, candidates=k, encoder_shapes=shapes,
      num_blocks=index.num_blocks if index is not None else 0,
      step_seconds=step_seconds, examples_per_second=batch / step_seconds,
      forward_backward_seconds=fb_seconds, encoder_seconds=encoder_seconds,
      retrieval_gather_seconds=retrieval_seconds,
      encoder_share=encoder_seconds / fb_seconds,
      retrieval_gather_share=retrieval_seconds / fb_seconds,
      heads_packing_losses_share=other / fb_seconds,
      outside_encoders_share=outside / fb_seconds,
      optimizer_share_of_step=max(0.0, step_seconds - fb_seconds) / step_seconds)


def run_tasks(args) -> dict:
  before = machine()
  limits = compute_limits()
  data_dir = tempfile.mkdtemp(prefix="train_step_tasks-")
  info = write_inputs(data_dir, args.num_blocks)
  rows = []
  for jit in args.task_xla:
    for task_type in args.tasks:
      row = time_task(task_type, data_dir, args, jit)
      print(json.dumps(row, default=str), flush=True)
      rows.append(row)
  for row in rows:
    row["run"] = _run_stamp(before, limits)
    if "failed" not in row:
      row["retrieval_target_met"] = row["retrieval_gather_share"] <= TASK_TARGET
      row["fraction_of_matmul_limit"] = (row["achieved_flops_per_second"]
                                         / limits["matmul"]["flops_per_second"])
  return dict(machine_before=before, machine_after=machine(), rows=rows, limits=limits,
              corpus=dict(info, source="vital_articles.jsonl, 100-word blocks"),
              repeats=args.task_steps, target_share=TASK_TARGET,
              note="fixed batch (input pipeline not timed); random weights; the encoders "
                   "are plain tf-models BertEncoderV2 of the same shapes in the same run")


def _stamp_text(run) -> str:
  if not run:
    return "-"
  return (f"{run['when']}, load {run['load_average'][0]} "
          f"({run['matmul_flops_per_second'] / 1e9:.1f} GFLOP/s)")


def _run_stamp(before: dict, limits: dict) -> dict:
  """Which run measured a row, and the matmul limit its fraction is of."""
  return dict(when=before["when"], load_average=before["load_average_1_5_15"],
              matmul_flops_per_second=limits["matmul"]["flops_per_second"])


def merge_task_runs(previous: dict, new: dict) -> dict:
  """The new run's part with the previous run's rows it did not re-measure (another XLA
  setting or task), each row stamped with the run that measured it: so XLA off can be run
  alone, on another day, without losing the XLA-on rows (or the other way round)."""
  def key(row):
    return row["task"], bool(row["xla"])

  for row in previous.get("rows", []):
    if "run" not in row and previous.get("limits"):
      row["run"] = _run_stamp(previous["machine_before"], previous["limits"])
  measured = {key(r) for r in new["rows"]}
  kept = [r for r in previous.get("rows", []) if key(r) not in measured]
  order = {task: i for i, task in enumerate(("ict", "pretrain", "openqa"))}
  rows = sorted(new["rows"] + kept, key=lambda r: (not r["xla"], order.get(r["task"], 9)))
  return dict(new, rows=rows)


def tasks_markdown(result: dict) -> list[str]:
  m = result["machine_before"]
  lines = [f"## Task steps at configs/demo.yaml sizes ({result['corpus']['blocks']:,} blocks)",
           "", f"{m['cpu_count']} cores, TF {m['tensorflow']}, {m['when']}; load average "
           f"{m['load_average_1_5_15']} before, {result['machine_after']['load_average_1_5_15']}"
           f" after. Median of {result['repeats']} steps on one fixed batch.", "",
           "| task | XLA | batch x K | examples/s | step s | GFLOP/example | GFLOP/s | "
           "x matmul limit | fwd+bwd s | encoders | retrieval + gathers | heads, packing, "
           "losses | measured (matmul limit of that run) |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
  limits = result.get("limits")
  if limits:
    lines[4:4] = [f"TensorFlow float32 matmul measured in the newest run: "
                  f"{limits['matmul']['flops_per_second'] / 1e9:.1f} GFLOP/s (theoretical "
                  f"peak {limits['cpu']['peak_flops'] / 1e9:.1f}). FLOPs are the encoders' "
                  f"matmuls (benchmarks.common.encoder_flops) plus, for pre-training, the MLM "
                  f"head's vocabulary projection.", ""]
  for r in result["rows"]:
    if "failed" in r:
      lines.append(f"| {r['task']} | {'on' if r['xla'] else 'off'} | failed: {r['failed'][:80]} |"
                   " | | | | | | | | |")
      continue
    lines.append(
        f"| {r['task']} | {'on' if r['xla'] else 'off'} | {r['batch']} x {r['candidates']} | "
        f"{r['examples_per_second']:.2f} | {r['step_seconds']:.2f} | "
        f"{r.get('flops_per_example', float('nan')) / 1e9:.2f} | "
        f"{r.get('achieved_flops_per_second', float('nan')) / 1e9:.1f} | "
        f"{r.get('fraction_of_matmul_limit', float('nan')):.2f} | "
        f"{r['forward_backward_seconds']:.2f} | {100 * r['encoder_share']:.0f}% | "
        f"{100 * r['retrieval_gather_share']:.1f}% | "
        f"{100 * r['heads_packing_losses_share']:.0f}% | {_stamp_text(r.get('run'))} |")
  met = all(r.get("retrieval_target_met", False) for r in result["rows"])
  lines += ["", "Each row's x matmul limit is against the matmul throughput measured in the "
            "run that timed it (last column)."]
  lines += ["", f"Target: retrieval and gathers at most {100 * TASK_TARGET:.0f}% of fwd+bwd: "
            f"{'met' if met else 'NOT met'} in every row. Shares are of the compiled "
            f"forward + backward; the encoders column is the same-size plain BertEncoderV2 "
            f"work measured alone.", ""]
  return lines
