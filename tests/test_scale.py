"""benchmarks/scale.py scaled down: the same code at 2,000 blocks on the tiny model, exact
export, one aspired-version policy. Every figure the full run reports is produced, the
served answer carries a real-length block, and the hand-over keeps one version resident."""
import json
import os

import pytest

from benchmarks import scale

BLOCKS = 2000


@pytest.fixture(scope="module")
def result(tmp_path_factory, repo_dir):
  work = str(tmp_path_factory.mktemp("scale"))
  args = scale.parse_args([
      f"--blocks={BLOCKS}", f"--work_dir={work}", "--kinds=realm_qa",
      "--policies=resource_preserving", "--requests=5", "--queries=20",
      f"--config={os.path.join(repo_dir, 'configs', 'tiny.yaml')}", "--block_seq_length=48",
      "--reader_seq_length=64", "--variables_layout_blocks=20000", "--trainer_blocks=400",
      "--timeout=300"])
  out = scale.run(args)
  with open(os.path.join(work, "result.json"), "w") as f:  # for a look after a failure
    json.dump(out, f, indent=1, default=str)
  return out


def test_the_corpus_has_real_length_blocks(result):
  corpus = result["corpus"]
  assert corpus["blocks"] == BLOCKS
  # [CLS] title [SEP] text [SEP] fills the block length (a word more would pass it).
  assert 44 <= corpus["wordpieces_per_block_sample"]["mean"] <= 48
  assert corpus["wordpieces_per_block_sample"]["max"] <= 48
  assert 0 < corpus["text_store_bytes"] < corpus["text_bytes"] + corpus["title_bytes"]


def test_the_variables_layout_is_measured_per_component(result):
  per_block = result["variables_layout"]["bytes_per_block"]
  assert set(per_block) >= {"texts", "titles", "embeddings_float32", "word_ids_int32",
                            "type_ids_int32", "body_ids_int32", "word_ids_uint16"}
  # Measured, not computed: an int32 table of 48 ids is about 192 bytes a block.
  assert 150 < per_block["word_ids_int32"] < 290, per_block
  assert per_block["texts"] > 100


def test_export_and_serving_figures(result):
  export = result["exports"]["realm_qa"]
  assert export["disk_bytes"] > 0 and export["build_and_export_seconds"] > 0
  parts = export["component_bytes"]
  assert parts["embeddings"] == BLOCKS * scale.DIMENSION * 4
  assert parts["texts_and_titles_on_disk_compressed"] > 0
  assert export["scann_recall_at_5"] is None  # exact only here
  (served,) = result["serving"]
  assert served["policy"] == "resource_preserving"
  assert served["load_seconds"] > 0 and served["p50_ms"] <= served["p99_ms"]
  assert served["rss_after_load_bytes"] > 0
  answer = served["sample_answer"]
  assert answer["version"] == 1 and min(answer["block_text_chars"]) > 50
  # One version resident at a time: the hand-over peak stays well under two loaded servers.
  assert served["handover_peak_rss_bytes"] < 1.5 * served["rss_after_load_bytes"]


def test_trainer_hand_over_is_measured_per_replica(result):
  local = result["trainer"]["local"]
  assert local["replicas"] == 2 and local["blocks"] == 400
  per_replica = local["bytes_per_replica"]
  assert per_replica["embeddings"] == 200 * scale.DIMENSION * 4
  assert per_replica["word_ids"] == 200 * 48 * 2  # uint16
  assert set(local["swaps"]) == {"1", "2"} or set(local["swaps"]) == {1, 2}
  extrapolated = result["extrapolated_to"]
  assert extrapolated["blocks"] == scale.WIKIPEDIA_BLOCKS
  assert extrapolated["realm_qa/resource_preserving"]["rss_after_load_gib"] > 0


def test_markdown_names_every_section(result, tmp_path):
  path = str(tmp_path / "scale.md")
  scale.write_markdown(path, result)
  with open(path) as f:
    text = f.read()
  for heading in ("previous design", "Exports", "Serving", "trainer", "Extrapolated"):
    assert heading in text
