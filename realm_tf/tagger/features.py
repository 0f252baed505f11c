"""CoNLL sentences → wordpiece training examples, labelled the way the tagger decodes.

The exported tagger sees raw text and splits it the way BERT does: on whitespace and on
punctuation, then into wordpieces. It reads one label per *BERT word* (every wordpiece that
is not a `##` continuation) and lets continuations share their word's label. Training must
label exactly those positions:
  * the first wordpiece of a CoNLL token gets the token's BIO label;
  * a later non-`##` wordpiece of the same token (the "." and "S" of "U.S.") continues
    the entity, so it gets I-X (or O for an O token);
  * `##` continuations get weight 0: they are not predicted, and not in the loss.
Seqeval scores one tag per CoNLL token, which is the tag of the token's first wordpiece.
"""
import dataclasses
from typing import Sequence

import numpy as np
import tensorflow as tf

from realm_tf.tagger.conll import LABEL_IDS, Sentence
from realm_tf.text import Tokenizer


@dataclasses.dataclass
class TaggingExample:
  """One packed sequence `[CLS] pieces [SEP]`; all three lists have the same length."""
  input_ids: list[int]
  label_ids: list[int]
  label_weights: list[int]


def continuation_table(tokenizer: Tokenizer) -> np.ndarray:
  """[vocab_size] bool: True for `##` wordpieces, which continue the previous BERT word."""
  return np.array([token.startswith("##") for token in tokenizer.vocab], dtype=bool)


def _inside(tag: str) -> str:
  return tag if tag == "O" else "I-" + tag[2:]


def _token_pieces(sentences: Sequence[Sentence], tokenizer: Tokenizer) -> list[list[list[int]]]:
  """Wordpiece ids of every token, tokenized in one batched call per corpus."""
  flat = [token for sentence in sentences for token in sentence.tokens]
  pieces = tokenizer.tokenize(tf.constant(flat, dtype=tf.string)).to_list() if flat else []
  out, cursor = [], 0
  for sentence in sentences:
    out.append(pieces[cursor:cursor + len(sentence.tokens)])
    cursor += len(sentence.tokens)
  return out


def _label_pieces(tag: str, pieces: Sequence[int], continuation: np.ndarray
                  ) -> list[tuple[int, int, int]]:
  """(wordpiece id, label id, weight) for the wordpieces of one CoNLL token."""
  out = []
  for i, piece in enumerate(pieces):
    if i == 0:
      out.append((piece, LABEL_IDS[tag], 1))
    elif continuation[piece]:
      out.append((piece, 0, 0))
    else:
      out.append((piece, LABEL_IDS[_inside(tag)], 1))
  return out


def _pack(chunk: Sequence[tuple[int, int, int]], tokenizer: Tokenizer) -> TaggingExample:
  ids, labels, weights = (list(column) for column in zip(*chunk))
  return TaggingExample([tokenizer.cls_id] + ids + [tokenizer.sep_id], [0] + labels + [0],
                        [0] + weights + [0])


def sentence_examples(sentences: Sequence[Sentence], tokenizer: Tokenizer,
                      seq_length: int) -> list[TaggingExample]:
  """Training examples; a sentence longer than seq_length is cut at token boundaries into
  several examples (nothing is truncated away), a single over-long token is clipped."""
  budget = seq_length - 2  # [CLS] and [SEP]
  if budget < 1:
    raise ValueError(f"seq_length must be at least 3, got {seq_length}")
  continuation = continuation_table(tokenizer)
  examples = []
  for sentence, token_pieces in zip(sentences, _token_pieces(sentences, tokenizer)):
    chunk: list[tuple[int, int, int]] = []
    for tag, pieces in zip(sentence.tags, token_pieces):
      pieces = pieces[:budget]
      if chunk and len(chunk) + len(pieces) > budget:
        examples.append(_pack(chunk, tokenizer))
        chunk = []
      chunk.extend(_label_pieces(tag, pieces, continuation))
    if chunk:
      examples.append(_pack(chunk, tokenizer))
  return examples


def training_dataset(examples: Sequence[TaggingExample], batch_size: int, seed: int,
                     repeat: bool = True) -> tf.data.Dataset:
  """Shuffled batches of similar length, padded to the longest in each batch.

  Bucketing by length matters on CPU: CoNLL sentences run from 3 to 100+ wordpieces, and
  padding every batch to seq_length would mostly compute on [PAD].
  """
  if not examples:
    raise ValueError("no training examples")
  ragged = {
      "input_word_ids": tf.ragged.constant([e.input_ids for e in examples], dtype=tf.int32),
      "input_mask": tf.ragged.constant([[1] * len(e.input_ids) for e in examples],
                                       dtype=tf.int32),
      "label_ids": tf.ragged.constant([e.label_ids for e in examples], dtype=tf.int32),
      "label_weights": tf.ragged.constant([e.label_weights for e in examples],
                                          dtype=tf.float32),
  }
  # Shuffle indices and gather rows: a row of a [N, (L)] ragged tensor is a dense [L]
  # tensor, which padded batching needs (slicing the ragged tensor directly would give
  # ragged elements).
  dataset = tf.data.Dataset.range(len(examples))
  dataset = dataset.shuffle(len(examples), seed=seed, reshuffle_each_iteration=True)
  dataset = dataset.map(lambda i: {key: values[i] for key, values in ragged.items()})
  if repeat:
    dataset = dataset.repeat()
  max_length = max(len(e.input_ids) for e in examples)
  boundaries = [b for b in (16, 24, 32, 48, 64, 96) if b < max_length]
  dataset = dataset.bucket_by_sequence_length(
      element_length_func=lambda x: tf.shape(x["input_word_ids"])[0],
      bucket_boundaries=boundaries,
      bucket_batch_sizes=[batch_size] * (len(boundaries) + 1),
      drop_remainder=repeat)
  return dataset.map(_to_bert_inputs).prefetch(tf.data.AUTOTUNE)


def _to_bert_inputs(batch: dict) -> tuple[dict, tf.Tensor, tf.Tensor]:
  # Every feature is [B, L], zero-padded past each sequence's end (mask 0 there).
  inputs = dict(input_word_ids=batch["input_word_ids"], input_mask=batch["input_mask"],
                input_type_ids=tf.zeros_like(batch["input_word_ids"]))
  return inputs, batch["label_ids"], batch["label_weights"]
