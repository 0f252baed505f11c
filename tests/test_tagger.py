"""The salient-span tagger: CoNLL reading, labelling, span decoding, a trained export,
and the Beam step that runs it through RunInference.

The CoNLL files are invented (tests/data/invented_conll.py: CoNLL-2003's layout and IOB1
tags, made-up names); the development file's names never occur in the training file, so
the trained tagger's score there and on the sentences below says whether it learns."""
import json
import os
import pathlib

import apache_beam as beam
import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from apache_beam.testing.util import assert_that, equal_to

from realm_tf.pipelines.transforms.salient_spans import TagSalientSpans
from realm_tf.tagger import signature
from realm_tf.tagger.__main__ import build_parser, config_from_args, main
from realm_tf.tagger.config import TaggerConfig
from realm_tf.tagger.conll import (
  LABEL_IDS,
  LABELS,
  ConllFormatError,
  Sentence,
  iob1_to_bio,
  read_conll,
  read_sentences,
)
from realm_tf.tagger.evaluation import entity_scores, spans_to_token_tags
from realm_tf.tagger.export import export_tagger, read_manifest
from realm_tf.tagger.features import sentence_examples
from realm_tf.tagger.inference import SavedTagger, module_tag_fn
from realm_tf.tagger.serving import SpanTagger
from realm_tf.tagger.spans import byte_to_char_offsets, resolve_overlaps
from realm_tf.tagger.train import build_manifest, train_tagger
from tests.data.invented_conll import (
  UNSEEN_ORGS,
  UNSEEN_PEOPLE,
  UNSEEN_PLACES,
  write_conll,
)


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


# --- A trained tagger ---------------------------------------------------------------------

@pytest.fixture(scope="session")
def trained_tagger_dir(tmp_path_factory, conll_dir):
  """A short MiniLM fine-tune (a couple of minutes on 2 CPU cores), exported. 130 steps at
  2e-4 score dev F1 1.0 on the evaluate test's subset and tag every sentence below right
  (measured; 100 steps at 1e-4 scored 0.81 and missed "Barnet" in the Beam test). 32
  wordpieces hold the invented sentences' entities: 163 s alone (64 took 224 s in make test)."""
  config = TaggerConfig(seq_length=32, batch_size=16, max_steps=130, learning_rate=2e-4,
                        log_every_steps=100)
  tagger, run = train_tagger(str(conll_dir / "eng.train"), config)
  export_dir = str(tmp_path_factory.mktemp("tagger") / "export")
  manifest = build_manifest(config, run, {}, {"train": str(conll_dir / "eng.train")},
                            tagger.tokenizer)
  export_tagger(tagger, export_dir, manifest)
  return export_dir


# Invented names that the training file never contains (invented_conll.UNSEEN_*).
SENTENCES = [
    ("Talvek Omrin flew to Brosmont on Monday.", [("Talvek Omrin", "PER"), ("Brosmont", "LOC")]),
    ("Shares of Kestova Holdings rose in Halvigrad.", [("Kestova Holdings", "ORG"),
                                                      ("Halvigrad", "LOC")]),
    ("Police in Ostrelle arrested Desra Quellin.", [("Ostrelle", "LOC"),
                                                    ("Desra Quellin", "PER")]),
]


def test_the_sentences_name_only_what_training_never_saw(conll_dir):
  train_tokens = {t for s in read_sentences(str(conll_dir / "eng.train")) for t in s.tokens}
  names = {n for _, expected in SENTENCES for n, _ in expected}
  assert names <= set(UNSEEN_PEOPLE + UNSEEN_PLACES + UNSEEN_ORGS)
  words = {w for n in names | set(UNSEEN_PEOPLE) for w in n.split()} - {"Holdings"}
  assert not words & train_tokens  # "Holdings" ends training ORG names too


@pytest.mark.slow  # trains the tagger (session fixture), minutes on 2 cores
def test_exported_tagger_finds_entities(trained_tagger_dir):
  tag = SavedTagger(trained_tagger_dir)
  for (text, expected), spans in zip(SENTENCES, tag([t for t, _ in SENTENCES])):
    found = {(text[s["start"]:s["end"]], s["label"]) for s in spans}
    assert set(expected) <= found, (text, found)


@pytest.mark.slow  # trains the tagger (session fixture), minutes on 2 cores
def test_export_is_published_whole_with_a_manifest(trained_tagger_dir):
  manifest = read_manifest(trained_tagger_dir)
  assert manifest["labels"] == list(LABELS)
  assert manifest["training"]["steps"] == 130
  assert manifest["signature"]["outputs"] == list(signature.OUTPUT_KEYS)
  parent = os.path.dirname(trained_tagger_dir)
  assert os.listdir(parent) == ["export"]  # no staging directories left behind


@pytest.mark.slow  # trains the tagger (session fixture), minutes on 2 cores
def test_evaluate_command_scores_an_exported_tagger(trained_tagger_dir, conll_dir, tmp_path,
                                                    capsys):
  # The head of the dev file (its first 70 blank-line-ended chunks), so it runs in seconds.
  subset = tmp_path / "dev_head.conll"
  lines, blanks = [], 0
  with open(conll_dir / "eng.testa", encoding="utf-8") as src:
    for line in src:
      lines.append(line)
      blanks += not line.strip()
      if blanks == 70:
        break
  subset.write_text("".join(lines), encoding="utf-8")
  assert main(["evaluate", "--tagger_dir", trained_tagger_dir, "--conll_file",
               str(subset)]) == 0
  result = json.loads(capsys.readouterr().out)
  assert result["sentences"] == len(read_sentences(str(subset)))
  assert result["sentences"] > 50
  # Names here never occur in training: 0.06 after one step, 1.0 after 130 (measured).
  assert result["f1"] > 0.9, result


# --- The Beam step ------------------------------------------------------------------------

def _spans_as_text(record):
  return record["id"], [(record["text"][s["start"]:s["end"]], s["label"])
                        for s in record["salient_spans"]]


@pytest.mark.slow  # trains the tagger (session fixture), minutes on 2 cores
def test_beam_step_tags_entities_and_dates_through_run_inference(trained_tagger_dir):
  records = [
      {"id": 1, "text": "Barnet Vorsk flew to Brosmont on 20 July 1969."},
      {"id": 2, "text": "Shares of Kestova Holdings rose in Halvigrad in 2004."},
      {"id": 3, "text": "Nothing to see here."},
  ]
  with beam.Pipeline() as pipeline:
    tagged = (pipeline | beam.Create(records)
              | TagSalientSpans(trained_tagger_dir, batch_size=2)
              | beam.Map(_spans_as_text))
    assert_that(tagged, equal_to([
        (1, [("Barnet Vorsk", "PER"), ("Brosmont", "LOC"), ("20 July 1969", "DATE")]),
        (2, [("Kestova Holdings", "ORG"), ("Halvigrad", "LOC"), ("2004", "DATE")]),
        (3, []),
    ]))


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
