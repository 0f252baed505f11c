"""Open-QA metrics and per-question predictions, from the reader's and retriever's outputs.

  exact_match     the predicted answer is correct: SQuAD-normalised string equality with a
                  reference, or (CuratedTREC) a reference pattern matching the prediction.
  recall@k        one of the top-k retrieved blocks contains an answer
                  (answers.contains_answer on the block's text), k in RECALL_AT.
  reader_oracle   the exact match a reader would reach if it always chose a correct span
                  when one exists: the fraction of questions for which some span the reader
                  can output (inside the top-K blocks as it sees them, truncated to its
                  input, at most max_span_width wordpieces) equals an answer string, as
                  the training span locator labels spans (spans.locate_answer_spans).
  answer_located  the fraction of questions with answer strings to look for at all (for
                  CuratedTREC: a pattern that matches somewhere in the corpus).

The prediction is the best span over all K read blocks jointly (ORQA: the reader's softmax
is over every span of every block), so p(z|x) does not re-rank spans; it is reported per
retrieved block, as the softmax over the retrieved blocks' relevance scores.
"""
import json
import os
import uuid
from typing import Sequence

import numpy as np
import tensorflow as tf

from realm_tf.data.block_store import BlockStore
from realm_tf.text import answers as answers_lib
from realm_tf.data.openqa_inputs import QAExample
from realm_tf.text.tokenization import Tokenizer, span_text

RECALL_AT = (1, 5, 20)


def _softmax(logits: np.ndarray) -> np.ndarray:
  shifted = logits - logits.max(axis=-1, keepdims=True)
  e = np.exp(shifted)
  return e / e.sum(axis=-1, keepdims=True)


def best_spans(span_logits: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
  """The best (block, span) over all K blocks jointly: indices [B], [B] and logits [B]."""
  num_spans = tf.shape(span_logits)[2]
  flat = tf.reshape(span_logits, [tf.shape(span_logits)[0], -1])  # [B, K*S]
  best = tf.argmax(flat, axis=1, output_type=tf.int32)
  return best // num_spans, best % num_spans, tf.reduce_max(flat, axis=1)


def choose_answers(span_logits: tf.Tensor, span_starts: tf.Tensor, span_ends: tf.Tensor,
                   body_start: tf.Tensor) -> dict[str, tf.Tensor]:
  """The predicted span of each question, in graph: the one rule evaluation, the Open-QA
  task's validation step and the serving exports (realm_tf.export.qa) all apply, so a
  served answer is exactly the evaluated one.

  Args:
    span_logits: [B, K, S] the reader's logits over the K blocks read.
    span_starts, span_ends: [S] token positions of the spans in the reader inputs.
    body_start: [B] position of the first body wordpiece in the reader inputs.
  Returns:
    best_block [B] (0..K-1), best_start / best_end [B] (inclusive body wordpiece indices,
    as `answer_strings` takes them) and best_score [B] (the span's logit).
  """
  block, span, score = best_spans(span_logits)
  return dict(best_block=block,
              best_start=tf.gather(span_starts, span) - body_start,
              best_end=tf.gather(span_ends, span) - body_start,
              best_score=score)


def answer_strings(tokenizer: Tokenizer, texts: tf.Tensor, starts: tf.Tensor,
                   ends: tf.Tensor) -> tf.Tensor:
  """[B] the original text under body wordpieces [start, end] of each block text, in graph.

  The texts are tokenized again with offsets (the index stores ids only), so the answer
  keeps the case, accents and punctuation of the corpus. An empty text gives "".
  """
  texts = tf.convert_to_tensor(texts, tf.string)
  _, token_starts, token_ends = tokenizer.tokenize_with_offsets(texts)
  lengths = tf.cast(token_starts.row_lengths(), tf.int64)  # [B]
  last = tf.maximum(lengths - 1, 0)
  # A span the reader chose always lies inside the body; clipping only guards the gather.
  starts = tf.clip_by_value(tf.cast(starts, tf.int64), 0, last)
  ends = tf.clip_by_value(tf.cast(ends, tf.int64), starts, last)
  # Rows without wordpieces get one dummy offset so the gather is defined, then "".
  pad = tf.cast(tf.equal(lengths, 0), tf.int64)
  safe_starts = _pad_empty_rows(token_starts, pad)
  safe_ends = _pad_empty_rows(token_ends, pad)
  found = span_text(texts, safe_starts, safe_ends, starts, ends)
  return tf.where(lengths > 0, found, tf.constant("", tf.string))


def _pad_empty_rows(offsets: tf.RaggedTensor, pad: tf.Tensor) -> tf.RaggedTensor:
  """Appends a 0 offset to the rows flagged by `pad` ([B] 0/1)."""
  return tf.concat([tf.cast(offsets, tf.int64),
                    tf.RaggedTensor.from_row_lengths(tf.zeros([tf.reduce_sum(pad)], tf.int64),
                                                     pad)], axis=1)


def span_strings(tokenizer: Tokenizer, texts: Sequence[str], starts: np.ndarray,
                 ends: np.ndarray) -> list[str]:
  """Host-side `answer_strings` over Python strings (evaluation's predictions)."""
  if not len(texts):
    return []
  found = answer_strings(tokenizer, tf.constant([t.encode("utf-8") for t in texts]),
                         tf.constant(np.asarray(starts, np.int64)),
                         tf.constant(np.asarray(ends, np.int64))).numpy()
  return [s.decode("utf-8") for s in found]


def score(examples: Sequence[QAExample], store: BlockStore, outputs: dict,
          tokenizer: Tokenizer, regex: bool, num_read: int) -> tuple[dict, list[dict]]:
  """Metrics and prediction records from gathered evaluation outputs.

  outputs (numpy, one row per question): example_index [Q], rows [Q, R] table rows of the
  retrieved blocks, retrieval_logits [Q, R], best_block [Q] (0..K-1), best_start/best_end
  [Q] body wordpiece indices, best_score [Q], oracle [Q] bool.
  """
  order = np.argsort(outputs["example_index"], kind="stable")
  out = {k: np.asarray(v)[order] for k, v in outputs.items()}
  n = len(out["example_index"])
  if n != len(examples):
    raise ValueError(f"evaluation covered {n} of {len(examples)} questions")
  rows = out["rows"]  # [Q, R]
  chosen_rows = rows[np.arange(n), out["best_block"]]
  texts = [store.text_strings[r] for r in chosen_rows]
  predictions = span_strings(tokenizer, texts, out["best_start"], out["best_end"])
  p_z = _softmax(out["retrieval_logits"].astype(np.float64))
  records, correct, hits = [], [], {k: [] for k in RECALL_AT}
  for i, example in enumerate(examples):
    ok = answers_lib.is_correct(predictions[i], example.answers, regex)
    has = [answers_lib.contains_answer(store.text_strings[r], example.answers, regex)
           for r in rows[i]]
    for k in RECALL_AT:
      hits[k].append(any(has[:k]))
    correct.append(ok)
    records.append(dict(
        question=example.question, gold=example.answers, prediction=predictions[i],
        correct=bool(ok), reader_oracle=bool(out["oracle"][i]),
        chosen=dict(rank=int(out["best_block"][i]),
                    block_id=int(store.block_ids[chosen_rows[i]]),
                    title=store.title_strings[chosen_rows[i]],
                    start_wordpiece=int(out["best_start"][i]),
                    end_wordpiece=int(out["best_end"][i]),
                    span_logit=float(out["best_score"][i])),
        retrieved=[dict(rank=j, block_id=int(store.block_ids[r]),
                        title=store.title_strings[r],
                        score=float(out["retrieval_logits"][i, j]),
                        p_z_given_x=float(p_z[i, j]), read=j < num_read,
                        has_answer=bool(has[j]))
                   for j, r in enumerate(rows[i])]))
  metrics = dict(num_questions=n, exact_match=float(np.mean(correct)),
                 reader_oracle=float(np.mean(out["oracle"])),
                 answer_located=float(np.mean(out["located"])),
                 num_retrieved=int(rows.shape[1]), num_read=num_read)
  for k in RECALL_AT:
    metrics[f"recall@{k}"] = float(np.mean(hits[k]))
  return metrics, records


def write_predictions(path: str, records: Sequence[dict]) -> str:
  """JSON lines, one per question, written to a temporary name and renamed into place."""
  directory = os.path.dirname(path)
  if directory:
    tf.io.gfile.makedirs(directory)
  tmp = f"{path}.tmp-{uuid.uuid4().hex}"
  with tf.io.gfile.GFile(tmp, "w") as f:
    for record in records:
      f.write(json.dumps(record, ensure_ascii=False) + "\n")
  tf.io.gfile.rename(tmp, path, overwrite=True)
  return path
