"""Sentence splitting for block packing and query extraction.

blingfire (a compiled finite-state splitter, no model download at run time) is used
because the pipeline splits every sentence of Wikipedia; it treats a newline as ordinary
space, so paragraphs (one per line in our plain text) are split one by one and a sentence
never spans two paragraphs.
"""
from typing import List

import blingfire


def normalize_whitespace(text: str) -> str:
  """Runs of whitespace → one space, ends stripped: what blocks and queries store."""
  return " ".join(text.split())


def split_sentences(text: str) -> List[str]:
  """Plain text (one paragraph per line) → whitespace-normalised sentences, in order."""
  sentences = []
  for paragraph in text.split("\n"):
    if not paragraph.strip():
      continue
    _, offsets = blingfire.text_to_sentences_and_offsets(paragraph)
    for start, end in offsets:
      sentence = normalize_whitespace(paragraph[start:end])
      if sentence:
        sentences.append(sentence)
  return sentences
