"""The demo's stages wired end to end at a small size, with act 1's figures' direction: the
system tier's check of `make demo`'s pipeline, stage by stage (`make test` checks the
stages' reuse without child processes, test_demo_stage_reuse.py, and the pipeline's
wiring, test_demo_pipeline.py).

Each stage's command runs as the demo runs it, as a child process (beam.preprocess,
beam.embed_corpus, realm_tf.training.own_block_reader, realm_tf.train for ICT, pre-training
with its index builder and act 2's fine-tuning, realm_tf.export, serving.server and
serving.client; the world, the leads' tower export and the fill-in run in the demo's own
process, as they do in `make demo`), on 12 invented articles and a world of 600 invented
people. The Demo itself runs in this process: the commands' absl flags cannot share a
process, and the demo's `python -m realm_tf.demo` wrapper (flags, printing) is one more
TensorFlow start-up, left to tests/test_demo.py. Checked: the paths each stage writes and
the next one reads, act 1's figures recounted from its rows and their direction (retrieval
ahead of the null document, the top-1 block stating the fact more often after
pre-training than at step 0), what act 2 serves before and after the edit, and that a
re-run reuses every finished stage and runs one again when its settings change."""
import json
import os

import pytest
import yaml

from realm_tf.demo import pipeline
from realm_tf.demo import world as world_lib
from realm_tf.demo.leads import format_leads
from realm_tf.demo.pipeline import Demo, DemoOptions, act1_figures, format_act1, format_summary
from realm_tf.demo.world import format_world
from realm_tf.io import layout, versioned
from tests import demo_checks

pytestmark = pytest.mark.demo

# Act 1 at the default world (a reader learns to read from 600 people's blocks, not from
# 60: it memorises their facts instead) with fewer steps: 400 reader steps, the weak ICT
# start, and 40 pre-training steps with a refresh every 10 teach the retriever.
SIZES = dict(world_entities=600, reader_steps=400, ict_steps=5, pretrain_steps=40,
             pretrain_batch_size=64, refresh_every_steps=10, num_shown=1,
             world_finetune_steps=2, world_batch_size=8, world_asked=2)
QUESTIONS = ("What is the capital of Veloria?", "Which river flows through Talmont?")


class _Stopped(Exception):
  """Raised where a re-run would run something: the test stops the demo there."""


def _params(model_dir: str) -> dict:
  """The config a training stage ran with (saved by realm_tf.train)."""
  with open(layout.params_path(model_dir), encoding="utf-8") as f:
    return yaml.safe_load(f)


def test_demo_stages_hand_over_end_to_end_learn_and_are_reused(repo_dir, tmp_path,
                                                               monkeypatch):
  articles = demo_checks.write_articles(tmp_path / "articles.jsonl", countries=4)
  titles = {a["title"] for a in articles}
  run_dir = tmp_path / "run"

  def options(**changed):
    return DemoOptions(leads_config=str(repo_dir / "configs" / "tiny.yaml"),
                       run_dir=str(run_dir), articles_file=str(tmp_path / "articles.jsonl"),
                       leads_questions=QUESTIONS, **dict(SIZES, **changed))

  lines = []
  demo = Demo(options(), log=lines.append)
  result = demo.run()
  printed = "\n".join(lines + [format_leads(result["leads"]["questions"]),
                               format_act1(result["act1"], SIZES["num_shown"]),
                               format_world(result["act2"]), format_summary(demo)])

  # Every stage ran once, in order.
  assert [(r.name, r.reused) for r in demo.stages.records] == [
      (name, False) for name in demo_checks.STAGES + ("world_serve",)]
  with open(run_dir / "summary.json", encoding="utf-8") as f:
    assert json.load(f) == json.loads(json.dumps(result, default=str))

  # The real data path: preprocessed leads, embedded by the exported towers, searched.
  corpus_dir = result["preprocess"]["corpus_dir"]
  assert corpus_dir == str(run_dir / "preprocess" / "corpus")
  leads_log = (run_dir / "leads_index" / "log.txt").read_text(encoding="utf-8")
  assert (f"--blocks {corpus_dir} --encoder "
          f"{layout.block_encoder_dir(str(run_dir / 'leads_index'))}/") in leads_log
  demo_checks.check_leads(result["leads"], titles, list(QUESTIONS), printed)

  # Act 1: what each stage wrote is what the next one read.
  world = result["world"]
  assert world["out_of_sample"]["shared_facts"] == 0
  assert world["out_of_sample"]["shared_sentences"] == 0
  assert "held out means held out: none of the 600 held-out" in printed
  reader_log = (run_dir / "reader" / "log.txt").read_text(encoding="utf-8")
  assert f"--world_dir {world['corpus_dir']} --output_dir {run_dir / 'reader'}" in reader_log
  assert result["reader"]["checkpoint"] == str(run_dir / "reader" / "ckpt-1")
  ict = _params(str(run_dir / "ict"))
  assert ict["task"]["ict"]["train_data"]["input_path"] == os.path.join(
      world["corpus_dir"], "ict-*")
  assert ict["model"]["retriever"]["share_towers"] is True
  index_log = (run_dir / "index" / "log.txt").read_text(encoding="utf-8")
  assert f"--encoder {layout.block_encoder_dir(str(run_dir / 'ict'))} " in index_log
  pretrain = _params(str(run_dir / "pretrain"))
  p = pretrain["task"]["pretrain"]
  assert (pretrain["index"]["blocks"], p["init_checkpoint"], p["mlm_init_checkpoint"],
          p["train_data"]["input_path"], p["validation_data"]["input_path"]) == (
              world["corpus_dir"], str(run_dir / "ict"), result["reader"]["checkpoint"],
              world["pretraining"], world["heldout"])
  assert pretrain["model"]["retriever"]["share_towers"] is True
  # Pre-training starts from the index stage's index, committed again under its own run,
  # and its builder refreshed it.
  first = versioned.latest_version(str(run_dir / "index" / "index"))
  assert f"first index: version {first.version} of {run_dir / 'index' / 'index'}" in printed
  assert versioned.latest_version(str(run_dir / "pretrain" / "index")).version > first.version
  assert result["pretrain"]["index_refreshes"] >= 1

  # Act 1's figures, recounted, and their direction at this size.
  demo_checks.check_act1(result["act1"], world, printed, num_candidates=2)
  f = act1_figures(result["act1"])
  assert f["count"] == 600
  assert f["retrieval_ahead"] > 0.0, f
  assert f["top1_rise"] > 0.0, f
  assert f["with_retrieval"]["end"]["accuracy"] > f["with_retrieval"]["start"]["accuracy"], f

  # Act 2 fine-tunes act 1's pre-trained checkpoint (the paper's order) on the same world.
  act2 = result["act2"]
  world_openqa = _params(str(run_dir / "world_openqa"))
  assert (world_openqa["task"]["openqa"]["init_from"],
          world_openqa["task"]["openqa"]["init_checkpoint"],
          world_openqa["index"]["blocks"]) == ("realm", str(run_dir / "pretrain"),
                                               world["corpus_dir"])
  edit_log = (run_dir / "world_edit" / "log.txt").read_text(encoding="utf-8")
  assert (f"--blocks {world['edited_dir']} --encoder "
          f"{layout.block_encoder_dir(str(run_dir / 'world_openqa'))} ") in edit_log
  assert act2["export"]["base_path"] == str(run_dir / "world_export" / "models" / "realm_qa")
  assert act2["export"]["version"] == SIZES["world_finetune_steps"]
  demo_checks.check_world_act(act2, world, printed, SIZES["world_entities"],
                              SIZES["world_asked"], SIZES["world_finetune_steps"])
  [server] = demo_checks.server_pids(printed)
  assert demo_checks.gone(server)  # the server was stopped

  # A re-run reuses every finished stage: no command runs, nothing is filled in again,
  # until serving (never reused), where the test stops it.
  def stop(*args, **kwargs):
    raise _Stopped(args)

  for module, name in ((pipeline, "run_command"), (world_lib, "run_command"),
                       (pipeline, "fill_in"), (world_lib, "Server")):
    monkeypatch.setattr(module, name, stop)
  again_lines = []
  again = Demo(options(), log=again_lines.append)
  with pytest.raises(_Stopped) as stopped:
    again.run()
  # Server(base_path, ...): the served root, a copy of act 2's export.
  assert stopped.value.args[0][0] == str(run_dir / "world_serve" / "models" / "realm_qa")
  assert [(r.name, r.reused) for r in again.stages.records] == [
      (name, True) for name in demo_checks.STAGES]
  assert [r.info for r in again.stages.records] == [  # as stage.done keeps them: JSON
      json.loads(json.dumps(r.info, default=str)) for r in demo.stages.records[:-1]]
  for name in demo_checks.STAGES:
    assert any(line.startswith(f"[{name}] ") and ": reused" in line for line in again_lines)

  # Other settings for act 2's fine-tuning: everything before it is reused, and it runs
  # again (its command is where the test stops the demo).
  changed = Demo(options(world_finetune_steps=3), log=[].append)
  with pytest.raises(_Stopped) as stopped:
    changed.run()
  argv = stopped.value.args[0][0]
  assert argv[argv.index("--model_dir") + 1] == str(run_dir / "world_openqa")
  assert [(r.name, r.reused) for r in changed.stages.records] == [
      (name, True) for name in demo_checks.STAGES[:demo_checks.STAGES.index("fill_in") + 1]]
