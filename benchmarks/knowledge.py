"""REALM's claim on a controlled world: the retriever learns, from the MLM loss alone, to
fetch the block that holds the missing fact, and the knowledge then lives in the corpus.

    python -m benchmarks.knowledge [--arms realm,frozen,none,cold] [--steps 400]
        [--batch_size 64] [--entities 3000] [--x_templates 1] [--num_candidates 2]
        [--refresh_every 10] [--ict_steps 300] [--reader_steps 1500] [--learning_rate 3e-3]
        [--curve_every 100] [--seed 0]
        [--config configs/tiny.yaml --config configs/knowledge.yaml] [--override k=v]
        [--work_dir DIR] [--no_write] [--name knowledge]

The defaults are the committed run's settings (benchmarks/results/knowledge.*).

The world (realm_tf.corpus.knowledge_world): invented entities with closed-set attributes;
Z states each entity's facts in one block (plus namesake and town distractors); X states
them in other wordings; held out are the (entity, attribute) pairs never seen in X. Every
arm trains the registered realm/pretrain experiment on the configs' model (default:
configs/knowledge.yaml over tiny.yaml) from the same seeded initialisation, the same reader
(--reader_steps on X's sentences each with its own block, realm_tf.training.own_block_reader: a
reader that reads from step 0) and the same ICT warm start (--ict_steps on Z's blocks), for
the same steps, batch and learning rate:
  realm   REALM with asynchronous refresh: a snapshot every --refresh_every steps for the
          index builder running beside the trainer.
  frozen  REALM over the step-0 index (the start document tower's embeddings), never
          refreshed.
  none    no retrieval: the null document alone (task.pretrain.retrieval=false).
  cold    as realm, from a random retriever (no ICT warm start).
Per arm: held-out masked-span accuracy (whole span right, binomial standard error) every
--curve_every steps; the share of held-out sentences whose retrieval top-1 is the entity's
own block (at step 0 and at every kept checkpoint) and what the top-1 is otherwise
(namesake, town, other entity); the knowledge edit (every held-out fact rewritten in its
block, the index rebuilt with the arm's document tower, no parameter changes: the share of
held-out spans predicted as the new value and as the old); index refreshes and staleness.
Results: benchmarks/results/<--name>.{json,md} and <--name>_curves.png (unless
--no_write; always in <work_dir>).

What the committed run shows is in README ("The knowledge world") and
benchmarks/results/knowledge.md. Every run is read against the targets that say REALM's
claim holds here (`targets`: a `met` flag each in the JSON, a table in the Markdown).
"""
import argparse
import gc
import json
import math
import os
import tempfile
import time

import numpy as np
import tensorflow as tf
import tf_keras

from benchmarks import harness
from realm_tf import tasks
from realm_tf.configs import load_config
from realm_tf.corpus import knowledge_world
from realm_tf.data import pretraining_inputs
from realm_tf.io import layout, versioned
from realm_tf.modeling import factory
from realm_tf.retrieval import recall
from realm_tf.retrieval.index_export import ShardData, write_export
from realm_tf.retrieval.knowledge_index import row_ordered_embeddings
from realm_tf.training import own_block_reader, train_lib

EVAL_BATCH = 64  # held-out passes: batch size does not change what is measured
ARMS = {
    "realm": "REALM, asynchronous index refresh",
    "frozen": "REALM, frozen step-0 index",
    "none": "No retrieval (null document only)",
    "cold": "REALM, asynchronous refresh, cold-start retriever (no ICT warm start)",
}


log = harness.logger("knowledge")


def ict_config(world_dir: str, args):
  """The shared start's ICT warm start of the retriever on the world's blocks."""
  values = {
      "task.ict.train_data.input_path": os.path.join(world_dir, "ict-*"),
      "task.ict.train_data.global_batch_size": args.batch_size * 2,
      "index.blocks": world_dir,
      "trainer.train_steps": args.ict_steps,
      "trainer.steps_per_loop": min(args.ict_steps, 50),
      "trainer.summary_interval": min(args.ict_steps, 50),
      "trainer.checkpoint_interval": args.ict_steps,
      "trainer.learning_rate": args.learning_rate,
      "trainer.warmup_steps": max(1, args.ict_steps // 10),
      "trainer.seed": args.seed,
  }
  overrides = [f"{k}={v}" for k, v in values.items()] + list(args.override or [])
  return load_config(args.config, overrides, experiment="realm/ict")


def heldout_sentences(world_dir: str) -> int:
  with tf.io.gfile.GFile(os.path.join(world_dir, "world.json")) as f:
    return len(json.load(f)["held_out"])


def arm_config(arm: str, world_dir: str, args, ict_dir: str = "", reader: str = ""):
  """The registered realm/pretrain experiment on --config's sizes, for one arm (ict_dir:
  the retriever's warm start; reader: a reader checkpoint to start from, else random)."""
  values = {
      "task.pretrain.train_data.input_path": os.path.join(world_dir, "pretraining-*"),
      "task.pretrain.validation_data.input_path": os.path.join(world_dir, "heldout-*"),
      "task.pretrain.train_data.global_batch_size": args.batch_size,
      "task.pretrain.validation_data.global_batch_size": EVAL_BATCH,
      "task.pretrain.validation_data.drop_remainder": False,
      "task.pretrain.num_candidates": args.num_candidates,
      "task.pretrain.start_index_builder": True,
      "task.pretrain.refresh_every_steps": args.refresh_every,
      "index.blocks": world_dir,
      "index.max_staleness_steps": args.refresh_every * 3,
      # Every version the run commits is kept: the curves read the index searched at each
      # checkpoint after the run (checkpoint_curve).
      "index.keep_versions": args.steps // args.refresh_every + 2,
      "trainer.train_steps": args.steps,
      "trainer.steps_per_loop": args.refresh_every,
      "trainer.summary_interval": args.refresh_every,
      # A checkpoint and a whole pass over the held-out sentences every --curve_every steps:
      # the curves (gold top-1 is measured from the checkpoints afterwards).
      "trainer.checkpoint_interval": args.curve_every,
      "trainer.max_to_keep": args.steps // args.curve_every + 1,
      "trainer.validation_interval": args.curve_every,
      "trainer.validation_steps": math.ceil(
          min(heldout_sentences(world_dir), args.curve_sentences) / EVAL_BATCH),
      "trainer.learning_rate": args.learning_rate,
      "trainer.warmup_steps": max(1, args.steps // 20),
      "trainer.seed": args.seed,
      "task.pretrain.init_checkpoint": "" if arm == "cold" else ict_dir,
      "task.pretrain.mlm_init_checkpoint": reader,
  }
  if arm == "frozen":  # the published step-0 index stays: no snapshots, no builder
    values.update({"task.pretrain.refresh_every_steps": 0, "index.max_staleness_steps": 0,
                   "task.pretrain.start_index_builder": False})
  elif arm == "none":
    values.update({"task.pretrain.retrieval": False, "task.pretrain.start_index_builder": False,
                   "task.pretrain.refresh_every_steps": 0, "index.max_staleness_steps": 0})
  overrides = [f"{k}={v}" for k, v in values.items()] + list(args.override or [])
  return load_config(args.config, overrides, experiment="realm/pretrain")


def world_index(config):
  """(the retrieval task, its KnowledgeIndex over the world's blocks, embeddings unset)."""
  task = tasks.get_task(config.replace(task=dict(pretrain=dict(retrieval=True))))
  return task, task.build_index(tf.distribute.get_strategy())


def heldout_queries(config, task, retriever_queries, world: dict) -> np.ndarray:
  """[H, P] query embeddings of the held-out sentences (masked as in validation), in
  world["held_out"] order."""
  m = config.model
  data = pretraining_inputs.pretraining_dataset(
      os.path.join(world["dir"], "heldout-*"), task.tokenizer, m.retriever.query_seq_length,
      "salient_spans", config.task.pretrain.max_predictions_per_seq, 64,
      seed=config.trainer.seed, repeat=False, shuffle_buffer=0, drop_remainder=False)
  out = np.concatenate([retriever_queries.embed_queries(batch["query"], training=False).numpy()
                        for batch in data])
  assert len(out) == len(world["held_out"]), (len(out), len(world["held_out"]))
  return out


def top1_blocks(config, retriever_queries, retriever_documents, world: dict) -> list[int]:
  """The top-1 block id under these towers for each held-out sentence (masked as in
  validation), in world["held_out"] order."""
  task, index = world_index(config)
  queries = heldout_queries(config, task, retriever_queries, world)
  documents = recall.embed_corpus(retriever_documents, index, task.tokenizer,
                                  config.model.retriever.block_seq_length)
  return top1_of(queries, documents, np.asarray(index.store.block_ids, np.int64))


def top_k_overlap(queries: np.ndarray, stale: np.ndarray, fresh: np.ndarray, k: int) -> float:
  """Mean over queries of |top-k under `stale` ∩ top-k under `fresh`| / k: recall@k of the
  index in use against an exact search of the current document tower's embeddings."""
  k = min(k, len(fresh))
  top_stale = np.argsort(-(queries @ stale.T), axis=1)[:, :k]
  top_fresh = np.argsort(-(queries @ fresh.T), axis=1)[:, :k]
  return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(top_stale, top_fresh)]))


def mean_row_cosine(a: np.ndarray, b: np.ndarray) -> float:
  """Mean cosine of row i of `a` to row i of `b` (how far block embeddings have moved)."""
  norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
  return float(np.mean(np.sum(a * b, axis=1) / np.maximum(norms, 1e-12)))


def index_version_in_use(model_dir: str, step: int) -> int:
  """The index version the trainer searched at `step`: its newest training record at or
  before `step` says (index_version); without one, the newest committed version numbered
  at or before `step` (versions are numbered by their snapshot's step)."""
  records = [r for r in layout.read_metrics(model_dir)
             if r.get("mode") == "pretrain" and "index_version" in r and r["step"] <= step]
  if records:
    return int(max(records, key=lambda r: r["step"])["index_version"])
  versions = [v.version for v in versioned.list_versions(layout.index_dir(model_dir))
              if v.version <= step]
  if not versions:
    raise ValueError(f"{model_dir}: no index version at or before step {step}")
  return max(versions)


def index_embeddings(model_dir: str, version: int, block_ids: np.ndarray) -> np.ndarray:
  """[N, P] embeddings of the run's committed index `version`, in row order."""
  index_dir = layout.index_dir(model_dir)
  export = versioned.read_version(versioned.manifest_path(index_dir, version))
  return row_ordered_embeddings(export, block_ids)


def top1_kinds(top: list[int], world: dict) -> dict:
  """What the top-1 blocks are: the entity's own block (any of them, in a world of several
  per entity), a namesake's (same first name), a town's, or another entity's. Why: a
  retriever can raise p(y|x) without the own block, by fetching blocks that narrow the
  closed set of answers (a town block names a town)."""
  titles = {b["block_id"]: b["title"] for b in world["blocks"]}
  towns = set(world["towns"])
  counts = dict(own=0, namesake=0, town=0, other_entity=0)
  for block, row in zip(top, world["held_out"]):
    title = titles.get(block, "")
    if block in row["gold_block_ids"]:
      counts["own"] += 1
    elif title in towns:
      counts["town"] += 1
    elif title.split(" ")[0] == row["entity"].split(" ")[0]:
      counts["namesake"] += 1
    else:
      counts["other_entity"] += 1
  return {k: v / max(1, len(top)) for k, v in counts.items()}


def gold_top1(config, retriever_queries, retriever_documents, world: dict) -> float:
  """Share of held-out sentences whose top-1 block under these towers is the entity's own
  block."""
  return top1_kinds(top1_blocks(config, retriever_queries, retriever_documents, world),
                    world)["own"]


def retriever_from(config, model_dir: str = ""):
  """The arm's start retriever (the ICT run's at task.pretrain.init_checkpoint, else the
  seeded random initialisation), or a run's trained one (model_dir: its newest checkpoint,
  or a checkpoint path)."""
  tf_keras.utils.set_random_seed(config.trainer.seed)
  if not model_dir:  # the same draws as the start of every arm (build_model after the seed)
    retriever = factory.build_realm_pretrainer(config).retriever
    ict = config.task.pretrain.init_checkpoint
    if ict:
      tf.train.Checkpoint(model=retriever).read(layout.latest_checkpoint(ict)).expect_partial()
    return retriever
  retriever = factory.build_retriever(config)
  tf.train.Checkpoint(model=tf.train.Checkpoint(retriever=retriever)).read(
      layout.latest_checkpoint(model_dir)).assert_existing_objects_matched().expect_partial()
  return retriever


def publish_index(config, documents, model_dir: str, version: int = 0) -> None:
  """`documents`' embeddings of config.index.blocks, committed as `version` of the run's
  index (what the index builder publishes for a snapshot of that document tower)."""
  task = tasks.get_task(config)
  index = task.build_index(tf.distribute.get_strategy())
  embeddings = recall.embed_corpus(documents, index, task.tokenizer,
                                   config.model.retriever.block_seq_length)
  write_export(layout.index_dir(model_dir), version,
               [ShardData(embeddings, np.asarray(index.store.block_ids, np.int64))],
               build_scann=False,
               extra=dict(encoder=dict(step=version, committed_at=time.time())))


def checkpoints(model_dir: str) -> list[tuple[int, str]]:
  """(step, path) of every checkpoint the run kept, oldest first."""
  state = tf.train.get_checkpoint_state(layout.checkpoint_dir(model_dir))
  paths = list(state.all_model_checkpoint_paths) if state else []
  return sorted((int(p.rsplit("-", 1)[1]), p) for p in paths)


def tower_embeddings(config, world: dict, retriever, task, index) -> tuple:
  """([H, P] held-out query embeddings, [N, P] block embeddings in row order) under
  `retriever`'s towers (task, index: world_index's)."""
  return (heldout_queries(config, task, retriever, world),
          recall.embed_corpus(retriever, index, task.tokenizer,
                              config.model.retriever.block_seq_length))


def top1_of(queries: np.ndarray, documents: np.ndarray, block_ids: np.ndarray) -> list[int]:
  """top1_blocks from embeddings already computed: each query's exact top-1 block id."""
  return block_ids[np.argmax(queries @ documents.T, axis=1)].tolist()


def own_share(queries: np.ndarray, documents: np.ndarray, block_ids: np.ndarray,
              world: dict) -> float:
  """Share of held-out sentences (`queries`, in world["held_out"] order) whose exact top-1
  block among `documents` is the entity's own."""
  top = top1_of(queries, documents, block_ids)
  return round(float(np.mean([b in r["gold_block_ids"] for b, r in zip(top, world["held_out"])])),
               4)


def checkpoint_curve(config, model_dir: str, world: dict, start, every: int = 0) -> list[dict]:
  """Step 0 and each kept checkpoint (at a multiple of `every` steps; 0: each): the
  held-out sentences' own-block top-1 against the index the trainer searched at that step
  (top1_searched) and against an exact search of that step's document tower (top1_exact);
  how stale that index was: the overlap of its top-k with the exact search's (overlap_at_k,
  k = the run's num_candidates; 1.0: a refresh could not have changed what was retrieved)
  and of the top-1s alone (overlap_at_1); and how far the document tower had moved
  (document_cosine_to_step0: the mean cosine of the block embeddings to their step-0 rows).

  Args:
    config: the arm's config.
    model_dir: the arm's run (its checkpoints, metrics and every committed index version).
    world: the world (its held_out rows give the own blocks).
    start: the step-0 retriever (retriever_from(config)).
    every: keep the checkpoints at multiples of this (0: all).

  Returns:
    [{step, top1_searched, top1_exact}] for step 0, then per checkpoint also
    {index_version, k, overlap_at_k, overlap_at_1, document_cosine_to_step0}.
  """
  task, index = world_index(config)
  block_ids = np.asarray(index.store.block_ids, np.int64)
  k = config.task.pretrain.num_candidates
  queries, step0 = tower_embeddings(config, world, start, task, index)
  top1 = own_share(queries, step0, block_ids, world)
  points = [dict(step=0, top1_searched=top1, top1_exact=top1)]
  for step, path in checkpoints(model_dir):
    if every and step % every:
      continue
    queries, fresh = tower_embeddings(config, world, retriever_from(config, path), task, index)
    version = index_version_in_use(model_dir, step)
    searched = index_embeddings(model_dir, version, block_ids)
    points.append(dict(
        step=step, index_version=version, k=k,
        overlap_at_k=round(top_k_overlap(queries, searched, fresh, k), 4),
        # The top-1s alone: with k=2 the second candidate is often a near-tie, so overlap@k
        # moves with it even where the block read first is the same.
        overlap_at_1=round(top_k_overlap(queries, searched, fresh, 1), 4),
        document_cosine_to_step0=round(mean_row_cosine(fresh, step0), 4),
        top1_searched=own_share(queries, searched, block_ids, world),
        top1_exact=own_share(queries, fresh, block_ids, world)))
    tf_keras.backend.clear_session()
  return points


def gold_top1_curve(arm: str, config, model_dir: str, world: dict, start) -> list[dict]:
  """checkpoint_curve with gold_top1 at each point: that step's query tower against that
  step's document tower (the index a refresh would publish), or, frozen, against the
  step-0 index it searched."""
  return [dict(p, gold_top1=p["top1_searched"] if arm == "frozen" else p["top1_exact"])
          for p in checkpoint_curve(config, model_dir, world, start)]


def per_attribute(config, model_dir: str, world: dict, documents) -> dict:
  """Per attribute of the held-out sentences: span accuracy, how often the own block is
  the top-1 and among the k read, and the reader's mean p(value | own block, x) when it
  is read. Why: one held-out accuracy mixes what the retriever fetches with what the
  reader can read; split by attribute, the two limits show apart (README, "The knowledge
  world": a reader that copies one attribute's values and guesses the others')."""
  task = tasks.get_task(config)
  index = task.build_index(tf.distribute.get_strategy())  # None without retrieval
  if index is not None:
    index.set_embeddings(recall.embed_corpus(documents, index, task.tokenizer,
                                             config.model.retriever.block_seq_length),
                         version=0)
  model = task.build_model()
  tf.train.Checkpoint(model=model).read(layout.latest_checkpoint(
      model_dir)).expect_partial().assert_existing_objects_matched()
  m = config.model
  data = pretraining_inputs.pretraining_dataset(
      os.path.join(world["dir"], "heldout-*"), task.tokenizer, m.retriever.query_seq_length,
      config.task.pretrain.validation_masking, config.task.pretrain.max_predictions_per_seq,
      EVAL_BATCH, seed=config.trainer.seed, repeat=False, shuffle_buffer=0,
      drop_remainder=False)
  rows = iter(world["held_out"])
  by: dict = {}
  pairs: dict = {}  # attribute → [(true token id, predicted token id)]
  for batch in data:
    _, out = task.forward(model, batch, False)
    weights = batch["masked_lm"]["weights"].numpy()  # [B, M]
    right = np.all((out["mlm_predictions"].numpy() == batch["masked_lm"]["ids"].numpy())
                   | (weights == 0), axis=1)  # [B]
    span_log_p = (out["token_log_probs"].numpy() * weights[:, None, :]).sum(-1)  # [B, K]
    ids = out["block_ids"].numpy()  # [B, k] (k = 0 without retrieval)
    predicted = out["mlm_predictions"].numpy()[:, 0]  # [B]: every value is one wordpiece
    true = batch["masked_lm"]["ids"].numpy()[:, 0]
    for i in range(len(right)):
      row = next(rows)
      pairs.setdefault(row["attribute"], []).append((int(true[i]), int(predicted[i])))
      # The first candidate that is one of the entity's own blocks (each states the fact).
      read = next((j for j, b in enumerate(ids[i]) if b in row["gold_block_ids"]), None)
      # Candidates in the reader's order: the null document first when it is read.
      offset = span_log_p.shape[1] - ids.shape[1]
      by.setdefault(row["attribute"], []).append((
          float(right[i]), float(ids.shape[1] > 0 and read == 0), float(read is not None),
          math.exp(span_log_p[i, read + offset]) if read is not None else float("nan")))
  out = {}
  for attribute, v in sorted(by.items()):
    v = np.asarray(v)
    with np.errstate(invalid="ignore"):
      own_read = float(np.nanmean(v[:, 3])) if np.isfinite(v[:, 3]).any() else None
    out[attribute] = dict(
        sentences=len(v), span_accuracy=round(float(v[:, 0].mean()), 4),
        own_block_top1=round(float(v[:, 1].mean()), 4) if index is not None else None,
        own_block_read=round(float(v[:, 2].mean()), 4) if index is not None else None,
        p_value_given_own_block=float(f"{own_read:.4g}") if own_read is not None else None,
        confusion=confusion(pairs[attribute], task.tokenizer))
  return out


def confusion(pairs: list, tokenizer) -> dict:
  """The confusion matrix of (true, predicted) token ids: {values: the true values, sorted;
  matrix[i][j]: sentences whose value is values[i] predicted as values[j], the last column
  anything outside the values}. Why: one accuracy per attribute cannot tell a reader that
  confuses a few values among themselves from one that guesses a prior."""
  ids = sorted({t for t, _ in pairs})
  words = [w.decode() for w in tokenizer.detokenize(tf.constant([[i] for i in ids])).numpy()]
  column = {i: n for n, i in enumerate(ids)}
  matrix = np.zeros([len(ids), len(ids) + 1], np.int64)
  for t, p in pairs:
    matrix[column[t], column.get(p, len(ids))] += 1
  return dict(values=words, matrix=matrix.tolist())


def top_confusions(matrix: dict, n: int = 3) -> list:
  """The `n` commonest (true value, predicted value, sentences) off the diagonal."""
  values, m = matrix["values"] + ["(other)"], matrix["matrix"]
  cells = [(m[i][j], values[i], values[j]) for i in range(len(m)) for j in range(len(m[i]))
           if i != j and m[i][j]]
  return [(t, p, c) for c, t, p in sorted(cells, reverse=True)[:n]]


def knowledge_edit(arm: str, config, model_dir: str, edited: dict, documents) -> dict:
  """REALM's knowledge lives in the corpus: the held-out entities' blocks are rewritten
  with other values (knowledge_world.edit_world), the index is rebuilt over the edited
  corpus with the arm's document tower and no parameter changes, and the trained
  checkpoint answers the held-out sentences again. follows_edit: share of held-out spans
  now predicted as the new value; keeps_old_value: as the value before the edit."""
  edit_dir = model_dir + "-edited"
  edited_config = config.replace(index=dict(blocks=edited["dir"]))
  if arm != "none":
    publish_index(edited_config, documents, edit_dir)
  checkpoint = layout.latest_checkpoint(model_dir)
  out = {}
  for name, pattern in (("follows_edit", os.path.join(edited["dir"], "heldout-*")),
                        ("keeps_old_value", edited["old_heldout"])):
    metrics, run = train_lib.evaluate_checkpoint(
        edited_config.replace(task=dict(pretrain=dict(validation_data=dict(
            input_path=pattern)))), edit_dir, checkpoint, name=f"edit-{name}")
    out[name] = metrics.get("span_accuracy")
    del run
    tf_keras.backend.clear_session()
    gc.collect()
  n = len(edited["held_out"])
  out.update({f"{k}_stderr": harness.share_stderr(v, n) for k, v in list(out.items())
              if v is not None})
  out["sentences"] = n
  return out


def train_arm(arm: str, config, model_dir: str):
  """Trains one arm's run and evaluates it on the held-out sentences.

  Returns:
    (the run's summary, the final held-out metrics, train seconds, the start retriever,
    the trained one, the document tower its index was built with).
  """
  if arm == "frozen":  # the step-0 index, published once
    publish_index(config, retriever_from(config), model_dir)
  train_lib.save_params(config, model_dir)  # read by the index builder beside the trainer
  start = time.time()
  run = train_lib.Run(config, model_dir)
  result = run.train()
  wall = time.time() - start
  final = run.evaluate(-1)
  del run
  tf_keras.backend.clear_session()
  gc.collect()
  start_retriever = retriever_from(config)
  trained = retriever_from(config, model_dir) if arm != "none" else start_retriever
  documents = start_retriever if arm == "frozen" else trained
  return result, final, wall, start_retriever, trained, documents


def run_arm(arm: str, world: dict, edited: dict, args, work: str, ict_dir: str,
            reader: str) -> dict:
  model_dir = os.path.join(work, arm)
  config = arm_config(arm, world["dir"], args, ict_dir, reader)
  log(f"arm {arm}: {ARMS[arm]}, {args.steps} steps of batch {args.batch_size}")
  result, final, wall, start_retriever, trained, documents = train_arm(arm, config, model_dir)
  kinds = top1_kinds(top1_blocks(config, trained, documents, world), world) \
      if arm != "none" else None
  top1 = kinds["own"] if kinds else None
  top1_curve = gold_top1_curve(arm, config, model_dir, world, start_retriever) \
      if arm != "none" else []
  attributes = per_attribute(config, model_dir, world, documents)
  tf_keras.backend.clear_session()
  edit = knowledge_edit(arm, config, model_dir, edited, documents)
  n = len(world["held_out"])
  accuracy = final.get("span_accuracy")
  metrics = layout.read_metrics(model_dir)
  train = [r for r in metrics if r.get("mode") == "pretrain"]
  held_out = [r for r in metrics if r.get("mode") == "eval"]
  out = dict(
      arm=arm, description=ARMS[arm], steps=result["step"], wall_seconds=round(wall, 1),
      heldout_sentences=n, heldout_span_accuracy=accuracy,
      heldout_span_accuracy_stderr=(harness.share_stderr(accuracy, n)
                                    if accuracy is not None else None),
      heldout_token_accuracy=final.get("mlm_accuracy"),
      heldout_retrieval_utility=final.get("retrieval_utility"),
      heldout_null_document_probability=final.get("null_document_probability"),
      gold_top1=top1, top1_kinds=kinds, knowledge_edit=edit, per_attribute=attributes,
      index_refreshes=result.get("index_refreshes", 0),
      gold_top1_curve=top1_curve,
      heldout_curve=[{k: r[k] for k in ("step", "span_accuracy", "retrieval_utility",
                                        "null_document_probability", "loss") if k in r}
                     for r in held_out],
      train_curve=[{k: r[k] for k in ("step", "loss", "span_accuracy", "retrieval_utility",
                                      "index_version", "index_staleness_steps") if k in r}
                   for r in train])
  tf_keras.backend.clear_session()
  gc.collect()
  log(f"arm {arm}: held-out span accuracy {accuracy}, gold top-1 {out['gold_top1']}, "
      f"edit {edit}, {out['wall_seconds']} s")
  return out


def chance(world: dict, length_of=None) -> float:
  """Accuracy of always answering an attribute's most frequent value in training (X); with
  `length_of` (value → its number of wordpieces), the most frequent among the values as
  long as the held-out one: what a reader without retrieval can reach, since the number of
  [MASK]s tells it the value's length."""
  length_of = length_of or (lambda value: 0)
  counts: dict = {}
  for r in world["x"]:
    key = (r["attribute"], length_of(r["value"]))
    counts.setdefault(key, {}).setdefault(r["value"], 0)
    counts[key][r["value"]] += 1
  best = {key: max(c, key=c.get) for key, c in counts.items()}
  return float(np.mean([best.get((r["attribute"], length_of(r["value"]))) == r["value"]
                        for r in world["held_out"]]))


def wordpiece_lengths(config, world: dict) -> dict:
  """value → its number of wordpieces under the experiment's tokenizer."""
  tokenizer = tasks.get_task(config).tokenizer
  values = sorted({r["value"] for r in world["x"] + world["held_out"]})
  pieces = tokenizer.tokenize(tf.constant(values))
  return dict(zip(values, pieces.row_lengths().numpy().tolist()))


def write_world(work: str, args) -> dict:
  """The seeded world of args (--seed, --entities, --x_templates, --namesake_fraction,
  --blocks_per_entity) in <work>/world; its description, with its directory as
  world["dir"]."""
  world_dir = os.path.join(work, "world")
  world = knowledge_world.write_world(world_dir, knowledge_world.WorldConfig(
      seed=args.seed, entities=args.entities, x_templates=args.x_templates,
      namesake_fraction=args.namesake_fraction,
      blocks_per_entity=args.blocks_per_entity))
  world["dir"] = world_dir
  return world


def run(args) -> dict:
  work = args.work_dir or tempfile.mkdtemp(prefix="realm_tf_knowledge_")
  world = write_world(work, args)
  world_dir = world["dir"]
  edited_dir = os.path.join(work, "world-edited")
  edited = knowledge_world.write_files(edited_dir, knowledge_world.edit_world(world, args.seed))
  edited.update(dir=edited_dir, old_heldout=os.path.join(world_dir, "heldout-*"))
  reader = ""
  if args.reader_steps:
    reader = own_block_reader.trained_checkpoint(
        arm_config("realm", world_dir, args), world, args.reader_steps, args.seed,
        os.path.join(work, "reader", "ckpt-1"), log)["checkpoint"]
  ict_dir, ict_seconds = "", 0.0
  if args.ict_steps:
    ict_dir = os.path.join(work, "ict")
    log(f"ICT warm start of the retriever: {args.ict_steps} steps")
    start = time.time()
    train_lib.run_experiment(ict_config(world_dir, args), ict_dir)
    ict_seconds = round(time.time() - start, 1)
    tf_keras.backend.clear_session()
  config = arm_config("realm", world_dir, args, ict_dir, reader)
  start_retriever = retriever_from(config)
  step0_kinds = top1_kinds(top1_blocks(config, start_retriever, start_retriever, world),
                           world)
  step0 = step0_kinds["own"]
  tf_keras.backend.clear_session()
  log(f"world: {len(world['blocks'])} blocks, {len(world['x'])} x, "
      f"{len(world['held_out'])} held out; step-0 gold top-1 {step0:.3f}")
  arms = {arm: run_arm(arm, world, edited, args, work, ict_dir, reader)
          for arm in args.arms.split(",")}
  return dict(
      settings=dict(steps=args.steps, batch_size=args.batch_size, entities=args.entities,
                    x_templates=args.x_templates, namesake_fraction=args.namesake_fraction,
                    blocks_per_entity=args.blocks_per_entity,
                    refresh_every=args.refresh_every, learning_rate=args.learning_rate,
                    num_candidates=args.num_candidates, seed=args.seed,
                    ict_steps=args.ict_steps, ict_seconds=ict_seconds,
                    reader_steps=args.reader_steps,
                    curve_every=args.curve_every,
                    config=[os.path.relpath(c, harness.REPO) for c in args.config],
                    overrides=args.override or []),
      world=dict(blocks=len(world["blocks"]), x=len(world["x"]),
                 held_out=len(world["held_out"]), chance=chance(world),
                 chance_given_length=chance(world, wordpiece_lengths(config, world).get)),
      step0_gold_top1=step0, step0_top1_kinds=step0_kinds, arms=arms,
      machine=harness.machine(), work_dir=work)


def _arms_in_order(payload: dict) -> list:
  """(arm, result) in ARMS' order: the JSON's keys come back sorted."""
  return sorted(payload["arms"].items(),
                key=lambda item: list(ARMS).index(item[0]) if item[0] in ARMS else len(ARMS))


def markdown(payload: dict) -> str:
  """benchmarks/results/knowledge.md: the table of arms."""
  s, w = payload["settings"], payload["world"]
  arms = _arms_in_order(payload)
  lines = ["# REALM on the knowledge world (benchmarks/knowledge.py)", "",
           f"World: {w['blocks']} blocks of Z, {w['x']} training sentences (X), "
           f"{w['held_out']} held-out sentences whose facts are only in Z; chance (the most "
           f"frequent training value per attribute) {w['chance']:.3f}, "
           f"{w.get('chance_given_length', float('nan')):.3f} among the values as long as the "
           f"answer in wordpieces (what the number of [MASK]s tells a reader; equal to "
           f"chance when every value is one wordpiece). "
           f"{s['steps']} steps of batch {s['batch_size']}, learning rate "
           f"{s['learning_rate']}, k={s['num_candidates']}, refresh every "
           f"{s['refresh_every']} steps; ICT warm start {s['ict_steps']} steps "
           f"(gold top-1 at step 0: {payload['step0_gold_top1']:.3f}). Configs "
           f"{' + '.join(s['config'])} with {' '.join(s['overrides']) or 'no overrides'}.", "",
           "| arm | held-out span accuracy | gold top-1 | edit: follows new value | "
           "edit: keeps old value | index refreshes | train s |",
           "|---|---|---|---|---|---|---|"]
  for arm, r in arms:
    e = r.get("knowledge_edit") or {}

    def pm(value, err):
      return "n/a" if value is None else f"{value:.3f} ± {err:.3f}"
    top1 = "n/a" if r["gold_top1"] is None else f"{r['gold_top1']:.3f}"
    lines.append(
        f"| {arm}: {r['description']} | "
        f"{pm(r['heldout_span_accuracy'], r['heldout_span_accuracy_stderr'] or 0)} | {top1} | "
        f"{pm(e.get('follows_edit'), e.get('follows_edit_stderr', 0))} | "
        f"{pm(e.get('keeps_old_value'), e.get('keeps_old_value_stderr', 0))} | "
        f"{r['index_refreshes']} | {r['wall_seconds']} |")
  kinds = [(arm, r["top1_kinds"]) for arm, r in arms if r.get("top1_kinds")]
  if kinds:
    lines += ["", "What the retriever's top-1 is for held-out sentences after training (own "
              "block / a namesake's / a town's / another entity's): " + "; ".join(
                  f"{arm} " + " / ".join(f"{k[key]:.3f}" for key in
                                         ("own", "namesake", "town", "other_entity"))
                  for arm, k in kinds) + "."]
  with_attributes = [(arm, r["per_attribute"]) for arm, r in arms if r.get("per_attribute")]
  if with_attributes:
    lines += ["", "Per attribute of the held-out sentences: span accuracy / own block top-1 / "
              "mean p(value | own block, x) where the own block is read (the reader's part "
              "apart from the retriever's):", "",
              "| arm | " + " | ".join(with_attributes[0][1]) + " |",
              "|---|" + "---|" * len(with_attributes[0][1])]

    def cell(a):
      def f(v):
        return "n/a" if v is None else f"{v:.3f}"
      return f"{f(a['span_accuracy'])} / {f(a['own_block_top1'])} / " \
             f"{f(a['p_value_given_own_block'])}"
    for arm, attributes in with_attributes:
      lines.append(f"| {arm} | " + " | ".join(cell(a) for a in attributes.values()) + " |")
    confused = [(arm, attributes) for arm, attributes in with_attributes
                if any(a.get("confusion") for a in attributes.values())]
    if confused:
      lines += ["", "The commonest confusions (true value → predicted: held-out sentences; the "
                "whole matrices are in the JSON, per_attribute.*.confusion):", ""]
      for arm, attributes in confused:
        lines.append(f"- {arm}: " + "; ".join(
            f"{name} " + (", ".join(f"{t} → {p}: {c}" for t, p, c in
                                    top_confusions(a["confusion"])) or "none")
            for name, a in attributes.items() if a.get("confusion")) + ".")
  stale = [(arm, [p for p in r.get("gold_top1_curve", []) if "overlap_at_k" in p])
           for arm, r in arms]
  stale = [(arm, points) for arm, points in stale if points]
  if stale:
    lines += ["", "Staleness at each checkpoint: the overlap of the top-k of the index the "
              "trainer searched (its version in parentheses) with an exact search of that "
              "step's document tower (1.000: a refresh could not have changed what was "
              "retrieved), and the mean cosine of the document embeddings to their step-0 "
              "rows (1.000: the document tower has not moved):", "",
              "| arm | step: overlap@k (index version) / cosine to step 0 |", "|---|---|"]
    for arm, points in stale:
      lines.append(f"| {arm} | " + "; ".join(
          f"{p['step']}: {p['overlap_at_k']:.3f}@{p['k']} ({p['index_version']}) / "
          f"{p['document_cosine_to_step0']:.3f}" for p in points) + " |")
  m = payload["machine"]
  lines += ["", "± one binomial standard error over the held-out sentences. Gold top-1: "
            "share of held-out sentences whose top-1 block is the entity's own (no "
            "supervision ever names it). The edit rewrites every held-out fact in its block "
            "and rebuilds the index with the arm's document tower; no parameter changes.", "",
            f"Measured {m['when']} on {m['cpu_count']} CPUs (load average "
            f"{m['load_average_1_5_15']}), {payload['wall_seconds']} s in all. Curves: "
            f"{payload.get('name', 'knowledge')}_curves.png.", ""]
  if payload.get("targets"):
    lines[-1:-1] = ["Targets:"] + targets_markdown(payload["targets"]) + [""]
  return "\n".join(lines)


def plot(payload: dict, path: str):
  def chance_lines(ax, curve, key):
    if key != "span_accuracy":
      return
    ax.axhline(payload["world"]["chance"], color="grey", linestyle=":", label="chance")
    if "chance_given_length" in payload["world"]:
      ax.axhline(payload["world"]["chance_given_length"], color="grey", linestyle="--",
                 label="chance given the span's length")
  harness.plot_arm_curves(
      dict(_arms_in_order(payload)),
      [("heldout_curve", "span_accuracy", "held-out span accuracy"),
       ("gold_top1_curve", "gold_top1", "gold top-1 (entity's own block)"),
       ("train_curve", "loss", "training loss"),
       ("train_curve", "index_staleness_steps", "index staleness (steps)")],
      path, "REALM on the knowledge world (benchmarks/knowledge.py)",
      point_curves=("heldout_curve", "gold_top1_curve"), decorate=chance_lines)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--arms", default="realm,frozen,none,cold")
  p.add_argument("--steps", type=int, default=400)
  p.add_argument("--batch_size", type=int, default=64)
  p.add_argument("--entities", type=int, default=3000)
  p.add_argument("--namesake_fraction", type=float, default=0.5,
                 help="share of entities with a namesake block (same first name)")
  p.add_argument("--blocks_per_entity", type=int, default=1, choices=(1, 2),
                 help="blocks stating all of an entity's facts, each in its own wording "
                      "(knowledge_world)")
  p.add_argument("--x_templates", type=int, default=1,
                 help="X wordings per trained (entity, attribute) pair (1 to 3)")
  p.add_argument("--num_candidates", type=int, default=2)
  p.add_argument("--refresh_every", type=int, default=10)
  p.add_argument("--curve_sentences", type=int, default=512,
                 help="held-out sentences scored at each curve point (all at the end)")
  p.add_argument("--curve_every", type=int, default=0,
                 help="steps between the curves' points (default: steps / 4)")
  p.add_argument("--ict_steps", type=int, default=300,
                 help="an ICT warm start of the retriever shared by every arm (0: none)")
  p.add_argument("--reader_steps", type=int, default=1500,
                 help="a reader trained on each X sentence with its own block first, shared "
                      "by every arm (realm_tf.training.own_block_reader; 0: a random-init reader)")
  p.add_argument("--learning_rate", type=float, default=3e-3)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--config", action="append",
                 help="config files applied in order (default: configs/tiny.yaml, then "
                      "configs/knowledge.yaml)")
  p.add_argument("--override", action="append", help="extra dotted=value config overrides")
  p.add_argument("--work_dir", default="")
  p.add_argument("--no_write", action="store_true")
  p.add_argument("--name", default="knowledge",
                 help="results file name (another name keeps the committed run's files)")
  args = p.parse_args(argv)
  args.config = args.config or [os.path.join(harness.REPO, "configs", name)
                                for name in ("tiny.yaml", "knowledge.yaml")]
  args.curve_every = args.curve_every or max(1, args.steps // 4)
  return args


# What REALM's claim needs of a run (`met` in the JSON, a table in the Markdown): the
# held-out facts read from the corpus, by every attribute, through the own block, and
# following an edit of it; no retrieval near chance; refresh ahead of a frozen index.
HELDOUT_TARGET, ATTRIBUTE_TARGET, TOP1_TARGET, EDIT_TARGET = 0.9, 0.8, 0.95, 0.9
NO_RETRIEVAL_MARGIN, REFRESH_MARGIN, WALL_TARGET_SECONDS = 0.1, 0.1, 45 * 60


def targets(payload: dict) -> list[dict]:
  """Each target with its measured value and whether it is met (None: the arms it needs
  were not run)."""
  arms, chance_value = payload["arms"], payload["world"]["chance"]
  realm, frozen, none = arms.get("realm"), arms.get("frozen"), arms.get("none")

  def row(name, value, met, target):
    return dict(target=name, goal=target, value=value, met=met)

  out = []
  if realm:
    accuracy = realm["heldout_span_accuracy"]
    out.append(row("REALM held-out span accuracy", accuracy,
                   accuracy is not None and accuracy >= HELDOUT_TARGET, f">= {HELDOUT_TARGET}"))
    worst = min((a["span_accuracy"] for a in realm["per_attribute"].values()
                 if a["span_accuracy"] is not None), default=None)
    out.append(row("REALM worst attribute's held-out span accuracy", worst,
                   worst is not None and worst >= ATTRIBUTE_TARGET, f">= {ATTRIBUTE_TARGET}"))
    out.append(row(f"REALM own-block top-1 after training (step 0: "
                   f"{payload['step0_gold_top1']:.3f})", realm["gold_top1"],
                   realm["gold_top1"] is not None and realm["gold_top1"] >= TOP1_TARGET,
                   f">= {TOP1_TARGET}"))
    follows = (realm.get("knowledge_edit") or {}).get("follows_edit")
    out.append(row("REALM after the edit: held-out predictions that follow the edited block",
                   follows, follows is not None and follows >= EDIT_TARGET, f">= {EDIT_TARGET}"))
  if none:
    value = none["heldout_span_accuracy"]
    out.append(row("No retrieval: held-out span accuracy", value,
                   value is not None and value <= chance_value + NO_RETRIEVAL_MARGIN,
                   f"<= chance + {NO_RETRIEVAL_MARGIN} = {chance_value + NO_RETRIEVAL_MARGIN:.3f}"))
  if realm and frozen:
    accuracy_gain = realm["heldout_span_accuracy"] - frozen["heldout_span_accuracy"]
    top1_gain = realm["gold_top1"] - frozen["gold_top1"]
    out.append(row("REALM with refresh minus the frozen index (held-out accuracy, own-block "
                   "top-1), this warm start (benchmarks.knowledge_staleness varies the interval)",
                   [round(accuracy_gain, 4), round(top1_gain, 4)],
                   max(accuracy_gain, top1_gain) >= REFRESH_MARGIN, f"either >= {REFRESH_MARGIN}"))
  if set(ARMS) <= set(arms):
    out.append(row("The four-arm benchmark's wall time (s)", payload["wall_seconds"],
                   payload["wall_seconds"] <= WALL_TARGET_SECONDS, f"<= {WALL_TARGET_SECONDS}"))
  return out


def targets_markdown(rows: list[dict]) -> list[str]:
  def f(v):
    if isinstance(v, list):
      return " / ".join(f"{x:+.3f}" for x in v)
    return "n/a" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)
  return ["", "| target | goal | measured | met |", "|---|---|---|---|"] + [
      f"| {r['target']} | {r['goal']} | {f(r['value'])} | {'yes' if r['met'] else 'no'} |"
      for r in rows]


def main(argv=None):
  args = parse_args(argv)
  if args.steps % args.curve_every:
    raise SystemExit(f"--steps {args.steps} must be a multiple of --curve_every "
                     f"{args.curve_every}")
  start = time.time()
  payload = run(args)
  payload["wall_seconds"] = round(time.time() - start, 1)
  payload["targets"] = targets(payload)
  print(json.dumps({a: {k: v for k, v in r.items() if k != "train_curve"}
                    for a, r in payload["arms"].items()}, indent=1))
  payload["name"] = args.name
  # Kept with the run, written or not.
  harness.Output(args.name, markdown, plot, directory=payload["work_dir"]).write(payload)
  if not args.no_write:
    log(f"wrote {harness.Output(args.name, markdown, plot).write(payload)}")


if __name__ == "__main__":
  main()
