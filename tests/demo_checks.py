"""The demo tests' corpus and the checks they share: tests/test_demo_stages.py (the
demo's stages in the test process, at the smallest size) and tests/test_demo.py
(`python -m realm_tf.demo` end to end, with act 1's Open-QA stages), both in the system
tier."""
import json
import os
import re

from realm_tf.demo import records
from realm_tf.demo.questions import violations
from tests.synthetic_corpus import _CITIES, _COUNTRIES, _RIVERS

# The stages a default run makes and a re-run reuses, in the order they run.
STAGES = ("corpus", "preprocess", "data", "ict", "index", "warmup", "pretrain", "fill_in",
          "world", "world_openqa", "world_export", "world_edit")


def write_articles(path, countries: int = len(_COUNTRIES)) -> list[dict]:
  """Invented countries, their capitals and rivers (three articles per country): every
  article names others by title."""
  rows = []
  for i, (country, city, river) in enumerate(zip(_COUNTRIES[:countries], _CITIES, _RIVERS)):
    rows += [
        {"title": country, "text": f"{country} is a small country. Its capital is {city}. "
                                   f"The river {river} flows through {country}. {country} "
                                   f"joined the league in {1800 + 13 * i}."},
        {"title": city, "text": f"{city} is the capital of {country}. It lies on the river "
                                f"{river}. {city} was founded in {1200 + 17 * i}."},
        {"title": river, "text": f"The {river} is a river in {country}. It flows through "
                                 f"{city} and reaches the sea in the south."}]
  with open(path, "w", encoding="utf-8") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")
  return rows


def check_filled_in(filled: list, titles: set, num_masked: int, num_candidates: int):
  """Table 3: held-out sentences filled in with and without retrieval, with the blocks read
  (never the sentence's own) and p(z|x) over them and the null document summing to 1."""
  assert len(filled) == num_masked
  for row in filled:
    assert "___" in row["masked"] and row["label"] in ("TITLE", "DATE")
    assert (row["answer"] in titles if row["label"] == "TITLE"
            else re.fullmatch(r"\d{4}", row["answer"]))
    assert row["with_retrieval"] and row["without_retrieval"]
    assert 0.0 < row["p_answer_with_retrieval"] <= 1.0
    assert 0.0 < row["p_null_document"] < 1.0
    assert len(row["blocks"]) == num_candidates - 1
    assert all(b["title"] in titles for b in row["blocks"])
    assert all(b["block_id"] != row["source_block_id"] for b in row["blocks"])
    assert abs(row["p_null_document"] + sum(b["p"] for b in row["blocks"]) - 1.0) < 1e-4


def check_fill_in_score(summary: dict, filled: list, printed: str):
  """The accuracy act 1 prints: counted again from the filled-in rows."""
  assert summary["count"] == len(filled)
  for reading in ("with_retrieval", "without_retrieval"):
    right = sum(r[reading] == r["answer_wordpieces"] for r in filled)
    assert summary[reading]["right"] == right
    assert summary[reading]["accuracy"] == right / len(filled)
  assert f"Fill-in accuracy over {len(filled)} held-out masked sentences" in printed
  assert "Held-out masked sentences filled in right: " in printed


def check_generated_questions(corpus_dir: str, data: dict, num_eval_questions: int) -> set:
  """The data stage's files (`data`: its info) made from the preprocessed `corpus_dir`:
  held-out means held out, no question answerable only from its own block, and those
  blocks left out of the Open-QA corpus. Returns their block ids."""
  blocks = records.read_blocks(corpus_dir)
  train = records.read_json_lines(data["train_questions"])
  heldout = records.read_json_lines(data["heldout_questions"])
  assert train and 1 <= len(heldout) <= num_eval_questions
  assert violations(train + heldout, blocks) == []
  assert all(q["source_block_id"] not in q["answer_block_ids"] for q in train + heldout)
  # Their source blocks are not in the corpus fine-tuning and the server search, so no
  # answer can be read from the block its question was made from.
  sources = {q["source_block_id"] for q in train + heldout}
  qa_blocks = {b.block_id for b in records.read_blocks(data["qa_corpus_dir"])}
  assert not sources & qa_blocks and len(qa_blocks) == len(blocks) - len(sources)
  assert all(set(q["answer_block_ids"]) - sources for q in train + heldout)
  assert not {q["question"] for q in train} & {q["question"] for q in heldout}
  masked = records.read_json_lines(data["masked_json"])
  pretraining = records.read_sentences(data["pretraining"])
  assert not {m["text"] for m in masked} & {s.text for s in pretraining}
  return sources


def check_world_act(world: dict, printed: str, entities: int, asked: int, steps: int):
  """The act's mechanics on a random-init tiny model (whether it answers right is the full
  demo's and benchmarks' business): held-out questions served by the first version, the
  edited corpus published as the next version while the server runs, the same questions
  answered by it from the edited blocks; no training between the two. `printed`: what the
  demo logged and format_world printed."""
  served = world["served"]
  with open(served["answers"], encoding="utf-8") as f:
    rows = json.load(f)  # every held-out question, one per invented person
  assert served["rows"] == rows[:asked] and served["shown"] == asked
  assert served["asked"] == len(rows) == entities
  assert all("answer_before" in r for r in rows[:asked]) and not any(
      "answer_before" in r for r in rows[asked:])
  # The first version is the fine-tuning's last step; the edit is the next.
  assert served["version_after"] == served["version_before"] + 1 == steps + 1
  old_blocks = {b.text for b in records.read_blocks(world["world"]["corpus_dir"])}
  new_blocks = {b.text for b in records.read_blocks(world["world"]["edited_dir"])}
  edited_only, old_only = new_blocks - old_blocks, old_blocks - new_blocks
  assert len(edited_only) == len(old_only) == entities  # every person's block was rewritten
  for row in rows:
    assert row["version_after"] == served["version_after"]
    assert row["old_value"] != row["new_value"]
    assert row["block_after"]["text"] in row["retrieved_after"]
    # The later version searches the edited corpus: it retrieves rewritten people's
    # blocks, and no block as it was before the edit.
    assert set(row["retrieved_after"]) <= new_blocks and set(row["retrieved_after"]) & edited_only
  for row in rows[:asked]:  # and the first version the corpus as built
    assert row["version_before"] == served["version_before"]
    assert row["block_before"]["text"] in row["retrieved_before"]
    assert set(row["retrieved_before"]) <= old_blocks and set(row["retrieved_before"]) & old_only
  assert served["shown_right_before"] == sum(r["right_before"] for r in rows[:asked])
  assert served["follows_edit"] == sum(r["follows_edit"] for r in rows)
  assert printed.count("(the block edited, no parameter changed)") == asked
  # Only the export ran between the two versions: the run's checkpoint is the same one.
  assert f"--version {served['version_after']} --blocks " in printed


def server_pids(printed: str) -> list[int]:
  """The pids of the servers the demo started, as it printed them."""
  found = re.findall(r"server listening on \S+ \(pid (\d+)\)", printed)
  assert found, printed[-3000:]
  return [int(pid) for pid in found]


def gone(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return True
  # A zombie child of a finished process is gone too; ours are reaped by the demo.
  with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
    return f.read().split()[2] == "Z"
