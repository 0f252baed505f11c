"""Greedy packing of sentences into length-bounded token budgets.

Used twice: sentences into blocks (`[CLS] title [SEP] body [SEP]` within the block
length) and a block's sentences into pre-training queries (`[CLS] x [SEP]` within the
query length). Whole sentences are kept together; a sentence is cut only when it alone
exceeds the budget, and then only before a wordpiece that begins a word, so each piece
re-tokenizes to exactly the counted wordpieces.
"""
from typing import List, Sequence, Tuple

from realm_tf.corpus.wordpieces import Wordpieces

Piece = Tuple[str, int]  # (text, wordpiece count)


def split_to_fit(text: str, wordpieces: Wordpieces, budget: int) -> List[Piece]:
  """Cuts `text` into consecutive pieces of at most `budget` wordpieces each.

  A cut falls before the last word start within the budget; only a single word longer
  than the budget is cut inside the word.
  """
  if budget < 1:
    raise ValueError(f"budget must be positive, got {budget}")
  data = text.encode("utf-8")
  total = len(wordpieces)
  pieces = []
  begin = 0
  while begin < total:
    end = min(begin + budget, total)
    if end < total:
      cut = end
      while cut > begin and not wordpieces.begins_word[cut]:
        cut -= 1
      end = cut if cut > begin else end
    piece = data[wordpieces.starts[begin]:wordpieces.ends[end - 1]].decode("utf-8")
    pieces.append((piece, end - begin))
    begin = end
  return pieces


def pack_greedy(pieces: Sequence[Piece], budget: int) -> List[List[Piece]]:
  """Consecutive pieces (each within budget) → groups whose counts sum to ≤ budget."""
  groups: List[List[Piece]] = []
  current: List[Piece] = []
  used = 0
  for text, length in pieces:
    if length > budget:
      raise ValueError(f"piece of {length} wordpieces exceeds the budget {budget}")
    if current and used + length > budget:
      groups.append(current)
      current, used = [], 0
    current.append((text, length))
    used += length
  if current:
    groups.append(current)
  return groups


def pack_sentences(sentences: Sequence[str], wordpieces: Sequence[Wordpieces],
                   budget: int) -> List[List[Piece]]:
  """Sentences with their wordpieces → groups within `budget`, over-long ones cut first.

  Sentences with no wordpieces at all (only characters the tokenizer drops) are skipped:
  they would add text the model never sees.
  """
  pieces: List[Piece] = []
  for sentence, pieces_of in zip(sentences, wordpieces):
    length = len(pieces_of)
    if length == 0:
      continue
    if length <= budget:
      pieces.append((sentence, length))
    else:
      pieces.extend(split_to_fit(sentence, pieces_of, budget))
  return pack_greedy(pieces, budget)
