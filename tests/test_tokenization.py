"""In-graph WordPiece tokenization and join_bert packing."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf.text import Tokenizer, span_text


def _row(x, i=0):
  return {k: v.numpy()[i].tolist() for k, v in x.as_dict().items()}


def test_join_single_segment(tokenizer):
  x = tokenizer.encode(["Hello world"], 6)
  row = _row(x)
  ids = tokenizer.tokenize(tf.constant(["hello world"])).to_list()[0]
  assert row["input_word_ids"] == [tokenizer.cls_id, *ids, tokenizer.sep_id, 0, 0]
  assert row["input_mask"] == [1, 1, 1, 1, 0, 0]
  assert row["input_type_ids"] == [0] * 6


def test_join_pair_segment_ids_and_mask(tokenizer):
  x = tokenizer.encode(["who wrote hamlet"], 12, pair_texts=["shakespeare"])
  row = _row(x)
  q = tokenizer.tokenize(tf.constant(["who wrote hamlet"])).to_list()[0]
  d = tokenizer.tokenize(tf.constant(["shakespeare"])).to_list()[0]
  expected = [tokenizer.cls_id, *q, tokenizer.sep_id, *d, tokenizer.sep_id]
  assert row["input_word_ids"][:len(expected)] == expected
  assert row["input_type_ids"][:len(expected)] == [0] * (len(q) + 2) + [1] * (len(d) + 1)
  assert row["input_mask"] == [1] * len(expected) + [0] * (12 - len(expected))


def test_truncation_rules(tokenizer):
  long_a = " ".join(["alpha"] * 20)
  long_b = " ".join(["beta"] * 20)
  rr = _row(tokenizer.encode([long_a], 11, pair_texts=[long_b], truncation="round_robin"))
  wf = _row(tokenizer.encode(["short query"], 11, pair_texts=[long_b], truncation="waterfall"))
  # 11 - 3 special tokens = 8 wordpieces: round robin splits them 4/4.
  assert rr["input_type_ids"] == [0] * 6 + [1] * 5
  assert all(m == 1 for m in rr["input_mask"])
  # Waterfall keeps the query whole and gives the rest to the block.
  q = tokenizer.tokenize(tf.constant(["short query"])).to_list()[0]
  assert wf["input_word_ids"][1:1 + len(q)] == q
  assert wf["input_word_ids"][-1] == tokenizer.sep_id
  with pytest.raises(ValueError, match="truncation"):
    tokenizer.encode(["a"], 8, truncation="longest_first")
  with pytest.raises(ValueError, match="no room"):
    tokenizer.encode(["a"], 3, pair_texts=["b"])


def test_batch_of_ragged_inputs_packs_each_row(tokenizer):
  x = tokenizer.encode(["a b c d e f g", "z"], 8)
  assert x.input_word_ids.shape == (2, 8)
  assert x.input_mask.numpy().sum(1).tolist() == [8, 3]
  assert x.input_word_ids.dtype == tf.int32


def test_span_text_returns_original_surface_form(tokenizer):
  texts = tf.constant(["Neil Armstrong walked on the Moon in July 1969.",
                       "Café Tacvba played in Zürich."])
  ids, starts, ends = tokenizer.tokenize_with_offsets(texts)
  words = [tokenizer.vocab[i] for i in ids.to_list()[1]]
  zurich = words.index("zurich")
  got = span_text(texts, starts, ends, tf.constant([0, 0]), tf.constant([1, zurich])).numpy()
  assert got[0].decode() == "Neil Armstrong"
  assert got[1].decode() == "Café Tacvba played in Zürich"
  # A wordpiece-split word comes back whole when its pieces are spanned.
  arm = tokenizer.tokenize(tf.constant(["armstrong"])).to_list()[0]
  assert len(arm) >= 1


def test_detokenize_joins_wordpieces(tokenizer):
  ids = tokenizer.tokenize(tf.constant(["Tokenization works"]))
  assert tokenizer.detokenize(ids).numpy()[0].decode() == "tokenization works"


def test_null_block_is_empty_title_and_body(tokenizer):
  x = _row(tokenizer.null_block(batch_size=3, seq_length=6), 2)
  assert x["input_word_ids"] == [tokenizer.cls_id, tokenizer.sep_id, tokenizer.sep_id, 0, 0, 0]
  assert x["input_mask"] == [1, 1, 1, 0, 0, 0]


def test_tokenizer_runs_inside_tf_function(tokenizer):
  @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
  def encode(texts):
    return tokenizer.encode(texts, 10).input_word_ids

  np.testing.assert_array_equal(encode(tf.constant(["hello"])).numpy(),
                                tokenizer.encode(["hello"], 10).input_word_ids.numpy())


def test_vocab_without_special_tokens_is_refused(tmp_path):
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("[PAD]\n[UNK]\nhello\n")
  with pytest.raises(ValueError, match=r"lacks \[CLS\]"):
    Tokenizer(str(vocab))
