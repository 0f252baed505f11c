"""Documents → blocks: sentence split, then greedy packing measured by the tokenizer."""
from typing import Iterator, List

import apache_beam as beam

from realm_tf.corpus import blocks, sentences
from realm_tf.corpus.records import Block, Document
from realm_tf.pipelines.transforms import metrics

class _PackBlocksFn(beam.DoFn):
  """A batch of documents → their blocks, with one tokenizer call for all sentences."""

  def __init__(self, max_block_length: int, max_title_length: int, vocab_file: str):
    super().__init__()
    self._max_block_length = max_block_length
    self._max_title_length = max_title_length
    self._vocab_file = vocab_file
    self._counter = None
    self._blocks = metrics.counter("blocks")

  def setup(self):
    from realm_tf.corpus.wordpieces import WordpieceCounter  # noqa: PLC0415  TensorFlow loads on the worker only
    self._counter = WordpieceCounter(self._vocab_file)

  def process(self, batch: List[Document]) -> Iterator[Block]:
    split = [sentences.split_sentences(d.text) for d in batch]
    # One tokenizer call for the whole batch: [documents + all their sentences] Wordpieces.
    wordpieces = self._counter([d.title for d in batch] +
                               [s for doc_sentences in split for s in doc_sentences])
    titles, flat = wordpieces[:len(batch)], wordpieces[len(batch):]
    offset = 0
    for document, title_wordpieces, doc_sentences in zip(batch, titles, split):
      doc_wordpieces = flat[offset:offset + len(doc_sentences)]
      offset += len(doc_sentences)
      for block in blocks.make_blocks(document.uid, document.title, title_wordpieces,
                                      doc_sentences, doc_wordpieces, self._max_block_length,
                                      self._max_title_length):
        self._blocks.inc()
        yield block


class PackBlocks(beam.PTransform):
  """Documents → Blocks that fit `[CLS] title [SEP] body [SEP]` in max_block_length."""

  def __init__(self, max_block_length: int, max_title_length: int, vocab_file: str = "",
               batch_size: int = 64):
    super().__init__()
    self._fn = _PackBlocksFn(max_block_length, max_title_length, vocab_file)
    self._batch_size = batch_size

  def expand(self, documents):
    return (documents
            | "Batch" >> beam.BatchElements(min_batch_size=1, max_batch_size=self._batch_size)
            | "SplitAndPack" >> beam.ParDo(self._fn))
