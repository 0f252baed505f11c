"""The Open-QA fine-tuning step for the shared StepTrainer, and its evaluator.

The step retrieves (MIPS over the fixed index, or BM25 top-k from the features), reads the
top-k, locates answer spans in what it read and minimises losses.openqa_loss, divided by
the global batch size (losses.global_mean). Evaluation needs per-question outputs (the
chosen span, the retrieved blocks), so FinetuneEvaluator extends StepEvaluator with
orbit's eval_reduce and scores them on the host (openqa.evaluation).
"""
import functools
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from realm_tf.modeling import losses
from realm_tf.openqa import evaluation, spans
from realm_tf.openqa.corpus import Corpus
from realm_tf.training.trainers import StepEvaluator, _apply, _Metrics

FINETUNE_METRICS = ["loss", "retriever_loss", "reader_loss", "answer_retrieved",
                    "span_accuracy"]


def _best_spans(span_logits: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
  """The best (block, span) over all K blocks jointly: indices [B], [B] and logits [B]."""
  num_spans = tf.shape(span_logits)[2]
  flat = tf.reshape(span_logits, [tf.shape(span_logits)[0], -1])  # [B, K*S]
  best = tf.argmax(flat, axis=1, output_type=tf.int32)
  return best // num_spans, best % num_spans, tf.reduce_max(flat, axis=1)


def _forward(model, corpus: Corpus, num_candidates: int, is_continuation, features: dict,
             training: bool, num_retrieved: Optional[int] = None):
  """Retrieval, reading, span location and the loss terms of one batch."""
  out = model(features, corpus=corpus, num_retrieved=num_retrieved or num_candidates,
              num_read=num_candidates, training=training)
  correct = spans.locate_answer_spans(
      out["reader_inputs"], out["span_starts"], out["span_ends"], features["answer_ids"],
      features["answer_lengths"], is_continuation)  # [B, K, S]
  terms = losses.openqa_loss(out["retrieval_logits"][:, :num_candidates],
                             out["span_logits"], correct)
  return out, correct, terms


def _update_metrics(metrics: _Metrics, out, correct, terms):
  block, span, _ = _best_spans(out["span_logits"])
  picked = tf.gather_nd(correct, tf.stack([tf.range(tf.shape(block)[0]), block, span], 1))
  metrics.update("loss", terms["loss"])
  metrics.update("retriever_loss", terms["retriever_loss"], terms["has_answer"])
  metrics.update("reader_loss", terms["reader_loss"], terms["has_answer"])
  metrics.update("answer_retrieved", terms["has_answer"])
  metrics.update("span_accuracy", tf.cast(picked, tf.float32))


def _finetune_step(model, corpus: Corpus, num_candidates: int, is_continuation,
                   features: dict, metrics: _Metrics, training: bool, optimizer=None):
  with tf.GradientTape() as tape:
    out, correct, terms = _forward(model, corpus, num_candidates, is_continuation, features,
                                   training)
    batch = tf.cast(tf.shape(terms["loss"])[0], tf.float32)
    loss = losses.global_mean(tf.reduce_sum(terms["loss"]), batch)
  if optimizer is not None:
    # The document tower gets no gradient unless it is live (refresh_index): _apply skips it.
    _apply(optimizer, tape, loss, model.trainable_variables)
  _update_metrics(metrics, out, correct, terms)


def finetune_step(model, corpus: Corpus, num_candidates: int,
                  is_continuation: np.ndarray) -> Callable:
  """The StepTrainer step of Open-QA fine-tuning."""
  return functools.partial(_finetune_step, model, corpus, num_candidates,
                           tf.constant(is_continuation))


def retrace(runner):
  """Makes an orbit trainer/evaluator trace its step again (after the index's ScaNN
  searchers were replaced: they are graph state, not variables). orbit builds its loop
  functions lazily from these attributes."""
  for name in ("_train_loop_fn", "_eval_loop_fn"):
    if hasattr(runner, name):
      setattr(runner, name, None)


class _Records:
  """Holds the last evaluation's per-question records out of tf.Module's attribute
  tracking, which would wrap the lists and dicts (and then json cannot write them)."""

  def __init__(self):
    self.records: list[dict] = []


class FinetuneEvaluator(StepEvaluator):
  """Runs every question once; eval_end scores them on the host.

  The step retrieves max(RECALL_AT) blocks for recall@k and reads the top K. The last
  evaluation's per-question records are in `predictions`.
  """

  def __init__(self, strategy, model, corpus: Corpus, dataset_fn: Callable, qa_set,
               tokenizer, num_candidates: int, is_continuation: np.ndarray, regex: bool):
    self.model = model
    self.corpus = corpus
    self.qa_set = qa_set
    self.tokenizer = tokenizer
    self.regex = regex
    self.k = num_candidates
    self.is_continuation = tf.constant(is_continuation)
    self.num_retrieved = min(max(max(evaluation.RECALL_AT), num_candidates),
                             corpus.table.num_blocks)
    self._last = _Records()
    super().__init__(strategy, finetune_step(model, corpus, num_candidates, is_continuation),
                     FINETUNE_METRICS, dataset_fn)

  @property
  def predictions(self) -> list[dict]:
    return self._last.records

  def eval_begin(self):
    self.metrics.reset()
    return []

  def eval_step(self, iterator):
    def replica_step(features):
      out, correct, terms = _forward(self.model, self.corpus, self.k, self.is_continuation,
                                     features, False, self.num_retrieved)
      _update_metrics(self.metrics, out, correct, terms)
      block, span, best_score = _best_spans(out["span_logits"])
      body_start = out["reader_inputs"]["body_start"]  # [B]
      return dict(
          example_index=features["example_index"], rows=out["rows"],
          retrieval_logits=out["retrieval_logits"], best_block=block,
          best_start=tf.gather(out["span_starts"], span) - body_start,
          best_end=tf.gather(out["span_ends"], span) - body_start,
          best_score=best_score, oracle=tf.reduce_any(correct, axis=[1, 2]),
          located=tf.reduce_any(features["answer_lengths"] > 0, axis=1))
    return self.strategy.run(replica_step, args=(next(iterator),))

  def eval_reduce(self, state, step_outputs):
    local = {k: self.strategy.experimental_local_results(v) for k, v in step_outputs.items()}
    for i in range(len(local["example_index"])):
      state.append({k: np.asarray(v[i]) for k, v in local.items()})
    return state

  def eval_end(self, state):
    gathered = {k: np.concatenate([s[k] for s in state]) for k in state[0]}
    metrics, self._last.records = evaluation.score(
        self.qa_set.examples, self.corpus.store, gathered, self.tokenizer, self.regex, self.k)
    in_graph = {k: float(v) for k, v in self.metrics.result().items()}
    return dict(metrics, **{f"step_{k}": v for k, v in in_graph.items()})
