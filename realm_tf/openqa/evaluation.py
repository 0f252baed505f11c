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
from realm_tf.openqa import answers as answers_lib
from realm_tf.openqa.inputs import QAExample
from realm_tf.text.tokenization import Tokenizer, span_text

RECALL_AT = (1, 5, 20)


def _softmax(logits: np.ndarray) -> np.ndarray:
  shifted = logits - logits.max(axis=-1, keepdims=True)
  e = np.exp(shifted)
  return e / e.sum(axis=-1, keepdims=True)


def span_strings(tokenizer: Tokenizer, texts: Sequence[str], starts: np.ndarray,
                 ends: np.ndarray) -> list[str]:
  """The original text under body wordpieces [start, end] of each block text."""
  if not len(texts):
    return []
  texts_t = tf.constant([t.encode("utf-8") for t in texts])
  _, token_starts, token_ends = tokenizer.tokenize_with_offsets(texts_t)
  lengths = token_starts.row_lengths().numpy()
  # A span the reader chose always lies inside the body; clipping only guards the gather.
  starts = np.clip(starts, 0, np.maximum(lengths - 1, 0))
  ends = np.clip(ends, starts, np.maximum(lengths - 1, 0))
  found = span_text(texts_t, token_starts, token_ends, starts, ends).numpy()
  return [s.decode("utf-8") if n else "" for s, n in zip(found, lengths)]


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
