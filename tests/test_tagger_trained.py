"""The salient-span tagger learns: a MiniLM tagger fine-tuned for a couple of minutes on the
invented CoNLL files finds entities whose names it never saw, through its export, the
evaluate command and the Beam step.

The system tier (tests/conftest.py's SYSTEM_TIER): the fixture trains for minutes. The
same code paths on a tiny random-init tagger (train and evaluate commands, export and
loading, the signature, the Beam step) are tests/test_tagger.py's, in `make test`.

The CoNLL files are invented (tests/data/invented_conll.py: CoNLL-2003's layout and IOB1
tags, made-up names); the development file's names never occur in the training file, so
the trained tagger's score there and on the sentences below says whether it learns."""
import json
import pathlib

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from realm_tf.pipelines.transforms.salient_spans import TagSalientSpans
from realm_tf.tagger.__main__ import main
from realm_tf.tagger.config import TaggerConfig
from realm_tf.tagger.conll import read_sentences
from realm_tf.tagger.export import export_tagger
from realm_tf.tagger.inference import SavedTagger
from realm_tf.tagger.train import build_manifest, train_tagger
from tests.data.invented_conll import (
  UNSEEN_ORGS,
  UNSEEN_PEOPLE,
  UNSEEN_PLACES,
  write_conll,
)



@pytest.fixture(scope="module")
def conll_dir(tmp_path_factory):
  return pathlib.Path(write_conll(str(tmp_path_factory.mktemp("conll") / "invented")))


@pytest.fixture(scope="module")
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


def test_exported_tagger_finds_entities(trained_tagger_dir):
  tag = SavedTagger(trained_tagger_dir)
  for (text, expected), spans in zip(SENTENCES, tag([t for t, _ in SENTENCES])):
    found = {(text[s["start"]:s["end"]], s["label"]) for s in spans}
    assert set(expected) <= found, (text, found)


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
  capsys.readouterr()
  assert main(["evaluate", "--tagger_dir", trained_tagger_dir, "--conll_file",
               str(subset)]) == 0
  result = json.loads(capsys.readouterr().out)
  assert result["sentences"] == len(read_sentences(str(subset)))
  assert result["sentences"] > 50
  # Names here never occur in training: 0.06 after one step, 1.0 after 130 (measured).
  assert result["f1"] > 0.9, result


def _spans_as_text(record):
  return record["id"], [(record["text"][s["start"]:s["end"]], s["label"])
                        for s in record["salient_spans"]]


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
