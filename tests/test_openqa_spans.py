"""Reader packing and answer-span location in retrieved blocks; BM25 retrieval."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf.data.block_store import BlockStore
from realm_tf.modeling.layers.span_scorer import enumerate_spans
from realm_tf.modeling import spans
from realm_tf.retrieval.bm25 import BM25Retriever
from realm_tf.data.openqa_inputs import QAExample, tokenize_targets

BLOCKS = ["The capital of Veloria is Talmont, a city on the river Amsel.",
          "Parisian cafes line the streets of Paris in France.",
          "Paris Hilton visited Talmont twice."]


def _pack(tokenizer, question, blocks, seq_length):
  query = tokenizer.encode([question], min(16, seq_length - 1))
  pieces = tokenizer.tokenize(tf.constant(blocks))  # [K, (T)]
  body = pieces.to_tensor()[None].numpy()  # [1, K, T]
  lengths = pieces.row_lengths().numpy()[None]  # [1, K]
  return spans.pack_reader_inputs(query.input_word_ids, query.input_mask, tf.constant(body),
                                  tf.constant(lengths), seq_length, tokenizer.sep_id)


@pytest.mark.parametrize("seq_length", [64, 24, 14])
def test_packing_equals_join_bert_waterfall(tokenizer, seq_length):
  question = "What is the capital of Veloria?"
  packed = _pack(tokenizer, question, BLOCKS, seq_length)
  x = tokenizer.tokenize(tf.constant([question] * len(BLOCKS)))
  expected = tokenizer.join_bert([x, tokenizer.tokenize(tf.constant(BLOCKS))], seq_length,
                                 truncation="waterfall")
  for key, value in expected.as_dict().items():
    np.testing.assert_array_equal(packed[key][0].numpy(), value.numpy(), err_msg=key)
  q_len = len(tokenizer.tokenize(tf.constant([question]))[0]) + 2  # [CLS] x [SEP]
  assert int(packed["body_start"][0]) == q_len


def _locate(tokenizer, question, blocks, answer_strings, seq_length=48, width=5):
  packed = _pack(tokenizer, question, blocks, seq_length)
  starts, ends = enumerate_spans(seq_length, width)
  example = QAExample(question, answer_strings, targets=answer_strings)
  ids, lengths = tokenize_targets([example], tokenizer, max_answers=4, width=width)
  correct = spans.locate_answer_spans(packed, starts, ends, tf.constant(ids),
                                      tf.constant(lengths),
                                      tf.constant(spans.continuation_table(tokenizer.vocab)))
  found = []  # (block, text of the wordpieces) of every span marked correct
  for k, s in zip(*np.nonzero(correct[0].numpy())):
    word_ids = packed["input_word_ids"][0, k, starts[s]:ends[s] + 1].numpy()
    found.append((int(k), tokenizer.detokenize(word_ids[None])[0].numpy().decode()))
  return sorted(found)


def test_answer_spans_are_found_in_block_bodies(tokenizer):
  assert _locate(tokenizer, "What is the capital of Veloria?", BLOCKS, ["Talmont"]) == [
      (0, "talmont"), (2, "talmont")]
  # Several wordpieces, case-insensitively (the tokenizer is uncased).
  assert _locate(tokenizer, "Which river?", BLOCKS, ["the River Amsel"]) == [
      (0, "the river amsel")]


def test_answers_in_the_question_or_inside_words_are_not_spans(tokenizer):
  # 'Veloria' is in the question and in block 0's body: only the body counts.
  assert _locate(tokenizer, "Where is Veloria?", BLOCKS, ["Veloria"]) == [(0, "veloria")]
  # 'Paris' must not match the first wordpiece of 'Parisian'.
  assert _locate(tokenizer, "Which city?", BLOCKS, ["Paris"]) == [(1, "paris"), (2, "paris")]


def test_truncated_and_missing_answers_are_not_found(tokenizer):
  # At 12 positions block 0 is cut before 'Talmont'; no block says 'Quessa'.
  assert _locate(tokenizer, "What is the capital?", BLOCKS[:1], ["Talmont"],
                 seq_length=12) == []
  assert _locate(tokenizer, "What is the capital?", BLOCKS[:1], ["Talmont"]) == [
      (0, "talmont")]
  assert _locate(tokenizer, "What is the capital?", BLOCKS, ["Quessa"]) == []
  # Targets longer than the widest span are dropped when tokenized.
  words = "one two three four five six"
  example = QAExample("q", [words], targets=[words])
  ids, lengths = tokenize_targets([example], tokenizer, max_answers=2, width=5)
  assert lengths.tolist() == [[0, 0]] and not ids.any()


def test_bm25_finds_the_obvious_block():
  store = BlockStore([30, 10, 20], ["a", "b", "c"], [b"Veloria", b"Paris", b"Hilton"],
                     [b"The capital of Veloria is Talmont.", b"Parisian cafes in Paris.",
                      b"Paris Hilton visited Talmont."])
  bm25 = BM25Retriever(store)
  ids, scores = bm25.search(["What is the capital of Veloria?", "cafes", "zzzz"], k=2)
  assert ids.shape == (3, 2) and scores.dtype == np.float32
  assert ids[0, 0] == 30 and scores[0, 0] > scores[0, 1]
  assert ids[1, 0] == 10
  assert np.all(scores[2] == 0)  # no known word: nothing scores
