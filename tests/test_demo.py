"""`make demo`'s pipeline end to end on the tiny config: a small invented corpus through
every default stage (preprocessing with the title gazetteer, ICT, the index, MLM-head
warm-up, REALM pre-training with the background index builder, masked sentences filled in,
then act 2: fine-tuning from that pre-training on the knowledge world, export, the gRPC
server, the edit published), then a re-run with act 1's Open-QA stages on (reader
fine-tuning on generated questions, export, the gRPC server) that reuses every finished
stage. No network, no package data, no shared data."""
import json
import os
import re
import subprocess
import sys

import pytest

from realm_tf.demo import records
from realm_tf.demo.questions import violations
from tests.synthetic_corpus import _CITIES, _COUNTRIES, _RIVERS

pytestmark = pytest.mark.demo

STAGES = ("corpus", "preprocess", "data", "ict", "index", "warmup", "pretrain", "fill_in",
          "world", "world_openqa", "world_export", "world_edit")
WIKIPEDIA_QA = ("openqa", "export")  # with --wikipedia_qa (or --ask, --train_file) only
# Never reused.
SERVED = ("world_serve",)
WIKIPEDIA_SERVED = ("serve",)
SIZES = ["--ict_steps", "2", "--warmup_steps", "2", "--warmup_batch_size", "4",
         "--pretrain_steps", "10", "--pretrain_batch_size", "4", "--num_candidates", "3",
         "--refresh_every_steps", "5", "--finetune_steps", "4", "--finetune_batch_size", "4",
         "--num_eval_questions", "6", "--num_asked", "3", "--num_masked", "2",
         "--world_entities", "12", "--world_finetune_steps", "2", "--world_batch_size", "4",
         "--world_asked", "3"]


def _write_articles(path) -> list[dict]:
  """Invented countries, their capitals and rivers: every article names others by title."""
  rows = []
  for i, (country, city, river) in enumerate(zip(_COUNTRIES, _CITIES, _RIVERS)):
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


def _run_demo(repo_dir, run_dir, articles, *extra):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  process = subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, "-m", "realm_tf.demo", "--config", str(repo_dir / "configs" / "tiny.yaml"),
       "--run_dir", str(run_dir), "--articles_file", str(articles), "--conll_dir=",
       *SIZES, *extra],
      cwd=repo_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
  try:
    stdout, stderr = process.communicate(timeout=900)
  except subprocess.TimeoutExpired:
    process.terminate()  # the demo stops its running stage's processes on SIGTERM
    stdout, stderr = process.communicate(timeout=120)
    pytest.fail(f"the demo did not finish within 900 s:\n{stdout[-3000:]}{stderr[-3000:]}")
  assert process.returncode == 0, stdout[-4000:] + stderr[-4000:]
  with open(run_dir / "summary.json", encoding="utf-8") as f:
    return stdout, json.load(f)


def _server_pid(stdout: str) -> int:
  match = re.search(r"server listening on \S+ \(pid (\d+)\)", stdout)
  assert match, stdout[-3000:]
  return int(match.group(1))


def _gone(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return True
  # A zombie child of a finished process is gone too; ours are reaped by the demo.
  with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
    return f.read().split()[2] == "Z"


def test_demo_pipeline_end_to_end_on_the_tiny_config(repo_dir, tmp_path):
  articles = _write_articles(tmp_path / "articles.jsonl")
  titles = {a["title"] for a in articles}
  run_dir = tmp_path / "run"
  stdout, summary = _run_demo(repo_dir, run_dir, tmp_path / "articles.jsonl")

  ran = {s["name"]: s for s in summary["stages"]}
  assert set(ran) == set(STAGES) | set(SERVED)  # act 1's Open-QA stages are off by default
  assert not any(s["reused"] for s in summary["stages"])
  assert summary["answers"] == [] and summary["openqa"] == {}
  assert "Questions asked over gRPC (held-out cloze questions)" not in stdout
  assert "dates plus mentions of other articles' titles" in stdout
  assert summary["preprocess"]["salient_spans"] == "title_mentions_and_dates"

  # Table 3: held-out sentences filled in with and without retrieval, with the block read.
  filled = summary["filled_in"]
  assert len(filled) == 2
  for row in filled:
    assert "___" in row["masked"] and row["label"] in ("TITLE", "DATE")
    assert (row["answer"] in titles if row["label"] == "TITLE"
            else re.fullmatch(r"\d{4}", row["answer"]))
    assert row["with_retrieval"] and row["without_retrieval"]
    assert 0.0 < row["p_answer_with_retrieval"] <= 1.0
    assert 0.0 < row["p_null_document"] < 1.0
    assert len(row["blocks"]) == 2 and all(b["title"] in titles for b in row["blocks"])
    assert all(b["block_id"] != row["source_block_id"] for b in row["blocks"])
    assert abs(row["p_null_document"] + sum(b["p"] for b in row["blocks"]) - 1.0) < 1e-4
  assert stdout.count("without retrieval (null document only)") == 2
  assert stdout.count("retrieved z: p(z|x) = ") == 2

  # Act 2 fine-tunes act 1's pre-trained checkpoint (the paper's order).
  world_log = (run_dir / "world_openqa" / "log.txt").read_text(encoding="utf-8")
  assert "task.openqa.init_from=realm" in world_log
  assert f"task.openqa.init_checkpoint={run_dir / 'pretrain'}" in world_log
  _check_world_act(summary["world"], stdout)
  assert _gone(_server_pid(stdout))  # the world act's server was stopped

  # A re-run with act 1's Open-QA stages (--ask implies them) reuses every finished stage,
  # runs those, and serves again.
  stdout_again, summary_again = _run_demo(repo_dir, run_dir, tmp_path / "articles.jsonl",
                                          "--ask", "What is the capital of Veloria?")
  reused = {s["name"]: s["reused"] for s in summary_again["stages"]}
  assert reused == dict({name: True for name in STAGES},
                        **{name: False for name in WIKIPEDIA_QA + SERVED + WIKIPEDIA_SERVED})
  for name in STAGES:
    assert re.search(rf"^\[{name}\] .*: reused", stdout_again, re.MULTILINE), name
  # No stage command ran before act 1's Open-QA fine-tuning, nor in act 2 before serving
  # (the world act's publish runs while it serves).
  assert "$ python -m" not in stdout_again.split("[openqa]")[0]
  assert "$ python -m" not in stdout_again.split("[world_openqa]")[1].split("[world_serve]")[0]
  assert summary_again["filled_in"] == filled
  assert summary_again["world"]["openqa"] == summary["world"]["openqa"]
  assert _gone(_server_pid(stdout_again))

  # Answers over gRPC with provenance: source titles and p(z|x) of the blocks read.
  answers = summary_again["answers"]
  assert [a["question"] for a in answers][-1] == "What is the capital of Veloria?"
  assert len(answers) == 4
  for answer in answers:
    assert answer["model"]["name"] == "realm_qa" and answer["model"]["version"] == 4
    assert isinstance(answer["answer"], str)
    probs = [b["retrieval_prob"] for b in answer["blocks"]]
    assert len(probs) >= 3 and all(0.0 <= p <= 1.0 for p in probs) and sum(probs) <= 1.0001
    assert probs == sorted(probs, reverse=True)
    assert all(b["title"] in titles and b["text"] for b in answer["blocks"])
    assert sum(b["is_answer_block"] for b in answer["blocks"]) == 1
  assert all(a["expected"] for a in answers[:3])
  assert "Questions asked over gRPC (held-out cloze questions)" in stdout_again
  assert stdout_again.count("p(z|x) = ") >= 2 + 3 * 4

  # Generated questions: none answerable only from its own block; held out means held out.
  blocks = records.read_blocks(summary["preprocess"]["corpus_dir"])
  train = records.read_json_lines(summary["data"]["train_questions"])
  heldout = records.read_json_lines(summary["data"]["heldout_questions"])
  assert len(train) >= 8 and 3 <= len(heldout) <= 6
  assert violations(train + heldout, blocks) == []
  assert all(q["source_block_id"] not in q["answer_block_ids"] for q in train + heldout)
  # Their source blocks are not in the corpus fine-tuning and the server search, so no
  # answer can be read from the block its question was made from.
  sources = {q["source_block_id"] for q in train + heldout}
  qa_blocks = {b.block_id for b in records.read_blocks(summary["data"]["qa_corpus_dir"])}
  assert not sources & qa_blocks and len(qa_blocks) == len(blocks) - len(sources)
  assert all(set(q["answer_block_ids"]) - sources for q in train + heldout)
  assert not {b["block_id"] for a in answers for b in a["blocks"]} & sources
  assert not {q["question"] for q in train} & {q["question"] for q in heldout}
  masked = records.read_json_lines(summary["data"]["masked_json"])
  pretraining = records.read_sentences(summary["data"]["pretraining"])
  assert not {m["text"] for m in masked} & {s.text for s in pretraining}


def _check_world_act(world: dict, stdout: str):
  """The act's mechanics on a random-init tiny model (whether it answers right is the full
  demo's and benchmarks' business): held-out questions served by the first version, the
  edited corpus published as the next version while the server runs, the same questions
  answered by it from the edited blocks; no training between the two."""
  served = world["served"]
  with open(served["answers"], encoding="utf-8") as f:
    rows = json.load(f)  # every held-out question, one per invented person
  assert served["rows"] == rows[:3] and served["shown"] == 3 and served["asked"] == len(rows) == 12
  assert all("answer_before" in r for r in rows[:3]) and not any("answer_before" in r
                                                                  for r in rows[3:])
  assert served["version_after"] == served["version_before"] + 1 == 3  # 2 steps, then +1
  old_blocks = {b.text for b in records.read_blocks(world["world"]["corpus_dir"])}
  new_blocks = {b.text for b in records.read_blocks(world["world"]["edited_dir"])}
  edited_only, old_only = new_blocks - old_blocks, old_blocks - new_blocks
  assert len(edited_only) == len(old_only) == 12  # every person's block was rewritten
  for row in rows:
    assert row["version_after"] == served["version_after"]
    assert row["old_value"] != row["new_value"]
    assert row["block_after"]["text"] in row["retrieved_after"]
    # Version 3 searches the edited corpus: it retrieves rewritten people's blocks (20 of
    # the 48 blocks are retrieved), and no block as it was before the edit.
    assert set(row["retrieved_after"]) <= new_blocks and set(row["retrieved_after"]) & edited_only
  for row in rows[:3]:  # and version 2 the corpus as built
    assert row["version_before"] == served["version_before"]
    assert row["block_before"]["text"] in row["retrieved_before"]
    assert set(row["retrieved_before"]) <= old_blocks and set(row["retrieved_before"]) & old_only
  assert served["shown_right_before"] == sum(r["right_before"] for r in rows[:3])
  assert served["follows_edit"] == sum(r["follows_edit"] for r in rows)
  assert stdout.count("(the block edited, no parameter changed)") == 3
  assert "Act 2, the knowledge world" in stdout and "Knowledge world: " in stdout
  # Only the export ran between the two versions: the run's checkpoint is the same one.
  assert f"--version {served['version_after']} --blocks " in stdout
