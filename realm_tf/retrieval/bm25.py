"""BM25 over the knowledge corpus (the paper's sparse-retrieval baseline), with `bm25s`.

Each block is indexed as its title and body, the text the dense document tower reads.
BM25 has no trainable parameters, so its top-k for every question is computed once on the
host and fed to the reader as features: the same reader, trained the same way.
"""
from typing import Sequence

import bm25s
import numpy as np

from realm_tf.data.block_store import BlockStore


class BM25Retriever:
  """search(questions, k) → (block ids [Q, k], BM25 scores [Q, k]), best first."""

  def __init__(self, store: BlockStore, k1: float = 1.5, b: float = 0.75,
               stopwords: str = "en"):
    if not len(store):
      raise ValueError("BM25 needs at least one block")
    self.block_ids = store.block_ids
    self._tokenizer = bm25s.tokenization.Tokenizer(stopwords=stopwords)
    documents = [f"{t}\n{x}" for t, x in zip(store.title_strings, store.text_strings)]
    tokens = self._tokenizer.tokenize(documents, update_vocab=True, show_progress=False,
                                      return_as="tuple")
    self._model = bm25s.BM25(k1=k1, b=b)
    self._model.index(tokens, show_progress=False)

  def __len__(self) -> int:
    return len(self.block_ids)

  def search(self, questions: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
    k = min(k, len(self))
    # Words the corpus never uses are dropped (they would score 0 everywhere anyway).
    tokens = self._tokenizer.tokenize(list(questions), update_vocab=False,
                                      show_progress=False, return_as="tuple")
    rows, scores = self._model.retrieve(tokens, k=k, show_progress=False, n_threads=1)
    return self.block_ids[rows].astype(np.int64), scores.astype(np.float32)
