"""The demo's stages wired end to end at the smallest size that runs them all: the system
tier's check of `make demo`'s pipeline, stage by stage (`make test` checks the stages'
reuse without child processes: test_demo_stage_reuse.py).

Each stage's command runs as the demo runs it, as a child process (beam.preprocess,
realm_tf.train for ICT, pre-training with its index builder and act 2's
fine-tuning, beam.embed_corpus, realm_tf.export, serving.server and serving.client; the MLM-head warm-up
and the fill-in run in the demo's own process, as they do in `make demo`), on
12 invented articles, one or two steps each, configs/tiny.yaml's random-init model. The
Demo itself runs in this process: the commands' absl flags cannot share a process, and the
demo's `python -m realm_tf.demo` wrapper (flags, printing) is one more TensorFlow start-up,
left to the system tier. Checked: the paths each stage writes and the next one reads, what
act 2 serves before and after the edit, and that a re-run reuses every finished stage and
runs one again when its settings change.

tests/test_demo.py (the system tier) runs `python -m realm_tf.demo` itself, at larger sizes
and with act 1's Open-QA stages (reader fine-tuning on generated questions, its export,
answers over gRPC with provenance)."""
import json
import os

import pytest
import yaml

from realm_tf.demo import pipeline
from realm_tf.demo import world as world_lib
from realm_tf.demo.fill_in import format_results, format_score
from realm_tf.demo.pipeline import Demo, DemoOptions, format_summary
from realm_tf.demo.world import format_world
from realm_tf.io import layout, versioned
from tests import demo_checks

pytestmark = pytest.mark.demo

# One or two of everything. 12 world entities (48 blocks) as in the system tier: the act's
# per-question checks need every person's block to be retrieved, which the random-init
# retriever does at that size; fewer would not shorten a stage (their cost is process
# start-up, not data).
SIZES = dict(ict_steps=1, warmup_steps=1, warmup_batch_size=2, pretrain_steps=2,
             pretrain_batch_size=2, num_candidates=2, refresh_every_steps=2,
             finetune_batch_size=2, num_eval_questions=2, num_asked=1, num_masked=1,
             world_entities=12, world_finetune_steps=1, world_batch_size=2, world_asked=2)


class _Stopped(Exception):
  """Raised where a re-run would run something: the test stops the demo there."""


def _params(model_dir: str) -> dict:
  """The config a training stage ran with (saved by realm_tf.train)."""
  with open(layout.params_path(model_dir), encoding="utf-8") as f:
    return yaml.safe_load(f)


def test_demo_stages_hand_over_end_to_end_and_are_reused(repo_dir, tmp_path, monkeypatch):
  articles = demo_checks.write_articles(tmp_path / "articles.jsonl", countries=4)
  titles = {a["title"] for a in articles}
  run_dir = tmp_path / "run"

  def options(**changed):
    return DemoOptions(config=str(repo_dir / "configs" / "tiny.yaml"), run_dir=str(run_dir),
                       articles_file=str(tmp_path / "articles.jsonl"), conll_dir="",
                       **dict(SIZES, **changed))

  lines = []
  demo = Demo(options(), log=lines.append)
  result = demo.run()
  printed = "\n".join(lines + [format_results(result["filled_in"]),
                               format_score(result["fill_in_score"]),
                               format_world(result["world"]), format_summary(demo)])

  # Every default stage ran once, in order; act 1's Open-QA stages are off by default.
  assert [(r.name, r.reused) for r in demo.stages.records] == [
      (name, False) for name in demo_checks.STAGES + ("world_serve",)]
  assert result["answers"] == [] and result["openqa"] == {}
  assert "dates plus mentions of other articles' titles" in printed
  assert result["preprocess"]["salient_spans"] == "title_mentions_and_dates"
  with open(run_dir / "summary.json", encoding="utf-8") as f:
    assert json.load(f) == json.loads(json.dumps(result, default=str))

  # What each stage wrote is what the next one read.
  corpus_dir = result["preprocess"]["corpus_dir"]
  assert corpus_dir == str(run_dir / "preprocess" / "corpus")
  data = result["data"]
  ict = _params(str(run_dir / "ict"))["task"]["ict"]
  assert ict["train_data"]["input_path"] == os.path.join(corpus_dir, "ict-*")
  index_log = (run_dir / "index" / "log.txt").read_text(encoding="utf-8")
  assert f"--encoder {layout.block_encoder_dir(str(run_dir / 'ict'))} " in index_log
  # The MLM-head warm-up (in this process) left the checkpoint pre-training starts from.
  warmup = next(r.info for r in demo.stages.records if r.name == "warmup")
  assert warmup["checkpoint"] == layout.latest_checkpoint(str(run_dir / "warmup"))
  assert warmup["examples"] > 0 and "masked salient spans of" in printed
  pretrain = _params(str(run_dir / "pretrain"))
  assert (pretrain["index"]["blocks"], pretrain["task"]["pretrain"]["init_checkpoint"],
          pretrain["task"]["pretrain"]["mlm_init_checkpoint"],
          pretrain["task"]["pretrain"]["train_data"]["input_path"]) == (
              corpus_dir, str(run_dir / "ict"), str(run_dir / "warmup"), data["pretraining"])
  # Pre-training starts from the index stage's index, committed again under its own run
  # (its builder then adds versions there and deletes old ones).
  first = versioned.latest_version(str(run_dir / "index" / "index"))
  assert f"first index: version {first.version} of {run_dir / 'index' / 'index'}" in printed
  assert versioned.latest_version(str(run_dir / "pretrain" / "index")).version >= first.version
  # Act 2 fine-tunes act 1's pre-trained checkpoint (the paper's order).
  world = result["world"]
  world_openqa = _params(str(run_dir / "world_openqa"))
  assert (world_openqa["task"]["openqa"]["init_from"],
          world_openqa["task"]["openqa"]["init_checkpoint"],
          world_openqa["index"]["blocks"]) == ("realm", str(run_dir / "pretrain"),
                                               world["world"]["corpus_dir"])
  edit_log = (run_dir / "world_edit" / "log.txt").read_text(encoding="utf-8")
  assert (f"--blocks {world['world']['edited_dir']} --encoder "
          f"{layout.block_encoder_dir(str(run_dir / 'world_openqa'))} ") in edit_log
  assert world["export"]["base_path"] == str(run_dir / "world_export" / "models" / "realm_qa")
  assert world["export"]["version"] == SIZES["world_finetune_steps"]
  served_versions = os.listdir(run_dir / "world_serve" / "models" / "realm_qa")
  assert sorted(v for v in served_versions if v.isdigit()) == [
      str(SIZES["world_finetune_steps"]), str(SIZES["world_finetune_steps"] + 1)]

  demo_checks.check_filled_in(result["filled_in"], titles, SIZES["num_masked"],
                              SIZES["num_candidates"])
  assert printed.count("without retrieval (null document only)") == SIZES["num_masked"]
  demo_checks.check_fill_in_score(result["fill_in_score"], result["filled_in"], printed)
  demo_checks.check_generated_questions(corpus_dir, data, SIZES["num_eval_questions"])
  demo_checks.check_world_act(world, printed, SIZES["world_entities"], SIZES["world_asked"],
                              SIZES["world_finetune_steps"])
  assert "Knowledge world: " in printed
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
  changed = Demo(options(world_finetune_steps=2), log=[].append)
  with pytest.raises(_Stopped) as stopped:
    changed.run()
  argv = stopped.value.args[0][0]
  assert argv[argv.index("--model_dir") + 1] == str(run_dir / "world_openqa")
  assert [(r.name, r.reused) for r in changed.stages.records] == [
      (name, True) for name in demo_checks.STAGES[:demo_checks.STAGES.index("world") + 1]]

