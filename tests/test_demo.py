"""`python -m realm_tf.demo` end to end on the tiny config, as a user runs it, with every
stage: a small invented corpus through preprocessing with the title gazetteer, ICT, the
index, MLM-head warm-up, REALM pre-training with the background index builder, masked
sentences filled in, act 1's Open-QA stages (--ask implies them: reader fine-tuning on
generated questions, export, answers over gRPC with their source blocks), then act 2:
fine-tuning from that pre-training on the knowledge world, export, the gRPC server, the
edit published. What the demo prints is checked too. No network, no package data, no
shared data.

The system tier (tests/conftest.py's SYSTEM_TIER): about twenty child processes, each
starting TensorFlow. The default stages at the smallest size, the paths they hand over
and their reuse on a re-run are tests/test_demo_stages.py's (system tier too; `make test`
checks reuse without child processes: tests/test_demo_stage_reuse.py)."""
import json
import os
import re
import subprocess
import sys

import pytest

from tests import demo_checks

pytestmark = pytest.mark.demo

WIKIPEDIA_QA = ("openqa", "export")  # with --wikipedia_qa (or --ask, --train_file) only
SERVED = ("serve", "world_serve")  # never reused
SIZES = ["--ict_steps", "2", "--warmup_steps", "2", "--warmup_batch_size", "4",
         "--pretrain_steps", "10", "--pretrain_batch_size", "4", "--num_candidates", "3",
         "--refresh_every_steps", "5", "--finetune_steps", "4", "--finetune_batch_size", "4",
         "--num_eval_questions", "6", "--num_asked", "3", "--num_masked", "2",
         "--world_entities", "12", "--world_finetune_steps", "2", "--world_batch_size", "4",
         "--world_asked", "3"]
QUESTION = "What is the capital of Veloria?"


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


def test_demo_pipeline_end_to_end_on_the_tiny_config(repo_dir, tmp_path):
  articles = demo_checks.write_articles(tmp_path / "articles.jsonl")
  titles = {a["title"] for a in articles}
  run_dir = tmp_path / "run"
  stdout, summary = _run_demo(repo_dir, run_dir, tmp_path / "articles.jsonl",
                              "--ask", QUESTION)

  ran = [(s["name"], s["reused"]) for s in summary["stages"]]
  assert sorted(ran) == sorted((name, False) for name in
                               demo_checks.STAGES + WIKIPEDIA_QA + SERVED)
  assert "dates plus mentions of other articles' titles" in stdout
  assert summary["preprocess"]["salient_spans"] == "title_mentions_and_dates"

  # Table 3: held-out sentences filled in with and without retrieval, with the block read.
  demo_checks.check_filled_in(summary["filled_in"], titles, num_masked=2, num_candidates=3)
  assert stdout.count("without retrieval (null document only)") == 2
  assert stdout.count("retrieved z: p(z|x) = ") == 2
  demo_checks.check_fill_in_score(summary["fill_in_score"], summary["filled_in"], stdout)

  # Answers over gRPC with provenance: source titles and p(z|x) of the blocks read.
  answers = summary["answers"]
  assert [a["question"] for a in answers][-1] == QUESTION
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
  assert "Questions asked over gRPC (held-out cloze questions)" in stdout
  assert stdout.count("p(z|x) = ") >= 2 + 3 * 4

  # Generated questions: none answerable only from its own block, held out means held
  # out, and no block the server read is one a question was made from.
  data = summary["data"]
  assert data["train_questions_count"] >= 8 and 3 <= data["heldout_questions_count"] <= 6
  sources = demo_checks.check_generated_questions(
      summary["preprocess"]["corpus_dir"], data, num_eval_questions=6)
  assert not {b["block_id"] for a in answers for b in a["blocks"]} & sources

  # Act 2 fine-tunes act 1's pre-trained checkpoint (the paper's order).
  world_log = (run_dir / "world_openqa" / "log.txt").read_text(encoding="utf-8")
  assert "task.openqa.init_from=realm" in world_log
  assert f"task.openqa.init_checkpoint={run_dir / 'pretrain'}" in world_log
  demo_checks.check_world_act(summary["world"], stdout, entities=12, asked=3, steps=2)
  assert "Act 2, the knowledge world" in stdout and "Knowledge world: " in stdout

  # Both servers (act 1's and the world act's) were stopped.
  servers = demo_checks.server_pids(stdout)
  assert len(servers) == 2 and all(demo_checks.gone(pid) for pid in servers)
  assert re.search(r"^  Summary as JSON: ", stdout, re.MULTILINE)
