"""One JSON line → (title, text): plain `{"title", "text"}` lines and news articles.

News follows news-please's layout (`title`, `maintext`, `language`, `url`, ...) as in
CC-News; lines with `text` instead of `maintext` (e.g. the BBC set) read the same way.
"""
import json
from typing import Any, Dict, Tuple

from realm_tf.corpus import records
from realm_tf.corpus.records import SetAsideError


def decode_object(payload: bytes) -> Dict[str, Any]:
  try:
    line = payload.decode("utf-8")
  except UnicodeDecodeError as e:
    raise SetAsideError(records.INVALID_UTF8, str(e)) from None
  try:
    value = json.loads(line)
  except ValueError as e:  # JSONDecodeError, or an integer past Python's digit limit
    raise SetAsideError(records.INVALID_JSON, str(e)) from None
  except RecursionError:  # arrays/objects nested past the interpreter's recursion limit
    raise SetAsideError(records.INVALID_JSON, "nested too deeply") from None
  if not isinstance(value, dict):
    raise SetAsideError(records.INVALID_JSON, f"a line must hold an object, not {type(value).__name__}")
  return value


def _string_field(obj: Dict[str, Any], *names: str) -> str:
  """The first of `names` holding a string; a missing or non-string field is bad input.

  JSON's \\u escapes can spell lone surrogates ("\\ud800"), which are not text: such a
  string could not be written as UTF-8 by any later step, so it is set aside here.
  """
  for name in names:
    value = obj.get(name)
    if isinstance(value, str):
      try:
        value.encode("utf-8")
      except UnicodeEncodeError as e:
        raise SetAsideError(records.INVALID_UTF8, f"field {name!r}: {e}") from None
      return value
  raise SetAsideError(records.MISSING_FIELD, f"no string field {' or '.join(names)}")


def checked_text(text: str, max_chars: int) -> str:
  """Paragraph lines, stripped, blank ones dropped; empty or enormous text is bad input."""
  if len(text) > max_chars:
    raise SetAsideError(records.TOO_LARGE, f"{len(text)} chars > {max_chars}")
  text = "\n".join(line.strip() for line in text.splitlines() if line.strip())
  if not text:
    raise SetAsideError(records.EMPTY, "empty text")
  return text


def plain_document(payload: bytes, max_chars: int) -> Tuple[str, str]:
  """`{"title": str, "text": str}` (other keys ignored)."""
  obj = decode_object(payload)
  title = _string_field(obj, "title").strip()
  return title, checked_text(_string_field(obj, "text"), max_chars)


def news_document(payload: bytes, max_chars: int, language: str = "en") -> Tuple[str, str]:
  """A news article; `language` (news-please's field, when present) must match if set."""
  obj = decode_object(payload)
  found = obj.get("language")
  if language and isinstance(found, str) and found and found != language:
    raise SetAsideError(records.LANGUAGE, found)
  title = _string_field(obj, "title").strip()
  return title, checked_text(_string_field(obj, "maintext", "text"), max_chars)
