"""The demo's wiring without its stages' processes (realm_tf.demo.pipeline): its options
refused when they cannot run, act 1's world held out as it claims, the blocks that state
each held-out fact found, act 1's figures computed and printed as fill_in's rows say, and
the Wikipedia leads' printout.
The stages themselves run in tests/test_demo_stages.py and tests/test_demo.py (system
tier)."""
import json

import pytest

from realm_tf.corpus import knowledge_world
from realm_tf.demo.fill_in import own_block_top1, score
from realm_tf.demo.leads import format_leads
from realm_tf.demo.pipeline import (DemoOptions, act1_figures, format_act1, out_of_sample,
                                    own_block_ids, world_config)
from realm_tf.demo.sentences import Sentence


def _options(repo_dir, **changed):
  tiny = str(repo_dir / "configs" / "tiny.yaml")
  return DemoOptions(**dict(dict(leads_config=tiny, configs=[tiny]), **changed))


def test_the_default_options_are_valid(repo_dir):
  _options(repo_dir).validate()


@pytest.mark.parametrize("changed, message", [
    (dict(pretrain_steps=0), "--pretrain_steps must be positive"),
    (dict(reader_steps=-1), "--reader_steps must be positive"),
    (dict(num_candidates=0), "--num_candidates must be positive"),
    (dict(learning_rate=0.0), "--learning_rate must be positive"),
    (dict(refresh_every_steps=20, pretrain_steps=10), "would never be refreshed"),
    (dict(world_entities=2), "at least 3"),
    (dict(world_entities=4, world_asked=5), "cannot exceed --world_entities"),
    (dict(run_dir="gs://bucket/demo"), "local disk only"),
    (dict(num_articles=-1), "--num_articles must be 0"),
])
def test_options_that_cannot_run_are_refused_with_the_flag(repo_dir, changed, message):
  with pytest.raises(ValueError, match=message):
    _options(repo_dir, **changed).validate()


def test_a_missing_config_or_articles_file_is_named(repo_dir, tmp_path):
  with pytest.raises(FileNotFoundError, match="nothing.yaml"):
    _options(repo_dir, configs=[str(tmp_path / "nothing.yaml")]).validate()
  with pytest.raises(FileNotFoundError, match="articles.jsonl"):
    _options(repo_dir, articles_file=str(tmp_path / "articles.jsonl")).validate()


def test_act1s_world_is_the_staleness_benchmarks_and_holds_out_what_it_says():
  config = world_config(entities=12, seed=3)
  assert (config.blocks_per_entity, config.x_templates, config.seed) == (2, 1, 3)
  world = knowledge_world.make_world(config)
  assert out_of_sample(world) == dict(heldout_facts=12, pretraining_facts=24,
                                      shared_facts=0, shared_sentences=0)
  # A held-out sentence that leaked into pre-training is counted, fact and sentence.
  leaked = dict(world, x=world["x"] + world["held_out"][:2])
  check = out_of_sample(leaked)
  assert (check["shared_facts"], check["shared_sentences"]) == (2, 2)


def test_own_block_ids_are_the_persons_blocks_in_sentence_order(tmp_path):
  world = knowledge_world.make_world(world_config(entities=6, seed=0))
  with open(tmp_path / "world.json", "w", encoding="utf-8") as f:
    json.dump(world, f)
  rows = list(reversed(world["held_out"]))
  sentences = [Sentence(r["text"], -1, "x:" + r["entity"], ((r["start"], r["end"], "LOC"),))
               for r in rows]
  got = own_block_ids(str(tmp_path), sentences)
  assert got == [r["gold_block_ids"] for r in rows]
  assert all(len(ids) == 2 for ids in got)
  with pytest.raises(ValueError, match="not the world's"):
    own_block_ids(str(tmp_path), [Sentence("Nobody was born anywhere.", -1, "x", ())])


def _row(right_with: bool, right_alone: bool, top_block: int):
  answer = "york"
  return dict(masked="Ann Lee grew up in ___ as a child.", answer=answer, label="LOC",
              answer_wordpieces=answer, with_retrieval=answer if right_with else "leeds",
              without_retrieval=answer if right_alone else "dover",
              p_answer_with_retrieval=0.9, p_answer_without_retrieval=0.2,
              p_null_document=0.0,
              blocks=[dict(block_id=top_block, title="Ann Lee", p=0.7,
                           text="Ann Lee was born in York in 1700."),
                      dict(block_id=99, title="Dover", p=0.3, text="Dover is a town.")])


def _when(rows, own):
  return dict(results=rows, score=score(rows), own_block_top1=own_block_top1(rows, own))


def test_act1_figures_and_their_printout_come_from_the_rows():
  own = [[1]] * 4
  start = [_row(True, False, 1), _row(False, False, 2), _row(False, True, 3),
           _row(True, False, 1)]
  end = [_row(True, False, 1), _row(True, False, 1), _row(True, True, 1),
         _row(False, False, 2)]
  act1 = dict(start=_when(start, own), end=_when(end, own))
  f = act1_figures(act1)
  assert f["count"] == 4
  assert f["with_retrieval"]["start"]["accuracy"] == 0.5
  assert f["with_retrieval"]["end"]["accuracy"] == 0.75
  assert f["null_document"]["end"]["accuracy"] == 0.25
  assert f["own_block_top1"]["start"]["rate"] == 0.5
  assert f["own_block_top1"]["end"]["rate"] == 0.75
  assert f["retrieval_ahead"] == pytest.approx(0.5)
  assert f["top1_rise"] == pytest.approx(0.25)
  text = format_act1(act1, shown=1)
  assert text.count("x: Ann Lee grew up in ___ as a child.") == 1  # one shown
  assert "Over all 4 held-out masked sentences" in text
  assert "step 0 0.500 ± 0.250   after pre-training 0.750 ± 0.217" in text
  assert "retrieval ahead of the null document by +0.500" in text
  assert "the top-1 rate rose by +0.250" in text


def test_the_leads_are_printed_best_first_with_long_text_cut():
  found = [dict(question="Where is the Parthenon?", leads=[
      dict(title="Athens", text="Athens is the capital of Greece. " * 5, score=0.71),
      dict(title="Acropolis", text="The Acropolis of Athens.", score=0.64)])]
  lines = format_leads(found, width=40).splitlines()
  assert lines[0] == "Q: Where is the Parthenon?"
  assert lines[1].startswith("   [1] 0.71  [Athens] Athens is the capital") and lines[1].endswith("...")
  assert len(lines[1].split("] ", 2)[2]) == 40
  assert lines[2] == "   [2] 0.64  [Acropolis] The Acropolis of Athens."
