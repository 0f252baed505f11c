"""TagSalientSpans: named entities (the exported CoNLL-2003 tagger and/or a gazetteer of
the corpus's titles) plus regex dates.

REALM's salient span masking needs, for every pre-training sentence, the character spans
of its entities and dates. Entities come from the tagger SavedModel through Beam's
`RunInference` (batched, the model loaded once per worker process and shared), and from
mentions of other articles' titles (`realm_tf.corpus.gazetteer`, given as a side input);
dates come from `realm_tf.corpus.dates`. All are merged into one sorted, non-overlapping
list.
"""
from typing import Any, Iterable, Optional, Sequence

import apache_beam as beam
from apache_beam.ml.inference.base import (
    KeyedModelHandler,
    ModelHandler,
    PredictionResult,
    RunInference,
)

from realm_tf.corpus.dates import find_dates
from realm_tf.corpus.gazetteer import TitleGazetteer
from realm_tf.tagger.spans import resolve_overlaps

SALIENT_SPANS_KEY = "salient_spans"


class SavedModelSpanTaggerHandler(ModelHandler[str, PredictionResult, Any]):
  """Runs the exported tagger's serving signature on a batch of raw strings.

  Written against `ModelHandler` rather than `tensorflow_inference.TFModelHandlerTensor`
  (which realm_tf/pipelines/transforms/savedmodel_inference.py adapts for plain signature calls): the
  TF handler loads models with `tf.keras.models.load_model`, which under Keras 3 refuses a
  plain `tf.saved_model` export such as ours, and the tagger is called through
  `SavedTagger`, which groups texts by length (about 2.6x faster than one padded call) and
  decodes the padded span outputs. Batching, model sharing and metrics still come from
  RunInference.
  """

  def __init__(self, tagger_dir: str, batch_size: int = 64, model_copies: int = 0):
    if batch_size < 1:
      raise ValueError(f"batch_size must be positive, got {batch_size}")
    # model_copies > 0: the tagger is shared by the SDK processes of a worker VM, at most
    # that many copies loaded (RunInference's large_model mode); 0: one per process.
    super().__init__(min_batch_size=1, max_batch_size=batch_size,
                     large_model=model_copies > 0, model_copies=model_copies or None)
    self._tagger_dir = tagger_dir

  def load_model(self) -> Any:
    # Imported here, on the worker, so that building a pipeline (and the dates-only
    # path) does not load TensorFlow.
    from realm_tf.tagger.inference import SavedTagger  # noqa: PLC0415  see above
    return SavedTagger(self._tagger_dir)

  def run_inference(self, batch: Sequence[str], model: Any,
                    inference_args: Optional[dict[str, Any]] = None
                    ) -> Iterable[PredictionResult]:
    texts = list(batch)
    return [PredictionResult(example=text, inference=spans, model_id=self._tagger_dir)
            for text, spans in zip(texts, model(texts))]

  def get_num_bytes(self, batch: Sequence[str]) -> int:
    return sum(len(text.encode("utf-8")) for text in batch)

  def get_metrics_namespace(self) -> str:
    return "RealmSalientSpanTagger"


def _text_of(record: dict) -> str:
  text = record.get("text") if isinstance(record, dict) else None
  if not isinstance(text, str):
    raise TypeError(f"TagSalientSpans expects dicts with a str 'text', got "
                    f"{type(record).__name__} with text={text!r:.80}")
  return text


def _with_salient_spans(record: dict, entity_spans: Sequence[dict],
                        gazetteer: Optional[TitleGazetteer] = None) -> dict:
  """A copy of `record` (Beam elements are immutable) with entities, title mentions (of
  documents other than the record's 'doc_uid') and dates merged."""
  text = _text_of(record)
  spans = list(entity_spans) + find_dates(text)
  if gazetteer is not None:
    spans += gazetteer.find(text, record.get("doc_uid", ""))
  return {**record, SALIENT_SPANS_KEY: resolve_overlaps(spans)}


class TagSalientSpans(beam.PTransform):
  """dicts with 'text' → the same dicts plus 'salient_spans'.

  Each span is {'start', 'end', 'label'}: character offsets into 'text' (end exclusive),
  label 'PER', 'LOC', 'ORG' or 'MISC' from the tagger, 'TITLE' from the gazetteer, or
  'DATE' from the regexes; the list is sorted and non-overlapping (see
  `resolve_overlaps`). `gazetteer`: a PCollection holding one TitleGazetteer (see
  `BuildTitleGazetteer`), read as a side input. With neither tagger nor gazetteer, only
  dates.
  """

  def __init__(self, tagger_dir: Optional[str] = None, batch_size: int = 64,
               model_copies: int = 0, gazetteer=None):
    super().__init__()
    self._tagger_dir = tagger_dir
    self._batch_size = batch_size
    self._model_copies = model_copies
    self._gazetteer = gazetteer

  def expand(self, records):
    side = {}
    if self._gazetteer is not None:
      side["gazetteer"] = beam.pvalue.AsSingleton(self._gazetteer)
    if self._tagger_dir is None:
      return records | "AddDateSpans" >> beam.Map(_with_salient_spans, entity_spans=(),
                                                  **side)
    handler = KeyedModelHandler(
        SavedModelSpanTaggerHandler(self._tagger_dir, self._batch_size,
                                    self._model_copies))
    return (records
            | "KeyByRecord" >> beam.Map(lambda record: (record, _text_of(record)))
            | "TagEntities" >> RunInference(handler)
            | "AddDateSpans" >> beam.Map(_with_tagged_spans, **side))


def _with_tagged_spans(keyed: tuple, gazetteer: Optional[TitleGazetteer] = None) -> dict:
  """(record, the tagger's PredictionResult) → the record with every salient span."""
  record, result = keyed
  return _with_salient_spans(record, result.inference, gazetteer)


class BuildTitleGazetteer(beam.PTransform):
  """Documents (anything with .title and .uid) → a one-element PCollection: the corpus's
  TitleGazetteer, for TagSalientSpans' side input.

  Every worker holds the whole gazetteer: right for corpora of thousands to a few hundred
  thousand articles; all of Wikipedia's titles would be better served by the tagger.
  """

  def expand(self, documents):
    return (documents
            | "TitleAndUid" >> beam.Map(lambda d: (d.title, d.uid))
            | "AllTitles" >> beam.combiners.ToList()
            | "Gazetteer" >> beam.Map(TitleGazetteer))
