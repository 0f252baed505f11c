"""benchmarks/harness.py with tiny fake benchmarks: a result's Markdown is a function of its
JSON as written (a re-render gives the same bytes), arms that are kept, budgeted, saved as
they finish and resumed after a cut, and the shared measurements."""
import json
import os
import subprocess
import sys
import time

import pytest

from benchmarks import harness


def _markdown(result: dict) -> str:
  # A renderer that sees what a reader of the JSON sees: string keys, sorted.
  return "\n".join([f"# {result['title']}", ""] + [
      f"- {arm}: {value}" for arm, value in result.get("arms", {}).items()]) + "\n"


def test_write_renders_the_markdown_from_the_json_as_written(tmp_path):
  plotted = []
  output = harness.Output("fake", _markdown, lambda result, path: plotted.append(
      (sorted(result["arms"]), path)), directory=str(tmp_path))
  path = output.write(dict(title="Fake", arms={2: "b", 10: "a"}, pairs=(1, 2)))
  assert path == str(tmp_path / "fake.json")
  written = (tmp_path / "fake.json").read_text()
  assert written == json.dumps(json.loads(written), indent=2, sort_keys=True)
  # Keys as the JSON has them (strings, sorted as text), not as the payload had them.
  assert (tmp_path / "fake.md").read_text() == "# Fake\n\n- 10: a\n- 2: b\n"
  assert plotted == [(["10", "2"], str(tmp_path / "fake_curves.png"))]
  # Rendering again from the JSON alone gives the same bytes.
  before = (tmp_path / "fake.md").read_bytes()
  (tmp_path / "fake.md").write_text("stale")
  assert output.render() == str(tmp_path / "fake.md")
  assert (tmp_path / "fake.md").read_bytes() == before
  # merge: top-level keys over those already written.
  output.write(dict(arms={"c": 1}), merge=True)
  assert output.read() == dict(title="Fake", arms={"c": 1}, pairs=[1, 2])
  assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]
  assert harness.output_at(path, _markdown).markdown_path == str(tmp_path / "fake.md")


def test_the_default_directory_is_read_when_writing(tmp_path, monkeypatch):
  output = harness.Output("late", _markdown)
  monkeypatch.setattr(harness, "RESULTS_DIR", str(tmp_path))
  output.write(dict(title="Late"))
  assert (tmp_path / "late.md").exists()


def _fake_benchmark(output, names, settings, budget_minutes=60.0, seconds=None,
                    fail_at=None, started=0.0):
  """A benchmark of arms: each arm's result is its name twice; `seconds[arm]`, what the
  arm is expected to take; `fail_at`, the arm that cuts the run."""
  earlier = harness.kept_result(output, settings, log=lambda _: None)
  done = earlier.get("arms", {})
  arms, ran = dict(done), []

  def payload(partial):
    return dict(title="Fake", settings=settings, partial=partial, arms=arms,
                skipped=runner.skipped)

  runner = harness.Arms(lambda partial: output.write(payload(partial)), budget_minutes,
                        started=started)
  expected = (lambda arm, _: seconds.get(arm, 0.0)) if seconds else None
  for arm in runner.due(names, kept=done, expected=expected,
                        label=lambda a: f"{a} (time budget)"):
    if arm == fail_at:
      raise RuntimeError(f"cut at {arm}")
    arms[arm] = arm * 2
    ran.append(arm)
    assert runner.arm_seconds() >= 0
  runner.finish()
  return ran, runner


def test_arms_are_saved_as_they_finish_and_kept_by_a_rerun(tmp_path):
  output = harness.Output("fake", _markdown, directory=str(tmp_path))
  settings = dict(steps=3)
  with pytest.raises(RuntimeError, match="cut at c"):
    _fake_benchmark(output, ["a", "b", "c", "d"], settings, fail_at="c")
  # The arms before the cut are on disk, the result marked partial, the Markdown with them.
  cut = output.read()
  assert cut["arms"] == {"a": "aa", "b": "bb"} and cut["partial"] is True
  assert "- b: bb" in (tmp_path / "fake.md").read_text()
  # A rerun with the same settings runs only what is missing, and ends not partial.
  ran, runner = _fake_benchmark(output, ["a", "b", "c", "d"], settings)
  assert ran == ["c", "d"] and list(runner.seconds) == ["c", "d"]
  assert output.read()["arms"] == {"a": "aa", "b": "bb", "c": "cc", "d": "dd"}
  assert output.read()["partial"] is False
  # Other settings start over; so does fresh.
  ran, _ = _fake_benchmark(output, ["a", "b"], dict(steps=4))
  assert ran == ["a", "b"] and output.read()["arms"] == {"a": "aa", "b": "bb"}
  assert harness.kept_result(output, dict(steps=4), fresh=True, log=lambda _: None) == {}


def test_arms_that_would_end_after_the_budget_are_skipped_and_named(tmp_path):
  output = harness.Output("fake", _markdown, directory=str(tmp_path))
  # 50 of 60 minutes spent: an arm expected to take 20 minutes would end after the budget.
  started = time.time() - 50 * 60
  ran, runner = _fake_benchmark(output, ["a", "b", "c"], {}, budget_minutes=60.0,
                                seconds={"b": 20 * 60.0, "c": 60.0}, started=started)
  assert ran == ["a", "c"]
  assert runner.skipped == ["b (time budget)"]
  result = output.read()
  assert result["skipped"] == ["b (time budget)"] and result["partial"] is True
  # By default an arm is expected to take as long as the last one run.
  runner = harness.Arms(lambda partial: None, budget_minutes=1.0, started=time.time() - 30)
  runner.seconds = {"a": 45.0}
  assert list(runner.due(["b"])) == [] and runner.skipped == ["b"]


def test_percentiles_and_recall():
  p = harness.percentiles([0.001 * i for i in range(1, 101)])
  assert p["requests"] == 100 and p["p50_ms"] == pytest.approx(50.5)
  assert p["p99_ms"] == pytest.approx(99.01) and p["mean_ms"] == pytest.approx(50.5)
  assert harness.percentiles([]) == dict(requests=0)
  assert harness.recall([[1, 2], [3, 4]], [[1, 5], [4, 3]]) == pytest.approx(0.75)


def test_memory_readings_of_this_process():
  assert harness.rss_bytes() > 0 and harness.peak_rss_bytes() >= harness.rss_bytes()
  with harness.PeakSampler(os.getpid(), every=0.01) as sampler:
    block = bytearray(32 << 20)
    time.sleep(0.1)
  del block
  assert sampler.peak >= 32 << 20


def test_publish_copy_adds_the_next_version(tmp_path):
  base = tmp_path / "model"
  (base / "1").mkdir(parents=True)
  (base / "1" / "saved_model.pb").write_text("graph")
  assert harness.publish_copy(str(base)) == 2
  assert (base / "2" / "saved_model.pb").read_text() == "graph"
  assert os.stat(base / "2" / "saved_model.pb").st_ino != os.stat(
      base / "1" / "saved_model.pb").st_ino
  assert harness.publish_copy(str(base), 1, hard_links=True) == 3
  assert os.stat(base / "3" / "saved_model.pb").st_ino == os.stat(
      base / "1" / "saved_model.pb").st_ino
  assert harness.versions(str(base)) == [1, 2, 3]
  assert not [n for n in os.listdir(base) if n.startswith(".tmp")]


def test_logger_stamps_its_lines(capsys):
  harness.logger("fake-bench")("started")
  line = capsys.readouterr().out
  assert line.startswith("[fake-bench ") and line.endswith("] started\n")


def test_a_cached_step_is_done_once_and_kept_while_it_holds(tmp_path):
  path = str(tmp_path / "step.json")
  made = []

  def make():
    made.append(1)
    return dict(blocks=10, order={"b": 1, "a": 2})

  first = harness.cached(path, make, log=lambda _: None)
  assert first == dict(blocks=10, order={"b": 1, "a": 2}) and len(made) == 1
  assert list(first["order"]) == ["b", "a"]  # as made, not sorted
  # A rerun reads it back; one whose keep says it no longer holds does the step again.
  assert harness.cached(path, make, log=lambda _: None) == first and len(made) == 1
  harness.cached(path, make, keep=lambda kept: kept["blocks"] == 20, log=lambda _: None)
  assert len(made) == 2

  # A step cut before it returns leaves no file: the next run does it.
  def cut():
    raise KeyboardInterrupt

  cut_path = str(tmp_path / "cut.json")
  with pytest.raises(KeyboardInterrupt):
    harness.cached(cut_path, cut)
  assert not os.path.exists(cut_path)
  assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]


def _git(repo, *args) -> str:
  return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                        capture_output=True, text=True, check=True).stdout.strip()


def test_the_commit_says_when_code_that_measures_differs_from_it(tmp_path, monkeypatch):
  """commit(): HEAD of the checkout, '+modified' once a tracked file that can change a
  measurement differs from it, not when only tests, docs, Markdown or results do
  (NOT_MEASURED)
  nor for an untracked file; '' outside a git checkout."""
  repo = tmp_path / "repo"
  for path in ("benchmarks/b.py", "tests/t.py", "docs/d.txt", "README.md",
               "benchmarks/results/r.json"):
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text("x = 1\n")
  _git(repo, "init", "-q")
  _git(repo, "add", ".")
  _git(repo, "commit", "-q", "-m", "one")
  monkeypatch.setattr(harness, "REPO", str(repo))
  head = _git(repo, "rev-parse", "HEAD")
  assert harness.commit() == head and len(head) == 40
  for path in ("tests/t.py", "docs/d.txt", "README.md", "benchmarks/results/r.json"):
    (repo / path).write_text("x = 2\n")
  (repo / "benchmarks" / "new.py").write_text("y = 1\n")
  assert harness.commit() == head
  (repo / "benchmarks" / "b.py").write_text("x = 2\n")
  assert harness.commit() == head + "+modified"
  monkeypatch.setattr(harness, "REPO", str(tmp_path / "nowhere"))
  assert harness.commit() == ""


def test_a_recorded_step_says_what_ran_it_when_and_how_loaded(monkeypatch):
  """recorded(make)() is make()'s result with its provenance: the commit as the step
  started, its start, its seconds (an injected clock) and the load average at its start
  and end."""
  ticks, loads, seen = iter([100.0, 102.5]), iter([(1.0, 2.0, 3.0), (4.0, 5.0, 6.0)]), []
  monkeypatch.setattr(harness, "commit", lambda: "c0ffee" if not seen else "later")
  monkeypatch.setattr(harness.time, "perf_counter", lambda: next(ticks))
  monkeypatch.setattr(harness.os, "getloadavg", lambda: next(loads))
  step = harness.recorded(lambda: seen.append(1) or dict(rows=7))
  result = step()
  monkeypatch.undo()
  assert seen == [1] and result["rows"] == 7
  provenance = result["provenance"]
  assert provenance["commit"] == "c0ffee"
  assert provenance["seconds"] == 2.5
  assert provenance["load_average_at_start"] == [1.0, 2.0, 3.0]
  assert provenance["load_average_at_end"] == [4.0, 5.0, 6.0]
  time.strptime(provenance["started"], "%Y-%m-%dT%H:%M:%S%z")


_FAKE_BENCHMARK = '''
import argparse
import os
import subprocess
import sys

from benchmarks import harness


def grow(args, work):
  held = bytearray(args.megabytes << 20)
  return dict(megabytes=args.megabytes, kind=args.kind, pid=os.getpid(), held=len(held))


def fail(args, work):
  raise ValueError("the phase broke")


PHASES = harness.Phases("fake_benchmark", dict(grow=grow, fail=fail), env=dict(
    PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.abspath(__file__)), harness.REPO])),
    log=lambda _: None)


def parse_args(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--megabytes", type=int, default=1)
  parser.add_argument("--work_dir", default="")
  return PHASES.parse(parser, argv)


if __name__ == "__main__":
  sys.exit(PHASES.child(parse_args()))
'''


def test_phases_run_in_a_child_of_the_same_module_with_the_parents_flags(tmp_path,
                                                                        monkeypatch):
  (tmp_path / "fake_benchmark.py").write_text(_FAKE_BENCHMARK)
  monkeypatch.syspath_prepend(str(tmp_path))
  import fake_benchmark  # pylint: disable=g-import-not-at-top,import-error  (written by this test)
  work = tmp_path / "work"
  work.mkdir()
  args = fake_benchmark.parse_args(["--megabytes=48"])
  assert args.phase == "" and args.argv == ["--megabytes=48"]
  result = fake_benchmark.PHASES.run(args, str(work), "grow", "small")
  # The child parsed the parent's flags, and the kind; its memory was its own.
  assert result["megabytes"] == 48 and result["kind"] == "small"
  assert result["pid"] != os.getpid() and result["held"] == 48 << 20
  assert json.loads((work / "grow-small.json").read_text()) == result
  assert (work / "grow-small.log").exists()
  # A result an earlier run left is kept only when keep says so.
  assert fake_benchmark.PHASES.run(args, str(work), "grow", "small",
                                   keep=lambda kept: True)["pid"] == result["pid"]
  assert fake_benchmark.PHASES.run(args, str(work), "grow", "small")["pid"] != result["pid"]
  # A phase that fails, or that the module does not have, fails the parent's call with the
  # child's output.
  with pytest.raises(RuntimeError, match="the phase broke"):
    fake_benchmark.PHASES.run(args, str(work), "fail")
  with pytest.raises(RuntimeError, match="unknown phase 'other'"):
    fake_benchmark.PHASES.run(args, str(work), "other")
  assert not (work / "fail.json").exists()


def test_run_process_measures_a_child_and_reports_its_failure(tmp_path):
  log_path = str(tmp_path / "child.log")
  done = harness.run_process(
      [sys.executable, "-c", "b = bytearray(64 << 20); print('hello')"], log_path)
  assert done["output"] == "hello\n" and done["seconds"] > 0
  assert done["peak_rss_bytes"] >= 64 << 20
  with pytest.raises(RuntimeError, match="exited 3"):
    harness.run_process([sys.executable, "-c", "import sys; sys.exit(3)"], log_path)


def test_sizes_count_a_hard_linked_file_once(tmp_path):
  (tmp_path / "a").write_bytes(b"x" * 5000)
  (tmp_path / "sub").mkdir()
  (tmp_path / "sub" / "b").write_bytes(b"y" * 100)
  os.link(tmp_path / "a", tmp_path / "sub" / "a_again")
  assert harness.du_bytes(str(tmp_path)) == 5100
  on_disk = harness.du_bytes(str(tmp_path), on_disk=True)
  assert on_disk % 512 == 0 and on_disk >= 5100
  assert len(harness.inode_sizes(str(tmp_path))) == 2
  assert harness.gib(3 * 2**30 / 4) == 0.75 and harness.gib(2**30 / 3, 2) == 0.33


def test_read_questions_from_the_shared_data_or_made_up(tmp_path, monkeypatch):
  monkeypatch.setattr(harness, "SHARED_DATA", str(tmp_path))
  with pytest.raises(OSError):
    harness.read_questions(3)
  made_up = harness.read_questions(3, fill=True)
  assert made_up == [f"who wrote the iliad {i}?" for i in range(3)]
  nq = tmp_path / "openqa" / "nq_open"
  nq.mkdir(parents=True)
  (nq / "b.jsonl").write_text(json.dumps(dict(question="q3")) + "\n")
  (nq / "a.jsonl").write_text("".join(json.dumps(dict(question=q)) + "\n"
                                      for q in ("q1", "q2")))
  (nq / "notes.txt").write_text("not questions")
  assert harness.read_questions(10) == ["q1", "q2", "q3"]
  assert harness.read_questions(2) == ["q1", "q2"]
  assert harness.read_questions(5, fill=True) == ["q1", "q2", "q3", "q1", "q2"]
