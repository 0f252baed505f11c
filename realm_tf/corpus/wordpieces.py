"""Batched wordpiece counting with offsets, for length-exact block packing.

Blocks must fit the model's length when tokenized by the *same* tokenizer the trainer
uses, so this wraps `realm_tf.text.Tokenizer` rather than re-implementing WordPiece. One
call tokenizes a whole batch of strings in the graph; callers batch many sentences per
call because a per-string call costs more in dispatch than in tokenizing.
"""
import dataclasses
import threading
from typing import List, Sequence

import numpy as np
import tensorflow as tf

from realm_tf.text import Tokenizer

_TRACE_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class Wordpieces:
  """One string's wordpieces: UTF-8 byte offsets [start, end), and which begin a word.

  A wordpiece begins a word unless it is a '##' continuation; cutting text only before
  such pieces leaves every other piece's tokenization unchanged.
  """
  starts: np.ndarray  # [tokens] int64
  ends: np.ndarray  # [tokens] int64
  begins_word: np.ndarray  # [tokens] bool

  def __len__(self) -> int:
    return len(self.starts)


class WordpieceCounter:
  """Strings → `Wordpieces`, through one traced tokenizer call per batch."""

  def __init__(self, vocab_file: str = ""):
    # Built and traced once, under a lock: Beam may set up several DoFns on threads of one
    # worker at the same time. No autograph: there is no Python control flow to convert.
    with _TRACE_LOCK:
      self._tokenizer = Tokenizer(vocab_file or None)
      self._tokenize = tf.function(self._tokenize_flat, autograph=False,
                                   input_signature=[tf.TensorSpec([None], tf.string)])
      self._tokenize.get_concrete_function()
    self._continuation = np.array(
        [token.startswith("##") for token in self._tokenizer.vocab], dtype=bool)

  def _tokenize_flat(self, texts: tf.Tensor):
    ids, starts, ends = self._tokenizer.tokenize_with_offsets(texts)  # [batch, (tokens)]
    return ids.flat_values, starts.flat_values, ends.flat_values, ids.row_splits

  def __call__(self, texts: Sequence[str]) -> List[Wordpieces]:
    if not texts:
      return []
    ids, starts, ends, splits = (t.numpy() for t in self._tokenize(tf.constant(list(texts))))
    begins_word = ~self._continuation[ids]
    return [Wordpieces(starts=starts[a:b], ends=ends[a:b], begins_word=begins_word[a:b])
            for a, b in zip(splits[:-1], splits[1:])]
