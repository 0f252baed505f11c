"""Blocks → REALM pre-training examples: queries x with their salient spans.

  blocks → PackQueries → TagSalientSpans (entities + dates) → PRETRAINING feature dicts
                              ▲ optional side input: the corpus's title gazetteer
"""
from typing import Dict, Iterator, List

import apache_beam as beam

from realm_tf.corpus import examples
from realm_tf.corpus.records import Block
from realm_tf.pipelines.transforms.salient_spans import TagSalientSpans


class _PackQueriesFn(beam.DoFn):
  """A batch of blocks → query dicts; only sentences longer than a query are tokenized."""

  def __init__(self, query_length: int, vocab_file: str):
    super().__init__()
    self._budget = examples.query_budget(query_length)
    self._vocab_file = vocab_file
    self._counter = None

  def setup(self):
    from realm_tf.corpus.wordpieces import WordpieceCounter  # noqa: PLC0415  TensorFlow loads on the worker only
    self._counter = WordpieceCounter(self._vocab_file)

  def process(self, batch: List[Block]) -> Iterator[Dict]:
    long_per_block = [examples.long_sentences(block, self._budget) for block in batch]
    flat = self._counter([s for long in long_per_block for s in long])  # [long sentences]
    offset = 0
    for block, long in zip(batch, long_per_block):
      yield from examples.pretraining_queries(block, self._budget,
                                              flat[offset:offset + len(long)])
      offset += len(long)


class MakePretrainingExamples(beam.PTransform):
  """Blocks → PRETRAINING feature dicts (see realm_tf.corpus.schema)."""

  def __init__(self, query_length: int, vocab_file: str = "", tagger_dir: str = "",
               tagger_batch_size: int = 64, batch_size: int = 64,
               tagger_model_copies: int = 0, gazetteer=None):
    """gazetteer: an optional one-element PCollection of TitleGazetteer (title mentions
    as entities)."""
    super().__init__()
    self._gazetteer = gazetteer
    self._tagger_model_copies = tagger_model_copies
    self._fn = _PackQueriesFn(query_length, vocab_file)
    self._tagger_dir = tagger_dir or None
    self._tagger_batch_size = tagger_batch_size
    self._batch_size = batch_size

  def expand(self, blocks):
    return (blocks
            | "Batch" >> beam.BatchElements(min_batch_size=1, max_batch_size=self._batch_size)
            | "PackQueries" >> beam.ParDo(self._fn)
            | "TagSalientSpans" >> TagSalientSpans(self._tagger_dir, self._tagger_batch_size,
                                                  self._tagger_model_copies,
                                                  self._gazetteer)
            | "ToFeatures" >> beam.Map(examples.pretraining_example))
