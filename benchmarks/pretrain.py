"""REALM pre-training at small scale: the paper's Table 2 ablations on this machine.

    python -m benchmarks.pretrain [--arms a,d,b,c,e] [--steps 300] [--batch_size 8]
        [--refresh_every 5] [--stale_factor 30] [--warmup_steps 300] [--ict_steps 0]
        [--news_records 800] [--wiki_x_records 1500] [--heldout_sentences 200]
        [--eval_every 100] [--recall_questions 500] [--tagger_dir DIR | --tagger_epochs 1]
        [--budget_minutes 120] [--work_dir DIR] [--quick] [--fresh]

Arms run in the order given (default: the paper's main comparison, a against d, first), so
a run cut by --budget_minutes loses the least informative arms.

Set-up, as the paper's CC-News row:
  Z  the vital-articles corpus (wikipedia/vital_articles.jsonl, ~13k blocks of 128
     wordpieces): the knowledge corpus every arm retrieves from.
  X  sentences of the BBC news stand-in for CC-News (news/bbc.jsonl, first --news_records
     articles) and of Wikipedia (the first --wiki_x_records vital articles; only the
     source block is excluded from retrieval). Salient spans come from the CoNLL-trained
     tagger (trained here unless --tagger_dir names an export) plus the date regexes;
     sentences with no salient span are skipped (task.pretrain.salient_span_fallback).
  Held out: every document whose uid hashes to 0 mod 10 (news and Wikipedia alike) is
     never trained on; the first --heldout_sentences of its masked sentences are the
     held-out evaluation of every arm (salient spans, fixed masks, same retrieval corpus).
Start, shared by every arm: MiniLM warm start for all towers (all-MiniLM-L6-v2 was trained
for retrieval; --ict_steps > 0 adds an ICT warm start of the retriever first), then an
MLM-head warm-up: MiniLM ships no MLM head, so a fresh head is trained on a frozen encoder
with no retrieval (task.pretrain.trainable=mlm_head) for --warmup_steps; its time and
held-out accuracy are reported. The step-0 index (the start retriever's embeddings of Z)
is computed once and published into every retrieval arm's index directory.
Arms, the same steps, batch, learning rate and start:
  a  REALM, asynchronous refresh: a snapshot every --refresh_every steps for the index
     builder running beside the trainer (it re-embeds Z while training goes on).
  b  REALM, frozen step-0 index (no refresh).
  c  REALM, a stale index: snapshots every --stale_factor x --refresh_every steps.
  d  no retrieval: the null document only (a plain MLM on the same sentences).
  e  REALM with random-span masking instead of salient spans (refreshed as a).
Per arm: held-out masked-span accuracy (whole span right), token accuracy and
log-likelihood (marginal p(y|x), per masked wordpiece) every --eval_every steps and at the
end; retrieval utility and null-document probability over training steps (and held out);
index staleness and refreshes; steps/s; zero-shot recall@5 of its retriever on NQ-Open,
WebQuestions and CuratedTREC questions against Z before (the shared start) and after.
Resumable: each arm checkpoints every --eval_every steps and its result is written to
benchmarks/results/pretrain.json as it finishes; a rerun with the same settings skips
finished arms and resumes a cut one from its checkpoint (prepared data, tagger, warm-up and
start index are reused from --work_dir). Sizes are flags: a user with an accelerator
reruns it larger (e.g. --steps 20000 --batch_size 512 on a TPU, as the paper's 200k).
Results: benchmarks/results/pretrain.{json,md} and pretrain_curves.png.
"""
import argparse
import gc
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import numpy as np
import tensorflow as tf
import tf_keras

from benchmarks import harness
from benchmarks.harness import SHARED_DATA, machine

CONFIG = os.path.join(harness.REPO, "configs", "demo.yaml")
WORK_DIR = os.path.join(tempfile.gettempdir(), "realm_tf_pretrain_bench")
ARMS = {
    "a": "REALM, asynchronous index refresh",
    "b": "REALM, frozen step-0 index",
    "c": "REALM, stale index (refreshed {stale}x less often)",
    "d": "No retrieval (null document only)",
    "e": "REALM, random-span masking (refreshed as a)",
}
RECALL_SETS = {  # zero-shot recall questions, held out as benchmarks.openqa holds them out
    "nq": ("NQ-Open", "openqa/nq_open/train_subset.jsonl", False),
    "wq": ("WebQuestions", "openqa/webquestions/train.jsonl", False),
    "trec": ("CuratedTREC", "openqa/curatedtrec/train.jsonl", True),
}
QUERY_LENGTH, BLOCK_LENGTH, READER_LENGTH = 48, 128, 176  # 48 + 128: whole bodies read
QUICK = dict(steps=4, batch_size=2, refresh_every=2, stale_factor=2, warmup_steps=2,
             news_records=20, wiki_x_records=20, heldout_sentences=4, eval_every=2,
             recall_questions=10, z_records=200, tagger_epochs=0)


log = harness.logger("pretrain-bench")


# ------------------------------------------------------------------------------ data


def train_tagger(work: str, epochs: int) -> str:
  """The CoNLL-2003 salient-span tagger (realm_tf.tagger), trained once into `work`."""
  out = os.path.join(work, f"tagger-{epochs}")
  if _has_export(out):
    return out
  log(f"training the salient-span tagger ({epochs} epoch(s) of CoNLL-2003)")
  subprocess.run([sys.executable, "-m", "realm_tf.tagger", "train", "--conll_dir",
                  os.path.join(SHARED_DATA, "ner", "conll2003"), "--output_dir", out,
                  "--epochs", str(epochs)], check=True)
  return out


def _has_export(path: str) -> bool:
  from realm_tf.io import versioned  # pylint: disable=g-import-not-at-top
  return os.path.isdir(path) and versioned.latest_version(path) is not None


def preprocess(name: str, input_format: str, source: str, output_dir: str, tagger_dir: str,
               max_records: int):
  """beam.preprocess (DirectRunner) into `output_dir`, once."""
  if os.path.exists(os.path.join(output_dir, "manifest.json")):
    return
  from beam import preprocess as beam_preprocess  # pylint: disable=g-import-not-at-top
  log(f"preprocessing {name} (first {max_records or 'all'} records)")
  args = ["--input_format", input_format, "--input", source, "--output_dir", output_dir,
          "--max_block_length", str(BLOCK_LENGTH), "--query_length", str(QUERY_LENGTH),
          "--max_records", str(max_records), "--overwrite"]
  if tagger_dir:
    args += ["--tagger_dir", tagger_dir]
  beam_preprocess.main(args)


def held_out(doc_uid: bytes) -> bool:
  return hashlib.sha256(doc_uid).digest()[0] % 10 == 0


def split_sentences(sources: list[str], out_dir: str, heldout_sentences: int) -> dict:
  """pretraining-* of `sources` → train/ and heldout/ (published), split by document
  (a held-out document's sentences are never trained on); the held-out file keeps its
  first `heldout_sentences` sentences that have a salient span. Done once per `out_dir`
  (harness.cached)."""
  os.makedirs(out_dir, exist_ok=True)
  return harness.cached(os.path.join(out_dir, "split.json"),
                        lambda: _write_split(sources, out_dir, heldout_sentences), log=log)


def _write_split(sources: list[str], out_dir: str, heldout_sentences: int) -> dict:
  from realm_tf.corpus import published, schema  # pylint: disable=g-import-not-at-top
  from realm_tf.data import files as data_files  # pylint: disable=g-import-not-at-top
  counts = dict(train=0, heldout=0, heldout_documents=0, skipped_unsalient_heldout=0)
  docs = set()
  split = dict(train=[], heldout=[])
  for source in sources:
    for record in tf.data.TFRecordDataset(data_files.files(os.path.join(source,
                                                                        "pretraining-*"))):
      parsed = schema.PRETRAINING.parse(record)
      uid = parsed["doc_uid"].numpy()
      if not held_out(uid):
        split["train"].append(record.numpy())
        counts["train"] += 1
      elif counts["heldout"] < heldout_sentences:
        if not len(parsed["salient_span_starts"].numpy()):
          counts["skipped_unsalient_heldout"] += 1
          continue
        split["heldout"].append(record.numpy())
        counts["heldout"] += 1
        docs.add(uid)
  paths = {}
  for name, records in split.items():  # each a published output, as the trainer reads them
    published.publish_records(os.path.join(out_dir, name), dict(pretraining=(records, None)),
                              dict(kind="benchmark_split", sources=sources), overwrite=True)
    paths[f"{name}_file"] = os.path.join(out_dir, name, "pretraining-*")
  counts["heldout_documents"] = len(docs)
  return dict(counts, **paths)


def check_exclusion(z_dir: str, wiki_x_dir: str):
  """Wikipedia sentences must name their source block by an id Z has, or "no trivial
  retrievals" would exclude nothing (ids are content hashes: the same block, same id)."""
  from realm_tf.corpus import schema  # pylint: disable=g-import-not-at-top
  from realm_tf.data import block_store  # pylint: disable=g-import-not-at-top
  from realm_tf.data import files as data_files  # pylint: disable=g-import-not-at-top
  z = set(np.asarray(block_store.BlockStore.from_tfrecords(
      block_store.blocks_pattern(z_dir)).block_ids).tolist())
  files = data_files.files(os.path.join(wiki_x_dir, "pretraining-*"))
  ids = [int(schema.PRETRAINING.parse(r)["block_id"]) for r in tf.data.TFRecordDataset(files)]
  missing = sum(i not in z for i in ids)
  if missing:
    raise RuntimeError(f"{missing} of {len(ids)} Wikipedia sentences of {wiki_x_dir} name a "
                       f"block that is not in Z ({z_dir}): blocks were cut differently")


def recall_questions(work: str, num: int) -> dict:
  """The first `num` of each set after a seeded shuffle (benchmarks.openqa's held-out
  reporting split), as files in `work` (never in the repository)."""
  out = {}
  for key, (name, relative, regex) in RECALL_SETS.items():
    with open(os.path.join(SHARED_DATA, relative), encoding="utf-8") as f:
      lines = [line for line in f if line.strip()]
    random.Random(0).shuffle(lines)
    path = os.path.join(work, f"recall-{key}.jsonl")
    with open(path, "w", encoding="utf-8") as f:
      f.writelines(lines[:num])
    out[key] = dict(name=name, path=path, regex=regex, questions=min(num, len(lines)),
                    source=relative)
  return out


# ----------------------------------------------------------------------------- models


def load_config(overrides: dict, experiment: str = "realm/pretrain"):
  """A stage's registered experiment, then demo.yaml's sizes, then `overrides`."""
  from realm_tf.configs import load_config as load  # pylint: disable=g-import-not-at-top
  return load(CONFIG, [f"{k}={v}" for k, v in overrides.items()], experiment=experiment)


def start_retriever(config, ict_dir: str):
  """The shared start's retriever: MiniLM warm start, or the ICT run's retriever."""
  from realm_tf.io import layout  # pylint: disable=g-import-not-at-top
  from realm_tf.modeling import factory  # pylint: disable=g-import-not-at-top
  retriever = factory.build_retriever(config)
  if ict_dir:
    tf.train.Checkpoint(model=retriever).read(layout.latest_checkpoint(ict_dir)).expect_partial()
  return retriever


def trained_retriever(config, model_dir: str):
  """The retriever of a pre-training run's newest checkpoint."""
  from realm_tf.io import layout  # pylint: disable=g-import-not-at-top
  from realm_tf.modeling import factory  # pylint: disable=g-import-not-at-top
  retriever = factory.build_retriever(config.replace(model=dict(warm_start=dict(source=""))))
  tf.train.Checkpoint(model=tf.train.Checkpoint(retriever=retriever)).read(
      layout.latest_checkpoint(model_dir)).assert_existing_objects_matched().expect_partial()
  return retriever


def index_and_tokenizer(config):
  """The task's KnowledgeIndex over Z (no embeddings yet) and its tokenizer."""
  from realm_tf import tasks  # pylint: disable=g-import-not-at-top
  task = tasks.get_task(config)
  return task.build_index(tf.distribute.get_strategy()), task.tokenizer


def zero_shot_recall(config, retriever, questions: dict) -> tuple[dict, np.ndarray,
                                                                  np.ndarray]:
  """recall@{1,5,20} per question set over Z, Z's embeddings by this retriever [N, P] and
  Z's block ids [N], in the index's row order."""
  from realm_tf.data import openqa_inputs as inputs  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval import recall  # pylint: disable=g-import-not-at-top
  start = time.time()
  index, tokenizer = index_and_tokenizer(config)
  embeddings = recall.embed_corpus(retriever, index, tokenizer, BLOCK_LENGTH)
  index.set_embeddings(embeddings, version=0)
  out = {}
  for key, spec in questions.items():
    examples = inputs.read_questions(spec["path"], spec["regex"])
    out[key] = recall.recall_at(retriever, index, tokenizer, examples, QUERY_LENGTH,
                                regex=spec["regex"])
  out["seconds"] = round(time.time() - start, 1)
  return out, embeddings, np.asarray(index.store.block_ids, np.int64)


def publish_start_index(index_dir: str, block_ids: np.ndarray, embeddings: np.ndarray):
  """The start retriever's embeddings of Z as a committed version 0 of `index_dir` (what
  the index builder would publish for the step-0 snapshot), unless one is there."""
  from realm_tf.io import versioned  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval.index_export import ShardData, write_export  # pylint: disable=g-import-not-at-top
  if versioned.latest_version(index_dir) is not None:
    return
  write_export(index_dir, 0, [ShardData(embeddings, block_ids)], build_scann=False,
               extra=dict(encoder=dict(step=0, committed_at=time.time())))


# ------------------------------------------------------------------------------- runs


def history(model_dir: str) -> tuple[list, list]:
  from realm_tf.io import layout  # pylint: disable=g-import-not-at-top
  records = layout.read_metrics(model_dir)
  return ([r for r in records if r.get("mode") == "pretrain"],
          [r for r in records if r.get("mode") == "eval"])


def same_start(warmup_a: dict, recall_a: dict, warmup_b: dict, recall_b: dict) -> bool:
  """Two starts are the same when the warm-up's held-out figures and the step-0 recall agree
  (times excluded)."""
  keys = ("steps", "heldout_span_accuracy", "heldout_token_accuracy", "heldout_loss")

  def untimed(recall):
    return {k: v for k, v in recall.items() if k != "seconds"}
  return ([warmup_a.get(k) for k in keys] == [warmup_b.get(k) for k in keys]
          and untimed(recall_a) == untimed(recall_b))


def run_warmup(work: str, common: dict, steps: int, batch: int, validation_steps: int) -> dict:
  """The MLM head alone, on a frozen MiniLM, reading no document. Done once per `work`
  (harness.cached: its summary is kept while <work>/warmup holds the finished run)."""
  from realm_tf.io import layout  # pylint: disable=g-import-not-at-top
  model_dir = os.path.join(work, "warmup")
  return harness.cached(
      os.path.join(work, f"warmup-{steps}.json"),
      lambda: _train_warmup(model_dir, common, steps, batch, validation_steps),
      keep=lambda _: layout.training_done(model_dir), log=log)


def _train_warmup(model_dir: str, common: dict, steps: int, batch: int,
                  validation_steps: int) -> dict:
  from realm_tf.training import train_lib  # pylint: disable=g-import-not-at-top
  log(f"MLM-head warm-up: {steps} steps, encoder frozen, no retrieval")
  config = load_config(dict(common, **{
      "trainer.train_steps": steps, "trainer.learning_rate": 1e-3,
      "trainer.warmup_steps": max(1, steps // 10),
      "task.pretrain.train_data.global_batch_size": batch,
      # Only x and [SEP] are read: a short reader input gives the same numbers.
      "model.reader.seq_length": QUERY_LENGTH + 2,
      "trainer.validation_interval": steps, "trainer.checkpoint_interval": steps}),
      experiment="realm/mlm_warmup")
  start = time.time()
  run = train_lib.Run(config, model_dir)
  result = run.train()
  train_seconds = time.time() - start
  _, evals = history(model_dir)
  last = evals[-1] if evals else run.evaluate(validation_steps)
  out = dict(steps=result["step"], seconds=round(train_seconds, 1),
             heldout_span_accuracy=last.get("span_accuracy"),
             heldout_token_accuracy=last.get("mlm_accuracy"),
             heldout_loss=last.get("loss"),
             train_curve=[{k: r.get(k) for k in ("step", "loss", "mlm_accuracy")}
                          for r in history(model_dir)[0]])
  del run
  tf_keras.backend.clear_session()
  gc.collect()
  return out


def arm_overrides(arm: str, args, common: dict, warmup_dir: str, ict_dir: str) -> dict:
  values = dict(common, **{
      "trainer.train_steps": args.steps,
      "task.pretrain.train_data.global_batch_size": args.batch_size,
      "task.pretrain.mlm_init_checkpoint": warmup_dir,
      "trainer.validation_interval": args.eval_every,
      "trainer.checkpoint_interval": args.eval_every,
      "task.pretrain.start_index_builder": True,
      "task.pretrain.refresh_every_steps": args.refresh_every})
  if ict_dir:
    values["task.pretrain.init_checkpoint"] = ict_dir
  if arm == "b":  # the published step-0 index stays: no snapshots, no builder
    values.update({"task.pretrain.refresh_every_steps": 0,
                   "task.pretrain.start_index_builder": False})
  elif arm == "c":
    values["task.pretrain.refresh_every_steps"] = args.refresh_every * args.stale_factor
  elif arm == "d":
    values.update({"task.pretrain.retrieval": False, "task.pretrain.start_index_builder": False,
                   "task.pretrain.refresh_every_steps": 0,
                   "model.reader.seq_length": QUERY_LENGTH + 2})
  elif arm == "e":
    values["task.pretrain.masking"] = "random_spans"
  return values


def run_arm(arm: str, args, work: str, common: dict, warmup_dir: str, ict_dir: str,
            start: dict, questions: dict, validation_steps: int) -> dict:
  from realm_tf.io import layout  # pylint: disable=g-import-not-at-top
  from realm_tf.training import train_lib  # pylint: disable=g-import-not-at-top
  model_dir = os.path.join(work, "arms", arm)
  config = load_config(arm_overrides(arm, args, common, warmup_dir, ict_dir))
  if config.task.pretrain.retrieval:
    publish_start_index(layout.index_dir(model_dir), start["block_ids"], start["embeddings"])
  train_lib.save_params(config, model_dir)  # read by the index builder beside the trainer
  resumed_from = layout.checkpoint_step(model_dir)
  log(f"arm {arm}: {ARMS[arm].format(stale=args.stale_factor)}"
      + (f" (resuming at step {resumed_from})" if resumed_from else ""))
  run = train_lib.Run(config, model_dir)
  if not resumed_from:  # the step-0 held-out evaluation of this arm's start
    run.evaluate(validation_steps)
  wall = time.time()
  result = run.train()
  wall = time.time() - wall
  final_eval = history(model_dir)[1][-1]
  if final_eval.get("step") != run.global_step:
    final_eval = dict(run.evaluate(validation_steps), step=run.global_step)
  train, evals = history(model_dir)
  del run
  tf_keras.backend.clear_session()
  gc.collect()
  if config.task.pretrain.retrieval:
    log(f"arm {arm}: zero-shot recall of its retriever over Z")
    after, _, _ = zero_shot_recall(config, trained_retriever(config, model_dir), questions)
  else:
    after = dict(start["recall"], note="no retrieval: the retriever is not trained")
  tf_keras.backend.clear_session()
  gc.collect()
  loops = [r for r in train if r.get("step", 0) > resumed_from]
  rate = [r["examples_per_second"] for r in loops[1:] or loops]  # the first loop traces
  keys = ("step", "loss", "mlm_accuracy", "span_accuracy", "retrieval_utility",
          "null_document_probability", "index_version", "index_staleness_steps",
          "index_refreshes", "examples_per_second")
  return dict(
      arm=arm, description=ARMS[arm].format(stale=args.stale_factor),
      refresh_every_steps=config.task.pretrain.refresh_every_steps,
      masking=config.task.pretrain.masking, retrieval=config.task.pretrain.retrieval,
      steps=result["step"], train_seconds=round(wall, 1),
      steps_per_second=round(float(np.mean(rate)) / args.batch_size, 3) if rate else None,
      heldout=dict(span_accuracy=final_eval.get("span_accuracy"),
                   token_accuracy=final_eval.get("mlm_accuracy"),
                   log_likelihood=-final_eval["loss"] if "loss" in final_eval else None,
                   retrieval_utility=final_eval.get("retrieval_utility"),
                   null_document_probability=final_eval.get("null_document_probability")),
      index_refreshes=result.get("index_refreshes", 0),
      mean_staleness_steps=(round(float(np.mean([r["index_staleness_steps"] for r in loops
                                                 if "index_staleness_steps" in r])), 1)
                            if any("index_staleness_steps" in r for r in loops) else None),
      recall_after=after,
      train_curve=[{k: r[k] for k in keys if k in r} for r in train],
      eval_curve=[{k: r[k] for k in ("step", "loss", "mlm_accuracy", "span_accuracy",
                                     "retrieval_utility", "null_document_probability")
                   if k in r} for r in evals])


# ---------------------------------------------------------------------------- reports


def stage_seconds(work: str, name: str, seconds: float, minimum: float = 5.0) -> float:
  """A stage's time, measured when it ran; a re-run that found it done (under `minimum`
  seconds) reports the time of the run that did it (kept in <work>/timings.json)."""
  path = os.path.join(work, "timings.json")
  timings = {}
  if os.path.exists(path):
    with open(path) as f:
      timings = json.load(f)
  if seconds >= minimum or name not in timings:
    timings[name] = round(seconds, 1)
    with open(path + ".tmp", "w") as f:
      json.dump(timings, f)
    os.replace(path + ".tmp", path)
  return timings[name]


def _fmt(value, digits=3):
  return "–" if value is None else f"{value:.{digits}f}"


def _acc(value, n: int) -> str:
  """An accuracy over n items with its binomial standard error."""
  if value is None:
    return "–"
  return f"{value:.3f} ± {harness.share_stderr(value, n):.3f}"


def markdown(payload: dict) -> str:
  s, start = payload["settings"], payload.get("start", {})
  warm = payload.get("warmup", {})
  lines = [
      "# REALM pre-training ablations (benchmarks/pretrain.py)", "",
      f"Machine: {payload['machine']['cpu_count']} CPU cores, TensorFlow "
      f"{payload['machine']['tensorflow']}, load average at the end "
      f"{payload['machine']['load_average_1_5_15']}; total {payload['total_minutes']} min"
      + (f" in {len(payload['invocations'])} invocations ("
         + "; ".join(f"{i['minutes']} min: {', '.join(i['arms']) or 'no arm'}"
                     for i in payload["invocations"]) + ")"
         if len(payload.get("invocations", [])) > 1 else "")
      + (" (partial: some arms not run yet)" if payload.get("partial") else "") + "; "
      f"shared start: tagger {payload['data'].get('tagger_seconds')} s, data "
      f"{payload['data'].get('data_seconds')} s.",
      f"Z: {payload['data']['z_blocks']} blocks of the vital-articles corpus. X: "
      f"{payload['data']['train_sentences']} training sentences (BBC news, first "
      f"{s['news_records']} articles; vital articles, first {s['wiki_x_records']}); held out: "
      f"{payload['data']['heldout_sentences']} masked sentences of "
      f"{payload['data']['heldout_documents']} documents never trained on. Salient spans: "
      f"{payload['data']['salient_spans']}.",
      f"Every arm: {s['steps']} steps of batch {s['batch_size']} from the same start "
      f"(MiniLM{' + ICT' if s['ict_steps'] else ''}; MLM head warmed up for "
      f"{s['warmup_steps']} steps in {warm.get('seconds', '–')} s, reaching held-out span "
      f"accuracy {_fmt(warm.get('heldout_span_accuracy'))} with no retrieval), "
      f"{s['num_candidates']} candidates (the null document included), refresh every "
      f"{s['refresh_every']} steps in a and e, every {s['refresh_every'] * s['stale_factor']} "
      f"in c.", "",
      "| arm | held-out span acc. | token acc. | log-lik. / token | retrieval utility "
      "(held out) | p(null) | refreshes | mean staleness (steps) | steps/s | "
      "R@5 NQ / WQ / TREC after |",
      "|---|---|---|---|---|---|---|---|---|---|"]
  before = start.get("recall", {})
  n = payload["data"]["heldout_sentences"]
  step0 = next((r["eval_curve"][0] for _, r in sorted(payload["arms"].items())
                if r.get("retrieval") and r.get("eval_curve")
                and r["eval_curve"][0].get("step") == 0), None)
  if step0:
    lines.append(
        f"| start (step 0, with retrieval) | {_acc(step0['span_accuracy'], n)} | "
        f"{_fmt(step0['mlm_accuracy'])} | {_fmt(-step0['loss'])} | "
        f"{_fmt(step0['retrieval_utility'])} | {_fmt(step0['null_document_probability'])} | "
        "– | – | – | " + " / ".join(_fmt(before.get(k, {}).get("recall@5"))
                                    for k in RECALL_SETS) + " |")
  lines.append(
      f"| start (step 0, null document only) | "
      f"{_acc(warm.get('heldout_span_accuracy'), n)} | "
      f"{_fmt(warm.get('heldout_token_accuracy'))} | "
      f"{_fmt(-warm['heldout_loss'] if warm.get('heldout_loss') is not None else None)} | "
      "0 | 1 | – | – | – | – |")
  for arm in sorted(payload["arms"]):
    r = payload["arms"][arm]
    h = r["heldout"]
    after = r["recall_after"]
    lines.append(
        f"| {arm}: {r['description']} | {_acc(h['span_accuracy'], n)} | "
        f"{_fmt(h['token_accuracy'])} | {_fmt(h['log_likelihood'])} | "
        f"{_fmt(h['retrieval_utility'])} | {_fmt(h['null_document_probability'])} | "
        f"{r['index_refreshes']} | {_fmt(r['mean_staleness_steps'], 1)} | "
        f"{_fmt(r['steps_per_second'], 3)} | "
        + " / ".join(_fmt(after.get(k, {}).get("recall@5")) for k in RECALL_SETS) + " |")
  for rebuilt in payload.get("rebuilt_starts", []):
    arms = rebuilt["arms"]
    said = (f"{'Arm' if len(arms) == 1 else 'Arms'} {', '.join(arms) or '(none yet)'} ran "
            f"from a start rebuilt on "
            f"{rebuilt['started'][:10]} (the earlier work directory was lost)")
    if rebuilt.get("same_as_kept"):
      lines += ["", f"{said}; it is identical to the kept arms' start: the same warm-up "
                f"held-out loss ({rebuilt['warmup'].get('heldout_loss'):.6f}) and span "
                "accuracy, the same step-0 recall."]
      continue
    lines += ["", f"{said}: warm-up held-out span accuracy {_fmt(rebuilt['warmup'].get('heldout_span_accuracy'))} "
              f"(kept start {_fmt(warm.get('heldout_span_accuracy'))}), step-0 R@5 "
              + " / ".join(_fmt(rebuilt["recall"].get(k, {}).get("recall@5"))
                           for k in RECALL_SETS)
              + " (kept start " + " / ".join(_fmt(before.get(k, {}).get("recall@5"))
                                             for k in RECALL_SETS)
              + "); each arm's own step-0 row is in its eval curve."]
  missing = [f"{arm}: {text.format(stale=s['stale_factor'])}" for arm, text in ARMS.items()
             if arm not in payload["arms"]]
  if missing:
    lines += ["", "Not run: " + "; ".join(missing) + "."]
  lines += ["", f"Span accuracy is over the {n} held-out sentences, ± one binomial standard "
            "error; the log-likelihood is per masked wordpiece, of the marginal p(y|x)."]
  lines += ["", "Curves: pretrain_curves.png (held-out span accuracy and retrieval utility "
            "over steps; training retrieval utility, p(null) and staleness).", ""]
  return "\n".join(lines)


def plot(payload: dict, path: str):
  harness.plot_arm_curves(
      dict(sorted(payload["arms"].items())),
      [("eval_curve", "span_accuracy", "held-out span accuracy"),
       ("eval_curve", "loss", "held-out −log p(y|x) per wordpiece"),
       ("eval_curve", "retrieval_utility", "held-out retrieval utility"),
       ("train_curve", "retrieval_utility", "training retrieval utility"),
       ("train_curve", "null_document_probability", "training p(null document)"),
       ("train_curve", "index_staleness_steps", "index staleness (steps)")],
      path, "REALM pre-training ablations (benchmarks/pretrain.py)", grid=(2, 3),
      figsize=(15, 8), dpi=90, point_curves=("eval_curve",))


# ------------------------------------------------------------------------------- main


def render(results_path: str) -> int:
  """Redraws the table and the curves from a result (after a change to the report code).
  A rebuilt start that records no `same_as_kept` is compared with the kept one here."""
  output = harness.output_at(results_path, markdown, plot)
  payload = output.read()
  for rebuilt in payload.get("rebuilt_starts", []):
    rebuilt.setdefault("same_as_kept", same_start(payload["warmup"], payload["start"]["recall"],
                                                  rebuilt["warmup"], rebuilt["recall"]))
  output.write(payload)
  log(f"redrew {output.markdown_path} and the curves")
  return 0


# Flags that say how or where to run, not what is measured: arms of invocations that differ
# only in these are one result.
RUN_FLAGS = ("arms", "work_dir", "quick", "fresh", "tagger_dir", "budget_minutes", "render")


def result_settings(args) -> dict:
  """The settings finished arms are kept under: every flag but RUN_FLAGS."""
  return {k: v for k, v in vars(args).items() if k not in RUN_FLAGS}


def flag_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--arms", default="a,d,b,c,e")
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--batch_size", type=int, default=8)
  parser.add_argument("--num_candidates", type=int, default=5,
                      help="k retrieved + the null document")
  parser.add_argument("--learning_rate", type=float, default=5e-5)
  parser.add_argument("--refresh_every", type=int, default=5)
  parser.add_argument("--stale_factor", type=int, default=30)
  parser.add_argument("--warmup_steps", type=int, default=300)
  parser.add_argument("--warmup_batch_size", type=int, default=32)
  parser.add_argument("--ict_steps", type=int, default=0)
  parser.add_argument("--news_records", type=int, default=800)
  parser.add_argument("--wiki_x_records", type=int, default=1500)
  parser.add_argument("--z_records", type=int, default=0, help="vital articles in Z (0: all)")
  parser.add_argument("--heldout_sentences", type=int, default=200)
  parser.add_argument("--eval_every", type=int, default=100)
  parser.add_argument("--recall_questions", type=int, default=500)
  parser.add_argument("--tagger_dir", default="", help="an exported tagger (else trained)")
  parser.add_argument("--tagger_epochs", type=int, default=1,
                      help="epochs when the tagger is trained here (0: dates only)")
  parser.add_argument("--budget_minutes", type=float, default=120.0,
                      help="arms that would end after this are skipped and listed")
  parser.add_argument("--work_dir", default=WORK_DIR)
  parser.add_argument("--quick", action="store_true",
                      help="a smoke run with tiny sizes (results in the work dir only)")
  parser.add_argument("--fresh", action="store_true", help="ignore finished arms")
  parser.add_argument("--render", action="store_true",
                      help="only redraw pretrain.md and the curves from pretrain.json")
  return parser


def parse_args(argv=None):
  args = flag_parser().parse_args(argv)
  if args.quick:
    for key, value in QUICK.items():
      setattr(args, key, value)
    if args.work_dir == WORK_DIR:
      args.work_dir = WORK_DIR + "_quick"
  return args


def run(args, output: harness.Output) -> str:
  """The shared data and start, then every arm of args.arms, `output` rewritten after each;
  returns the result's path."""
  work = args.work_dir
  os.makedirs(work, exist_ok=True)
  begin = time.time()
  settings = result_settings(args)

  # Data: tagger, Z, X (news + Wikipedia), the held-out split, recall questions.
  stage = time.time()
  tagger = args.tagger_dir or (train_tagger(work, args.tagger_epochs)
                               if args.tagger_epochs else "")
  tagger_seconds = time.time() - stage
  from realm_tf.pipelines.corpus_blocks import prepare_blocks  # pylint: disable=g-import-not-at-top
  vital = os.path.join(SHARED_DATA, "wikipedia", "vital_articles.jsonl")
  if args.z_records:
    vital_subset = os.path.join(work, f"vital-{args.z_records}.jsonl")
    with open(vital, encoding="utf-8") as f, open(vital_subset, "w", encoding="utf-8") as out:
      out.writelines(line for _, line in zip(range(args.z_records), f))
    vital = vital_subset
  stage = time.time()
  z_dir = os.path.join(work, "z")
  prepare_blocks(vital, z_dir, BLOCK_LENGTH)
  with open(os.path.join(z_dir, "manifest.json")) as f:
    z_blocks = json.load(f)["counts"]["blocks"]
  tag = "tagged" if tagger else "dates"
  preprocess("news", "ccnews", os.path.join(SHARED_DATA, "news", "bbc.jsonl"),
             os.path.join(work, f"x-news-{tag}-{args.news_records}"), tagger,
             args.news_records)
  preprocess("wikipedia X", "jsonl", vital,
             os.path.join(work, f"x-wiki-{tag}-{args.wiki_x_records}"), tagger,
             args.wiki_x_records)
  split = split_sentences(
      [os.path.join(work, f"x-news-{tag}-{args.news_records}"),
       os.path.join(work, f"x-wiki-{tag}-{args.wiki_x_records}")],
      os.path.join(work, f"x-split-{tag}-{args.news_records}-{args.wiki_x_records}-"
                         f"{args.heldout_sentences}"), args.heldout_sentences)
  data_seconds = time.time() - stage
  check_exclusion(z_dir, os.path.join(work, f"x-wiki-{tag}-{args.wiki_x_records}"))
  questions = recall_questions(work, args.recall_questions)
  validation_steps = max(1, split["heldout"] // args.batch_size)
  common = {
      "index.blocks": z_dir,
      "task.pretrain.train_data.input_path": split["train_file"],
      "task.pretrain.validation_data.input_path": split["heldout_file"],
      "task.pretrain.validation_data.global_batch_size": args.batch_size,
      "task.pretrain.num_candidates": args.num_candidates,
      "task.pretrain.max_predictions_per_seq": 10,
      "model.retriever.query_seq_length": QUERY_LENGTH,
      "model.retriever.block_seq_length": BLOCK_LENGTH,
      "model.reader.seq_length": READER_LENGTH,
      "trainer.learning_rate": args.learning_rate, "trainer.warmup_steps": 30,
      "trainer.summary_interval": 5, "trainer.steps_per_loop": 5,
      "trainer.validation_steps": validation_steps, "trainer.max_to_keep": 2,
      "index.backend": "exact", "index.num_shards": 1, "index.poll_seconds": 2.0,
  }
  data = dict(z_blocks=z_blocks, train_sentences=split["train"],
              heldout_sentences=split["heldout"], heldout_documents=split["heldout_documents"],
              salient_spans="CoNLL tagger + dates" if tagger else "dates only",
              tagger_seconds=stage_seconds(work, "tagger", tagger_seconds),
              data_seconds=stage_seconds(work, "data", data_seconds))
  data["recall_questions"] = {k: dict(name=v["name"], questions=v["questions"],
                                      source=v["source"]) for k, v in questions.items()}

  # The shared start: optional ICT, the MLM-head warm-up, the step-0 index and recall.
  ict_dir = ""
  if args.ict_steps:
    from realm_tf.io import layout  # pylint: disable=g-import-not-at-top
    from realm_tf.training import train_lib  # pylint: disable=g-import-not-at-top
    ict_dir = os.path.join(work, f"ict-{args.ict_steps}")
    if not layout.training_done(ict_dir):
      log(f"ICT warm start: {args.ict_steps} steps")
      train_lib.run_experiment(load_config(dict(common, **{
          "task.ict.train_data.input_path": os.path.join(z_dir, "ict-*"),
          "task.ict.train_data.global_batch_size": 16,
          "trainer.train_steps": args.ict_steps}), experiment="realm/ict"), ict_dir)
  start_path = os.path.join(work, f"start-{'ict' if ict_dir else 'minilm'}")
  warmup = run_warmup(work, common, args.warmup_steps, args.warmup_batch_size,
                      validation_steps)
  base_config = load_config(common)

  def start_recall() -> dict:
    log("zero-shot recall of the start retriever over Z (and the step-0 index)")
    recall, embeddings, block_ids = zero_shot_recall(
        base_config, start_retriever(base_config, ict_dir), questions)
    np.savez(start_path + ".npz", embeddings=embeddings, block_ids=block_ids)
    tf_keras.backend.clear_session()
    gc.collect()
    return recall

  # The step-0 index beside its recall (.npz), which the JSON, written last, says is whole.
  before = harness.cached(start_path + ".json", start_recall, log=log)
  with np.load(start_path + ".npz", allow_pickle=False) as saved:
    embeddings, block_ids = saved["embeddings"], saved["block_ids"]
  start = dict(recall=before, embeddings=embeddings, block_ids=block_ids)
  # When this work directory's start was built: an invocation records it, so a start built
  # after the kept arms ran (a new machine) is told from theirs even if the invocation that
  # rebuilt it was cut before finishing an arm.
  start_built = time.strftime("%Y-%m-%dT%H:%M:%S%z",
                              time.localtime(os.path.getmtime(start_path + ".npz")))

  # The arms: those of an earlier run with the same settings are kept.
  earlier = harness.kept_result(output, settings, fresh=args.fresh, log=log)
  done = earlier.get("arms", {})
  arms = dict(done)
  # Every invocation's wall time and arms, so a run made in several goes reports its total.
  invocations = list(earlier.get("invocations", [])) if done else []
  this_run = dict(started=time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(begin)),
                  minutes=0.0, arms=[], start_built=start_built)
  invocations.append(this_run)
  # A work directory lost between invocations (a new machine) means the warm-up and the
  # step-0 index are rebuilt: the kept arms' start stays the reported one and the rebuilt
  # start is recorded beside it with the arms that ran from it, so the two can be compared.
  rebuilt_starts = list(earlier.get("rebuilt_starts", [])) if done else []
  if done and start_built not in {i.get("start_built") for i in invocations[:-1]}:
    same = same_start(earlier.get("warmup", {}), earlier.get("start", {}).get("recall", {}),
                      warmup, before)
    rebuilt_starts.append(dict(started=this_run["started"], arms=this_run["arms"],
                               same_as_kept=same,
                               warmup={k: v for k, v in warmup.items() if k != "train_curve"},
                               recall=before))
    warmup, before = earlier["warmup"], earlier["start"]["recall"]
    log("the start was rebuilt: " + ("identical to the kept arms' start" if same else
                                     "it differs from the kept arms' start; both are reported"))

  def payload(partial: bool) -> dict:
    this_run["minutes"] = round((time.time() - begin) / 60, 1)
    return dict(machine=machine(), partial=partial or set(arms) != set(ARMS),
                settings=settings,
                total_minutes=round(sum(i["minutes"] for i in invocations), 1),
                invocations=invocations, data=data,
                warmup={k: v for k, v in warmup.items()},
                start=dict(recall=before), rebuilt_starts=rebuilt_starts, arms=arms,
                skipped=runner.skipped)

  runner = harness.Arms(lambda partial: output.write(payload(partial)), args.budget_minutes,
                        started=begin)
  for arm in runner.due(args.arms.split(","), kept=done,
                        label=lambda a: f"{a}: {ARMS[a].format(stale=args.stale_factor)}"):
    arms[arm] = run_arm(arm, args, work, common, os.path.join(work, "warmup"), ict_dir, start,
                        questions, validation_steps)
    this_run["arms"].append(arm)
    arms[arm]["total_seconds"] = round(runner.arm_seconds(), 1)
    log(f"arm {arm}: {json.dumps(arms[arm]['heldout'])}")
  return runner.finish()


def main(argv=None) -> int:
  args = parse_args(argv)
  # A smoke (--quick) writes into its work directory, never over the committed results.
  output = (harness.Output("pretrain.quick", markdown, plot, directory=args.work_dir)
            if args.quick else harness.Output("pretrain", markdown, plot))
  if args.render:
    return render(output.json_path)
  log(f"wrote {run(args, output)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
