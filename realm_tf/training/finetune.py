"""Open-QA fine-tuning runs (`python -m realm_tf.train --mode finetune`), end to end.

  questions ─ answer strings ───────────┐
  corpus ─ blocks ─ BlockTable ─────────┼─ StepTrainer + finetune_step: retrieve top-k
  retriever ─ snapshot 0 ─ embed_corpus ┘    in the step, read them, locate answer
             (<model_dir>/index/0 → DocumentIndex)     spans, openqa_loss

Initial weights (finetune.init_from): 'warm_start' (both networks from warm_start, e.g.
MiniLM), 'ict' (the retriever of an ICT run, the reader from warm_start) or 'realm' (the
retriever and the knowledge-augmented encoder's BERT of a REALM pre-training run).
finetune.retrieval='bm25' swaps the retriever for BM25 over the same blocks.
finetune.refresh_index keeps re-embedding the corpus while fine-tuning, with the
pre-training machinery: SnapshotExporter → beam.index_builder → newer index swapped in.
"""
import dataclasses
import logging
import os
import time
from typing import Optional

import tensorflow as tf
import tf_keras

from realm_tf.configs.experiment import ExperimentConfig
from realm_tf.data import files as data_files
from realm_tf.data.block_store import BlockStore
from realm_tf.io import versioned
from realm_tf.modeling import factory
from realm_tf.openqa import evaluation, inputs, spans
from realm_tf.openqa.bm25 import BM25Retriever
from realm_tf.openqa.corpus import BlockTable, Corpus, DocumentIndex, prepare_blocks
from realm_tf.openqa.model import OpenQAModel
from realm_tf.text.tokenization import Tokenizer
from realm_tf.training import runs, snapshots
from realm_tf.training.finetune_trainers import (
    FINETUNE_METRICS, FinetuneEvaluator, finetune_step, retrace)
from realm_tf.training.progress import ProgressReporter
from realm_tf.training.runtime import build_optimizer
from realm_tf.training.trainers import StepTrainer

INIT_SOURCES = ("warm_start", "ict", "realm")
RETRIEVALS = ("dense", "bm25")


def check_config(config: ExperimentConfig):
  f = config.finetune
  if f.init_from not in INIT_SOURCES:
    raise ValueError(f"finetune.init_from must be one of {INIT_SOURCES}, got {f.init_from!r}")
  if f.retrieval not in RETRIEVALS:
    raise ValueError(f"finetune.retrieval must be one of {RETRIEVALS}, got {f.retrieval!r}")
  if f.init_from != "warm_start" and not f.init_checkpoint:
    raise ValueError(f"finetune.init_from={f.init_from} needs finetune.init_checkpoint")
  if f.retrieval == "bm25" and f.refresh_index:
    raise ValueError("finetune.refresh_index needs dense retrieval (BM25 has no index)")
  if f.query_seq_length > f.reader_seq_length - 3:
    raise ValueError(f"finetune.query_seq_length {f.query_seq_length} leaves no room for a "
                     f"block in finetune.reader_seq_length {f.reader_seq_length}")
  if f.num_candidates < 1 or f.max_answers < 1:
    raise ValueError("finetune.num_candidates and finetune.max_answers must be positive")


def build_model(config: ExperimentConfig, sep_id: int) -> OpenQAModel:
  """Networks as finetune.init_from says (call under strategy.scope())."""
  f = config.finetune
  retriever = factory.build_retriever(config) if f.retrieval == "dense" else None
  reader = factory.build_reader(config)
  model = OpenQAModel(reader, retriever, reader_seq_length=f.reader_seq_length,
                      sep_id=sep_id, train_document_encoder=f.refresh_index,
                      name="openqa_model")
  if f.init_from == "ict" and retriever is not None:
    runs.restore_retriever(retriever, f.init_checkpoint)
  elif f.init_from == "realm":
    restore_from_pretraining(model, f.init_checkpoint)
  return model


def restore_from_pretraining(model: OpenQAModel, path: str) -> str:
  """The retriever and the reader's BERT from a REALM pre-training checkpoint.

  The pre-training checkpoint is `Checkpoint(model=RealmPretrainer)`; these proxies name the
  same object-graph edges (model/retriever, model/knowledge_augmented_encoder/encoder), so
  the weights load straight into the fine-tuning networks without building the pretrainer.
  Every fine-tuning variable of those networks must be found in the checkpoint.
  """
  path = runs.latest_checkpoint(path)
  parts = dict(knowledge_augmented_encoder=tf.train.Checkpoint(encoder=model.reader.encoder))
  if model.retriever is not None:
    parts["retriever"] = model.retriever
  status = tf.train.Checkpoint(model=tf.train.Checkpoint(**parts)).read(path)
  status.expect_partial()
  status.assert_existing_objects_matched()
  logging.info("Retriever and reader BERT restored from REALM pre-training %s", path)
  return path


def ensure_index(work_dir: str, retriever, tokenizer, config: ExperimentConfig, blocks: str,
                 index_dir: str, step: int = 0) -> versioned.Version:
  """The newest committed index under `index_dir`, built first if there is none.

  Building exports the retriever as snapshot `step` (the same exports pre-training hands
  to the index builder) and embeds the blocks with `beam.embed_corpus`.
  """
  latest = versioned.latest_version(index_dir)
  if latest is not None:
    logging.info("Using index %s", latest.path)
    return latest
  from beam import embed_corpus  # pylint: disable=g-import-not-at-top
  if versioned.latest_version(snapshots.block_encoder_dir(work_dir)) is None:
    snapshots.export_retriever(work_dir, step, retriever, tokenizer, config)
  args = ["--blocks", blocks, "--encoder", snapshots.block_encoder_dir(work_dir),
          "--output_dir", index_dir, "--num_shards", str(config.index.num_shards),
          "--version", str(step), "--keep_versions", str(config.index.keep_versions)]
  if config.index.backend == "exact":
    args.append("--no_scann")
  start = time.time()
  path = embed_corpus.run(args)
  logging.info("Index %s built in %.0fs", path, time.time() - start)
  return versioned.read_version(path)


def build_corpus(config: ExperimentConfig, model: OpenQAModel, store: BlockStore, tokenizer,
                 work_dir: str, blocks: str, strategy, step: int = 0) -> Corpus:
  """The table, and for dense retrieval the index (built once if missing)."""
  f = config.finetune
  with strategy.scope():
    table = BlockTable(store, tokenizer, body_length=f.reader_seq_length - 3,
                       block_seq_length=config.retriever.block_seq_length
                       if f.refresh_index else 0)
  if model.retriever is None:
    return Corpus(table)
  export = ensure_index(work_dir, model.retriever, tokenizer, config, blocks,
                        snapshots.index_dir(work_dir, config.index.index_dir), step)
  with strategy.scope():
    index = DocumentIndex(table, export, config.index.backend, config.index.rescore)
  return Corpus(table, index)


def load_qa_set(path: str, config: ExperimentConfig, tokenizer, store: BlockStore,
                regex: bool, bm25: Optional[BM25Retriever], limit: int = 0):
  f = config.finetune
  examples = inputs.read_questions(path, regex, limit)
  texts = store.text_strings if regex else []
  return inputs.build_qa_set(examples, tokenizer, texts, regex, f.max_answers,
                             config.reader.max_span_width, bm25,
                             max(max(evaluation.RECALL_AT), f.num_candidates))


def make_evaluator(config, strategy, model, corpus, qa_set, tokenizer, regex):
  f = config.finetune

  def dataset_fn(context):
    return inputs.qa_dataset(qa_set, tokenizer, f.query_seq_length,
                             context.get_per_replica_batch_size(f.eval_batch_size),
                             training=False, input_context=context)

  return FinetuneEvaluator(strategy, model, corpus, dataset_fn, qa_set, tokenizer,
                           f.num_candidates, spans.continuation_table(tokenizer.vocab), regex)


def save_evaluation(model_dir: str, name: str, step: int, metrics: dict,
                    predictions: list) -> dict:
  """<model_dir>/eval/<name>-<step>.json (metrics) and .jsonl (predictions)."""
  tf.io.gfile.makedirs(os.path.join(model_dir, "eval"))
  base = os.path.join(model_dir, "eval", f"{name}-{step:012d}")
  versioned.write_json_atomic(base + ".json", dict(metrics, step=step))
  evaluation.write_predictions(base + ".predictions.jsonl", predictions)
  return dict(metrics=base + ".json", predictions=base + ".predictions.jsonl")


def run_finetune(config: ExperimentConfig, model_dir: str, strategy: tf.distribute.Strategy,
                 train_file: str, eval_file: str = "", corpus: str = "", regex: bool = False,
                 stop_at_step: Optional[int] = None, train_limit: int = 0,
                 eval_limit: int = 0) -> dict:
  """Fine-tunes on `train_file`; evaluates on `eval_file` every eval_every_steps and at
  the end. `corpus`: blocks dir/pattern or JSON lines (default: data.blocks/corpus_dir)."""
  check_config(config)
  f = config.finetune
  blocks = (prepare_blocks(corpus, os.path.join(model_dir, "corpus"),
                           config.retriever.block_seq_length) if corpus
            else data_files.pattern(config.data, data_files.BLOCKS))
  config = config.replace(data=dict(blocks=blocks))  # what the index builder and eval read
  runs.save_params(config, model_dir)
  tf_keras.utils.set_random_seed(config.trainer.seed)
  snapshots.clear_training_done(model_dir)
  tokenizer = Tokenizer(config.tokenizer.vocab_file or None, config.tokenizer.lower_case)
  store = BlockStore.from_tfrecords(blocks)
  with strategy.scope():
    model = build_model(config, tokenizer.sep_id)
    optimizer = build_optimizer(config.trainer)
    global_step = optimizer.iterations
  # The checkpoint layout and orbit controller of the pre-training runs, reused on purpose.
  _, manager = runs._checkpoint(  # pylint: disable=protected-access
      model_dir, config, global_step, model=model, optimizer=optimizer)
  manager.restore_or_initialize()
  start = int(global_step.numpy())
  setup_start = time.time()
  corpus_ = build_corpus(config, model, store, tokenizer, model_dir, blocks, strategy)
  bm25 = BM25Retriever(store) if f.retrieval == "bm25" else None
  train_set = load_qa_set(train_file, config, tokenizer, store, regex, bm25, train_limit)
  eval_set = (load_qa_set(eval_file, config, tokenizer, store, regex, bm25, eval_limit)
              if eval_file else None)
  setup_seconds = time.time() - setup_start
  batch = config.trainer.batch_size

  def train_dataset_fn(context):
    return inputs.qa_dataset(train_set, tokenizer, f.query_seq_length,
                             context.get_per_replica_batch_size(batch), training=True,
                             seed=config.trainer.seed, start_batch=start,
                             input_context=context)

  refresher = None
  try:
    if f.refresh_index:
      refresher = _IndexRefresher(config, model_dir, model, corpus_, tokenizer, global_step)
    step = finetune_step(model, corpus_, f.num_candidates,
                         spans.continuation_table(tokenizer.vocab))
    trainer = StepTrainer(strategy, step, FINETUNE_METRICS, optimizer, train_dataset_fn,
                          host_metrics=refresher.metrics if refresher else None)
    evaluator = (make_evaluator(config, strategy, model, corpus_, eval_set, tokenizer, regex)
                 if eval_set else None)
    actions = [ProgressReporter(model_dir, global_step, config.trainer.train_steps, batch,
                                "finetune")]
    intervals = []
    if refresher is not None:
      refresher.attach(trainer, evaluator)
      actions.insert(0, refresher)
      intervals.append(f.refresh_every_steps)
    steps_per_loop = runs._steps_per_loop(config, *intervals)  # pylint: disable=protected-access
    controller = runs._controller(  # pylint: disable=protected-access
        strategy, trainer, None, global_step, manager, model_dir, steps_per_loop, config,
        actions)
    steps = config.trainer.train_steps if stop_at_step is None else min(
        config.trainer.train_steps, stop_at_step)
    train_start = time.time()
    every = config.trainer.eval_every_steps if evaluator is not None else 0
    while int(global_step.numpy()) < steps:
      controller.train(min(steps, int(global_step.numpy()) + every) if every > 0 else steps)
      if every > 0 and int(global_step.numpy()) < steps:
        _evaluate(evaluator, model_dir, "eval", int(global_step.numpy()))
  finally:
    if refresher is not None:
      refresher.stop()
  train_seconds = time.time() - train_start
  step = int(global_step.numpy())
  result = dict(step=step, checkpoint=manager.latest_checkpoint,
                parameters=factory.count_parameters(model), setup_seconds=setup_seconds,
                train_seconds=train_seconds, train_questions=len(train_set),
                train_answer_located=train_set.located,
                index_version=corpus_.index.version if corpus_.index else None)
  if refresher is not None:
    result.update(refresher.summary())
  if evaluator is not None:
    result["eval"] = _evaluate(evaluator, model_dir, "eval", step)
  return result


def evaluate_once(evaluator: FinetuneEvaluator) -> dict:
  """Every question once: metrics as Python numbers, plus eval_seconds."""
  start = time.time()
  metrics = evaluator.evaluate(tf.constant(-1))
  metrics = {k: (v.item() if hasattr(v, "item") else v) for k, v in metrics.items()}
  metrics["eval_seconds"] = time.time() - start
  return metrics


def _evaluate(evaluator: FinetuneEvaluator, model_dir: str, name: str, step: int) -> dict:
  metrics = evaluate_once(evaluator)
  files = save_evaluation(model_dir, name, step, metrics, evaluator.predictions)
  writer = tf.summary.create_file_writer(os.path.join(model_dir, "summaries", name))
  with writer.as_default():
    for key, value in metrics.items():
      tf.summary.scalar(key, value, step=step)
  writer.close()
  logging.info("[finetune] eval at step %d: EM %.4f recall@5 %.4f (%s)", step,
               metrics["exact_match"], metrics["recall@5"], files["metrics"])
  return dict(metrics, files=files)


@dataclasses.dataclass
class _RefreshStats:
  swaps: int = 0
  index_step: int = 0


class _IndexRefresher:
  """refresh_index: snapshots the retriever every refresh_every_steps (non-blocking), runs
  beam.index_builder beside training, and swaps each newer index in between train loops."""

  def __init__(self, config, model_dir, model, corpus: Corpus, tokenizer, global_step):
    self.config = config
    self.model_dir = model_dir
    self.corpus = corpus
    self.global_step = global_step
    self.every = config.finetune.refresh_every_steps
    self.index_dir = snapshots.index_dir(model_dir, config.index.index_dir)
    self.exporter = snapshots.SnapshotExporter(
        model_dir, model.retriever, lambda: factory.build_retriever(
            config.replace(warm_start=dict(source=""))), tokenizer, config)
    self.builder = runs.IndexBuilderProcess(model_dir)
    self.stats = _RefreshStats(index_step=corpus.index.version)
    self.trainer = self.evaluator = None

  def attach(self, trainer, evaluator):
    self.trainer, self.evaluator = trainer, evaluator

  def __call__(self, _):
    step = int(self.global_step.numpy())
    if self.every > 0 and step % self.every == 0 and step < self.config.trainer.train_steps:
      self.exporter.snapshot(step)
    latest = versioned.latest_version(self.index_dir)
    if latest is not None and latest.version > self.corpus.index.version:
      if self.corpus.index.swap(latest):
        retrace(self.trainer)
        if self.evaluator is not None:
          retrace(self.evaluator)
      self.stats.swaps += 1
      self.stats.index_step = latest.version
      logging.info("[finetune] step %d: swapped in index %d", step, latest.version)

  def metrics(self) -> dict:
    step = int(self.global_step.numpy())
    return dict(index_version=float(self.corpus.index.version),
                index_staleness_steps=float(step - self.corpus.index.version),
                index_refreshes=float(self.stats.swaps))

  def stop(self):
    self.exporter.wait()
    snapshots.mark_training_done(self.model_dir, int(self.global_step.numpy()))
    # An index finished after the last step would serve nothing: do not wait for it.
    self.builder.stop(timeout=10.0)

  def summary(self) -> dict:
    return dict(index_refreshes=self.stats.swaps, final_index_version=self.corpus.index.version,
                snapshots_exported=list(self.exporter.exported),
                snapshots_skipped=list(self.exporter.skipped),
                snapshot_errors=self.exporter.errors)
