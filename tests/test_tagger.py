"""The salient-span tagger: CoNLL reading, labelling, span decoding, the train and
evaluate commands, the export and its loading, and the Beam step that runs it through
RunInference, on a tiny random-init tagger trained a few steps.

The CoNLL files are invented (tests/data/invented_conll.py: CoNLL-2003's layout and IOB1
tags, made-up names). Whether a trained tagger finds entities it never saw is
tests/test_tagger_trained.py's (the system tier: it fine-tunes MiniLM for minutes)."""
import contextlib
import hashlib
import io
import json
import os
import pathlib

import apache_beam as beam
import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from apache_beam.testing.util import assert_that, equal_to

from realm_tf.configs.experiment import EncoderConfig, WarmStartConfig
from realm_tf.corpus.dates import find_dates
from realm_tf.io import versioned
from realm_tf.pipelines.transforms.salient_spans import TagSalientSpans
from realm_tf.tagger import signature
from realm_tf.tagger.__main__ import build_parser, config_from_args, main
from realm_tf.tagger.config import TaggerConfig
from realm_tf.tagger.conll import (
  ENTITY_TYPES,
  LABEL_IDS,
  LABELS,
  ConllFormatError,
  Sentence,
  iob1_to_bio,
  read_conll,
  read_sentences,
)
from realm_tf.tagger.evaluation import entity_scores, spans_to_token_tags
from realm_tf.tagger.export import read_manifest, resolve_tagger_dir
from realm_tf.tagger.features import sentence_examples, training_dataset
from realm_tf.tagger.inference import SavedTagger, module_tag_fn
from realm_tf.tagger.model import build_token_classifier, masked_loss
from realm_tf.tagger.serving import SpanTagger
from realm_tf.tagger.spans import byte_to_char_offsets, resolve_overlaps
from realm_tf.tagger.train import fit
from tests.data.invented_conll import write_conll


@pytest.fixture(scope="session")
def conll_dir(tmp_path_factory):
  return pathlib.Path(write_conll(str(tmp_path_factory.mktemp("conll") / "invented")))


# --- CoNLL-2003 reading -------------------------------------------------------------------

@pytest.mark.parametrize("name, documents, sentences", [
    ("eng.train", 140, 2110), ("eng.testa", 20, 300), ("eng.testb", 20, 291)])
def test_reads_every_document_and_sentence(conll_dir, name, documents, sentences):
  docs = read_conll(str(conll_dir / name))
  assert len(docs) == documents
  flat = [s for d in docs for s in d.sentences]
  assert len(flat) == sentences
  assert all(len(s.tokens) == len(s.tags) > 0 for s in flat)
  for s in flat:  # BIO: an entity never starts with I-
    for previous, tag in zip(["O"] + s.tags, s.tags):
      assert not (tag.startswith("I-") and previous[2:] != tag[2:]), s


def test_iob1_becomes_bio():
  iob1 = ["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-LOC", "I-ORG", "I-MISC", "O"]
  assert iob1_to_bio(iob1) == [
      "B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC", "B-ORG", "B-MISC", "O"]


def test_reader_on_a_small_file(tmp_path):
  path = tmp_path / "mini.conll"
  path.write_text(
      "-DOCSTART- -X- O O\n\n"
      "Ada NNP I-NP I-PER\nLovelace NNP I-NP I-PER\nwrote VBD I-VP O\n\n"
      "-DOCSTART- -X- O O\n\n"
      "Paris NNP I-NP I-LOC\nBerlin NNP I-NP B-LOC\n")  # no final blank line
  docs = read_conll(str(path))
  assert [len(d.sentences) for d in docs] == [1, 1]
  assert docs[0].sentences[0] == Sentence(["Ada", "Lovelace", "wrote"],
                                          ["B-PER", "I-PER", "O"])
  assert docs[1].sentences[0].tags == ["B-LOC", "B-LOC"]


def test_reader_names_the_bad_line(tmp_path):
  path = tmp_path / "bad.conll"
  path.write_text("Ada NNP I-NP I-PER\nLovelace NNP I-PER\n")
  with pytest.raises(ConllFormatError, match=r"bad.conll:2: expected 4 columns"):
    read_conll(str(path))
  path.write_text("Ada NNP I-NP I-PERSON\n")
  with pytest.raises(ConllFormatError, match=r"bad.conll:1: unknown NER tag"):
    read_conll(str(path))


# --- Wordpiece labels ---------------------------------------------------------------------

def test_labels_first_wordpiece_and_bert_words_inside_a_token(tokenizer):
  sentence = Sentence(["Gelsenkirchen", "beat", "U.S.", "side"],
                      ["B-LOC", "O", "B-LOC", "O"])
  [example] = sentence_examples([sentence], tokenizer, seq_length=32)
  pieces = [tokenizer.vocab[i] for i in example.input_ids]
  assert pieces == ["[CLS]", "gel", "##sen", "##kir", "##chen", "beat", "u", ".", "s", ".",
                    "side", "[SEP]"]
  labels = [LABELS[i] if w else None
            for i, w in zip(example.label_ids, example.label_weights)]
  assert labels == [None, "B-LOC", None, None, None, "O", "B-LOC", "I-LOC", "I-LOC", "I-LOC",
                    "O", None]


def test_long_sentences_are_split_at_token_boundaries(tokenizer):
  sentence = Sentence(["Paris"] * 10, ["B-LOC"] * 10)
  examples = sentence_examples([sentence], tokenizer, seq_length=6)  # 4 pieces each
  assert [len(e.input_ids) for e in examples] == [6, 6, 4]
  assert sum(sum(e.label_weights) for e in examples) == 10


# --- Span decoding in the graph -----------------------------------------------------------

class _LabelByWordpiece(tf_keras.Model):
  """A stand-in classifier: a fixed label per wordpiece string (O for the rest)."""

  def __init__(self, tokenizer, labels):
    super().__init__()
    table = np.zeros([tokenizer.vocab_size, len(LABELS)], np.float32)
    table[:, LABEL_IDS["O"]] = 1.0
    index = {piece: i for i, piece in enumerate(tokenizer.vocab)}
    for piece, label in labels.items():
      table[index[piece]] = 0.0
      table[index[piece], LABEL_IDS[label]] = 1.0
    self.table = tf.constant(table)

  def call(self, inputs, training=None):
    return tf.gather(self.table, inputs["input_word_ids"])  # [B, L, labels]


def test_decodes_bio_words_into_character_spans(tokenizer):
  model = _LabelByWordpiece(tokenizer, {
      "hans": "B-PER", "muller": "I-PER",
      "ru": "B-PER", "##di": "B-LOC",  # a continuation's own label is ignored
      "vol": "I-PER",
      "gel": "B-LOC", "##sen": "O",
      "u": "B-ORG", ".": "I-ORG", "n": "I-ORG",
      "tuesday": "I-MISC",  # I- after O starts an entity, as seqeval reads it
  })
  tag = module_tag_fn(SpanTagger(model, tokenizer, max_seq_length=64))
  text = "Hans Müller met Rudi Völler in Gelsenkirchen and the U.N. on Tuesday"
  spans, empty, short = tag([text, "", "Rudi"])
  assert [(text[s["start"]:s["end"]], s["label"]) for s in spans] == [
      ("Hans Müller", "PER"), ("Rudi Völler", "PER"), ("Gelsenkirchen", "LOC"),
      ("U.N.", "ORG"), ("Tuesday", "MISC")]
  assert empty == []
  assert short == [{"start": 0, "end": 4, "label": "PER"}]


def test_adjacent_b_tags_make_separate_entities(tokenizer):
  model = _LabelByWordpiece(tokenizer, {"paris": "B-LOC", "berlin": "B-LOC"})
  tag = module_tag_fn(SpanTagger(model, tokenizer, max_seq_length=64))
  assert tag(["Paris Berlin"]) == [[{"start": 0, "end": 5, "label": "LOC"},
                                    {"start": 6, "end": 12, "label": "LOC"}]]


def test_long_texts_are_tagged_in_their_first_wordpieces(tokenizer):
  model = _LabelByWordpiece(tokenizer, {"paris": "B-LOC"})
  tag = module_tag_fn(SpanTagger(model, tokenizer, max_seq_length=5))  # 3 wordpieces
  assert tag(["Paris and Paris"]) == [[{"start": 0, "end": 5, "label": "LOC"},
                                       {"start": 10, "end": 15, "label": "LOC"}]]
  assert tag(["Paris and so Paris"]) == [[{"start": 0, "end": 5, "label": "LOC"}]]


# --- Spans, overlaps and scoring ----------------------------------------------------------

def test_byte_offsets_map_to_characters():
  table = byte_to_char_offsets("aé€b")  # 1 + 2 + 3 + 1 bytes
  assert table == [0, 1, 1, 2, 2, 2, 3, 4]


def test_overlaps_resolve_to_the_longest_span_whatever_the_order():
  spans = [{"start": 0, "end": 4, "label": "MISC"}, {"start": 0, "end": 9, "label": "DATE"},
           {"start": 8, "end": 12, "label": "LOC"}, {"start": 20, "end": 25, "label": "PER"},
           {"start": 20, "end": 25, "label": "DATE"}]
  expected = [{"start": 0, "end": 9, "label": "DATE"}, {"start": 20, "end": 25,
                                                         "label": "DATE"}]
  assert resolve_overlaps(spans) == expected
  assert resolve_overlaps(reversed(spans)) == expected


def test_spans_become_token_tags_and_seqeval_scores():
  tokens = ["Hans", "Müller", "visited", "New", "York", "."]
  spans = [{"start": 0, "end": 11, "label": "PER"}, {"start": 20, "end": 28, "label": "LOC"}]
  gold = spans_to_token_tags(tokens, spans)
  assert gold == ["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "O"]
  assert entity_scores([gold], [gold])["f1"] == 1.0
  half = spans_to_token_tags(tokens, spans[:1])
  scores = entity_scores([gold], [half])
  assert (scores["precision"], scores["recall"]) == (1.0, 0.5)


# --- Command line -------------------------------------------------------------------------

def test_cli_flags_override_the_config():
  args = build_parser().parse_args([
      "train", "--conll_dir", "c", "--output_dir", "o", "--max_steps", "7",
      "--learning_rate", "3e-5", "--override", "encoder.dropout_rate=0.2"])
  config = config_from_args(args)
  assert (config.max_steps, config.learning_rate, config.encoder.dropout_rate) == (7, 3e-5,
                                                                                   0.2)
  assert config.epochs == TaggerConfig().epochs


# --- A tiny random-init tagger: training, export and loading ----------------------------

# A 2-layer, 32-wide encoder from random weights: seconds to train and to score CoNLL's dev
# and test files, so the mechanics are checked here; whether the tagger learns (entity F1
# of a trained MiniLM tagger) is tests/test_tagger_trained.py's, in the system tier.
TINY_CONFIG = """\
encoder: {hidden_size: 32, num_layers: 2, num_attention_heads: 2, intermediate_size: 64,
          max_position_embeddings: 64}
warm_start: {source: ''}
serving_max_seq_length: 64
"""
TINY_STEPS = 4


@pytest.fixture(scope="session")
def tiny_tagger(tmp_path_factory, conll_dir):
  """`python -m realm_tf.tagger train` on the tiny config: (the command's JSON, export dir)."""
  directory = tmp_path_factory.mktemp("tiny_tagger")
  (directory / "tiny.yaml").write_text(TINY_CONFIG, encoding="utf-8")
  export_dir = str(directory / "export")
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    assert main(["train", "--conll_dir", str(conll_dir), "--output_dir", export_dir,
                 "--config", str(directory / "tiny.yaml"), "--max_steps", str(TINY_STEPS),
                 "--batch_size", "8", "--seq_length", "32"]) == 0
  return json.loads(out.getvalue()), export_dir


def _sha256(path) -> str:
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def test_train_command_trains_scores_and_publishes_the_export(tiny_tagger, conll_dir):
  result, export_dir = tiny_tagger
  manifest = read_manifest(export_dir)
  assert result["output_dir"] == export_dir
  assert result["training"] == manifest["training"]
  assert manifest["training"]["steps"] == TINY_STEPS
  assert manifest["training"]["examples"] >= 2110  # every training sentence, some split
  assert np.isfinite(manifest["training"]["final_loss"])
  # The YAML and the flags reached the run.
  assert manifest["config"]["encoder"]["hidden_size"] == 32
  assert manifest["config"]["warm_start"]["source"] == ""
  assert (manifest["config"]["batch_size"], manifest["config"]["seq_length"]) == (8, 32)
  # Both held-out files scored before export, entity by entity.
  assert result["scores"] == manifest["scores"]
  assert (manifest["scores"]["dev"]["sentences"], manifest["scores"]["test"]["sentences"]) == (
      300, 291)
  assert all(0.0 <= manifest["scores"][s][m] <= 1.0 for s in ("dev", "test")
             for m in ("f1", "precision", "recall"))
  assert manifest["labels"] == list(LABELS)
  assert manifest["signature"]["outputs"] == list(signature.OUTPUT_KEYS)
  assert {name: entry["sha256"] for name, entry in manifest["inputs"].items()} == {
      split: _sha256(conll_dir / name) for split, name in (
          ("train", "eng.train"), ("dev", "eng.testa"), ("test", "eng.testb"))}
  # Published whole: one committed version (its data and its manifest), nothing staged.
  version = resolve_tagger_dir(export_dir)
  assert sorted(os.listdir(export_dir)) == sorted([
      os.path.basename(version.path), f"{version.version:012d}{versioned.MANIFEST_SUFFIX}"])
  assert sorted(os.listdir(os.path.dirname(export_dir))) == ["export", "tiny.yaml"]


def test_evaluate_command_scores_the_export_as_training_scored_the_model(tiny_tagger,
                                                                         conll_dir, capsys):
  """The export, loaded, tags eng.testa as the in-memory model did before export: every
  score the train command recorded comes out again, to the 4th decimal."""
  _, export_dir = tiny_tagger
  dev = read_manifest(export_dir)["scores"]["dev"]
  # Some entities right: the comparison is between real predictions, not two empty sets.
  assert dev["precision"] > 0.0, dev
  capsys.readouterr()
  assert main(["evaluate", "--tagger_dir", export_dir, "--conll_file",
               str(conll_dir / "eng.testa")]) == 0
  result = json.loads(capsys.readouterr().out)
  assert (result["tagger_dir"], result["conll_file"]) == (export_dir,
                                                          str(conll_dir / "eng.testa"))
  assert {k: v for k, v in result.items() if k not in ("tagger_dir", "conll_file")} == dev


def test_serving_signature_layout_and_decoded_spans(tiny_tagger):
  _, export_dir = tiny_tagger
  texts = ["Talvek Omrin flew to Brosmont on Monday.", "",
           "Shares of Kestova Holdings rose in Halvigrad, police in Ostrelle said.",
           "Desra Quellin"]
  loaded = tf.saved_model.load(resolve_tagger_dir(export_dir).path)
  outputs = loaded.signatures[signature.SIGNATURE_KEY](**{
      signature.INPUT_KEY: tf.constant(texts)})
  assert set(outputs) == set(signature.OUTPUT_KEYS)
  num_spans = outputs["num_spans"].numpy()
  assert outputs["num_spans"].dtype == tf.int64 and num_spans.shape == (len(texts),)
  width = max(1, int(num_spans.max()))
  for key, dtype in (("span_starts", tf.int64), ("span_ends", tf.int64),
                     ("span_labels", tf.string)):
    assert outputs[key].dtype == dtype and tuple(outputs[key].shape) == (len(texts), width)
  assert num_spans[1] == 0 and num_spans.sum() > 0  # the random tagger does find spans
  for row, n in enumerate(num_spans):  # padding past each row's spans
    assert (outputs["span_starts"].numpy()[row, n:] == -1).all()
    assert (outputs["span_labels"].numpy()[row, n:] == b"").all()

  spans = SavedTagger(export_dir, group_size=2)(texts)
  assert spans == signature.decode_spans(texts, {k: v.numpy() for k, v in outputs.items()})
  assert [len(s) for s in spans] == list(num_spans)
  for text, text_spans in zip(texts, spans):
    ends = [0] + [s["end"] for s in text_spans]
    for span, previous_end in zip(text_spans, ends):
      assert previous_end <= span["start"] < span["end"] <= len(text), (text, text_spans)
      assert span["label"] in ENTITY_TYPES
      piece = text[span["start"]:span["end"]]
      assert piece == piece.strip() and piece, (text, span)


def test_training_steps_lower_the_loss_on_the_batch_they_see(conll_dir, tokenizer):
  """fit's optimizer steps reach the weights: ten steps on one batch more than halve its
  loss (2.16 to 0.66, measured), where a step that updated nothing would leave it."""
  tf_keras.utils.set_random_seed(0)
  config = TaggerConfig(encoder=EncoderConfig(hidden_size=32, num_layers=2,
                                              num_attention_heads=2, intermediate_size=64),
                        warm_start=WarmStartConfig(source=""), learning_rate=1e-2,
                        warmup_fraction=0.0, log_every_steps=100)
  examples = sentence_examples(read_sentences(str(conll_dir / "eng.train"))[:8], tokenizer,
                               seq_length=32)
  inputs, labels, weights = next(iter(training_dataset(examples, batch_size=8, seed=0)))
  model = build_token_classifier(config)

  def loss():
    return float(masked_loss(model(inputs, training=False), labels, weights))

  before = loss()
  fit(model, tf.data.Dataset.from_tensors((inputs, labels, weights)).repeat(), 10, config)
  assert loss() < 0.5 * before, before


# --- The Beam step ------------------------------------------------------------------------

def _spans_as_text(record):
  return record["id"], [(record["text"][s["start"]:s["end"]], s["label"])
                        for s in record["salient_spans"]]


def test_beam_step_runs_the_exported_tagger_through_run_inference(tiny_tagger):
  """Three records in batches of two through RunInference: each gets the export's own spans
  for its text merged with its dates, its other fields kept."""
  _, export_dir = tiny_tagger
  records = [
      {"id": 1, "uid": "a", "text": "Barnet Vorsk flew to Brosmont on 20 July 1969."},
      {"id": 2, "uid": "b", "text": "Shares of Kestova Holdings rose in Halvigrad in 2004."},
      {"id": 3, "uid": "c", "text": "Nothing to see here."},
  ]
  tagged = SavedTagger(export_dir)([r["text"] for r in records])
  assert any(tagged)
  expected = [dict(r, salient_spans=resolve_overlaps(spans + find_dates(r["text"])))
              for r, spans in zip(records, tagged)]
  assert all(any(s["label"] == "DATE" for s in e["salient_spans"]) for e in expected[:2])
  with beam.Pipeline() as pipeline:
    out = (pipeline | beam.Create(records)
           | TagSalientSpans(export_dir, batch_size=2))
    assert_that(out, equal_to(expected))


def test_beam_step_without_a_tagger_finds_dates_only():
  records = [{"id": 1, "text": "Angela Merkel flew to Paris on 20 July 1969."},
             {"id": 2, "text": "Zürich, 1990s."}]
  with beam.Pipeline() as pipeline:
    tagged = (pipeline | beam.Create(records) | TagSalientSpans()
              | beam.Map(_spans_as_text))
    assert_that(tagged, equal_to([(1, [("20 July 1969", "DATE")]),
                                  (2, [("1990s", "DATE")])]))


def test_beam_step_keeps_the_other_fields():
  with beam.Pipeline() as pipeline:
    tagged = (pipeline | beam.Create([{"id": 7, "uid": "abc", "text": "In 1066."}])
              | TagSalientSpans())
    assert_that(tagged, equal_to([{"id": 7, "uid": "abc", "text": "In 1066.",
                                   "salient_spans": [{"start": 3, "end": 7,
                                                      "label": "DATE"}]}]))
