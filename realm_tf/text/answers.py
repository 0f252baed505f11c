"""Answer normalisation and matching, as the Open-QA references score answers.

Strings: exact match after the normalisation of DrQA's and ORQA's evaluation scripts:
Unicode NFD first (so a precomposed 'é' and 'e' + combining acute compare equal, whichever
form the corpus or the reference uses), then SQuAD v1.1's steps (lower-case, drop ASCII
punctuation and the articles a/an/the, collapse white space): the rule NQ-Open,
WebQuestions and SQuAD-open results are reported under. Regular expressions
(CuratedTREC): DrQA's and ORQA's rule, `re.match` of the pattern, case-insensitive, against
the raw predicted string.

This module is plain Python: it scores predictions on the host and prepares answer
strings before they are tokenized; nothing here runs in a training step.
"""
import re
import string
import unicodedata
from typing import Iterable, Sequence

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_REGEX_FLAGS = re.IGNORECASE | re.UNICODE | re.MULTILINE


def normalize_answer(text: str) -> str:
  """ORQA's normalize_answer (NFD, then SQuAD v1.1's): 'The  U.S.A.!' → 'usa'."""
  text = unicodedata.normalize("NFD", text).lower()
  text = "".join(ch for ch in text if ch not in _PUNCTUATION)
  text = _ARTICLES.sub(" ", text)
  return " ".join(text.split())


def compile_pattern(pattern: str) -> re.Pattern:
  """A CuratedTREC answer pattern; re.error names the pattern."""
  try:
    return re.compile(pattern, _REGEX_FLAGS)
  except re.error as e:
    raise re.error(f"answer pattern {pattern!r}: {e}") from e


def exact_match(prediction: str, answers: Sequence[str]) -> bool:
  """Normalised prediction equals some normalised answer."""
  predicted = normalize_answer(prediction)
  return any(predicted == normalize_answer(a) for a in answers)


def regex_match(prediction: str, patterns: Sequence[str]) -> bool:
  """Some pattern matches at the start of the prediction (re.match, as DrQA/ORQA)."""
  return any(compile_pattern(p).match(prediction) is not None for p in patterns)


def is_correct(prediction: str, answers: Sequence[str], regex: bool) -> bool:
  return regex_match(prediction, answers) if regex else exact_match(prediction, answers)


def contains_answer(text: str, answers: Sequence[str], regex: bool) -> bool:
  """Whether a block holds an answer (recall@k): a pattern found anywhere in the text, or a
  normalised answer that appears on word boundaries of the normalised text."""
  if regex:
    return any(compile_pattern(p).search(text) is not None for p in answers)
  haystack = f" {normalize_answer(text)} "
  for answer in answers:
    needle = normalize_answer(answer)
    if needle and f" {needle} " in haystack:
      return True
  return False


def answer_variants(answers: Iterable[str]) -> list[str]:
  """The strings the span locator looks for: each answer as written and its normalised
  form ('The Beatles' → also 'beatles'), so that the spans labelled correct in training
  are, as nearly as wordpieces allow, the spans exact match would accept."""
  out, seen = [], set()
  for answer in answers:
    for variant in (answer.strip(), normalize_answer(answer)):
      if variant and variant not in seen:
        seen.add(variant)
        out.append(variant)
  return out


def expand_patterns(patterns: Sequence[str], corpus_text: str, max_strings: int) -> list[str]:
  """Literal strings that answer patterns match in the corpus (host, once per question).

  A training step locates answers by comparing wordpieces, which a regular expression
  cannot drive; the strings a pattern matches in the knowledge corpus are exactly the spans
  that could be labelled correct, so they stand in for the pattern. `corpus_text` is every
  block's text joined by newlines ('.' never crosses a block boundary). At most
  `max_strings` distinct strings, most frequent first.
  """
  counts: dict[str, int] = {}
  for pattern in patterns:
    for match in compile_pattern(pattern).finditer(corpus_text):
      found = match.group(0).strip()
      if found:
        counts[found] = counts.get(found, 0) + 1
  ranked = sorted(counts, key=lambda s: (-counts[s], s))
  return ranked[:max_strings]
