"""The input formats `--input_format` accepts: how each is read and parsed."""
import dataclasses
import functools
from typing import Callable, Dict, Iterator, Tuple

from realm_tf.corpus import json_records, readers, wikipedia
from realm_tf.corpus.records import RawRecord

NAMES = ("wikipedia_xml", "jsonl", "ccnews")


@dataclasses.dataclass(frozen=True)
class InputFormat:
  """reader(stream, path, max_record_bytes, max_records) → RawRecords;
  parser(payload, max_chars) → (title, text) or raises SetAsideError."""
  reader: Callable[..., Iterator[RawRecord]]
  parser: Callable[[bytes, int], Tuple[str, str]]


def get(name: str, news_language: str = "en") -> InputFormat:
  formats: Dict[str, InputFormat] = {
      "wikipedia_xml": InputFormat(readers.read_wikipedia_pages, wikipedia.article),
      "jsonl": InputFormat(readers.read_json_lines, json_records.plain_document),
      "ccnews": InputFormat(readers.read_json_lines, functools.partial(
          json_records.news_document, language=news_language)),
  }
  if name not in formats:
    raise ValueError(f"unknown input format {name!r}; choose from {list(NAMES)}")
  return formats[name]
