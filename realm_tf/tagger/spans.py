"""Salient spans as plain dicts: byte→character offsets and overlap resolution.

The exported tagger reports byte offsets (tensorflow_text's `tokenize_with_offsets` works
on UTF-8 bytes), while corpus records and Python string slicing use characters. Both kinds
of span (entities from the tagger, dates from regexes) meet here and must come out as one
sorted, non-overlapping list, the same on every run, so masking is reproducible.
"""
from typing import Iterable, Sequence

ENTITY_LABELS = ("PER", "LOC", "ORG", "MISC")
# Tie-break between spans of equal extent: a regex date is high precision, and CoNLL-2003
# has no date type, so a tagger label on exactly a date's characters is the tagger's error.
_LABEL_PRIORITY = {"DATE": 0, "PER": 1, "ORG": 2, "LOC": 3, "MISC": 4}


def byte_to_char_offsets(text: str) -> list[int]:
  """A table t with t[b] = the character offset of UTF-8 byte offset b (len = bytes + 1).

  A byte offset inside a multi-byte character maps to that character's start.
  """
  table = []
  for char_index, char in enumerate(text):
    table.extend([char_index] * len(char.encode("utf-8")))
  table.append(len(text))
  return table


def char_to_byte_offsets(text: str, spans: Iterable[dict]) -> tuple[list[int], list[int]]:
  """Character-offset span dicts → (byte starts, byte ends), for masking by wordpiece
  offsets, which tensorflow_text reports in UTF-8 bytes."""
  prefix_bytes = [0]
  for char in text:
    prefix_bytes.append(prefix_bytes[-1] + len(char.encode("utf-8")))
  starts, ends = [], []
  for span in spans:
    if not 0 <= span["start"] <= span["end"] <= len(text):
      raise ValueError(f"span {span} lies outside a text of {len(text)} characters")
    starts.append(prefix_bytes[span["start"]])
    ends.append(prefix_bytes[span["end"]])
  return starts, ends


def spans_from_byte_offsets(text: str, starts: Sequence[int], ends: Sequence[int],
                            labels: Sequence[str]) -> list[dict]:
  """Byte-offset spans of `text` → character-offset span dicts (empty spans dropped)."""
  if not len(starts) == len(ends) == len(labels):
    raise ValueError(f"span starts, ends and labels differ in length: "
                     f"{len(starts)}, {len(ends)}, {len(labels)}")
  table = byte_to_char_offsets(text)
  spans = []
  for start, end, label in zip(starts, ends, labels):
    start, end = int(start), int(end)
    if not 0 <= start <= end < len(table):
      raise ValueError(f"byte span [{start}, {end}) lies outside a text of "
                       f"{len(table) - 1} bytes: {text[:60]!r}")
    char_start, char_end = table[start], table[end]
    if char_end > char_start:
      spans.append({"start": char_start, "end": char_end,
                    "label": label.decode("utf-8") if isinstance(label, bytes) else label})
  return spans


def resolve_overlaps(spans: Iterable[dict]) -> list[dict]:
  """Sorted, non-overlapping spans; where spans overlap the longest one wins.

  Ties go to the earlier start, then to _LABEL_PRIORITY, then to the label's name, so the
  result does not depend on the order spans arrive in.
  """
  def preference(span):
    return (-(span["end"] - span["start"]), span["start"],
            _LABEL_PRIORITY.get(span["label"], len(_LABEL_PRIORITY)), span["label"])

  kept: list[dict] = []
  for span in sorted(spans, key=preference):
    if span["end"] <= span["start"]:
      continue
    if all(span["end"] <= other["start"] or other["end"] <= span["start"] for other in kept):
      kept.append(dict(span))
  return sorted(kept, key=lambda s: (s["start"], s["end"]))
