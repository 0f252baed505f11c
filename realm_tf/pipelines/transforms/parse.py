"""Raw records → documents; anything else → set aside with its reason and location."""
import apache_beam as beam
from apache_beam import pvalue

from realm_tf.corpus import formats, ids, records
from realm_tf.corpus.records import Document, RawRecord, SetAside, SetAsideError
from realm_tf.corpus.sentences import normalize_whitespace
from realm_tf.pipelines.transforms.metrics import set_aside_counter

SET_ASIDE = "set_aside"  # tagged output name


class _ParseFn(beam.DoFn):

  def __init__(self, input_format: str, max_chars: int, news_language: str):
    super().__init__()
    self._input_format = input_format
    self._max_chars = max_chars
    self._news_language = news_language
    self._parser = None

  def setup(self):
    self._parser = formats.get(self._input_format, self._news_language).parser

  def process(self, raw: RawRecord):
    try:
      if raw.defect:
        raise SetAsideError(raw.defect, raw.detail or "flagged by the reader")
      title, text = self._parser(raw.payload, self._max_chars)
    except SetAsideError as e:
      set_aside_counter(e.reason).inc()
      yield pvalue.TaggedOutput(SET_ASIDE, SetAside(
          reason=e.reason, detail=e.detail, path=raw.path, index=raw.index, line=raw.line,
          excerpt=records.excerpt(raw.payload)))
      return
    title = normalize_whitespace(title)
    yield Document(uid=ids.doc_uid(title, text), title=title, text=text, path=raw.path,
                   index=raw.index, line=raw.line)


class ParseDocuments(beam.PTransform):
  """RawRecords → outputs `documents` (Document) and `set_aside` (SetAside)."""

  def __init__(self, input_format: str, max_chars: int, news_language: str = "en"):
    super().__init__()
    self._fn = _ParseFn(input_format, max_chars, news_language)

  def expand(self, raw_records):
    return raw_records | "Parse" >> beam.ParDo(self._fn).with_outputs(
        SET_ASIDE, main="documents")
