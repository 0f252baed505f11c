"""The demo's plain records: blocks and pre-training sentences as realm_tf.demo.records
reads them, and the word match that says whether a block states an answer.

Everything here is plain Python over plain records (realm_tf.demo.records reads and
writes the TFRecords and JSON lines).
"""
import dataclasses
import re
from typing import Sequence, Tuple

_WORD = re.compile(r"\w+")


def answer_key(text: str) -> Tuple[str, ...]:
  """The answer's words, lower-cased: what 'contains the answer' compares."""
  return tuple(w.lower() for w in _WORD.findall(text))


def states(words: Sequence[str], key: Tuple[str, ...]) -> bool:
  """Whether `key` occurs in `words` as a contiguous sequence."""
  return any(tuple(words[i:i + len(key)]) == key for i in range(len(words) - len(key) + 1))


@dataclasses.dataclass(frozen=True)
class Block:
  block_id: int
  title: str
  text: str


@dataclasses.dataclass(frozen=True)
class Sentence:
  """A pre-training example: x with its salient spans (character offsets into text)."""
  text: str
  block_id: int
  doc_uid: str
  spans: Tuple[Tuple[int, int, str], ...]  # (start, end, label)
