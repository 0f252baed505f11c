"""tests/conftest.py's SYSTEM_TIER check: a key that names no test fails the run (a renamed
test would otherwise move to the other tier unnoticed), but a run of one file does not
fail for the keys of modules it did not collect."""
import types

import pytest

from tests import conftest

pytest_plugins = ("pytester",)


def test_a_key_whose_module_file_is_gone_is_found(tmp_path):
  (tmp_path / "test_kept.py").write_text("")
  table = {"test_kept.py": "", "test_kept.py::test_a": "", "test_gone.py": "",
           "test_gone.py::test_b": ""}
  assert conftest.missing_modules(table, tmp_path) == ["test_gone.py", "test_gone.py::test_b"]
  assert conftest.missing_modules(conftest.SYSTEM_TIER, conftest.TESTS_DIR) == []


def test_a_key_whose_test_its_module_does_not_define_is_found():
  module = types.ModuleType("test_kept")
  module.test_a = lambda: None
  module.TestGroup = type("TestGroup", (), {"test_in_class": lambda self: None})
  table = {"test_kept.py": "", "test_kept.py::test_a": "", "test_kept.py::test_in_class": "",
           "test_kept.py::test_renamed": "", "test_other.py::test_x": ""}
  assert conftest.undefined_tests(table, "test_kept.py", module) == ["test_kept.py::test_renamed"]
  assert conftest.undefined_tests(table, "test_other.py", types.ModuleType("t")) == [
      "test_other.py::test_x"]


# A suite of its own whose conftest is tests/conftest.py's checks over the table TIER.
_SUITE_CONFTEST = """
import pathlib
from tests import conftest
from tests.conftest import pytest_configure, pytest_make_collect_report  # noqa: F401
conftest.SYSTEM_TIER, conftest.TESTS_DIR = {tier!r}, pathlib.Path(__file__).parent
"""


@pytest.fixture
def suite(pytester, monkeypatch):
  """Runs pytest in-process on two modules under a SYSTEM_TIER of the test's own."""
  for name in ("SYSTEM_TIER", "TESTS_DIR"):  # restored after the test
    monkeypatch.setattr(conftest, name, getattr(conftest, name))
  pytester.makepyfile(test_kept="def test_a():\n  pass\n",
                      test_other="def test_c():\n  pass\n")

  def run(tier, *args):
    pytester.makeconftest(_SUITE_CONFTEST.format(tier=tier))
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-n", "0", *args)

  return run


RENAMED = ("tests/conftest.py SYSTEM_TIER names tests that test_kept.py does not define: "
           "['test_kept.py::test_renamed']")


def test_a_renamed_test_fails_collection_of_its_module_only(suite):
  tier = {"test_kept.py::test_a": "", "test_kept.py::test_renamed": "", "test_other.py": ""}
  result = suite(tier)
  assert result.ret == pytest.ExitCode.INTERRUPTED  # a collection error
  assert RENAMED in result.stdout.str()
  assert suite(tier, "test_other.py").ret == pytest.ExitCode.OK  # test_kept.py not collected
  # One test of the module run alone: the module is collected, and still lacks the test
  # (pytest then finds nothing to run by that id: a usage error).
  result = suite(tier, "test_kept.py::test_a")
  assert result.ret == pytest.ExitCode.USAGE_ERROR and RENAMED in result.stdout.str()
  assert suite({"test_kept.py::test_a": "", "test_other.py": ""}).ret == pytest.ExitCode.OK


def test_a_key_whose_module_is_gone_is_a_usage_error_even_for_another_file(suite):
  result = suite({"test_gone.py": ""}, "test_other.py")
  assert result.ret == pytest.ExitCode.USAGE_ERROR
  assert ("SYSTEM_TIER names test modules that do not exist in tests/: ['test_gone.py']"
          in result.stderr.str())
