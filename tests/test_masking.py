"""Masking modes for pre-training: salient spans, random tokens, random spans."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf.data.masking import MODES, mask_query
from realm_tf.tagger.spans import char_to_byte_offsets

MASK_ID = 103
MAX_PREDICTIONS = 8


def run(tokens, spans=(), seed=(0, 0), mode="salient_spans", **kwargs):
  """tokens: (id, byte_start, byte_end) triples; spans: (byte_start, byte_end) pairs."""
  ids = tf.constant([t[0] for t in tokens], tf.int32)
  starts = tf.constant([t[1] for t in tokens], tf.int64)
  ends = tf.constant([t[2] for t in tokens], tf.int64)
  span_starts = tf.constant([s[0] for s in spans], tf.int64)
  span_ends = tf.constant([s[1] for s in spans], tf.int64)
  kwargs.setdefault("max_predictions", MAX_PREDICTIONS)
  out = mask_query(ids, starts, ends, span_starts, span_ends, tf.constant(seed, tf.int64),
                   mode=mode, mask_id=MASK_ID, **kwargs)
  return {k: v.numpy() for k, v in out.items()}


def words(n):
  """n wordpieces 'w0 w1 ...' two bytes apart: ids 1000+i, bytes [3i, 3i+2)."""
  return [(1000 + i, 3 * i, 3 * i + 2) for i in range(n)]


def masked_positions(out):
  return out["masked_lm_positions"][out["masked_lm_weights"] > 0].tolist()


def check_consistent(tokens, out, position_offset=0):
  """Outputs agree with each other: [MASK] exactly at the positions, original ids kept."""
  ids = np.array([t[0] for t in tokens])
  positions = np.array(masked_positions(out), dtype=int) - position_offset
  n = len(positions)
  assert out["masked_lm_positions"].shape == (MAX_PREDICTIONS,)
  assert out["masked_lm_ids"].shape == (MAX_PREDICTIONS,)
  assert out["masked_lm_weights"].tolist() == [1.0] * n + [0.0] * (MAX_PREDICTIONS - n)
  assert positions.tolist() == sorted(set(positions.tolist()))
  assert out["masked_lm_ids"][:n].tolist() == ids[positions].tolist()
  assert out["masked_lm_ids"][n:].tolist() == [0] * (MAX_PREDICTIONS - n)
  expected = ids.copy()
  expected[positions] = MASK_ID
  assert out["input_ids"].tolist() == expected.tolist()


def test_salient_spans_masks_every_wordpiece_of_one_span():
  tokens = words(20)
  spans = [(6, 11), (30, 38)]  # wordpieces {2, 3} and {10, 11, 12}
  seen = set()
  for seed in range(20):
    out = run(tokens, spans, seed=(7, seed))
    check_consistent(tokens, out)
    seen.add(tuple(masked_positions(out)))
  assert seen == {(2, 3), (10, 11, 12)}


def test_salient_spans_is_deterministic_given_the_seed():
  tokens, spans = words(30), [(0, 5), (15, 20), (45, 50), (60, 70)]
  first = run(tokens, spans, seed=(3, 4))
  again = run(tokens, spans, seed=(3, 4))
  for key in first:
    np.testing.assert_array_equal(first[key], again[key])


def test_salient_spans_skip_spans_that_cannot_be_predicted():
  tokens = words(20)
  too_long = (0, 3 * 10)  # ten wordpieces > max_predictions
  truncated_away = (100, 110)  # beyond the query's last byte
  usable = (45, 47)  # wordpiece 15
  for seed in range(5):
    out = run(tokens, [too_long, truncated_away, usable], seed=(0, seed))
    assert masked_positions(out) == [15]


def test_salient_spans_falls_back_to_random_spans():
  tokens = words(40)
  fallbacks = set()
  for seed in range(5):
    out = run(tokens, spans=(), seed=(1, seed))
    check_consistent(tokens, out)
    positions = masked_positions(out)
    assert len(positions) == 6  # round(0.15 * 40), as in 'random_spans'
    fallbacks.add(tuple(positions))
  assert len(fallbacks) > 1


def test_random_tokens_masks_fifteen_percent():
  tokens = words(40)
  draws = set()
  for seed in range(5):
    out = run(tokens, [(0, 5)], seed=(seed, 0), mode="random_tokens")
    check_consistent(tokens, out)
    assert len(masked_positions(out)) == 6  # round(0.15 * 40)
    draws.add(tuple(masked_positions(out)))
  assert len(draws) > 1, "different seeds should mask different tokens"


def test_random_tokens_respects_max_predictions():
  tokens = words(200)
  out = run(tokens, mode="random_tokens")
  check_consistent(tokens, out)
  assert len(masked_positions(out)) == MAX_PREDICTIONS


def test_random_spans_fill_the_budget():
  tokens = words(40)
  for seed in range(10):
    for max_span_length in (1, 4, 10):
      out = run(tokens, seed=(seed, 9), mode="random_spans", max_span_length=max_span_length)
      check_consistent(tokens, out)
      assert len(masked_positions(out)) == 6


def test_random_spans_favour_runs_over_scattered_tokens():
  tokens = words(60)
  adjacent = total = 0
  for seed in range(20):
    positions = masked_positions(run(tokens, seed=(seed, 1), mode="random_spans"))
    adjacent += sum(b == a + 1 for a, b in zip(positions, positions[1:]))
    total += len(positions)
  # Geometric(0.2) spans have mean length ~3.8: most masked pieces neighbour another.
  assert adjacent / total > 0.4


def test_position_offset_shifts_only_real_predictions():
  tokens = words(10)
  out = run(tokens, [(9, 14)], position_offset=1)  # wordpieces 3 and 4
  check_consistent(tokens, out, position_offset=1)
  assert out["masked_lm_positions"].tolist() == [4, 5] + [0] * (MAX_PREDICTIONS - 2)


def test_empty_query_yields_only_padding():
  out = run([], mode="random_spans")
  assert out["input_ids"].tolist() == []
  assert out["masked_lm_weights"].sum() == 0


@pytest.mark.parametrize("mode", MODES)
def test_runs_inside_tf_data(mode):
  tokens = words(20)
  ids = tf.constant([t[0] for t in tokens], tf.int32)
  starts = tf.constant([t[1] for t in tokens], tf.int64)
  ends = tf.constant([t[2] for t in tokens], tf.int64)
  dataset = tf.data.Dataset.range(4).map(lambda i: mask_query(
      ids, starts, ends, tf.constant([6], tf.int64), tf.constant([11], tf.int64),
      tf.stack([tf.constant(5, tf.int64), i]), mode=mode, mask_id=MASK_ID,
      max_predictions=MAX_PREDICTIONS))
  assert dataset.element_spec["masked_lm_positions"].shape == [MAX_PREDICTIONS]
  first = [x["masked_lm_positions"].numpy().tolist() for x in dataset]
  second = [x["masked_lm_positions"].numpy().tolist() for x in dataset]
  assert first == second
  for row in first:
    assert sum(p > 0 for p in row) >= 1


def test_char_spans_convert_to_the_tokenizers_byte_offsets(tokenizer):
  text = "Müller flew to Zürich."
  span = {"start": text.index("Zürich"), "end": text.index("Zürich") + len("Zürich"),
          "label": "LOC"}
  starts, ends = char_to_byte_offsets(text, [span])
  ids, token_starts, token_ends = tokenizer.tokenize_with_offsets(tf.constant([text]))
  out = mask_query(ids[0], token_starts[0], token_ends[0], tf.constant(starts, tf.int64),
                   tf.constant(ends, tf.int64), tf.constant([0, 0], tf.int64),
                   mode="salient_spans", mask_id=tokenizer.mask_id, max_predictions=4)
  n = int(out["masked_lm_weights"].numpy().sum())
  masked = tokenizer.detokenize(out["masked_lm_ids"][None, :n]).numpy()[0].decode()
  assert masked == "zurich"


def test_unknown_mode_is_rejected():
  with pytest.raises(ValueError, match="masking mode"):
    run(words(5), mode="whole_words")
