"""Answer normalisation and matching on hand-written cases (realm_tf.text.answers)."""
import json

import pytest

from realm_tf.text import answers
from realm_tf.data.openqa_inputs import read_questions


@pytest.mark.parametrize("text, normalized", [
    ("The Beatles", "beatles"),             # article
    ("  a  Tale of Two Cities!", "tale of two cities"),  # article, punctuation, spaces
    ("U.S.A.", "usa"),                      # punctuation inside
    ("Theatre an Anne", "theatre anne"),    # articles only as whole words
    ("1,000", "1000"),
    ("Padmé Amidala", "padme\u0301 amidala"),  # letters kept, accents decomposed (NFD)
    ("\"Hello,\" she said.", "hello she said"),
    ("THE END", "end"),
])
def test_squad_normalisation(text, normalized):
  assert answers.normalize_answer(text) == normalized


def test_nfd_makes_composed_and_decomposed_accents_equal():
  """DrQA's and ORQA's normalize_answer start with NFD: the same name typed with a
  precomposed 'é' (U+00E9) or 'e' + combining acute (U+0301) is the same answer."""
  composed, decomposed = "Beyonc\u00e9", "Beyonce\u0301"
  assert composed != decomposed
  assert answers.normalize_answer(composed) == answers.normalize_answer(decomposed)
  assert answers.exact_match(composed, [decomposed])
  assert answers.contains_answer(f"Songs by {decomposed} topped the charts", [composed], False)
  assert not answers.exact_match("Beyonce", [composed])  # the accent itself still counts


def test_exact_match_like_the_papers():
  # Case, articles and punctuation never decide a match; words do.
  assert answers.exact_match("the Eiffel Tower.", ["Eiffel Tower"])
  assert answers.exact_match("eiffel tower", ["The Eiffel Tower"])
  assert answers.exact_match("Tower", ["Eiffel Tower", "tower"])
  assert not answers.exact_match("Eiffel Towers", ["Eiffel Tower"])
  assert not answers.exact_match("the Eiffel Tower in Paris", ["Eiffel Tower"])
  assert not answers.exact_match("", ["Eiffel Tower"])


def test_regex_match_is_curatedtrec_style():
  # re.match (anchored at the start of the prediction), case-insensitive, as DrQA/ORQA.
  assert answers.regex_match("September", [r"Sept?(ember)?|Feb(ruary)?"])
  assert answers.regex_match("february 2010", [r"Sept?(ember)?|Feb(ruary)?"])
  assert not answers.regex_match("in September", [r"Sept?(ember)?|Feb(ruary)?"])
  assert answers.regex_match("SAUDI ARABIA", ["Saudi Arabia"])
  assert answers.regex_match("NewYork", [r"Long Island|New\s?York|Roosevelt Field"])
  assert answers.is_correct("5,778 K", [r"(5,?778|6,?[05]00)\s*K"], regex=True)
  assert not answers.is_correct("5,778 K", [r"(5,?778|6,?[05]00)\s*K"], regex=False)


def test_contains_answer_respects_word_boundaries():
  text = "The Beatles were an English rock band formed in Liverpool in 1960."
  assert answers.contains_answer(text, ["the beatles"], regex=False)
  assert answers.contains_answer(text, ["Liverpool"], regex=False)
  assert not answers.contains_answer("Beatlesque pop songs", ["Beatles"], regex=False)
  assert not answers.contains_answer(text, ["a"], regex=False)  # normalises to nothing
  assert answers.contains_answer(text, [r"19[56]0"], regex=True)  # found anywhere
  assert not answers.contains_answer(text, [r"19[78]0"], regex=True)


def test_answer_variants_and_pattern_expansion():
  assert answers.answer_variants(["The Beatles", "beatles", "U.S."]) == [
      "The Beatles", "beatles", "U.S.", "us"]
  corpus = "Mt. Everest is the highest.\nClimbers call it Everest.\nEverest again."
  assert answers.expand_patterns([r"Mt\.? Everest|Everest"], corpus, 5) == [
      "Everest", "Mt. Everest"]  # most frequent first
  assert answers.expand_patterns([r"K2"], corpus, 5) == []


def test_read_questions_names_the_bad_record(tmp_path):
  path = tmp_path / "q.jsonl"
  path.write_text(json.dumps({"question": "Who?", "answer": ["Ann"]}) + "\n"
                  + json.dumps({"question": "What?", "answer": "Bob"}) + "\n")
  got = read_questions(str(path))
  assert [(e.question, e.answers) for e in got] == [("Who?", ["Ann"]), ("What?", ["Bob"])]
  path.write_text(json.dumps({"question": "Who?", "answer": []}) + "\n")
  with pytest.raises(ValueError, match=r"q\.jsonl:1: 'answer' must be"):
    read_questions(str(path))
  path.write_text(json.dumps({"question": "Who?", "answer": ["ok"]}) + "\n{not json\n")
  with pytest.raises(ValueError, match=r"q\.jsonl:2: not JSON"):
    read_questions(str(path))
  path.write_text(json.dumps({"question": "When?", "answer": ["(unclosed"]}) + "\n")
  with pytest.raises(ValueError, match=r"q\.jsonl:1: .*unclosed"):
    read_questions(str(path), regex=True)
