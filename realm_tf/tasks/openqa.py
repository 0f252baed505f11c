"""Open-QA fine-tuning and evaluation (ORQA / REALM section 4).

One step, per replica (B questions, R retrieved, K <= R read, S spans, A answers):
  query tower(question) → MIPS over the index (or BM25 top-k from the features) → rows [B, R]
    (R = task.openqa.retriever_beam in training; in the reading-comprehension stage,
    the first gold_block_steps steps, each question's gold block is put first)
  KnowledgeIndex.gather → whole bodies; [CLS] x [SEP] z_body [SEP] of the best K → reader
    → span scores, plus the retrieval score ('orqa') → answer logits [B, K, S]
  answer spans located in what was read (spans.locate_answer_spans); blocks of the beam
    with an answer anywhere in their body (spans.block_has_answer) → losses.openqa_loss
The document index stays fixed unless refresh_index (then the document tower trains too
and the index builder re-embeds the corpus beside the trainer, as in pre-training).

Validation returns per-question outputs; `aggregate_logs` collects them on the host and
`reduce_aggregated_logs` scores them (exact match, recall@k, reader oracle) and writes the
per-question predictions (tasks/openqa_evaluation.py).
"""
import json
import logging
import os
from typing import Optional

import numpy as np
import tensorflow as tf

from realm_tf.data import block_store
from realm_tf.data import block_texts
from realm_tf.data import openqa_inputs
from realm_tf.io import layout
from realm_tf.modeling import factory, losses, spans
from realm_tf.modeling.models.openqa import OpenQAModel
from realm_tf.retrieval.bm25 import BM25Retriever
from realm_tf.retrieval.knowledge_index import KnowledgeIndex
from realm_tf.tasks import base
from realm_tf.tasks import openqa_evaluation as evaluation

# The span choice is openqa_evaluation's, shared with the serving exports.
best_spans = evaluation.best_spans


def reader_body_length(experiment) -> int:
  """Lb, the body wordpieces an Open-QA index keeps per block: the reader's room for a
  body (reader_seq_length - 3: [CLS], [SEP], [SEP]), or the document tower's length where
  that is longer. Why whole bodies: a block's body is shorter than its document-tower
  input, so the retriever's labels (an answer anywhere in the body) see the whole block
  even when the reader reads less. The task's index and every served index keep this.

  Args:
    experiment: the ExperimentConfig (model.retriever.block_seq_length,
      task.openqa.reader_seq_length).

  Returns:
    The body length.
  """
  return max(experiment.task.openqa.reader_seq_length - 3,
             experiment.model.retriever.block_seq_length)


def retrieved_blocks(openqa_config, num_blocks: int, training: bool) -> int:
  """R, the blocks a question retrieves: in training the retriever beam (ORQA's
  retriever_beam_size, at least the blocks read); in evaluation, and so in every served
  QA export, enough for recall@20 and the blocks read (the retriever loss reported in
  validation is over those, and p(z|x) of an export is evaluation's). Never more than
  the corpus holds.

  Args:
    openqa_config: task.openqa (num_candidates, retriever_beam).
    num_blocks: blocks of the index searched.
    training: the training step's R rather than evaluation's.

  Returns:
    R.
  """
  k = openqa_config.num_candidates
  wanted = (max(k, openqa_config.retriever_beam) if training
            else max(max(evaluation.RECALL_AT), k))
  return min(wanted, num_blocks)


def restore_from_pretraining(model: OpenQAModel, path: str) -> str:
  """The retriever and the reader's BERT from a REALM pre-training checkpoint.

  The pre-training checkpoint is `Checkpoint(model=RealmPretrainer, ...)`; these proxies
  name the same object-graph edges (model/retriever, model/knowledge_augmented_encoder/
  encoder), so the weights load straight into the fine-tuning networks without building the
  pretrainer. Every fine-tuning variable of those networks must be found in the checkpoint.

  Args:
    model: the OpenQAModel (its retriever, if dense, and its reader's encoder are read).
    path: a pre-training checkpoint, or a run directory (its latest checkpoint).

  Returns:
    The checkpoint path read.

  Raises:
    AssertionError: a fine-tuning variable of those networks is not in the checkpoint.
  """
  path = layout.latest_checkpoint(path)
  parts = dict(knowledge_augmented_encoder=tf.train.Checkpoint(encoder=model.reader.encoder))
  if model.retriever is not None:
    parts["retriever"] = model.retriever
  status = tf.train.Checkpoint(model=tf.train.Checkpoint(**parts)).read(path)
  status.expect_partial()
  status.assert_existing_objects_matched()
  logging.info("Retriever and reader BERT restored from REALM pre-training %s", path)
  return path


def restore_reader(model: OpenQAModel, path: str) -> str:
  """The reader (BERT and span head) of another Open-QA run's checkpoint.

  An Open-QA checkpoint is `Checkpoint(model=OpenQAModel, ...)`; the proxy names the
  model/reader edge only, so the retriever keeps its own start (a reader trained to read
  on one question set can start another set's fine-tuning without also taking a query
  tower tuned to the first set's questions). Every reader variable must be found.

  Args:
    model: the OpenQAModel whose reader is restored.
    path: an Open-QA checkpoint, or a run directory (its latest checkpoint).

  Returns:
    The checkpoint path read.

  Raises:
    AssertionError: a reader variable is not in the checkpoint.
  """
  path = layout.latest_checkpoint(path)
  status = tf.train.Checkpoint(model=tf.train.Checkpoint(reader=model.reader)).read(path)
  status.expect_partial()
  status.assert_existing_objects_matched()
  logging.info("Reader (BERT and span head) restored from Open-QA run %s", path)
  return path


class _Records:
  """Holds the last evaluation's per-question records out of tf.Module's attribute
  tracking (a Task is a tf.Module), which would wrap the lists and dicts so that json
  cannot write them."""

  def __init__(self):
    self.records: list[dict] = []


class OpenQATask(base.RetrievalTask):
  """build_model → OpenQAModel; inputs {'example_index', 'query', 'answers'[, 'bm25']}."""

  metric_names = ("loss", "retriever_loss", "reader_loss", "answer_retrieved",
                  "answer_in_beam", "span_accuracy")
  evaluates_whole_set = True  # exact match and recall are over every question

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.index: Optional[KnowledgeIndex] = None
    self._qa_sets: dict[str, openqa_inputs.QASet] = {}
    self._bm25: Optional[BM25Retriever] = None
    self._records = _Records()

  @property
  def predictions(self) -> list[dict]:
    """The last evaluation's per-question records (see openqa_evaluation.score)."""
    return self._records.records

  @property
  def dense(self) -> bool:
    """Whether questions are retrieved by the dense retriever (else BM25)."""
    return self.task_config.retrieval == "dense"

  @property
  def refreshes_index(self) -> bool:
    """With task.refresh_index (dense retrieval only; otherwise the index stays fixed)."""
    return bool(self.task_config.refresh_index)

  @property
  def is_continuation(self) -> np.ndarray:
    """[V] bool: the vocabulary's '##' continuation wordpieces (spans.continuation_table)."""
    return spans.continuation_table(self.tokenizer.vocab)

  def build_model(self):
    """The reader and, for dense retrieval, the retriever, warm-started per model.warm_start.

    Returns:
      An OpenQAModel (retriever None under BM25); its document tower trains only with
      task.refresh_index.
    """
    c = self.task_config
    retriever = factory.build_retriever(self.experiment) if self.dense else None
    reader = factory.build_reader(self.experiment)
    return OpenQAModel(reader, retriever, reader_seq_length=c.reader_seq_length,
                       sep_id=self.tokenizer.sep_id, train_document_encoder=c.refresh_index,
                       answer_logits=c.loss, name="openqa_model")

  def build_index(self, strategy) -> KnowledgeIndex:
    """The corpus Z (index.blocks) as the step retrieves and reads it; built for BM25 too.

    With index.text_store the index holds no token tables and no texts: the retrieved
    blocks are read from the store (knowledge_index's text layout).

    Args:
      strategy: the run's strategy; the embedding variables are sharded over its replicas.

    Returns:
      The KnowledgeIndex (its embeddings loaded later, by on_train_begin /
      on_evaluate_begin, for dense retrieval only).

    Raises:
      ValueError: a text store with BM25 retrieval (which indexes every text) or under a
        TPU strategy (whose step cannot read files).
    """
    m, i = self.experiment.model, self.experiment.index
    texts = None
    if i.text_store:
      if not self.dense:
        raise ValueError("index.text_store serves dense retrieval; BM25 indexes every "
                         "block's text: leave index.text_store empty")
      if isinstance(strategy, (tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy)):
        raise ValueError("index.text_store reads files in the step, which a TPU cannot: "
                         "leave it empty on TPU (token tables)")
      store = block_texts.HostBlockTexts(i.text_store)
      texts = block_texts.BlockTexts(i.text_store)
    else:
      store = block_store.BlockStore.from_tfrecords(block_store.blocks_pattern(i.blocks),
                                                    i.unpublished_blocks)
    self.index = KnowledgeIndex(
        store, self.tokenizer, m.retriever.block_seq_length,
        body_length=reader_body_length(self.experiment),
        dimension=factory.retriever_output_size(self.experiment), strategy=strategy,
        backend=i.backend, embedding_dtype=i.embedding_dtype, rescore=i.rescore,
        texts=texts)
    return self.index

  @property
  def jit_compile(self) -> bool:
    """XLA unless the blocks come from a text store (file reads and the tokenizer in the
    step have no XLA kernels)."""
    return super().jit_compile and not self.experiment.index.text_store

  def qa_set(self, path: str, limit: int = 0) -> openqa_inputs.QASet:
    """Questions with their answer strings tokenized (and BM25 top-k), built once per path.

    Args:
      path: NQ-Open JSON lines of questions and answers.
      limit: read at most this many questions (0: all).

    Returns:
      The QASet (cached: a later call with the same path returns it, whatever `limit`).
    """
    if path not in self._qa_sets:
      c = self.task_config
      store = self.index.store
      if not self.dense and self._bm25 is None:
        self._bm25 = BM25Retriever(store)
      examples = openqa_inputs.read_questions(path, c.answer_regex, limit)
      self._qa_sets[path] = openqa_inputs.build_qa_set(
          examples, self.tokenizer, store.text_strings, c.answer_regex, c.max_answers,
          self.experiment.model.reader.max_span_width, self._bm25,
          max(max(evaluation.RECALL_AT), c.num_candidates, c.retriever_beam),
          corpus_titles=store.title_strings if c.gold_block_steps else ())
    return self._qa_sets[path]

  def build_inputs(self, params, input_context=None):
    """One input pipeline's batches of questions.

    Args:
      params: the DataConfig (train_data or validation_data): input_path (NQ-Open JSON
        lines), global_batch_size, is_training, max_examples.
      input_context: the pipeline's tf.distribute.InputContext, or None.

    Returns:
      A tf.data.Dataset of the features listed in realm_tf.data.openqa_inputs
      (example_index [B], query [B, Lq], answers ids [B, A, W] / lengths [B, A],
      gold_row [B], bm25 under BM25 retrieval). Training repeats and shuffles; evaluation
      reads every question once.

    Raises:
      RuntimeError: build_index has not run (the questions' labels need the corpus).
    """
    if self.index is None:
      raise RuntimeError("OpenQATask.build_index must run before build_inputs")
    training = bool(params.is_training)
    return openqa_inputs.qa_dataset(
        self.qa_set(params.input_path, params.max_examples), self.tokenizer,
        self.task_config.query_seq_length,
        base.per_replica_batch(params.global_batch_size, input_context), training=training,
        seed=self.experiment.trainer.seed,
        skip_batches=base.input_skip(self.start_step, input_context) if training else 0,
        input_context=input_context)

  # ------------------------------------------------------------------------- the step

  def num_retrieved(self, training: bool) -> int:
    """The blocks a question retrieves from the task's index (retrieved_blocks)."""
    return retrieved_blocks(self.task_config, self.index.num_blocks, training)

  def gold_rows(self, features, training: bool):
    """[B] gold rows to read first during the reading-comprehension stage, else None.

    The stage is decided in the step from the global step (features['global_step'], set by
    train_step), so one compiled step serves both stages and a resumed run continues in
    the right one.
    """
    steps = self.task_config.gold_block_steps
    if not training or not steps or "global_step" not in features:
      return None
    in_stage = tf.cast(features["global_step"], tf.int64) < steps
    return tf.where(in_stage, tf.cast(features["gold_row"], tf.int32), -1)

  def forward(self, model, features, training):
    """Retrieve, read and score one replica's batch (the steps of the module docstring).

    Args:
      model: the OpenQAModel.
      features: one batch of build_inputs (plus 'global_step' in training).
      training: dropout on; the retriever beam and the gold-block stage apply.

    Returns:
      (this replica's share of the global mean loss, {'out': OpenQAOutputs, 'correct':
      [B, K, S] bool, spans that match an answer, 'terms': losses.openqa_loss's
      per-question terms}).
    """
    c = self.task_config
    k = c.num_candidates
    out = model(features, index=self.index, num_retrieved=self.num_retrieved(training),
                num_read=k, training=training, gold_rows=self.gold_rows(features, training))
    is_continuation = tf.constant(self.is_continuation)
    correct = spans.locate_answer_spans(
        out.reader_inputs, out.span_starts, out.span_ends, features["answers"]["ids"],
        features["answers"]["lengths"], is_continuation)  # [B, K, S]
    if c.loss == "orqa":
      beam_correct = spans.block_has_answer(
          out.body_ids, out.body_lengths, features["answers"]["ids"],
          features["answers"]["lengths"], is_continuation)  # [B, R]
      # A block whose read part holds a correct span is a positive even where the
      # wordpiece windows disagree (e.g. bodies cut to the table width).
      beam_correct = tf.concat([beam_correct[:, :k] | tf.reduce_any(correct, axis=-1),
                                beam_correct[:, k:]], axis=1)
    else:
      beam_correct = tf.reduce_any(correct, axis=-1)  # [B, K]: the marginal reads these
    terms = losses.openqa_loss(out.retrieval_logits, beam_correct, out.span_logits, correct,
                               mode=c.loss)
    batch = tf.cast(tf.shape(terms["loss"])[0], tf.float32)
    loss = losses.global_mean(tf.reduce_sum(terms["loss"]), batch)
    return loss, dict(out=out, correct=correct, terms=terms)

  def _update(self, metrics, result):
    out, correct, terms = result["out"], result["correct"], result["terms"]
    block, span, _ = best_spans(out.span_logits)
    picked = tf.gather_nd(correct, tf.stack([tf.range(tf.shape(block)[0]), block, span], 1))
    self.update_metrics(
        metrics, dict(loss=terms["loss"], retriever_loss=terms["retriever_loss"],
                      reader_loss=terms["reader_loss"], answer_retrieved=terms["has_answer"],
                      answer_in_beam=terms["answer_in_beam"],
                      span_accuracy=tf.cast(picked, tf.float32)),
        dict(retriever_loss=terms["answer_in_beam"], reader_loss=terms["has_answer"]))
    return tf.reduce_mean(terms["loss"])

  def train_step(self, inputs, model, optimizer, metrics=None):
    """One update on a per-replica batch (runs in replica context).

    Args:
      inputs: one batch of build_inputs.
      model: the OpenQAModel.
      optimizer: the optimizer of create_task_optimizer.
      metrics: build_metrics' Means, updated here.

    Returns:
      {'loss': this replica's mean loss per question}.
    """
    # The step the update is for (the reading-comprehension stage is decided from it).
    inputs = dict(inputs, global_step=tf.identity(optimizer.iterations))
    _, result = self.gradient_step(model, optimizer,
                                   lambda f, t: self.forward(model, f, t), inputs)
    return {self.loss: self._update(metrics, result)}

  def validation_step(self, inputs, model, metrics=None):
    """One validation batch: the loss terms and each question's chosen answer.

    Args:
      inputs: one batch of build_inputs (validation_data).
      model: the OpenQAModel.
      metrics: build_metrics' Means, updated here.

    Returns:
      {'loss': mean loss} plus per-question outputs for aggregate_logs: example_index,
      rows [B, R], retrieval_logits [B, R], best_block, best_start, best_end, best_score,
      oracle and located [B].
    """
    def evaluate(features):
      _, result = self.forward(model, features, False)
      out = result["out"]
      chosen = evaluation.choose_answers(out.span_logits, out.span_starts, out.span_ends,
                                         out.reader_inputs["body_start"])
      per_question = dict(
          chosen, example_index=features["example_index"], rows=out.rows,
          retrieval_logits=out.retrieval_logits,
          oracle=tf.reduce_any(result["correct"], axis=[1, 2]),
          located=tf.reduce_any(features["answers"]["lengths"] > 0, axis=1))
      return result, per_question

    result, per_question = self.compiled("validation", evaluate)(inputs)
    loss = self._update(metrics, result)
    return dict(per_question, **{self.loss: loss})

  def aggregate_logs(self, state=None, step_outputs=None):
    """Collects validation_step's per-question outputs on the host.

    Args:
      state: the list so far (None on the first batch).
      step_outputs: one validation step's outputs, one value per local replica.

    Returns:
      `state` with one dict of numpy arrays appended per replica.
    """
    state = state if state is not None else []
    local = {k: v for k, v in step_outputs.items() if k != self.loss}
    num_parts = len(local["example_index"])
    for i in range(num_parts):  # one entry per replica (experimental_local_results)
      state.append({k: np.asarray(v[i]) for k, v in local.items()})
    return state

  def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
    """Scores the whole validation set and, on the chief, writes the evaluation files.

    Args:
      aggregated_logs: aggregate_logs' list.
      global_step: the step evaluated (a tf.Variable), or None.

    Returns:
      The metrics of openqa_evaluation.score (exact_match, recall@k, reader_oracle,
      answer_located, ...); the per-question records are kept as `predictions` and written
      by save_evaluation.

    Raises:
      ValueError: the evaluation did not cover every question.
    """
    gathered = {k: np.concatenate([s[k] for s in aggregated_logs])
                for k in aggregated_logs[0]}
    path = self.task_config.validation_data.input_path
    metrics, self._records.records = evaluation.score(
        self.qa_set(path, self.task_config.validation_data.max_examples).examples,
        self.index.store, gathered, self.tokenizer, self.task_config.answer_regex,
        self.task_config.num_candidates)
    step = int(global_step.numpy()) if global_step is not None else 0
    if self.model_dir and self.role.is_chief:
      files = save_evaluation(self.model_dir, self.evaluation_name, step, metrics,
                              self.predictions, self.evaluation_log)
      logging.info("[openqa] evaluation at step %d: EM %.4f recall@5 %.4f (%s)", step,
                   metrics["exact_match"], metrics["recall@5"], files["metrics"])
    return metrics

  # ------------------------------------------------------------------------- host side

  def initialize(self, model):
    """A fresh run's weights, per task.init_from from task.init_checkpoint.

    'ict': the retriever from an ICT run; 'realm': retriever and reader encoder from a
    pre-training run (restore_from_pretraining); 'openqa_reader': the reader of another
    Open-QA run (restore_reader); 'warm_start': build_model's weights as they are.

    Args:
      model: the OpenQAModel.
    """
    c = self.task_config
    if c.init_from == "ict" and model.retriever is not None:
      path = layout.latest_checkpoint(c.init_checkpoint)
      tf.train.Checkpoint(model=model.retriever).read(path).expect_partial()
      base.log_restore("Retriever (ICT)", path)
    elif c.init_from == "realm":
      restore_from_pretraining(model, c.init_checkpoint)
    elif c.init_from == "openqa_reader":
      restore_reader(model, c.init_checkpoint)

  def start_index(self, model, global_step: int, train: bool):
    """Loads the first index (dense retrieval); with refresh_index, follows newer ones.

    Without a committed index, the current retriever is exported as snapshot `global_step`
    and one index is built from it by a child index builder (the same `beam.index_builder`
    that refreshes indexes during pre-training).

    Args:
      model: the OpenQAModel.
      global_step: the step training or evaluation starts from.
      train: a training run (refresh_index applies only then).
    """
    if not self.dense:
      return
    i, c = self.experiment.index, self.task_config
    refreshing = train and self.refreshes_index
    self.start_refresher(
        model, global_step, train,
        refresh_every_steps=c.refresh_every_steps if refreshing else 0, start_builder=True,
        max_staleness_steps=i.max_staleness_steps if refreshing else 0)

  def on_train_begin(self, model, global_step: int):
    """Dense retrieval: loads (or has built) the first index; see start_index."""
    self.start_index(model, global_step, train=True)

  def on_evaluate_begin(self, model, global_step: int):
    """Dense retrieval: loads the first index, or a side-car follows the newest."""
    if not self.dense:
      return
    if self.index.version is None:
      self.start_index(model, global_step, train=False)
    elif self.side_car:
      self.follow_index()

  def on_evaluate_end(self, global_step: int, logs: dict):
    """Nothing more: reduce_aggregated_logs already wrote the evaluation (save_evaluation)."""
    del global_step, logs


def save_evaluation(model_dir: str, name: str, step: int, metrics: dict,
                    predictions: list[dict], log_path: str = "") -> dict:
  """Writes one evaluation: metrics, per-question predictions and a log line.

  Args:
    model_dir: the run's directory; files go to <model_dir>/eval/.
    name: the evaluation's name (RealmTask.evaluation_name).
    step: the step evaluated.
    metrics: name → value (JSON-serialisable).
    predictions: one record per question (openqa_evaluation.score).
    log_path: the JSON-lines log to append to (default the run's metrics.jsonl; a
      side-car evaluator's own file).

  Returns:
    {'metrics': <model_dir>/eval/<name>-<step>.json, 'predictions': the same with
    .predictions.jsonl}.
  """
  directory = layout.eval_dir(model_dir)
  tf.io.gfile.makedirs(directory)
  base_name = os.path.join(directory, f"{name}-{step}")
  files = dict(metrics=base_name + ".json", predictions=base_name + ".predictions.jsonl")
  evaluation.write_predictions(files["predictions"], predictions)
  with tf.io.gfile.GFile(files["metrics"], "w") as f:
    json.dump(dict(metrics, step=step), f, indent=2, sort_keys=True)
  layout.append_json_line(log_path or layout.metrics_path(model_dir),
                          dict(metrics, step=step, mode=f"eval:{name}"))
  return files
