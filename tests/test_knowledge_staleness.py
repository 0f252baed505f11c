"""benchmarks.knowledge_staleness's verdict rule on hand-made arms: each outcome is reached
only by the figures its rule names, and a manipulation that fails is never read as a
result."""
import pytest

from benchmarks import knowledge_staleness as staleness


def _arm(accuracy: float, overlaps, cosine: float = 0.8) -> dict:
  curve = [dict(step=0, top1_searched=0.3, top1_exact=0.3)]
  curve += [dict(step=100 * (i + 1), overlap_at_k=o, document_cosine_to_step0=cosine,
                 top1_searched=0.5, top1_exact=0.5) for i, o in enumerate(overlaps)]
  return dict(heldout_span_accuracy=accuracy, curve=curve)


def _arms(fresh=0.8, never=0.6, stale=0.7, second=(0.75, 0.6), never_overlap=0.3,
          never_cosine=0.8, fresh_overlaps=(0.95, 0.92)):
  return {"refresh-10": _arm(fresh, fresh_overlaps),
          "never": _arm(never, [0.7, never_overlap], never_cosine),
          "refresh-300": _arm(stale, [0.9, 0.6]),
          "refresh-10-seed1": _arm(second[0], fresh_overlaps),
          "never-seed1": _arm(second[1], [0.7, 0.3])}


@pytest.fixture
def args():
  return staleness.parse_args(["--work_dir", "unused"])


def test_a_clear_gap_with_the_manipulation_holding_is_clear(args):
  v = staleness.verdict(_arms(), args)
  assert v["verdict"] == "clear", v
  assert v["gap"] == pytest.approx(0.2) and v["second_seed_gap"] == pytest.approx(0.15)
  assert v["manipulation"]["holds"]


@pytest.mark.parametrize("change", [dict(never_overlap=0.5), dict(never_cosine=0.9),
                                    dict(fresh_overlaps=(0.95, 0.89))])
def test_an_index_that_did_not_go_stale_or_a_refresh_that_did_not_keep_up_reads_nothing(
    args, change):
  v = staleness.verdict(_arms(**change), args)
  assert v["verdict"] == "manipulation failed", v
  assert not v["manipulation"]["holds"]


def test_a_small_gap_is_null(args):
  assert staleness.verdict(_arms(fresh=0.64, never=0.6), args)["verdict"] == "null"
  assert staleness.verdict(_arms(fresh=0.56, never=0.6), args)["verdict"] == "null"


@pytest.mark.parametrize("change", [dict(fresh=0.67, stale=0.62),  # between the two bounds
                                    dict(second=(0.5, 0.6)),  # the other sign at seed 1
                                    dict(stale=0.9),  # refresh-300 above refresh-10
                                    dict(fresh=0.4, never=0.6, stale=0.5)])  # never ahead
def test_anything_else_is_inconclusive(args, change):
  assert staleness.verdict(_arms(**change), args)["verdict"] == "inconclusive"


def test_without_the_two_first_seed_arms_there_is_no_verdict(args):
  arms = _arms()
  del arms["never"]
  assert staleness.verdict(arms, args)["verdict"] == "incomplete"


def test_the_other_tower_arrangement_is_reported_beside_the_verdict_not_in_it():
  args = staleness.parse_args(["--work_dir", "unused", "--towers", "two"])
  arms = _arms(fresh=0.62, never=0.6)
  arms["refresh-10-shared"] = _arm(0.99, [0.95, 0.93])
  arms["never-shared"] = _arm(0.15, [0.4, 0.1], cosine=0.2)
  v = staleness.verdict(arms, args)
  assert v["verdict"] == "null"
  other = v["other_towers"]
  assert other["towers"] == "one" and other["gap"] == pytest.approx(0.84)
  assert other["manipulation"]["holds"]


def test_arms_are_planned_by_interval_then_at_the_second_seed_then_the_other_towers(args):
  # The defaults: one tower, the manipulation check's two arms first.
  assert args.towers == "one"
  assert staleness.arm_plan(args) == [
      ("refresh-10", 10, 0, True), ("never", 0, 0, True), ("refresh-30", 30, 0, True),
      ("refresh-100", 100, 0, True), ("refresh-300", 300, 0, True),
      ("refresh-10-seed1", 10, 1, True), ("never-seed1", 0, 1, True),
      ("refresh-10-two-towers", 10, 0, False), ("never-two-towers", 0, 0, False)]
  assert {arm.start for arm in staleness.arm_plan(args)} == {
      "seed0-shared", "seed1-shared", "seed0"}
  two = staleness.parse_args(["--towers", "two", "--refresh", "10,0",
                              "--second_seed_refresh", "", "--other_towers_refresh", "10"])
  assert staleness.arm_plan(two) == [("refresh-10", 10, 0, False), ("never", 0, 0, False),
                                     ("refresh-10-shared", 10, 0, True)]
  with pytest.raises(SystemExit, match="multiple"):
    staleness.parse_args(["--steps", "250", "--curve_every", "50"])
