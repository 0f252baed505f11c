"""A document's sentences → REALM blocks that fit `[CLS] title [SEP] body [SEP]`."""
from typing import List, Sequence

from realm_tf.corpus import ids, packing
from realm_tf.corpus.records import Block
from realm_tf.corpus.wordpieces import Wordpieces

SPECIAL_TOKENS = 3  # [CLS], [SEP], [SEP]


def block_features(block: Block) -> dict:
  """A Block → the feature dict of schema.BLOCK."""
  return {"block_id": block.block_id, "doc_uid": block.doc_uid, "title": block.title,
          "text": block.text}


def fit_title(title: str, wordpieces: Wordpieces, max_title_length: int) -> packing.Piece:
  """The title, cut at a word start if longer than `max_title_length` wordpieces.

  A cap keeps a freak title from leaving no room for the body.
  """
  if len(wordpieces) <= max_title_length:
    return title, len(wordpieces)
  return packing.split_to_fit(title, wordpieces, max_title_length)[0]


def make_blocks(uid: str, title: str, title_wordpieces: Wordpieces,
                sentences: Sequence[str], sentence_wordpieces: Sequence[Wordpieces],
                max_block_length: int, max_title_length: int) -> List[Block]:
  """Greedy packing of whole sentences; ids are stable hashes of (uid, block index)."""
  if max_title_length + SPECIAL_TOKENS >= max_block_length:
    raise ValueError(f"max_title_length {max_title_length} leaves no room for a body in "
                     f"{max_block_length} wordpieces")
  title, title_length = fit_title(title, title_wordpieces, max_title_length)
  budget = max_block_length - SPECIAL_TOKENS - title_length
  groups = packing.pack_sentences(sentences, sentence_wordpieces, budget)
  return [Block(block_id=ids.block_id(uid, index), doc_uid=uid, title=title,
                sentences=tuple(text for text, _ in group),
                sentence_lengths=tuple(length for _, length in group))
          for index, group in enumerate(groups)]
