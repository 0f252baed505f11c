"""Entity-level F1 (seqeval, CoNLL's own metric) of a tagger over a CoNLL-2003 file.

The tagger is scored as it is used: each sentence is given as raw text (tokens joined by
spaces) to the same tag function the exported model serves, and the spans it returns are
mapped back to one BIO tag per CoNLL token. A token takes the tag of the span covering its
first character, so seqeval sees what the tagger's first wordpiece of the token decided.
"""
from typing import Sequence

from seqeval import metrics

from realm_tf.tagger.conll import Sentence
from realm_tf.tagger.inference import TagFn


def spans_to_token_tags(tokens: Sequence[str], spans: Sequence[dict]) -> list[str]:
  """Char spans over " ".join(tokens) → BIO tags, one per token."""
  tags, offset, previous_span = [], 0, None
  for token in tokens:
    covering = next((i for i, s in enumerate(spans) if s["start"] <= offset < s["end"]), None)
    if covering is None:
      tags.append("O")
    else:
      prefix = "I" if covering == previous_span else "B"
      tags.append(f"{prefix}-{spans[covering]['label']}")
    previous_span = covering
    offset += len(token) + 1
  return tags


def predict_tags(tag_fn: TagFn, sentences: Sequence[Sentence],
                 batch_size: int = 64) -> list[list[str]]:
  """Predicted BIO tags per sentence. Sentences are batched by length, so padding is small."""
  order = sorted(range(len(sentences)), key=lambda i: len(sentences[i].tokens))
  predicted: list[list[str]] = [[] for _ in sentences]
  for begin in range(0, len(order), batch_size):
    batch = order[begin:begin + batch_size]
    texts = [" ".join(sentences[i].tokens) for i in batch]
    for i, spans in zip(batch, tag_fn(texts)):
      predicted[i] = spans_to_token_tags(sentences[i].tokens, spans)
  return predicted


def entity_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict:
  """Micro precision / recall / F1 over entities, and F1 per entity type (seqeval)."""
  report = metrics.classification_report(gold, predicted, output_dict=True, zero_division=0)
  per_type = {label: round(float(values["f1-score"]), 4) for label, values in report.items()
              if label not in ("micro avg", "macro avg", "weighted avg")}
  return {
      "f1": round(float(metrics.f1_score(gold, predicted)), 4),
      "precision": round(float(metrics.precision_score(gold, predicted)), 4),
      "recall": round(float(metrics.recall_score(gold, predicted)), 4),
      "per_type_f1": per_type,
      "sentences": len(gold),
  }


def evaluate_sentences(tag_fn: TagFn, sentences: Sequence[Sentence],
                       batch_size: int = 64) -> dict:
  gold = [s.tags for s in sentences]
  return entity_scores(gold, predict_tags(tag_fn, sentences, batch_size))
