"""The order test modules are handed to pytest-xdist's two workers, and its record.

With `--dist loadfile` a worker takes a whole module at a time, in the collected order
(`--no-loadscope-reorder`). xdist's own order (most tests first) hands the long few-test
modules (a chain of training runs, a model export served over gRPC) out last, where one
of them can run alone while the other worker idles. Handing them out longest first (the
classic longest-processing-time rule) keeps both workers busy to the end.

How long a test takes is read from tests/durations.json, recorded from a run's JUnit XML
(`make test` and `make test-system` write one under runs/pytest/):

  python -m tests.suite_order runs/pytest/test.xml [runs/pytest/test-system.xml ...]

A test the record does not name (a new one) counts as the record's median test. A stale
record costs only a worse order, never a failure; tests/test_suite_order.py checks that
every module it names still exists.
"""
import json
import pathlib
import statistics
import sys
import xml.etree.ElementTree as ET

RECORD = pathlib.Path(__file__).resolve().parent / "durations.json"


def load_record(path: pathlib.Path = RECORD) -> dict[str, float]:
  """{node id: seconds} from `path`, or {} when there is none (a fresh record)."""
  if not path.is_file():
    return {}
  return {k: float(v) for k, v in json.loads(path.read_text())["seconds"].items()}


def hand_out_order(modules: dict, seconds: dict[str, float],
                   first: tuple[str, ...] = ()) -> list:
  """The module keys of `modules`, in the order they are handed out.

  Args:
    modules: {module key: [node ids of its tests selected in this run]}; a key is any
      object whose `.name` (or str) is the module's file name.
    seconds: recorded seconds per node id (load_record).
    first: module file names handed out before every other (the system tier's two demo
      modules, each a chain of child processes that would otherwise end the run alone).

  Returns:
    `first`'s modules, then the rest by recorded seconds, longest first; a test without a
    record counts as the median recorded test (one second when nothing is recorded).
  """
  default = statistics.median(seconds.values()) if seconds else 1.0

  def cost(key):
    return sum(seconds.get(node, default) for node in modules[key])

  def name(key):
    return getattr(key, "name", str(key))

  return sorted(modules, key=lambda key: (name(key) not in first, -cost(key), name(key)))


def node_id(classname: str, name: str, root: pathlib.Path) -> str:
  """pytest's node id of a JUnit testcase ("tests.test_x.TestY", "test_z[a]" ->
  "tests/test_x.py::TestY::test_z[a]"): the longest dotted prefix that is a file under
  `root` is the module, the rest its classes."""
  parts = classname.split(".")
  for cut in range(len(parts), 0, -1):
    module = "/".join(parts[:cut]) + ".py"
    if (root / module).is_file():
      return "::".join([module, *parts[cut:], name])
  raise ValueError(f"JUnit classname {classname!r} names no module under {root}")


def read_junit(path: pathlib.Path, root: pathlib.Path) -> dict[str, float]:
  """{node id: seconds} of the tests `path` (pytest's --junitxml) reports as run (its
  time covers set-up, call and tear-down); skipped tests are left out."""
  try:
    tree = ET.parse(path)
  except (OSError, ET.ParseError) as e:
    raise ValueError(f"{path}: not a readable JUnit XML report: {e}") from e
  out = {}
  for case in tree.iter("testcase"):
    if case.find("skipped") is not None:
      continue
    out[node_id(case.get("classname", ""), case.get("name", ""), root)] = float(
        case.get("time", 0.0))
  return out


def main(argv: list[str]) -> int:
  if not argv:
    print("usage: python -m tests.suite_order REPORT.xml [REPORT.xml ...]", file=sys.stderr)
    return 2
  root = RECORD.parents[1]
  seconds = load_record()
  for report in argv:
    seconds.update(read_junit(pathlib.Path(report), root))  # newer figures replace older
  existing = {key: value for key, value in sorted(seconds.items())
              if (root / key.split("::")[0]).is_file()}
  tmp = RECORD.with_suffix(".json.tmp")
  tmp.write_text(json.dumps({"recorded_from": [str(a) for a in argv],
                             "seconds": {k: round(v, 2) for k, v in existing.items()}},
                            indent=1) + "\n")
  tmp.replace(RECORD)
  print(f"{RECORD}: {len(existing)} tests, {sum(existing.values()) / 60:.1f} min in all")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
