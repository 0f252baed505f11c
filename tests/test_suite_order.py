"""The order test modules are handed to the two xdist workers (tests/suite_order.py)."""
import pathlib

import pytest

from tests import suite_order

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_modules_are_handed_out_longest_first_after_the_named_first_ones():
  modules = {"test_a.py": ["a::1", "a::2"], "test_b.py": ["b::1"], "test_c.py": ["c::1"],
             "test_demo.py": ["d::1"]}
  seconds = {"a::1": 5.0, "a::2": 5.0, "b::1": 30.0, "c::1": 1.0, "d::1": 2.0}
  assert suite_order.hand_out_order(modules, seconds, ("test_demo.py",)) == [
      "test_demo.py", "test_b.py", "test_a.py", "test_c.py"]
  # Counted by tests (xdist's own rule), test_a would come first.
  assert suite_order.hand_out_order(modules, seconds) == [
      "test_b.py", "test_a.py", "test_demo.py", "test_c.py"]


def test_a_test_without_a_record_counts_as_the_median_recorded_test():
  seconds = {"a::1": 1.0, "b::1": 10.0, "c::1": 100.0}  # median 10
  modules = {"test_a.py": ["a::1"], "test_new.py": ["new::1", "new::2"],
             "test_c.py": ["c::1"]}
  assert suite_order.hand_out_order(modules, seconds) == [
      "test_c.py", "test_new.py", "test_a.py"]
  # Nothing recorded: one second a test, so the module with more tests goes first.
  assert suite_order.hand_out_order(modules, {}) == ["test_new.py", "test_a.py",
                                                     "test_c.py"]


def test_junit_test_cases_become_node_ids_and_skipped_ones_are_left_out(tmp_path):
  report = tmp_path / "test.xml"
  report.write_text(
      '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
      '<testcase classname="tests.test_suite_order" name="test_x[a-1]" time="2.5"/>'
      '<testcase classname="tests.test_suite_order.TestThing" name="test_y" time="0.25"/>'
      '<testcase classname="tests.test_suite_order" name="test_z" time="9">'
      '<skipped message="no data"/></testcase>'
      '</testsuite></testsuites>')
  assert suite_order.read_junit(report, REPO) == {
      "tests/test_suite_order.py::test_x[a-1]": 2.5,
      "tests/test_suite_order.py::TestThing::test_y": 0.25}


def test_a_report_that_is_not_junit_or_names_no_module_is_refused_by_name(tmp_path):
  broken = tmp_path / "broken.xml"
  broken.write_text("<testsuites><testcase")
  with pytest.raises(ValueError, match="broken.xml: not a readable JUnit XML"):
    suite_order.read_junit(broken, REPO)
  with pytest.raises(ValueError, match="'tests.test_gone' names no module"):
    suite_order.node_id("tests.test_gone", "test_a", REPO)


def test_the_record_names_only_modules_that_exist():
  seconds = suite_order.load_record()
  assert seconds, "tests/durations.json is missing: record it (tests/suite_order.py)"
  gone = sorted({node.split("::")[0] for node in seconds} - {
      str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py")})
  assert not gone, f"tests/durations.json names modules no longer in tests/: {gone}"
