"""Drops documents whose title and text repeat another's (common in news crawls).

Duplicates would give one text several copies of the same block ids; one copy is kept,
chosen by source location so the choice is the same on every run.
"""
import apache_beam as beam
from apache_beam import pvalue

from realm_tf.corpus import records
from realm_tf.corpus.records import SetAside
from realm_tf.pipelines.transforms.metrics import set_aside_counter
from realm_tf.pipelines.transforms.parse import SET_ASIDE


class _KeepFirstFn(beam.DoFn):

  def process(self, keyed):
    _, documents = keyed  # (uid, Iterable[Document])
    first, *rest = sorted(documents, key=lambda d: (d.path, d.index))
    yield first
    for duplicate in rest:
      set_aside_counter(records.DUPLICATE).inc()
      yield pvalue.TaggedOutput(SET_ASIDE, SetAside(
          reason=records.DUPLICATE, detail=f"same as {first.path} record {first.index}",
          path=duplicate.path, index=duplicate.index, line=duplicate.line,
          excerpt=duplicate.title))


class DropDuplicateDocuments(beam.PTransform):
  """Documents → outputs `documents` (unique by uid) and `set_aside` (the repeats)."""

  def expand(self, documents):
    return (documents
            | "KeyByUid" >> beam.Map(lambda d: (d.uid, d))
            | "GroupByUid" >> beam.GroupByKey()
            | "KeepFirst" >> beam.ParDo(_KeepFirstFn()).with_outputs(
                SET_ASIDE, main="documents"))
