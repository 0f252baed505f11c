"""Corpus building blocks without Beam: wikitext, readers, packing, ids, examples, schema."""
import bz2
import hashlib
import io
import json

import pytest
import tensorflow as tf

from realm_tf.corpus import (blocks, examples, ids, json_records, manifest, packing, readers,
                             records, schema, sentences, wikipedia, wikitext)
from realm_tf.corpus.records import Block, SetAsideError
from realm_tf.corpus.wordpieces import WordpieceCounter


@pytest.fixture(scope="module")
def counter():
  return WordpieceCounter()


def _real_pages(wiki_dump_sample, titles):
  """Raw <page> chunks of the named articles of the real dump sample, by title."""
  found = {}
  with bz2.open(wiki_dump_sample) as stream:
    for record in readers.read_wikipedia_pages(stream, "sample", 1 << 24):
      title = wikipedia.parse_page(record.payload).title
      if title in titles:
        found[title] = record.payload
  return [found[t] for t in titles]


# --- wikitext -------------------------------------------------------------------------

def test_plain_text_keeps_prose_and_link_text_only():
  code = wikitext.parse(
      "'''Alaska''' ({{IPA|əˈlæskə}}; {{lang-ru|Аляска}}) is a [[U.S. state|state]] of "
      "[[North America]], {{convert|1717856|km2|sqmi}} in area.<ref name=a>{{cite web|"
      "url=http://x}}</ref> It was bought in 1867.<ref>Cited.</ref>\n"
      "[[File:Alaska.jpg|thumb|A [[glacier]] caption]]\n"
      "{| class=\"wikitable\"\n|-\n! Year !! Pop\n|-\n| 1900 || 63592\n|}\n"
      "<!-- hidden --><gallery>\nImage:x.jpg|y\n</gallery>\n"
      "== Economy ==\nOil is [http://example.com the main] industry.<br />Fishing too.\n"
      "== References ==\n{{reflist}}\n* [[Some book]]\n"
      "[[Category:States]] [[fr:Alaska]]")
  text = wikitext.to_plain_text(code)
  assert text.split("\n") == [
      "Alaska (Аляска) is a state of North America, 1717856 km2 in area. "
      "It was bought in 1867.",
      "Oil is the main industry.",
      "Fishing too.",
  ]


def test_plain_text_has_no_markup_even_when_unbalanced():
  code = wikitext.parse("Open [[link without end and {{template without end.\n"
                        "Stray '''bold and <ref>never closed\nTable end |} here.")
  text = wikitext.to_plain_text(code)
  for remnant in ("[[", "{{", "<ref", "|}", "'''"):
    assert remnant not in text


def test_page_rules():
  assert wikitext.is_non_article_title("List of anthropologists")
  assert wikitext.is_non_article_title("Outline of physics")
  assert not wikitext.is_non_article_title("Listeria")
  assert wikitext.is_disambiguation("Ada", wikitext.parse("'''Ada''' may be:\n{{Disambiguation}}"))
  assert wikitext.is_disambiguation("Aa River", wikitext.parse("x {{geodis}}"))
  assert wikitext.is_disambiguation("Mercury (disambiguation)", wikitext.parse("x"))
  assert not wikitext.is_disambiguation(
      "Apollo", wikitext.parse("{{Redirect-distinguish|x|y}} Apollo is a god."))


def test_real_pages_become_articles(wiki_dump_sample):
  payloads = _real_pages(wiki_dump_sample, ["Actrius", "Ada", "List of anthropologists"])
  title, text = wikipedia.article(payloads[0], max_chars=10**6)
  assert title == "Actrius" and "Actrius" in text and "{{" not in text
  with pytest.raises(SetAsideError) as dab:
    wikipedia.article(payloads[1], max_chars=10**6)
  assert dab.value.reason == records.DISAMBIGUATION
  with pytest.raises(SetAsideError) as listing:
    wikipedia.article(payloads[2], max_chars=10**6)
  assert listing.value.reason == records.NON_ARTICLE_TITLE
  with pytest.raises(SetAsideError) as big:
    wikipedia.article(payloads[0], max_chars=100)
  assert big.value.reason == records.TOO_LARGE


@pytest.mark.parametrize("payload,reason", [
    (b"<page><title>A</title><ns>0</ns><revision><text>x\xff</text></revision></page>",
     records.INVALID_UTF8),
    (b"<page><title>A & B</title><ns>0</ns><revision><text>x</text></revision></page>",
     records.MALFORMED_XML),
    (b"<page><title>A</title><ns>0</ns></page>", records.MALFORMED_XML),
    (b"<page><title>A</title><ns>0</ns><revision><text>{{stub}}</text></revision></page>",
     records.EMPTY),
    (b"<page><title>T:A</title><ns>10</ns><revision><text>x</text></revision></page>",
     records.NAMESPACE),
    (b"<page><title>A</title><ns>0</ns><revision><text>#REDIRECT [[B]]</text>"
     b"</revision></page>", records.REDIRECT),
])
def test_bad_pages_are_set_aside_with_reason(payload, reason):
  with pytest.raises(SetAsideError) as error:
    wikipedia.article(payload, max_chars=1000)
  assert error.value.reason == reason


def test_markup_nesting_past_the_parser_limit_is_set_aside_at_every_depth():
  """The parser gives up at its own depth limit and reads the rest as text, which once let
  a 1,913-deep template through as the article "x"; every depth past the bound is set
  aside the same way, every depth within it parses as markup."""
  def page(body):
    return (f"<page><title>Deep</title><ns>0</ns><revision><text>{body}</text>"
            f"</revision></page>").encode()
  limit = wikitext.MAX_MARKUP_DEPTH
  for n in range(limit + 1, 2100):
    for opener, closer in (("{{", "}}"), ("[[", "]]")):
      with pytest.raises(SetAsideError) as error:
        wikipedia.article(page("Prose. " + opener * n + "x" + closer * n), 10 ** 5)
      assert error.value.reason == records.UNPARSABLE_WIKITEXT, n
  assert wikipedia.article(page("Prose. " + "{{" * limit + "x" + "}}" * limit),
                           10 ** 5) == ("Deep", "Prose.")
  assert wikitext.markup_depth("}} {{a|{{b}}}} [[c]] ]]") == 2


# --- readers --------------------------------------------------------------------------

def _page(title, body="Some text."):
  return (f"  <page>\n    <title>{title}</title>\n    <ns>0</ns>\n    <revision>\n"
          f"      <text>{body}</text>\n    </revision>\n  </page>\n").encode()


def test_page_reader_isolates_unclosed_and_oversized_pages():
  dump = (b"<mediawiki>\n  <siteinfo>\n  </siteinfo>\n" + _page("One") +
          b"  <page>\n    <title>Unclosed</title>\n" + _page("Two") +
          _page("Big", "y" * 5000) + _page("Three") + b"</mediawiki>\n")
  got = list(readers.read_wikipedia_pages(io.BytesIO(dump), "d.xml", max_record_bytes=2000))
  assert [r.index for r in got] == [0, 1, 2, 3, 4]
  assert [r.defect for r in got] == ["", records.MALFORMED_XML, "", records.TOO_LARGE, ""]
  assert [r.line for r in got] == [4, 11, 13, 20, 27]
  assert wikipedia.parse_page(got[4].payload).title == "Three"
  assert len(got[3].payload) <= 2000
  limited = list(readers.read_wikipedia_pages(io.BytesIO(dump), "d.xml", 2000, max_records=2))
  assert [r.index for r in limited] == [0, 1]


def test_page_reader_flags_a_page_cut_off_by_end_of_file():
  dump = _page("One") + b"  <page>\n    <title>Cut</title>\n"
  got = list(readers.read_wikipedia_pages(io.BytesIO(dump), "d.xml", 10_000))
  assert [r.defect for r in got] == ["", records.MALFORMED_XML]


def test_json_line_reader_skips_blank_lines_and_bounds_long_ones():
  data = b'{"a": 1}\n\n' + b'{"b": "' + b"x" * 500 + b'"}\n{"c": 3}'
  got = list(readers.read_json_lines(io.BytesIO(data), "f.jsonl", max_record_bytes=100))
  assert [(r.index, r.line, r.defect) for r in got] == [
      (0, 1, ""), (1, 3, records.TOO_LARGE), (2, 4, "")]
  assert got[2].payload == b'{"c": 3}' and len(got[1].payload) == 100


@pytest.mark.parametrize("payload,reason", [
    (b'{"title": "A", "text": ', records.INVALID_JSON),
    (b'["title", "text"]', records.INVALID_JSON),
    (b'{"title": "A"}', records.MISSING_FIELD),
    (b'{"title": "A", "text": 3}', records.MISSING_FIELD),
    (b'{"title": "A", "text": "  \\n "}', records.EMPTY),
    (b'{"title": "A", "text": "caf\xe9"}', records.INVALID_UTF8),
])
def test_bad_json_lines_are_set_aside_with_reason(payload, reason):
  with pytest.raises(SetAsideError) as error:
    json_records.plain_document(payload, max_chars=1000)
  assert error.value.reason == reason


def test_news_lines_read_news_please_and_plain_layouts(news_articles):
  with open(news_articles, "rb") as f:
    bbc_line = f.readline()
  title, text = json_records.news_document(bbc_line, max_chars=10**6)
  assert (title, text) == (json.loads(bbc_line)["title"], json.loads(bbc_line)["text"])
  news_please = json.dumps({"title": "T", "maintext": "Body.\n\nMore.", "language": "en",
                            "date_publish": "2019-01-01 00:00:00", "url": "http://x"})
  assert json_records.news_document(news_please.encode(), 1000) == ("T", "Body.\nMore.")
  german = json.dumps({"title": "T", "maintext": "Text.", "language": "de"}).encode()
  with pytest.raises(SetAsideError) as error:
    json_records.news_document(german, 1000)
  assert error.value.reason == records.LANGUAGE
  assert json_records.news_document(german, 1000, language="") == ("T", "Text.")


# --- sentences, packing, blocks ----------------------------------------------------------

def test_sentences_never_cross_paragraphs():
  got = sentences.split_sentences("Dr. Smith left.  He came   back.\nA new paragraph\nEnd.")
  assert got == ["Dr. Smith left.", "He came back.", "A new paragraph", "End."]


def test_split_to_fit_cuts_at_word_starts_and_counts_exactly(counter):
  text = "Antidisestablishmentarianism is unbelievably long, isn't it? Café naïveté."
  [wordpieces] = counter([text])
  longest_word = max(len(w) for w in counter(text.split()))
  for budget in (1, longest_word, longest_word + 2, 2 * longest_word):
    pieces = packing.split_to_fit(text, wordpieces, budget)
    assert all(length <= budget for _, length in pieces)
    assert sum(length for _, length in pieces) == len(wordpieces)
    assert " ".join(p for p, _ in pieces).replace(" ", "") == text.replace(" ", "")
    if budget >= longest_word:  # no cut inside a word: each piece re-tokenizes exactly
      assert [len(w) for w in counter([p for p, _ in pieces])] == [n for _, n in pieces]


def test_pack_greedy_keeps_order_and_fills_blocks():
  pieces = [("a", 3), ("b", 4), ("c", 2), ("d", 5), ("e", 1)]
  assert packing.pack_greedy(pieces, 7) == [[("a", 3), ("b", 4)], [("c", 2), ("d", 5)],
                                            [("e", 1)]]
  with pytest.raises(ValueError):
    packing.pack_greedy([("x", 8)], 7)


def test_blocks_fit_and_split_only_overlong_sentences(counter, tokenizer):
  title = "A title"
  long_sentence = " ".join(["word"] * 40) + "."
  doc_sentences = ["Short one.", long_sentence, "Another short one.", "End."]
  made = blocks.make_blocks("uid", title, counter([title])[0], doc_sentences,
                            counter(doc_sentences), max_block_length=20, max_title_length=8)
  joined = " ".join(b.text for b in made)
  assert joined.replace(" ", "") == " ".join(doc_sentences).replace(" ", "")
  for block in made:
    inputs = tokenizer.encode([block.title], 64, pair_texts=[block.text])
    assert int(tf.reduce_sum(inputs.input_mask)) <= 20
    assert sum(block.sentence_lengths) == len(counter([block.text])[0])
  assert "Short one." in made[0].sentences and "End." in made[-1].sentences
  assert [b.block_id for b in made] == [ids.block_id("uid", i) for i in range(len(made))]


# --- ids, examples, schema, manifest -----------------------------------------------------

def test_ids_are_content_hashes():
  uid = ids.doc_uid("Title", "Text.")
  assert uid == ids.doc_uid("Title", "Text.") != ids.doc_uid("Title", "Text!")
  assert len(uid) == 32 and int(uid, 16) >= 0
  # The documented scheme, spelled out: a change here silently re-keys published indexes.
  digest = hashlib.sha256(f"{uid}/3".encode()).digest()
  assert ids.block_id(uid, 3) == int.from_bytes(digest[:8], "big") >> 1
  assert ids.block_id(uid, 0) != ids.block_id(uid, 1)
  assert all(0 <= ids.block_id(uid, i) < 2**63 for i in range(100))


def _block(i, n_sentences=5):
  body = tuple(f"Sentence {j} of block {i}." for j in range(n_sentences))
  return Block(block_id=ids.block_id("doc", i), doc_uid="doc", title="T", sentences=body,
               sentence_lengths=tuple(6 for _ in body))


def test_ict_removal_rate_and_determinism():
  made = [examples.ict_example(_block(i), keep_query_prob=0.1, seed=0) for i in range(4000)]
  removed = sum(e["query_removed"] for e in made) / len(made)
  assert 0.88 < removed < 0.92
  for e, i in zip(made[:200], range(200)):
    assert (e["query"] in e["text"]) == (not e["query_removed"])
    assert e["query"] in _block(i).sentences
  again = [examples.ict_example(_block(i), 0.1, seed=0) for i in range(200)]
  assert again == made[:200]
  other_seed = [examples.ict_example(_block(i), 0.1, seed=1) for i in range(200)]
  assert other_seed != made[:200]
  assert examples.ict_example(_block(0, n_sentences=1), 0.1, 0) is None


def test_pretraining_queries_fit_and_cover_the_block(counter):
  sentences_ = ("One two three.", " ".join(["long"] * 30) + ".", "Four five.")
  block = Block(block_id=7, doc_uid="d", title="T", sentences=sentences_,
                sentence_lengths=tuple(len(w) for w in counter(list(sentences_))))
  budget = examples.query_budget(12)
  long = examples.long_sentences(block, budget)
  queries = examples.pretraining_queries(block, budget, counter(long))
  assert all(len(w) <= budget for w in counter([q["text"] for q in queries]))
  # A cut sentence's pieces are joined by a space: compare without spaces.
  assert "".join(q["text"] for q in queries).replace(" ", "") == block.text.replace(" ", "")
  assert queries[0]["text"] == "One two three." and len(queries) == 5
  assert {(q["block_id"], q["doc_uid"]) for q in queries} == {(7, "d")}


def test_pretraining_example_offsets_are_utf8_bytes():
  text = "Née in Zürich on 20 July 1969."
  start = text.index("Zürich")
  tagged = {"text": text, "block_id": 1, "doc_uid": "d", "salient_spans": [
      {"start": text.index("20 July"), "end": len(text) - 1, "label": "DATE"},
      {"start": start, "end": start + len("Zürich"), "label": "LOC"}]}
  features = examples.pretraining_example(tagged)
  data = text.encode()
  got = [data[s:e].decode() for s, e in zip(features["salient_span_starts"],
                                            features["salient_span_ends"])]
  assert got == ["Zürich", "20 July 1969"]
  assert features["salient_span_labels"] == ["LOC", "DATE"]


def test_schema_round_trip_in_tf_data():
  rows = [{"text": "x", "block_id": 5, "doc_uid": "u", "salient_span_starts": [0, 2],
           "salient_span_ends": [1, 3], "salient_span_labels": ["PER", "DATE"]},
          {"text": "y", "block_id": 6, "doc_uid": "v", "salient_span_starts": [],
           "salient_span_ends": [], "salient_span_labels": []}]
  serialized = [schema.PRETRAINING.serialize(r) for r in rows]
  batch = next(iter(tf.data.Dataset.from_tensor_slices(serialized).batch(2)
                    .map(schema.PRETRAINING.parse)))
  assert batch["block_id"].numpy().tolist() == [5, 6]
  assert batch["salient_span_starts"].to_list() == [[0, 2], []]
  assert batch["salient_span_labels"].to_list() == [[b"PER", b"DATE"], []]
  with pytest.raises(ValueError, match="needs"):
    schema.BLOCK.serialize({"block_id": 1, "title": "t", "text": "x"})


def test_accounting_check_catches_lost_records():
  counts = manifest.counts_from_stats({
      "count/records_in": 10, "count/accepted": 6, "set_aside/redirect": 3,
      "set_aside/invalid_json": 1, "count/blocks": 9})
  assert counts["set_aside"] == {"by_rule": {"redirect": 3}, "bad_input": {"invalid_json": 1}}
  manifest.check_accounting(counts)
  counts["accepted"] = 5
  with pytest.raises(RuntimeError, match="accounting"):
    manifest.check_accounting(counts)
