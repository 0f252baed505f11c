"""`python -m realm_tf.demo` end to end as a user runs it, at a small size: a small invented
corpus through preprocessing and the embedding job with questions answered from the leads
they retrieve; act 1 in a world of 30 invented people (the reader's training, ICT, the
index, REALM pre-training with the background index builder, the held-out sentences
filled in at step 0 and at the end); act 2 from act 1's checkpoint (fine-tuning, export,
the gRPC server, the edit published). What the demo prints is checked too. No network,
no package data, no shared data.

The system tier (tests/conftest.py's SYSTEM_TIER): about fifteen child processes, each
starting TensorFlow. The stages' hand-overs, act 1's figures' direction and their reuse on
a re-run are tests/test_demo_stages.py's (system tier too; `make test` checks reuse
without child processes, tests/test_demo_stage_reuse.py, and the wiring,
tests/test_demo_pipeline.py)."""
import json
import os
import re
import subprocess
import sys

import pytest

from tests import demo_checks

pytestmark = pytest.mark.demo

SERVED = ("world_serve",)  # never reused
SIZES = ["--world_entities", "30", "--reader_steps", "100", "--ict_steps", "1",
         "--pretrain_steps", "10", "--pretrain_batch_size", "16",
         "--refresh_every_steps", "5", "--num_shown", "2", "--world_finetune_steps", "2",
         "--world_batch_size", "4", "--world_asked", "3"]
QUESTION = "What is the capital of Veloria?"


def _run_demo(repo_dir, run_dir, articles, *extra):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  process = subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, "-m", "realm_tf.demo",
       "--leads_config", str(repo_dir / "configs" / "tiny.yaml"),
       "--run_dir", str(run_dir), "--articles_file", str(articles), *SIZES, *extra],
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
  assert sorted(ran) == sorted((name, False) for name in demo_checks.STAGES + SERVED)

  # The real data path: the question answered with the leads it retrieved.
  demo_checks.check_leads(summary["leads"], titles, [QUESTION], stdout)
  assert "questions answered with the Wikipedia leads they retrieve" in stdout

  # Act 1: why an invented world, the filled-in sentences with the block read, the figures.
  assert "Why invented facts: no BERT pre-trained to fill masks can be reached" in stdout
  demo_checks.check_act1(summary["act1"], summary["world"], stdout, num_candidates=2)
  assert stdout.count("without retrieval (null document only)") == 2
  assert stdout.count("retrieved z: p(z|x) = ") == 2

  # Act 2 fine-tunes act 1's pre-trained checkpoint (the paper's order).
  world_log = (run_dir / "world_openqa" / "log.txt").read_text(encoding="utf-8")
  assert "task.openqa.init_from=realm" in world_log
  assert f"task.openqa.init_checkpoint={run_dir / 'pretrain'}" in world_log
  demo_checks.check_world_act(summary["act2"], summary["world"], stdout, entities=30,
                              asked=3, steps=2)
  assert "Act 2: act 1's model fine-tuned for Open-QA" in stdout
  assert "What it does not" not in stdout

  [server] = demo_checks.server_pids(stdout)
  assert demo_checks.gone(server)  # the server was stopped
  assert re.search(r"^  Summary as JSON: ", stdout, re.MULTILINE)
