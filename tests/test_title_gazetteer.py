"""The title gazetteer: other articles' titles as salient entities when there is no tagger."""
import json

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to
import tensorflow as tf

from beam import preprocess
from realm_tf.corpus import schema
from realm_tf.corpus.gazetteer import TITLE_LABEL, TitleGazetteer
from realm_tf.pipelines.transforms.salient_spans import TagSalientSpans


def _mentions(gazetteer, text, doc_uid=""):
  return [text[s["start"]:s["end"]] for s in gazetteer.find(text, doc_uid)]


def test_mentions_are_exact_case_sensitive_and_word_bounded():
  g = TitleGazetteer([("Rome", "r"), ("Paris", "p"), ("C++", "c"), ("I", "i")])
  text = "Romeo left Rome for paris, then Paris; he wrote C++ code and I did not."
  assert _mentions(g, text) == ["Rome", "Paris", "C++"]
  assert all(s["label"] == TITLE_LABEL for s in g.find(text))
  assert _mentions(g, "Romes and Parisian streets") == []


def test_the_longest_title_wins_and_matches_do_not_overlap():
  g = TitleGazetteer([("New York", "a"), ("New York City", "b"), ("York", "c"),
                      ("City", "d")])
  assert _mentions(g, "He moved to New York City in 1990.") == ["New York City"]
  assert _mentions(g, "He moved to New York in 1990.") == ["New York"]


def test_a_title_inside_a_longer_name_is_no_mention():
  g = TitleGazetteer([("Abraham", "a"), ("Sahara", "s"), ("Africa", "af"), ("Society", "so"),
                      ("Paris", "p")])
  assert _mentions(g, "Abraham Maslow wrote about Abraham.") == ["Abraham"]
  assert [s["start"] for s in g.find("Abraham Maslow wrote about Abraham.")] == [27]
  # A sentence's first word is capitalised anyway; a capitalised word mid-sentence is not.
  assert _mentions(g, "The Sahara spans North Africa. In Paris, it rains.") == ["Sahara",
                                                                                "Paris"]
  assert _mentions(g, "He co-founded the Watch Tower Tract Society in 1881.") == []
  text = "Paris Saint-Germain won; (Paris) won; Africa-wide."
  assert [(s["start"], text[s["start"]:s["end"]]) for s in g.find(text)] == [
      (26, "Paris"), (38, "Africa")]


def test_a_text_never_mentions_its_own_article():
  g = TitleGazetteer([("New York City", "nyc"), ("York", "york"), ("France", "fr"),
                      ("Mercury", "planet"), ("Mercury", "element")])
  # Its own title is skipped whole: no shorter title inside it is taken instead.
  assert _mentions(g, "New York City is larger than York.", "nyc") == ["York"]
  assert _mentions(g, "France borders Spain.", "fr") == []
  # A title two documents share is another article's title for either of them.
  assert _mentions(g, "Mercury is a planet.", "planet") == ["Mercury"]
  spans = g.find("Paris is in France and France is in Europe.", "paris")
  assert [(s["start"], s["end"]) for s in spans] == [(12, 18), (23, 29)]


def test_beam_step_merges_title_mentions_with_dates():
  records = [{"text": "Paris hosted the 1900 Olympics.", "doc_uid": "fr"},
             {"text": "France was founded in 843.", "doc_uid": "fr"}]
  with beam.Pipeline() as pipeline:
    gazetteer = pipeline | "Titles" >> beam.Create(
        [TitleGazetteer([("Paris", "paris"), ("France", "fr"), ("Olympics", "o")])])
    tagged = (pipeline | beam.Create(records) | TagSalientSpans(gazetteer=gazetteer)
              | beam.Map(lambda r: [(r["text"][s["start"]:s["end"]], s["label"])
                                    for s in r["salient_spans"]]))
    assert_that(tagged, equal_to([
        [("Paris", "TITLE"), ("1900", "DATE"), ("Olympics", "TITLE")],
        []]))  # "France" is the record's own article; "843" is no plausible year


def test_preprocess_with_title_gazetteer(tmp_path):
  articles = [
      {"title": "Veloria", "text": "Veloria is a country. Its capital is Talmont. "
                                   "The river Amsel flows through Veloria."},
      {"title": "Talmont", "text": "Talmont is the capital of Veloria. It was founded "
                                   "in 1204 on the Amsel."},
      {"title": "Amsel", "text": "The Amsel is a river of Veloria. It reaches the sea "
                                 "near Talmont."},
  ]
  corpus = tmp_path / "articles.jsonl"
  corpus.write_text("".join(json.dumps(a) + "\n" for a in articles))
  out = tmp_path / "corpus"
  assert preprocess.main(["--input_format", "jsonl", "--input", str(corpus),
                          "--output_dir", str(out), "--max_block_length", "48",
                          "--max_title_length", "16", "--query_length", "24",
                          "--title_gazetteer"]) == 0
  with open(out / "manifest.json") as f:
    assert json.load(f)["salient_spans"] == "title_mentions_and_dates"
  titles = {}
  for record in tf.data.TFRecordDataset(tf.io.gfile.glob(str(out / "blocks-*"))):
    block = schema.BLOCK.parse(record[None])
    titles[block["doc_uid"][0].numpy().decode()] = block["title"][0].numpy().decode()
  mentioned = {title: set() for title in titles.values()}
  dates = []
  for record in tf.data.TFRecordDataset(tf.io.gfile.glob(str(out / "pretraining-*"))):
    parsed = schema.PRETRAINING.parse(record[None])
    text = parsed["text"][0].numpy()
    title = titles[parsed["doc_uid"][0].numpy().decode()]
    for start, end, label in zip(parsed["salient_span_starts"][0].numpy(),
                                 parsed["salient_span_ends"][0].numpy(),
                                 parsed["salient_span_labels"][0].numpy()):
      if label.decode() == TITLE_LABEL:
        mentioned[title].add(text[start:end].decode())
      else:
        dates.append(text[start:end].decode())
  # Every article mentions the two others by title, never itself.
  assert mentioned == {"Veloria": {"Talmont", "Amsel"}, "Talmont": {"Veloria", "Amsel"},
                       "Amsel": {"Veloria", "Talmont"}}
  assert dates == ["1204"]
