"""The demo tests' corpus and the checks they share: tests/test_demo_stages.py (the
demo's stages in the test process, at a small size) and tests/test_demo.py (`python -m
realm_tf.demo` end to end), both in the system tier."""
import json
import os
import re

from realm_tf.demo import records
from realm_tf.demo.pipeline import act1_figures
from tests.synthetic_corpus import _CITIES, _COUNTRIES, _RIVERS

# The stages a run makes and a re-run reuses, in the order they run (world_serve, never
# reused, follows).
STAGES = ("corpus", "preprocess", "leads_index", "world", "reader", "ict", "index",
          "pretrain", "fill_in", "world_openqa", "world_export", "world_edit")


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


def check_leads(leads: dict, titles: set, questions: list, printed: str):
  """The real data path: every question answered with three leads of the corpus, best
  first, as printed."""
  assert [q["question"] for q in leads["questions"]] == questions
  for q in leads["questions"]:
    scores = [lead["score"] for lead in q["leads"]]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True)
    assert all(lead["title"] in titles and lead["text"] for lead in q["leads"])
    assert f"Q: {q['question']}" in printed


def check_act1(act1: dict, world: dict, printed: str, num_candidates: int):
  """Act 1's figures as fill_in counted them, recounted from its rows: every held-out
  sentence read at step 0 and at the end, k blocks each with p(z|x) summing to 1 (no null
  document in the knowledge config), the fills and the top-1 block counted, and printed."""
  with open(os.path.join(world["corpus_dir"], "world.json"), encoding="utf-8") as f:
    own = {r["value"] + "|" + r["text"]: set(r["gold_block_ids"])
           for r in json.load(f)["held_out"]}
  for when in ("start", "end"):
    rows = act1[when]["results"]
    assert len(rows) == world["heldout_count"]
    right = {"with_retrieval": 0, "without_retrieval": 0}
    top1 = 0
    for row in rows:
      assert "___" in row["masked"] and row["label"] in ("LOC", "MISC", "DATE")
      assert len(row["blocks"]) == num_candidates
      assert abs(sum(b["p"] for b in row["blocks"]) - 1.0) < 1e-4
      assert [b["p"] for b in row["blocks"]] == sorted((b["p"] for b in row["blocks"]),
                                                       reverse=True)
      for reading in right:
        right[reading] += row[reading] == row["answer_wordpieces"]
      key = row["answer"] + "|" + row["masked"].replace("___", row["answer"])
      top1 += row["blocks"][0]["block_id"] in own[key]
    score = act1[when]["score"]
    for reading, count in right.items():
      assert score[reading]["right"] == count
    assert act1[when]["own_block_top1"]["right"] == top1
  f = act1_figures(act1)
  assert f"Over all {f['count']} held-out masked sentences" in printed
  assert "top-1 block is the one stating the fact" in printed
  assert f"retrieval ahead of the null document by {f['retrieval_ahead']:+.3f}" in printed
  assert printed.count("without retrieval (null document only)") >= 1
  assert "Act 1 (REALM pre-training, invented world)" in printed


def check_world_act(act2: dict, world: dict, printed: str, entities: int, asked: int,
                    steps: int):
  """Act 2's mechanics (whether it answers right is the full demo's business): held-out
  questions served by the first version, the edited corpus published as the next version
  while the server runs, the same questions answered by it from the edited blocks; no
  training between the two. `world`: the world stage's info; `printed`: what the demo
  logged and format_world printed."""
  served = act2["served"]
  with open(served["answers"], encoding="utf-8") as f:
    rows = json.load(f)  # every held-out question, one per invented person
  assert served["rows"] == rows[:asked] and served["shown"] == asked
  assert served["asked"] == len(rows) == entities
  assert all("answer_before" in r for r in rows[:asked]) and not any(
      "answer_before" in r for r in rows[asked:])
  # The first version is the fine-tuning's last step; the edit is the next.
  assert served["version_after"] == served["version_before"] + 1 == steps + 1
  old_blocks = {b.text for b in records.read_blocks(world["corpus_dir"])}
  new_blocks = {b.text for b in records.read_blocks(world["edited_dir"])}
  edited_only, old_only = new_blocks - old_blocks, old_blocks - new_blocks
  # Both blocks of every person were rewritten.
  assert len(edited_only) == len(old_only) == 2 * entities
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
