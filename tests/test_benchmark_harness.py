"""benchmarks/harness.py with tiny fake benchmarks: a result's Markdown is a function of its
JSON as written (a re-render gives the same bytes), arms that are kept, budgeted, saved as
they finish and resumed after a cut, and the shared measurements."""
import json
import os
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
