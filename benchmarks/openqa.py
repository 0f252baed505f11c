"""Open-QA quality benchmark: the paper's Tables 1-2 at this machine's scale.

    python -m benchmarks.openqa [--datasets squad,nq,wq,trec] [--rows bm25,dense,...]
                                [--budget_minutes 115] [--train_steps 300] [--batch_size 8]
                                [--gold_steps -1] [--retriever_beam 100]
                                [--eval_questions 0] [--heldout_questions 500]
                                [--pretrain_steps 50] [--quick] [--fresh]
                                [--merge [--pretrained_dir DIR]] [--work_dir DIR --keep_work]

Resumable: every finished row is written to benchmarks/results/openqa.json (and the .md
table) at once, and a rerun with the same sizes skips the rows already there (--fresh
starts over). The work directory is fixed (--work_dir, default WORK_DIR) so a rerun also
reuses the prepared corpora, the REALM pre-training run, the indexes, and a cut row's
checkpoints (it resumes from its newest one).

Recipe per row: configs/demo.yaml's retriever scoring (MiniLM mean pooling,
384-d, L2-normalised, scale 20); ORQA fine-tuning (answer logits = span score + retrieval
score, retriever loss over a --retriever_beam beam labelled by answer match on the whole
block); a reading-comprehension stage on gold blocks first (--gold_steps, SQuAD-open only:
its questions carry their article's title); the span head at 10x the learning rate; reader
input long enough for whole block bodies. Each row also reports the step-0 (zero-shot)
recall@k of its retriever over the same blocks and reporting questions.

Datasets (../shared/data/openqa; the questions are never copied into the repository):
  squad  SQuAD-open: corpus squad_open/corpus.jsonl; train on train.jsonl, report dev.jsonl.
  nq, wq, trec  NQ-Open, WebQuestions, CuratedTREC (regex answers): corpus
         wikipedia/vital_articles.jsonl; each train file is shuffled once (seed 0), the first
         --heldout_questions (500) are held out for reporting and training samples the rest.
Rows, each fine-tuned the same way (same reader architecture, steps, batch, learning rate):
  bm25          BM25 (bm25s) top-k + MiniLM reader
  dense         MiniLM warm start for both towers and the reader, no REALM pre-training
  dense_squad_reader  dense, but the reader (BERT and span head) starts from the finished
                SQuAD-open dense row's (task.openqa.init_from=openqa_reader): NQ-Open,
                WebQuestions and CuratedTREC name no article, so their readers get no
                reading-comprehension stage of their own; this one had SQuAD-open's
  realm         retriever and reader BERT from a short REALM pre-training run (below)
  realm_refresh realm, plus the document tower trained and the index re-embedded during
                fine-tuning (beam.index_builder beside the trainer)
REALM pre-training is run here first (configs/demo.yaml with the overrides in the
results): salient-span masking with the dates-only fallback (no NER tagger is exported),
the null document, no trivial retrievals and asynchronous index refresh, on the SQuAD-open
corpus as both X and Z; the model then fine-tunes against either corpus.

Sizes are flags. The defaults aim at about two hours alone on the 2-core machine (a
6-layer MiniLM, 384 hidden; readers of 160 wordpieces; a few hundred steps over a sample of
the training questions; the whole SQuAD-open dev split and 500 held-out questions of each
other set); a smaller --train_steps or --datasets fits less time. Times are
wall seconds on this (shared) machine: `finetune_s` is the training loop, `eval_s` the
evaluation, `index_s` embedding the corpus when the row had to (a shared index is built
once per document encoder and corpus, and charged to the first row that needs it).
Rows run dataset by dataset, except the refresh rows on the 12,912-block vital corpus,
which run last (each refresh re-embeds the whole corpus beside the trainer); a row that
would end after --budget_minutes is skipped and listed as such in the table. --merge adds
rows of a later invocation (for example the skipped ones, reusing its --pretrained_dir) to
the committed results, and the table lists every invocation's time.
Results: benchmarks/results/openqa.json and openqa.md.
"""
import argparse
import gc
import json
import os
import random
import shutil
import sys
import tempfile
import time

import tensorflow as tf
import tf_keras

from benchmarks import harness
from benchmarks.harness import SHARED_DATA, machine
from realm_tf.configs import load_config
from realm_tf.io import layout, versioned
from realm_tf.modeling import factory
from realm_tf.training import train_lib

CONFIG = os.path.join(harness.REPO, "configs", "demo.yaml")
TRAIN_STEPS, BATCH, HELDOUT_QUESTIONS = 300, 8, 500
WORK_DIR = os.path.join(tempfile.gettempdir(), "realm_tf_openqa_bench")
log = harness.logger("openqa")
QUICK = dict(TRAIN_STEPS=4, BATCH=2, EVAL_QUESTIONS=6, HELDOUT_QUESTIONS=6, PRETRAIN_STEPS=2,
             CORPUS_DOCS=150, GOLD_STEPS=2, RETRIEVER_BEAM=20)

DATASETS = {
    "squad": dict(name="SQuAD-open", corpus="squad", train="openqa/squad_open/train.jsonl",
                  eval="openqa/squad_open/dev.jsonl", regex=False),
    "nq": dict(name="NQ-Open", corpus="vital", train="openqa/nq_open/train_subset.jsonl",
               regex=False),
    "wq": dict(name="WebQuestions", corpus="vital", train="openqa/webquestions/train.jsonl",
               regex=False),
    "trec": dict(name="CuratedTREC", corpus="vital", train="openqa/curatedtrec/train.jsonl",
                 regex=True),
}
CORPORA = {"squad": "openqa/squad_open/corpus.jsonl", "vital": "wikipedia/vital_articles.jsonl"}
ROWS = {
    "bm25": "BM25 + reader",
    "dense": "Dense (MiniLM warm start, no REALM pre-training) + reader",
    "dense_squad_reader": "Dense (MiniLM warm start) + reader started from the SQuAD-open "
                          "dense row's",
    "realm": "REALM pre-trained + reader",
    "realm_refresh": "REALM pre-trained + reader, index refreshed during fine-tuning",
}

# Fine-tuning: the realm/openqa experiment, demo.yaml, then these overrides for every row
# (task.type repeats the experiment's: the dict is part of the recorded settings).
FINETUNE_OVERRIDES = {
    "task.type": "openqa",
    "task.openqa.num_candidates": 5, "task.openqa.query_seq_length": 32,
    # 32 + the longest body (125 wordpieces of a 128-wordpiece block) + [SEP]: bodies whole.
    "task.openqa.reader_seq_length": 160, "task.openqa.max_answers": 8,
    "task.openqa.loss": "orqa", "trainer.head_learning_rate_multiplier": 10.0,
    "task.openqa.validation_data.global_batch_size": 16,
    "task.openqa.refresh_every_steps": 20,
    "trainer.learning_rate": 5e-5, "trainer.warmup_steps": 20,
    "trainer.summary_interval": 10, "trainer.steps_per_loop": 10,
    "index.backend": "exact", "index.num_shards": 1,
}
# REALM pre-training: the realm/pretrain experiment, demo.yaml, then these overrides.
PRETRAIN_STEPS = 50
PRETRAIN_OVERRIDES = {
    "task.type": "pretrain", "task.pretrain.train_data.global_batch_size": 4,
    "trainer.learning_rate": 5e-5, "trainer.warmup_steps": 6,
    "trainer.summary_interval": 10, "trainer.steps_per_loop": 5,
    "trainer.checkpoint_interval": 25,
    "task.pretrain.num_candidates": 4, "task.pretrain.refresh_every_steps": 25,
    "task.pretrain.start_index_builder": True,
    "index.poll_seconds": 2.0, "model.retriever.query_seq_length": 48,
    "model.reader.seq_length": 128, "index.backend": "exact", "index.num_shards": 1,
}


def _setting(values: dict, key: str, old_key: str):
  """A setting by its config key, else by `old_key`: the name a kept result may record it
  under (rows of several invocations share one result)."""
  return values[key] if key in values else values[old_key]


def _overrides(values: dict) -> list[str]:
  return [f"{k}={v}" for k, v in values.items()]


def _read_jsonl(path):
  with open(path, encoding="utf-8") as f:
    return [line for line in f if line.strip()]


def _write_lines(path, lines):
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(lines)
  return path


def question_files(work: str, key: str, num_train: int, num_eval: int,
                   num_heldout: int = HELDOUT_QUESTIONS) -> dict:
  """Train / report files in `work` (outside the repository). Sets with a dev split report
  on `num_eval` of it (0: all of it); the others hold out their first `num_heldout`."""
  spec = DATASETS[key]
  rng = random.Random(0)
  train = _read_jsonl(os.path.join(SHARED_DATA, spec["train"]))
  if "eval" in spec:
    report = _read_jsonl(os.path.join(SHARED_DATA, spec["eval"]))
    if num_eval and num_eval < len(report):
      rng.shuffle(report)
      report = report[:num_eval]
      split = f"{spec['eval']} ({num_eval} sampled)"
    else:
      split = f"{spec['eval']} (all)"
    pool = train
  else:
    rng.shuffle(train)
    report, pool = train[:num_heldout], train[num_heldout:]
    split = f"held out: the first {num_heldout} of {spec['train']} after a seeded shuffle"
  pool = list(pool)
  rng.shuffle(pool)
  return dict(train=_write_lines(os.path.join(work, f"{key}-train.jsonl"), pool[:num_train]),
              eval=_write_lines(os.path.join(work, f"{key}-eval.jsonl"), report),
              num_train=min(num_train, len(pool)), num_eval=len(report), report_split=split,
              train_pool=len(pool))


def prepare_corpora(work: str, block_length: int, max_docs: int = 0) -> dict:
  """Each corpus into blocks; `max_docs` keeps only the first documents (--quick)."""
  from realm_tf.pipelines.corpus_blocks import prepare_blocks  # pylint: disable=g-import-not-at-top
  out = {}
  for key, relative in CORPORA.items():
    start = time.time()
    directory = os.path.join(work, "corpora", key)
    source = os.path.join(SHARED_DATA, relative)
    if max_docs:
      source = _write_lines(os.path.join(work, f"{key}-corpus.jsonl"),
                            _read_jsonl(source)[:max_docs])
    prepare_blocks(source, directory, block_length)
    with open(os.path.join(directory, "manifest.json")) as f:
      blocks = json.load(f)["counts"]["blocks"]
    out[key] = dict(dir=directory, file=relative, blocks=blocks,
                    preprocess_s=round(time.time() - start, 1))
  return out


def pretrain(work: str, corpus_dir: str, steps: int) -> dict:
  """A short REALM pre-training run (MiniLM warm start) on one corpus; a finished one in
  `work` is reused (its summary file, harness.cached), a cut one resumes from its
  checkpoint."""
  model_dir = os.path.join(work, "realm_pretrain")
  summary = harness.cached(os.path.join(work, f"realm_pretrain-{steps}.json"),
                           lambda: _pretrain(model_dir, corpus_dir, steps),
                           keep=lambda _: layout.training_done(model_dir), log=log)
  return dict(summary, model_dir=model_dir)


def _pretrain(model_dir: str, corpus_dir: str, steps: int) -> dict:
  overrides = dict(PRETRAIN_OVERRIDES, **{
      "trainer.train_steps": steps, "index.blocks": corpus_dir,
      "task.pretrain.train_data.input_path": os.path.join(corpus_dir, "pretraining-*")})
  config = load_config(CONFIG, _overrides(overrides), experiment="realm/pretrain")
  start = time.time()
  result = train_lib.run_experiment(config, model_dir, tf.distribute.get_strategy())
  history = [r for r in layout.read_metrics(model_dir) if r.get("mode") == "pretrain"]
  out = dict(model_dir=model_dir, seconds=round(time.time() - start, 1), steps=result["step"],
             overrides=overrides, index_refreshes=result["index_refreshes"],
             first_loss=history[0]["loss"], last_loss=history[-1]["loss"],
             last_retrieval_utility=history[-1].get("retrieval_utility"),
             corpus="SQuAD-open corpus (X and Z)")
  return out


def zero_shot_recall(config, index_dir: str, eval_file: str, regex: bool) -> dict:
  """Step-0 recall@k of the row's retriever, before any fine-tuning: the initial query
  tower (warm start or REALM pre-training) against the row's first index (built from the
  initial document tower), or BM25, over the reporting questions."""
  from realm_tf import tasks  # pylint: disable=g-import-not-at-top
  from realm_tf.data import openqa_inputs as inputs  # pylint: disable=g-import-not-at-top
  from realm_tf.text import answers  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval.bm25 import BM25Retriever  # pylint: disable=g-import-not-at-top
  from realm_tf.tasks.openqa_evaluation import RECALL_AT  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval import recall  # pylint: disable=g-import-not-at-top
  start = time.time()
  task = tasks.get_task(config)
  examples = inputs.read_questions(eval_file, regex)
  if config.task.openqa.retrieval == "bm25":
    from realm_tf.data import block_store  # pylint: disable=g-import-not-at-top
    store = block_store.BlockStore.from_tfrecords(block_store.blocks_pattern(
        config.index.blocks))
    block_ids, _ = BM25Retriever(store).search([e.question for e in examples],
                                               max(RECALL_AT))
    row_of = {int(b): i for i, b in enumerate(store.block_ids)}
    hits = [[answers.contains_answer(store.text_strings[row_of[int(b)]], e.answers, regex)
             for b in ids] for e, ids in zip(examples, block_ids)]
    found = {f"recall@{n}": sum(any(h[:n]) for h in hits) / len(hits) for n in RECALL_AT}
  else:
    model = task.build_model()
    task.initialize(model)
    index = task.build_index(tf.distribute.get_strategy())
    index.swap(versioned.list_versions(index_dir)[0])  # the step-0 document tower's index
    found = recall.recall_at(model.retriever, index, task.tokenizer, examples,
                             config.task.openqa.query_seq_length, ks=RECALL_AT, regex=regex)
  out = {f"step0_recall_at_{n}": found[f"recall@{n}"] for n in RECALL_AT}
  out["step0_s"] = round(time.time() - start, 1)
  return out


def finetune_row(work, row, key, files, corpus, pretrained, steps, batch, gold_steps=-1,
                 retriever_beam=100) -> dict:
  spec = DATASETS[key]
  model_dir = os.path.join(work, "runs", f"{key}-{row}")
  if gold_steps < 0:  # a third of the steps on gold blocks where questions name their article
    gold_steps = steps // 3 if "eval" in spec else 0
  values = dict(FINETUNE_OVERRIDES, **{
      "trainer.train_steps": steps, "task.openqa.train_data.global_batch_size": batch,
      "task.openqa.gold_block_steps": gold_steps,
      "task.openqa.retriever_beam": retriever_beam,
      # Checkpoints every 50 steps: a cut row resumes from its newest one.
      "trainer.checkpoint_interval": min(steps, 50), "index.blocks": corpus["dir"],
      "task.openqa.train_data.input_path": files["train"],
      "task.openqa.validation_data.input_path": files["eval"],
      "task.openqa.answer_regex": spec["regex"]})
  encoder = "minilm"
  if row == "bm25":
    values["task.openqa.retrieval"] = "bm25"
  reader_from = None
  if row == "dense_squad_reader":  # schedule() gives SQuAD-open no row of this kind
    source_reader = os.path.join(work, "runs", "squad-dense")
    if not layout.training_done(source_reader):
      raise SystemExit(f"the dense_squad_reader row starts from the SQuAD-open dense row's "
                       f"reader: {source_reader} holds no finished run (run --datasets squad "
                       f"--rows dense with the same --work_dir first)")
    values.update({"task.openqa.init_from": "openqa_reader",
                   "task.openqa.init_checkpoint": source_reader})
    reader_from = dict(run="squad-dense", checkpoint=os.path.basename(
        layout.latest_checkpoint(source_reader)))
  if row.startswith("realm"):
    values.update({"task.openqa.init_from": "realm",
                   "task.openqa.init_checkpoint": pretrained})
    encoder = "realm"
  index_dir = os.path.join(work, "index", f"{encoder}-{spec['corpus']}")
  index_built_here = (row in ("dense", "dense_squad_reader", "realm")
                      and not os.path.isdir(index_dir))
  if row == "realm_refresh":
    # Starts from the pre-trained document encoder's index (the realm row built it); the
    # index builder then writes refreshed versions into this run's own index directory.
    values["task.openqa.refresh_index"] = True
    if os.path.isdir(index_dir) and not os.path.isdir(os.path.join(model_dir, "index")):
      shutil.copytree(index_dir, os.path.join(model_dir, "index"))
    else:
      index_built_here = True
  elif row != "bm25":
    values["index.index_dir"] = index_dir
  config = load_config(CONFIG, _overrides(values), experiment="realm/openqa")
  strategy = tf.distribute.get_strategy()
  start = time.time()
  train_lib.save_params(config, model_dir)  # read by the index builder beside the trainer
  # Trained without evaluation; the reporting set is evaluated once at the end, timed.
  run = train_lib.Run(config, model_dir, strategy, evaluate=False)
  setup_seconds = time.time() - start
  train_start = time.time()
  result = run.train()
  train_seconds = result["train_seconds"]
  # A row that builds its first index does so before its first step (task.start_index): the
  # index's commit time splits that from the training loop.
  index_seconds = 0.0
  if index_built_here:
    first = versioned.list_versions(layout.index_dir(model_dir, config.index.index_dir))[0]
    index_seconds = max(0.0, first.manifest["committed_at"] - train_start)
  c = config.task.openqa
  train_set = run.task.qa_set(c.train_data.input_path, c.train_data.max_examples)
  train_located = train_set.located
  gold_found = (float((train_set.gold_rows >= 0).mean())
                if train_set.gold_rows is not None else 0.0)
  history = [r for r in layout.read_metrics(model_dir) if r.get("mode") == "openqa"]
  parameters = factory.count_parameters(run.model)
  eval_start = time.time()
  ev, _ = train_lib.evaluate_checkpoint(config, model_dir, strategy=strategy)
  eval_seconds = time.time() - eval_start
  total = time.time() - start
  step0 = {}
  if row != "realm_refresh":  # its retriever starts as the realm row's
    first_index = layout.index_dir(model_dir, config.index.index_dir)
    step0 = zero_shot_recall(config, first_index, files["eval"], spec["regex"])
  out = dict(dataset=spec["name"], row=row, description=ROWS[row], **step0,
             gold_block_steps=c.gold_block_steps, train_gold_found=gold_found,
             train_history=[{k: r.get(k) for k in ("step", "loss", "reader_loss",
                                                   "retriever_loss", "span_accuracy",
                                                   "answer_retrieved", "answer_in_beam")}
                            for r in history],
             exact_match=ev["exact_match"], recall_at_1=ev["recall@1"],
             recall_at_5=ev["recall@5"], recall_at_20=ev["recall@20"],
             reader_oracle=ev["reader_oracle"], answer_located=ev["answer_located"],
             eval_questions=ev["num_questions"], parameters=parameters,
             finetune_s=round(train_seconds - index_seconds, 1), eval_s=round(eval_seconds, 1),
             setup_s=round(setup_seconds, 1), total_s=round(total, 1),
             index_s=round(index_seconds, 1), steps=result["step"],
             train_answer_located=train_located,
             # A row's own sizes: rows of several invocations (--merge) may differ.
             train_steps=steps, batch_size=batch, train_questions=files["num_train"])
  if reader_from:
    out["reader_from"] = reader_from
  if row == "realm_refresh":
    out.update(index_refreshes=result["index_refreshes"],
               snapshots_exported=result["snapshots_exported"],
               final_index_version=result["final_index_version"])
  return out


def schedule(keys: list, rows: list) -> list:
  """(dataset, row) pairs in run order: dataset by dataset, except that refresh rows on
  the large corpus go last. Each of their refreshes re-embeds the whole corpus beside the
  trainer, so they are the most expensive rows and the first the time budget drops."""
  # The SQuAD-open reader is the dense_squad_reader rows' start, not a row of its own set.
  pairs = [(k, r) for k in keys for r in rows if (k, r) != ("squad", "dense_squad_reader")]
  last = [(k, r) for k, r in pairs
          if r == "realm_refresh" and DATASETS[k]["corpus"] != "squad"]
  return [p for p in pairs if p not in last] + last


def markdown(payload: dict) -> str:
  s, p = payload["settings"], payload["pretrain"]
  k = _setting(s["finetune"], "task.openqa.num_candidates", "finetune.num_candidates")
  reader_length = _setting(s["finetune"], "task.openqa.reader_seq_length",
                           "finetune.reader_seq_length")
  pretrain_batch = (_setting(p["overrides"], "task.pretrain.train_data.global_batch_size",
                             "trainer.batch_size") if p else 0)
  multiplier = s["finetune"].get("trainer.head_learning_rate_multiplier")
  head_rate = f", span head x{multiplier}" if multiplier else ""
  lines = [
      "# Open-QA benchmark (`python -m benchmarks.openqa`)", "",
      f"Measured {payload['machine']['when']} on {payload['machine']['cpu_count']} CPU cores "
      f"(TensorFlow {payload['machine']['tensorflow']}); total {payload['total_minutes']} min"
      + ("." if len(payload["invocations"]) == 1 else ", in " + "; ".join(
          f"{i['minutes']} min ({i['datasets']})" for i in payload["invocations"]) + "."),
      "",
      f"Scaled down for a 2-core CPU: MiniLM-L6 (384 hidden) towers and "
      f"reader, k={k} blocks of up to {s['block_length']} wordpieces, reader input "
      f"{reader_length} wordpieces, fine-tuning sizes per row ('steps x batch (questions)') "
      f"(lr {s['finetune']['trainer.learning_rate']}"
      f"{head_rate}), ORQA loss with a retriever beam of {s.get('retriever_beam', k)}; "
      "the first steps read each question's gold block first where its questions name their "
      "article (SQuAD-open: 'gold steps' below). "
      "Reporting questions per set below. " + (
          f"REALM pre-training: "
          f"{p['steps']} steps (batch {pretrain_batch}) on the SQuAD-open corpus, "
          f"{p['seconds']} s, MLM loss {p['first_loss']:.3f} → {p['last_loss']:.3f}, "
          f"{p['index_refreshes']} index refresh{'' if p['index_refreshes'] == 1 else 'es'}. "
          if p else "No REALM pre-training in these rows. ") +
      "EM is on all reporting questions, whether or not the small corpus "
      "can answer them.", "",
      "| dataset (corpus) | row | EM | recall@1 | recall@5 | recall@20 | EM / R@5 | reader "
      "oracle | step-0 R@1 / R@5 / R@20 | steps x batch (questions) | gold steps | fine-tune s | "
      "eval s | index s | parameters |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  order = list(DATASETS)
  for r in sorted(payload["rows"],
                  key=lambda r: (order.index(r["key"]), list(ROWS).index(r["row"]))):
    data = payload["datasets"][r["key"]]
    r = _with_sizes(r, payload)
    corpus = f"{'/'.join(data['corpus_file'].split('/')[-2:])}, {data['corpus_blocks']} blocks"
    note = ""
    if r["row"] == "realm_refresh":
      note = f" ({r['index_refreshes']} refresh{'' if r['index_refreshes'] == 1 else 'es'})"
    step0 = ("{:.1f} / {:.1f} / {:.1f}".format(*(100 * r[f"step0_recall_at_{n}"]
                                                 for n in (1, 5, 20)))
             if "step0_recall_at_5" in r else "as REALM")
    lines.append(
        f"| {r['dataset']} ({corpus}) | {ROWS[r['row']]}{note} | "
        f"{100 * r['exact_match']:.1f} | {100 * r.get('recall_at_1', 0):.1f} | "
        f"{100 * r['recall_at_5']:.1f} | "
        f"{100 * r['recall_at_20']:.1f} | "
        f"{r['exact_match'] / max(r['recall_at_5'], 1e-9):.2f} | "
        f"{100 * r['reader_oracle']:.1f} | {step0} | "
        f"{r['train_steps']} x {r['batch_size']} ({r['train_questions']}) | "
        f"{r.get('gold_block_steps', 0)} | "
        f"{r['finetune_s']:.0f} | {r['eval_s']:.0f} | {r['index_s']:.0f} | "
        f"{r['parameters'] / 1e6:.1f}M |")
  for skipped in payload.get("skipped", []):
    lines.append(f"| {skipped} | not run | | | | | | | | | | | | | |")
  if payload.get("partial"):
    lines += ["", "**Partial results**: the run was still going (or was cut); a rerun with "
              "the same sizes adds the missing rows."]
  lines += ["", "EM, recall and reader oracle in %; definitions in "
            "realm_tf/tasks/openqa_evaluation.py. Step-0 recall: the row's retriever before "
            "fine-tuning (zero-shot), same blocks and questions. Reporting splits:", ""]
  for key, d in payload["datasets"].items():
    lines.append(f"- {d['name']}: reported on {d['num_eval']} questions ({d['report_split']}); "
                 f"trained on questions sampled from the other {d['train_pool']} (how many: "
                 f"each row's 'questions').")
  lines += ["", "Targets, read off the rows above:", ""] + targets(payload)
  return "\n".join(lines) + "\n"


def targets(payload: dict) -> list[str]:
  """The quality targets the rows are read against, each marked met or missed."""
  rows = {(r["key"], r["row"]): r for r in payload["rows"]}
  out = []

  def mark(ok):
    return "met" if ok else "**missed**"

  dense = rows.get(("squad", "dense"))
  if dense and "step0_recall_at_5" in dense:
    out.append(f"- Dense warm start at step 0 keeps MiniLM's retrieval: its scoring is MiniLM's "
               f"cosine (mean pooling, no projection, L2-normalised; the scale does not change "
               f"the ranking), step-0 R@5 {100 * dense['step0_recall_at_5']:.1f} on SQuAD-open: "
               f"met by construction.")
  for row, goal in (("bm25", 0.35), ("dense", 0.30)):
    r = rows.get(("squad", row))
    if r:
      out.append(f"- SQuAD-open EM with {ROWS[row]}: {100 * r['exact_match']:.1f} "
                 f"(target >= {100 * goal:.0f}): {mark(r['exact_match'] >= goal)}.")
  for key in ("nq", "wq", "trec"):
    for row in ROWS:
      r = rows.get((key, row))
      if r:
        ratio = r["exact_match"] / max(r["recall_at_5"], 1e-9)
        out.append(f"- {r['dataset']} / {ROWS[row]}: EM {100 * r['exact_match']:.1f} vs "
                   f"0.4 x R@5 = {40 * r['recall_at_5']:.1f} (EM/R@5 {ratio:.2f}): "
                   f"{mark(ratio >= 0.4)}.")
  return out


def _previous_results(output: harness.Output) -> dict:
  previous = output.read()
  if not previous:
    raise SystemExit(f"--merge: {output.json_path} does not exist")
  return previous


def _with_sizes(row: dict, payload: dict) -> dict:
  """`row` with the fine-tuning sizes it ran with: its own, else (a row that records none)
  its invocation's settings."""
  s, data = payload["settings"], payload["datasets"][row["key"]]
  return dict(dict(train_steps=s["train_steps"], batch_size=s["batch_size"],
                   train_questions=data["num_train"]), **row)


def _merged(previous: dict, new: dict) -> dict:
  """`new`'s rows added to (or replacing) `previous`'s; every invocation is listed."""
  done = {(r["key"], r["row"]) for r in new["rows"]}
  rows = [_with_sizes(r, previous) for r in previous["rows"]
          if (r["key"], r["row"]) not in done] + new["rows"]
  order = {k: i for i, k in enumerate(DATASETS)}
  rows.sort(key=lambda r: (order[r["key"]], list(ROWS).index(r["row"])))
  ran = {f"{r['dataset']} / {ROWS[r['row']]}" for r in rows}
  # A skipped row is listed as "<dataset> / <row> (<why>)": dropped once it has run, in
  # this invocation or an earlier one.
  skipped = [s for s in previous.get("skipped", [])
             if s not in ran and not any(s.startswith(f"{r} (") for r in ran)] + new["skipped"]
  invocations = previous.get("invocations") or [
      dict(datasets=",".join(previous["datasets"]), minutes=previous["total_minutes"])]
  # The pre-training these rows started from: this invocation's if it ran (or reused) one,
  # else the one the kept rows name.
  return dict(new, rows=rows, skipped=skipped,
              pretrain=new.get("pretrain") or previous.get("pretrain") or {},
              datasets=dict(previous["datasets"], **new["datasets"]),
              invocations=invocations + new["invocations"],
              total_minutes=round(sum(i["minutes"] for i in invocations + new["invocations"]),
                                  1))


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--datasets", default=",".join(DATASETS))
  parser.add_argument("--rows", default=",".join(ROWS))
  parser.add_argument("--budget_minutes", type=float, default=115.0,
                      help="rows that would end after this are skipped and listed")
  parser.add_argument("--quick", action="store_true",
                      help="a smoke run with tiny sizes (results not written)")
  parser.add_argument("--train_steps", type=int, default=TRAIN_STEPS)
  parser.add_argument("--batch_size", type=int, default=BATCH)
  parser.add_argument("--eval_questions", type=int, default=0,
                      help="questions of a dev split reported on (0: all; SQuAD-open 1,864)")
  parser.add_argument("--heldout_questions", type=int, default=HELDOUT_QUESTIONS,
                      help="questions held out for reporting from sets without a dev split")
  parser.add_argument("--train_questions", type=int, default=0,
                      help="training questions sampled per set (0: train_steps x batch)")
  parser.add_argument("--gold_steps", type=int, default=-1,
                      help="reading-comprehension steps on gold blocks first (-1: a third "
                           "of train_steps for sets whose questions carry titles)")
  parser.add_argument("--retriever_beam", type=int, default=100,
                      help="blocks per question the retriever loss is labelled over")
  parser.add_argument("--fresh", action="store_true",
                      help="ignore finished rows in the results (default: skip them)")
  parser.add_argument("--pretrain_steps", type=int, default=PRETRAIN_STEPS)
  parser.add_argument("--work_dir", default=WORK_DIR,
                      help="reused: corpora, pre-training, indexes, cut rows' checkpoints")
  parser.add_argument("--keep_work", action="store_true", help="do not delete --work_dir")
  parser.add_argument("--pretrained_dir", default="",
                      help="a finished REALM pre-training of an earlier invocation (with "
                           "--merge, whose results record its settings); skips pre-training")
  parser.add_argument("--merge", action="store_true",
                      help="add these rows to benchmarks/results/openqa.json (rows of the "
                           "same dataset and row are replaced)")
  args = parser.parse_args(argv)
  if args.quick and args.work_dir == WORK_DIR:
    args.work_dir = WORK_DIR + "_quick"
  return args


def _expected_seconds(arm: tuple, seconds: dict) -> float:
  """What a (dataset, row) should take: as long as the same row took on the last dataset of
  the same corpus, else of any corpus (0 for a row not run yet)."""
  key, row = arm
  same_row = [(k, s) for (k, r), s in seconds.items() if r == row]
  same_corpus = [s for k, s in same_row if DATASETS[k]["corpus"] == DATASETS[key]["corpus"]]
  return (same_corpus or [s for _, s in same_row] or [0.0])[-1]


def run(args, output: harness.Output) -> str:
  """Every (dataset, row) of args in schedule() order, `output` rewritten after each;
  returns the result's path."""
  sizes = dict(TRAIN_STEPS=args.train_steps, BATCH=args.batch_size,
               EVAL_QUESTIONS=args.eval_questions, HELDOUT_QUESTIONS=args.heldout_questions,
               PRETRAIN_STEPS=args.pretrain_steps, CORPUS_DOCS=0, GOLD_STEPS=args.gold_steps,
               RETRIEVER_BEAM=args.retriever_beam,
               TRAIN_QUESTIONS=args.train_questions)
  if args.quick:
    sizes.update(QUICK)
  num_train = sizes["TRAIN_QUESTIONS"] or sizes["TRAIN_STEPS"] * sizes["BATCH"]
  work = args.work_dir
  os.makedirs(work, exist_ok=True)
  start = time.time()
  demo = load_config(CONFIG)
  corpora = harness.cached(
      os.path.join(work, f"corpora-{sizes['CORPUS_DOCS']}.json"),
      lambda: prepare_corpora(work, demo.model.retriever.block_seq_length,
                              sizes["CORPUS_DOCS"]), log=log)
  print(f"corpora: {json.dumps(corpora)}", flush=True)
  row_names = args.rows.split(",")
  previous = _previous_results(output) if args.merge else None
  settings = dict(config="configs/demo.yaml", finetune=FINETUNE_OVERRIDES,
                  train_steps=sizes["TRAIN_STEPS"], batch_size=sizes["BATCH"],
                  eval_questions=sizes["EVAL_QUESTIONS"],
                  heldout_questions=sizes["HELDOUT_QUESTIONS"], train_questions=num_train,
                  gold_steps=sizes["GOLD_STEPS"], retriever_beam=sizes["RETRIEVER_BEAM"],
                  pretrain_steps=sizes["PRETRAIN_STEPS"],
                  block_length=demo.model.retriever.block_seq_length)
  # Rows of an earlier run with the same settings are kept (--merge keeps them its own way).
  earlier = harness.kept_result(output, settings, fresh=args.fresh or args.merge)
  done = earlier.get("rows", [])
  earlier_datasets, earlier_invocations = earlier.get("datasets", {}), earlier.get(
      "invocations", [])
  earlier_pretrain = earlier.get("pretrain") or {}
  pretrained = None
  if args.pretrained_dir:
    if previous is None or not previous.get("pretrain"):
      raise SystemExit("--pretrained_dir needs --merge into results that describe it")
    pretrained = dict(previous["pretrain"], model_dir=args.pretrained_dir)
  elif any(r.startswith("realm") for r in row_names):
    pretrained = pretrain(work, corpora["squad"]["dir"], sizes["PRETRAIN_STEPS"])
    print(f"pretrain: {json.dumps(pretrained)}", flush=True)
  elif earlier_pretrain:
    pretrained = dict(earlier_pretrain)  # described by kept rows; no row here needs it
  datasets, files = dict(earlier_datasets), {}  # kept rows keep their dataset notes
  for key in args.datasets.split(","):
    files[key] = question_files(work, key, num_train, sizes["EVAL_QUESTIONS"],
                                sizes["HELDOUT_QUESTIONS"])
    corpus = corpora[DATASETS[key]["corpus"]]
    datasets[key] = dict(name=DATASETS[key]["name"], corpus_file=corpus["file"],
                         corpus_blocks=corpus["blocks"], regex=DATASETS[key]["regex"],
                         **{k: v for k, v in files[key].items() if k not in ("train", "eval")})
  results = list(done)

  def payload(partial: bool) -> dict:
    out = dict(
        machine=machine(), partial=partial,
        total_minutes=round((time.time() - start) / 60 + sum(
            r.get("total_s", 0) for r in done) / 60, 1),
        settings=settings,
        corpora={k: {kk: vv for kk, vv in v.items() if kk != "dir"}
                 for k, v in corpora.items()},
        pretrain={k: v for k, v in (pretrained or {}).items() if k != "model_dir"},
        datasets=datasets, rows=results, skipped=rows.skipped,
        invocations=earlier_invocations + [dict(
            datasets=args.datasets, rows=args.rows,
            minutes=round((time.time() - start) / 60, 1))])
    return out if previous is None else _merged(previous, out)

  rows = harness.Arms(lambda partial: output.write(payload(partial)), args.budget_minutes,
                     started=start)
  for key, row in rows.due(
      schedule(args.datasets.split(","), row_names),
      kept={(r["key"], r["row"]) for r in done}, expected=_expected_seconds,
      label=lambda arm: f"{DATASETS[arm[0]]['name']} / {ROWS[arm[1]]} (time budget)"):
    result = finetune_row(work, row, key, files[key], corpora[DATASETS[key]["corpus"]],
                          (pretrained or {}).get("model_dir", ""),
                          sizes["TRAIN_STEPS"], sizes["BATCH"], sizes["GOLD_STEPS"],
                          sizes["RETRIEVER_BEAM"])
    result["key"] = key
    results.append(result)  # written when the body returns: kept even if the run is cut
    print(json.dumps({k: v for k, v in result.items() if k != "train_history"}), flush=True)
    tf_keras.backend.clear_session()
    gc.collect()
  path = rows.finish()
  if args.quick:
    print(markdown(payload(False)))
  if not args.keep_work and not args.quick and not rows.skipped:
    shutil.rmtree(work, ignore_errors=True)
  return path


def main(argv=None) -> int:
  args = parse_args(argv)
  # A smoke (--quick) writes into its work directory, never over the committed results.
  output = (harness.Output("openqa.quick", markdown, directory=args.work_dir) if args.quick
            else harness.Output("openqa", markdown))
  path = run(args, output)
  print(f"wrote {path} and {output.markdown_path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
