"""The records that flow between pipeline steps, and why a record is set aside.

Every input record ends in exactly one of three places: an accepted document, a rule that
drops it on purpose (redirects, disambiguation pages, duplicates, ...), or the dead-letter
output for bad input. The manifest checks `records_in == accepted + set aside` with these.
"""
import dataclasses
from typing import Tuple

# Pages that are fine but are not articles we want: dropped on purpose, only counted.
REDIRECT = "redirect"
DISAMBIGUATION = "disambiguation"
NON_ARTICLE_TITLE = "non_article_title"  # "List of ...", "Index of ...", "Outline of ..."
NAMESPACE = "namespace"  # not the main (article) namespace
DUPLICATE = "duplicate"  # same title and text as another document
LANGUAGE = "language"  # a news article in another language
BY_RULE = frozenset({REDIRECT, DISAMBIGUATION, NON_ARTICLE_TITLE, NAMESPACE, DUPLICATE,
                     LANGUAGE})

# Bad input: counted and written, with the record, to the dead-letter output.
MALFORMED_XML = "malformed_xml"
INVALID_UTF8 = "invalid_utf8"
INVALID_JSON = "invalid_json"
MISSING_FIELD = "missing_field"
UNPARSABLE_WIKITEXT = "unparsable_wikitext"
EMPTY = "empty"
TOO_LARGE = "too_large"
# A compressed input whose stream is corrupt or truncated: the records before the damage
# come through; one record with this reason stands for the unreadable rest of the file.
UNREADABLE = "unreadable"
BAD_INPUT = frozenset({MALFORMED_XML, INVALID_UTF8, INVALID_JSON, MISSING_FIELD,
                       UNPARSABLE_WIKITEXT, EMPTY, TOO_LARGE, UNREADABLE})


class SetAsideError(Exception):
  """Raised by record parsers; `reason` is one of BY_RULE or BAD_INPUT."""

  def __init__(self, reason: str, detail: str = ""):
    if reason not in BY_RULE | BAD_INPUT:
      raise ValueError(f"unknown set-aside reason {reason!r}")
    super().__init__(f"{reason}: {detail}" if detail else reason)
    self.reason = reason
    self.detail = detail


@dataclasses.dataclass(frozen=True)
class RawRecord:
  """One record as read: a page's XML or one JSON line, not yet decoded.

  `index` is the record's 0-based ordinal in its file, `line` the 1-based line it starts
  on; `defect` is a BAD_INPUT reason the reader already saw (a page never closed, a
  record past the size guard, an unreadable compressed stream), else '', and `detail`
  what the reader saw.
  """
  path: str
  index: int
  line: int
  payload: bytes
  defect: str = ""
  detail: str = ""


@dataclasses.dataclass(frozen=True)
class Document:
  """An accepted article: plain-text body, one paragraph per line."""
  uid: str
  title: str
  text: str
  path: str
  index: int
  line: int


@dataclasses.dataclass(frozen=True)
class SetAside:
  """A record that did not become a document, with where it came from."""
  reason: str
  detail: str
  path: str
  index: int
  line: int
  excerpt: str  # the record, truncated, invalid bytes shown as \\x escapes

  @property
  def is_bad_input(self) -> bool:
    return self.reason in BAD_INPUT

  def as_json_dict(self) -> dict:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Block:
  """A retrieval unit: whole sentences of one document that fit `[CLS] title [SEP] body [SEP]`.

  `sentences` are whitespace-normalised and joined by one space to give the body, so the
  body's wordpiece count is the sum of `sentence_lengths`.
  """
  block_id: int
  doc_uid: str
  title: str
  sentences: Tuple[str, ...]
  sentence_lengths: Tuple[int, ...]

  @property
  def text(self) -> str:
    return " ".join(self.sentences)


def excerpt(payload: bytes, max_chars: int = 2000) -> str:
  """A printable head of a raw record for the dead-letter file."""
  head = payload[:4 * max_chars].decode("utf-8", errors="backslashreplace")
  return head if len(head) <= max_chars else head[:max_chars] + "…"
