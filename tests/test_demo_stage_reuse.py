"""The demo's resumability (realm_tf.demo.stages), without child processes: a finished
stage is reused while its settings and its inputs' identities are unchanged, a stage made
with other settings (or from inputs made since) is run again from nothing, one cut short
is continued in place, and a directory the demo did not make is refused. The same rules
end to end, with every stage's real command: test_demo_stages.py (system tier)."""
import os

import pytest

from realm_tf.demo.stages import DONE, StageError, Stages


def _body(calls, name, write=None):
  def body(directory):
    calls.append(name)
    if write:
      with open(os.path.join(directory, write), "a", encoding="utf-8") as f:
        f.write("x")
    return {"dir": directory, "runs": calls.count(name)}
  return body


def test_a_finished_stage_is_reused_and_its_readers_too(tmp_path):
  calls = []
  stages = Stages(str(tmp_path), log=lambda _: None)
  first = stages.run("a", "A", {"n": 1}, [], _body(calls, "a"))
  stages.run("b", "B", {}, ["a"], _body(calls, "b"))
  again = Stages(str(tmp_path), log=lambda _: None)
  assert again.run("a", "A", {"n": 1}, [], _body(calls, "a")) == first
  again.run("b", "B", {}, ["a"], _body(calls, "b"))
  assert calls == ["a", "b"]
  assert [(r.name, r.reused) for r in again.records] == [("a", True), ("b", True)]


def test_other_settings_run_the_stage_again_and_every_stage_that_reads_it(tmp_path):
  calls = []
  Stages(str(tmp_path), log=lambda _: None).run("a", "A", {"n": 1}, [],
                                               _body(calls, "a", write="old"))
  stages = Stages(str(tmp_path), log=lambda _: None)
  stages.run("b", "B", {}, [], _body(calls, "b"))  # b reads nothing: kept below
  stages = Stages(str(tmp_path), log=lambda _: None)
  stages.run("a", "A", {"n": 2}, [], _body(calls, "a"))
  assert not os.path.exists(tmp_path / "a" / "old")  # started from nothing
  stages.run("b", "B", {}, [], _body(calls, "b"))
  stages.run("c", "C", {}, ["a"], _body(calls, "c"))
  again = Stages(str(tmp_path), log=lambda _: None)
  again.run("a", "A", {"n": 1}, [], _body(calls, "a"))  # back to n=1: a runs, so c does
  again.run("c", "C", {}, ["a"], _body(calls, "c"))
  assert calls == ["a", "b", "a", "c", "a", "c"]


def test_a_stage_cut_short_is_continued_in_place(tmp_path):
  calls = []

  def dies(directory):
    calls.append("a")
    with open(os.path.join(directory, "checkpoint"), "w", encoding="utf-8") as f:
      f.write("step 5")
    raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    Stages(str(tmp_path), log=lambda _: None).run("a", "A", {"n": 1}, [], dies)
  assert not os.path.exists(tmp_path / "a" / DONE)

  def resumes(directory):
    calls.append("a")
    with open(os.path.join(directory, "checkpoint"), encoding="utf-8") as f:
      return {"resumed_from": f.read()}

  info = Stages(str(tmp_path), log=lambda _: None).run("a", "A", {"n": 1}, [], resumes)
  assert info == {"resumed_from": "step 5"} and calls == ["a", "a"]


def test_a_directory_the_demo_did_not_make_is_refused(tmp_path):
  os.makedirs(tmp_path / "a")
  with pytest.raises(StageError, match="was not made by the demo"):
    Stages(str(tmp_path), log=lambda _: None).run("a", "A", {}, [], _body([], "a"))
