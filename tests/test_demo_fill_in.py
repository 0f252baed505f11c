"""The fill-in accuracy act 1 prints: counted per blank, with how collapsed the fills are."""
import pytest

from realm_tf.demo.fill_in import format_score, own_block_top1, score


def _row(answer, answer_wordpieces, with_retrieval, without_retrieval, block_texts):
  return dict(answer=answer, answer_wordpieces=answer_wordpieces,
              with_retrieval=with_retrieval, without_retrieval=without_retrieval,
              blocks=[dict(text=t) for t in block_texts])


ROWS = [
    _row("Talmont", "talmont", "talmont", "century", ["Its capital is Talmont."]),
    _row("1204", "120 ##4", "120 ##4", "120 ##4", ["Romeo swam in 1204."]),
    _row("Amsel", "am ##sel", "am ##bel", "century", ["The Amselbach flows."]),
    _row("Ruvik", "ru ##vik", "century", "century", ["Nothing here.", "Ruvik, a city."]),
]


def test_accuracy_counts_whole_blanks_and_the_commonest_fill():
  s = score(ROWS)
  assert s["count"] == 4
  w, wo = s["with_retrieval"], s["without_retrieval"]
  assert (w["right"], w["accuracy"]) == (2, 0.5)  # a blank is right only when whole
  assert w["stderr"] == pytest.approx((0.5 * 0.5 / 4) ** 0.5)
  assert (wo["right"], wo["accuracy"]) == (1, 0.25)
  assert wo["commonest_fill"] == dict(fill="century", share=0.75)
  # Wordpieces: century x3 of 5 predicted wordpieces without retrieval.
  assert wo["commonest_wordpiece"] == dict(fill="century", share=0.6)
  # "Amsel" is not a word of "Amselbach": word-bounded, case-insensitive, any block.
  assert s["answer_in_retrieved_block"] == 0.75
  text = format_score(s)
  assert "over 4 held-out masked sentences" in text and "75% of blanks" in text
  assert "with retrieval" in text and " 50.0% ± 25.0 (2 right)" in text


def test_nothing_to_score_is_an_error():
  with pytest.raises(ValueError, match="no filled-in sentences"):
    score([])


def _retrieved(*block_ids):
  """A filled-in row's blocks, most probable first."""
  return dict(blocks=[dict(block_id=b, p=1.0 / len(block_ids)) for b in block_ids])


def test_own_block_top1_counts_the_most_probable_block_only():
  rows = [_retrieved(7, 8), _retrieved(8, 7), _retrieved(3, 7), _retrieved(9, 1)]
  own = [[7, 8], [7], [7], [9]]
  # Row 1: its own block 7 is retrieved, but second; row 2: 3 is not its own.
  got = own_block_top1(rows, own)
  assert (got["count"], got["right"], got["rate"]) == (4, 2, 0.5)
  assert got["stderr"] == pytest.approx((0.5 * 0.5 / 4) ** 0.5)


def test_own_block_top1_needs_one_list_of_own_blocks_per_row():
  with pytest.raises(ValueError, match="one list per row"):
    own_block_top1([_retrieved(1)], [[1], [2]])
  with pytest.raises(ValueError, match="one list per row"):
    own_block_top1([], [])
