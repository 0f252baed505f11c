"""REALM's asynchronous index refresh, tested where it can show: arms by refresh interval on
a knowledge world whose document tower moves, with a verdict either way.

    python -m benchmarks.knowledge_staleness [--refresh 10,0,30,100,300]
        [--second_seed_refresh 10,0] [--towers one] [--other_towers_refresh 10,0]
        [--blocks_per_entity 2] [--steps 600]
        [--batch_size 64] [--entities 600] [--reader_steps 600] [--ict_steps 5]
        [--ict_learning_rate 3e-3]
        [--num_candidates 2] [--curve_every 100]
        [--learning_rate 3e-3] [--seed 0] [--second_seed 1] [--override k=v]
        [--work_dir DIR] [--fresh] [--no_write] [--name knowledge_staleness]

Why: the paper's ablation (Guu et al., 2020, Table 3, NQ dev) loses about 10 EM with a
30x staler index. An index can only go stale if the document tower moves, and in
benchmarks.knowledge it barely does (the retriever is held for 300 steps, then trains at a
tenth of a decaying rate). Here nothing holds it: every arm starts from a reader that
already reads (realm_tf.training.own_block_reader: trained on each sentence with its own block,
saved as the run's mlm_init_checkpoint), a weak ICT warm start (--ict_steps), and trains
both retriever towers at the reader's rate from step 0.

Arms (same world, seed, steps and batch): refresh every --refresh steps (the index builder
beside the trainer re-embeds the corpus from a snapshot, and the trainer waits for it at
each refresh, so the index searched is never older than the interval; 0 = never: the
step-0 index, published once); for --second_seed_refresh, the same at --second_seed (its
own reader, ICT start and initialisation). --towers: the verdict's arms use one tower for
queries and documents (model.retriever.share_towers), or two; for --other_towers_refresh,
the same intervals with the other arrangement, reported beside the verdict. With two
towers the query tower can learn to keep to a stale index (measured: the never arm's
own-block top-1 against its step-0 index rose from 0.52 to 0.98 in 100 steps), so an index
only goes stale in the sense the check asks where the query tower is the document tower.
--blocks_per_entity 2 gives each entity two sources (knowledge_world): with one helpful
block, the k=2 candidate set's second slot churns while the retriever trains (each
unhelpful retrieval is pushed down until another takes its place), refreshed index or not.
The defaults (one tower, two sources per entity, the reader's rate 3e-3) are the world
the manipulation check first held in (300-step pilots, in the committed result's notes):
with one source refresh-10's top-2 churned (lowest overlap 0.74-0.82); with two towers or at
half the rate the never arm's index stayed close to exact (0.75-0.99).
At every --curve_every steps, per arm:
  held-out span accuracy   the trainer's own evaluation over all held-out sentences, against
                           the index it searched then (± binomial standard error);
  own-block top-1          against the index searched at that step, and against an exact
                           search of that step's document tower (what a refresh would give);
  overlap@k                of the searched index's top-k with that exact search's (1: a
                           refresh could not have changed what was retrieved);
  cosine to step 0         the document embeddings' mean cosine to their step-0 rows.

The verdict (`verdict`, fixed here before any run):
  manipulation   holds when the never-refreshed arm's last overlap@k < MANIPULATION_OVERLAP
                 and its document cosine < MANIPULATION_COSINE, while refresh-10 keeps
                 overlap@k >= FRESH_OVERLAP at every point; else "manipulation failed", and
                 no accuracy is read.
  clear          refresh-10 minus never >= CLEAR_GAP in held-out accuracy, the same sign at
                 the second seed, and refresh-300 between the two.
  null           the gap < NULL_GAP (the query tower compensates for the stale index).
  inconclusive   anything else (a gap between the two bounds, or the arms out of order).
Each arm is saved as it finishes: a rerun with the same settings keeps the finished arms.
The other arrangement's manipulation check and gap are reported beside the verdict, not in
it.
Results: benchmarks/results/<--name>.{json,md} and <--name>_curves.png (unless --no_write;
always in <work_dir>).
"""
import argparse
import gc
import math
import os
import tempfile
import time
from typing import NamedTuple

import tf_keras

from benchmarks import harness, knowledge
from realm_tf.io import layout
from realm_tf.training import own_block_reader, train_lib

log = harness.logger("knowledge_staleness")

# The verdict's rule (module docstring).
MANIPULATION_OVERLAP, MANIPULATION_COSINE, FRESH_OVERLAP = 0.5, 0.9, 0.9
CLEAR_GAP, NULL_GAP = 0.10, 0.05
WALL_TARGET_SECONDS = 60 * 60
# The other arrangement's arms are named with this suffix (by --towers).
OTHER_SUFFIX = {"one": "-two-towers", "two": "-shared"}
# Held fixed in every arm, whatever configs/knowledge.yaml says: the retriever trains from
# step 0 at the reader's rate, both towers (an index goes stale only if the documents' tower
# moves).
ARM_OVERRIDES = ("trainer.retriever_frozen_steps=0",
                 "trainer.retriever_learning_rate_multiplier=1.0")


class Arm(NamedTuple):
  """One run: its name, refresh interval (0: never), seed and whether the retriever's
  query and document towers are one."""
  name: str
  refresh: int
  seed: int
  shared: bool = False

  @property
  def start(self) -> str:
    """The key of the start (reader and ICT warm start) it shares with other arms."""
    return f"seed{self.seed}" + ("-shared" if self.shared else "")


def arm_plan(args) -> list[Arm]:
  """Every arm, in run order: the intervals at --seed, the second seed's (both with the
  --towers of the verdict), then the other tower arrangement's (OTHER_SUFFIX)."""
  def name(refresh, suffix=""):
    return (f"refresh-{refresh}" if refresh else "never") + suffix
  shared = args.towers == "one"
  return ([Arm(name(r), r, args.seed, shared) for r in args.refresh]
          + [Arm(name(r, f"-seed{args.second_seed}"), r, args.second_seed, shared)
             for r in args.second_seed_refresh]
          + [Arm(name(r, OTHER_SUFFIX[args.towers]), r, args.seed, not shared)
             for r in args.other_towers_refresh])


def arm_args(args, arm: Arm) -> argparse.Namespace:
  """benchmarks.knowledge's arguments for one arm (its config is knowledge.arm_config's)."""
  shared = ["model.retriever.share_towers=true"] if arm.shared else []
  return argparse.Namespace(**dict(
      vars(args), seed=arm.seed, refresh_every=arm.refresh or args.steps,
      curve_sentences=args.heldout_sentences,
      override=list(ARM_OVERRIDES) + shared + list(args.override or [])))


def start_of(world: dict, args, arm: Arm, work: str) -> dict:
  """The start every arm of `arm.start` shares: a reader trained to read own blocks (saved
  as a pre-training checkpoint) and a weak ICT warm start of the retriever; reused when its
  directory holds them (a rerun)."""
  directory = os.path.join(work, f"start-{arm.start}")
  reader_path = os.path.join(directory, "reader", "ckpt-1")
  ict_dir = os.path.join(directory, "ict")
  ns = arm_args(args, arm._replace(refresh=0))
  config = knowledge.arm_config("frozen", world["dir"], ns, ict_dir)
  own_block_reader.trained_checkpoint(config, world, args.reader_steps, arm.seed, reader_path,
                                      log=lambda m: log(f"{arm.start}: {m}"))
  if not layout.training_done(ict_dir):
    log(f"{arm.start}: ICT warm start, {args.ict_steps} steps")
    train_lib.run_experiment(
        knowledge.ict_config(world["dir"], argparse.Namespace(
            **dict(vars(ns), learning_rate=args.ict_learning_rate))), ict_dir)
    tf_keras.backend.clear_session()
  start = knowledge.retriever_from(config)
  step0 = knowledge.gold_top1(config, start, start, world)
  tf_keras.backend.clear_session()
  log(f"{arm.start}: step-0 own-block top-1 {step0:.3f}")
  return dict(reader=reader_path, ict_dir=ict_dir, step0_gold_top1=step0)


def run_arm(arm: Arm, world: dict, start: dict, args, work: str) -> dict:
  kind = "realm" if arm.refresh else "frozen"
  # A checkpoint at every loop's end, so every evaluation step has one: a run's first save
  # is at its first loop's end and the interval counts from there (tf.train.CheckpointManager).
  every = math.gcd(arm.refresh or args.steps, args.curve_every)
  config = knowledge.arm_config(kind, world["dir"], arm_args(args, arm), start["ict_dir"],
                                start["reader"]).replace(
      trainer=dict(checkpoint_interval=every, max_to_keep=args.steps // every + 1))
  if arm.refresh:
    # "Every N steps" means the index searched is never more than N steps old: at each
    # refresh the trainer waits for that refresh's index (on 2 cores a build of the corpus
    # takes longer than 10 steps). A bound of N would not do it: the check runs after the
    # snapshot is taken, so N lets the next loop search the previous refresh's index and
    # end at 2N steps old (measured: refresh-10 ended its loops at 17-20); arm_config's 3N,
    # at 30-40.
    config = config.replace(index=dict(max_staleness_steps=arm.refresh - 1))
  model_dir = os.path.join(work, arm.name)
  description = (f"refresh {'every ' + str(arm.refresh) + ' steps' if arm.refresh else 'never'}"
                 f", seed {arm.seed}{', shared towers' if arm.shared else ''}")
  log(f"arm {arm.name}: {args.steps} steps, {description}")
  result, final, wall, start_retriever, _, _ = knowledge.train_arm(kind, config, model_dir)
  points = knowledge.checkpoint_curve(config, model_dir, world, start_retriever,
                                       args.curve_every)
  n = len(world["held_out"])
  metrics = layout.read_metrics(model_dir)
  accuracy = {r["step"]: r["span_accuracy"] for r in metrics
              if r.get("mode") == "eval" and "span_accuracy" in r}
  for p in points:
    if p["step"] in accuracy:
      p["heldout_span_accuracy"] = accuracy[p["step"]]
      p["heldout_span_accuracy_stderr"] = round(harness.share_stderr(accuracy[p["step"]], n), 4)
  # How old the index searched was at each loop's end, as the trainer logged it.
  staleness = [r["index_staleness_steps"] for r in metrics
               if r.get("mode") == "pretrain" and r.get("index_staleness_steps") is not None]
  out = dict(
      arm=arm.name, refresh_every=arm.refresh, seed=arm.seed, shared_towers=arm.shared,
      steps=result["step"], description=description,
      wall_seconds=round(wall, 1), heldout_span_accuracy=final.get("span_accuracy"),
      heldout_span_accuracy_stderr=round(harness.share_stderr(final["span_accuracy"], n), 4),
      index_refreshes=result.get("index_refreshes", 0), curve=points,
      index_staleness_steps=staleness_summary(staleness))
  tf_keras.backend.clear_session()
  gc.collect()
  last = points[-1]
  log(f"arm {arm.name}: held-out {out['heldout_span_accuracy']:.3f}, top-1 searched "
      f"{last['top1_searched']:.3f} / exact {last['top1_exact']:.3f}, overlap "
      f"{last.get('overlap_at_k')}, cosine {last.get('document_cosine_to_step0')}, "
      f"{out['wall_seconds']} s")
  return out


def staleness_summary(steps: list) -> dict:
  """{mean, max} of the index's age in steps at each loop's end ({} for none: a run whose
  index never went older than its first)."""
  if not steps:
    return {}
  return dict(mean=round(float(sum(steps)) / len(steps), 1), max=max(steps))


def manipulation(arms: dict, never: str, fresh: str) -> dict:
  """The manipulation check on the arms named `never` and `fresh` (refresh-10): the
  never-refreshed index went stale and refresh-10's did not."""
  last = arms[never]["curve"][-1]
  fresh_overlaps = [p["overlap_at_k"] for p in arms[fresh]["curve"] if "overlap_at_k" in p]
  return dict(
      never_overlap_at_k=last["overlap_at_k"],
      never_document_cosine=last["document_cosine_to_step0"],
      refresh10_lowest_overlap_at_k=min(fresh_overlaps),
      holds=bool(last["overlap_at_k"] < MANIPULATION_OVERLAP
                 and last["document_cosine_to_step0"] < MANIPULATION_COSINE
                 and min(fresh_overlaps) >= FRESH_OVERLAP))


def accuracy_gap(arms: dict, fresh: str, never: str):
  """Held-out accuracy of `fresh` minus `never`, or None when either was not run."""
  if fresh not in arms or never not in arms:
    return None
  return round(arms[fresh]["heldout_span_accuracy"] - arms[never]["heldout_span_accuracy"], 4)


def verdict(arms: dict, args) -> dict:
  """The rule of the module docstring applied to the arms run (the other tower
  arrangement's figures beside it). Returns {verdict: 'clear' | 'null' | 'inconclusive' |
  'manipulation failed' | 'incomplete', reason, manipulation, gap, second_seed_gap,
  other_towers}."""
  out = {}
  suffix = OTHER_SUFFIX[args.towers]
  if f"refresh-10{suffix}" in arms and f"never{suffix}" in arms:
    out["other_towers"] = dict(
        towers="two" if args.towers == "one" else "one",
        manipulation=manipulation(arms, f"never{suffix}", f"refresh-10{suffix}"),
        gap=accuracy_gap(arms, f"refresh-10{suffix}", f"never{suffix}"))
  never, fresh = arms.get("never"), arms.get("refresh-10")
  if never is None or fresh is None:
    return dict(out, verdict="incomplete",
                reason="the refresh-10 and never arms are both needed")
  out.update(manipulation=manipulation(arms, "never", "refresh-10"),
             gap=accuracy_gap(arms, "refresh-10", "never"),
             second_seed_gap=accuracy_gap(arms, f"refresh-10-seed{args.second_seed}",
                                          f"never-seed{args.second_seed}"))
  gap, stale = out["gap"], arms.get("refresh-300")
  m = out["manipulation"]
  if not m["holds"]:
    failed = [f"never's overlap@k {m['never_overlap_at_k']:.3f} (needs < {MANIPULATION_OVERLAP})"
              if m["never_overlap_at_k"] >= MANIPULATION_OVERLAP else "",
              f"never's document cosine {m['never_document_cosine']:.3f} (needs < "
              f"{MANIPULATION_COSINE})" if m["never_document_cosine"] >= MANIPULATION_COSINE
              else "",
              f"refresh-10's lowest overlap@k {m['refresh10_lowest_overlap_at_k']:.3f} (needs "
              f">= {FRESH_OVERLAP})" if m["refresh10_lowest_overlap_at_k"] < FRESH_OVERLAP
              else ""]
    return dict(out, verdict="manipulation failed",
                reason="; ".join(f for f in failed if f) + ": the accuracies are not read")
  if abs(gap) < NULL_GAP:
    return dict(out, verdict="null", reason=f"|refresh-10 - never| = {abs(gap):.3f} < "
                f"{NULL_GAP}: the query tower compensates for the stale index")
  in_between = stale is not None and (
      min(never["heldout_span_accuracy"], fresh["heldout_span_accuracy"])
      <= stale["heldout_span_accuracy"]
      <= max(never["heldout_span_accuracy"], fresh["heldout_span_accuracy"]))
  if gap >= CLEAR_GAP and (out["second_seed_gap"] or 0) > 0 and in_between:
    return dict(out, verdict="clear", reason=f"refresh-10 - never = {gap:+.3f} >= {CLEAR_GAP}, "
                f"the same sign at seed {args.second_seed}, refresh-300 in between")
  return dict(out, verdict="inconclusive", reason=(
      f"refresh-10 - never = {gap:+.3f}; second seed "
      f"{'not run' if out['second_seed_gap'] is None else format(out['second_seed_gap'], '+.3f')}"
      f"; refresh-300 {'in between' if in_between else 'not in between (or not run)'}"))


def run(args, started: float) -> dict:
  work = args.work_dir or tempfile.mkdtemp(prefix="realm_tf_knowledge_staleness_")
  world = knowledge.write_world(work, args)
  args.heldout_sentences = len(world["held_out"])
  settings = dict(steps=args.steps, batch_size=args.batch_size, entities=args.entities,
                  x_templates=args.x_templates, namesake_fraction=args.namesake_fraction,
                  blocks_per_entity=args.blocks_per_entity, reader_steps=args.reader_steps,
                  ict_steps=args.ict_steps, ict_learning_rate=args.ict_learning_rate,
                  num_candidates=args.num_candidates,
                  learning_rate=args.learning_rate, curve_every=args.curve_every,
                  refresh=args.refresh, second_seed_refresh=args.second_seed_refresh,
                  towers=args.towers, other_towers_refresh=args.other_towers_refresh,
                  seed=args.seed,
                  second_seed=args.second_seed,
                  config=[os.path.relpath(c, harness.REPO) for c in args.config],
                  overrides=list(ARM_OVERRIDES) + list(args.override or []))
  work_output = harness.Output(args.name, markdown, plot, directory=work)
  payload = harness.kept_result(work_output, settings, args.fresh, log) or dict(
      settings=settings, arms={}, starts={})
  earlier_seconds = payload.get("wall_seconds", 0.0)  # a rerun's finished arms took these
  payload.update(world=dict(blocks=len(world["blocks"]), x=len(world["x"]),
                            held_out=len(world["held_out"]), chance=knowledge.chance(world)),
                 work_dir=work, name=args.name)

  def save(partial: bool):
    payload.update(machine=harness.machine(), partial=partial,
                   wall_seconds=round(earlier_seconds + time.time() - started, 1),
                   verdict=verdict(payload["arms"], args))
    return work_output.write(payload)

  arms = harness.Arms(save)
  plan = {arm.name: arm for arm in arm_plan(args)}
  for name in arms.due(plan, kept=payload["arms"]):
    arm = plan[name]
    if arm.start not in payload["starts"]:
      payload["starts"][arm.start] = start_of(world, args, arm, work)
    payload["arms"][name] = run_arm(arm, world, payload["starts"][arm.start], args, work)
  arms.finish()
  return payload


def _fmt(value, digits=3):
  return "n/a" if value is None else f"{value:.{digits}f}"


def markdown(payload: dict) -> str:
  s, w, v = payload["settings"], payload["world"], payload["verdict"]
  lines = ["# Does the index refresh matter? (benchmarks/knowledge_staleness.py)", "",
           f"World: {w['blocks']} blocks, {w['x']} training sentences, {w['held_out']} held "
           f"out (chance {w['chance']:.3f}). Every arm: {s['steps']} steps of batch "
           f"{s['batch_size']}, k={s['num_candidates']}, learning rate {s['learning_rate']}, "
           f"both retriever towers trained at the reader's rate from step 0; the reader "
           f"pre-trained {s['reader_steps']} steps on own blocks, ICT {s['ict_steps']} steps at "
           f"rate {s['ict_learning_rate']} "
           f"(step-0 own-block top-1: " + ", ".join(
               f"{key} {start['step0_gold_top1']:.3f}"
               for key, start in sorted(payload["starts"].items())) + "). Configs "
           f"{' + '.join(s['config'])} with {' '.join(s['overrides'])}.", "",
           f"**Verdict: {v['verdict']}.** {v.get('reason', '')}", ""]
  other = v.get("other_towers") or {}
  arrangement = {"one": "one tower for queries and documents (a never-refreshed index cannot "
                        "be made up for by the query tower alone: it is the document tower)",
                 "two": "a query tower and a document tower (the query tower can learn to "
                        "keep to a stale index)"}
  lines[-2:-2] = [f"Retriever: {arrangement[s.get('towers', 'two')]}.", ""]
  for label, m in (("Manipulation check", v.get("manipulation")),
                   (f"Beside the verdict, {arrangement.get(other.get('towers'), '')}: its "
                    f"manipulation check", other.get("manipulation"))):
    if not m:
      continue
    lines += [f"{label} ({'holds' if m['holds'] else 'fails'}): the never-refreshed "
              f"index's overlap@k with an exact search of the current document tower at the "
              f"last step {m['never_overlap_at_k']:.3f} (needs < {MANIPULATION_OVERLAP}), its "
              f"document embeddings' mean cosine to step 0 {m['never_document_cosine']:.3f} "
              f"(needs < {MANIPULATION_COSINE}); refresh-10's lowest overlap@k "
              f"{m['refresh10_lowest_overlap_at_k']:.3f} (needs >= {FRESH_OVERLAP}).", ""]
  if other.get("gap") is not None:
    towers = "one tower" if other["towers"] == "one" else "two towers"
    lines += [f"Beside the verdict, with {towers}: refresh-10 minus never "
              f"{other['gap']:+.3f} held-out.", ""]
  lines += ["| arm | held-out span accuracy | own-block top-1, index searched / exact | "
            "overlap@k | document cosine to step 0 | index refreshes | index age at loop "
            "ends, mean / max steps | train s |",
            "|---|---|---|---|---|---|---|---|"]
  for name, r in payload["arms"].items():
    last, age = r["curve"][-1], r.get("index_staleness_steps") or {}
    age_text = f"{age['mean']} / {age['max']}" if age else "n/a"
    lines.append(
        f"| {name} | {r['heldout_span_accuracy']:.3f} ± {r['heldout_span_accuracy_stderr']:.3f}"
        f" | {last['top1_searched']:.3f} / {last['top1_exact']:.3f} | "
        f"{_fmt(last.get('overlap_at_k'))} | {_fmt(last.get('document_cosine_to_step0'))} | "
        f"{r['index_refreshes']} | {age_text} | {r['wall_seconds']} |")
  lines += ["", "At each evaluation point (step: held-out accuracy / own-block top-1 against "
            "the index searched / overlap@k / overlap@1 / document cosine to step 0):", "",
            "| arm | points |", "|---|---|"]
  for name, r in payload["arms"].items():
    lines.append(f"| {name} | " + "; ".join(
        f"{p['step']}: {_fmt(p.get('heldout_span_accuracy'))} / {p['top1_searched']:.3f} / "
        f"{_fmt(p.get('overlap_at_k'))} / {_fmt(p.get('overlap_at_1'))} / "
        f"{_fmt(p.get('document_cosine_to_step0'))}"
        for p in r["curve"]) + " |")
  mach = payload["machine"]
  lines += ["", "± one binomial standard error over the held-out sentences. The verdict's "
            f"rule: clear when the manipulation holds, refresh-10 minus never >= {CLEAR_GAP} "
            f"held-out, the same sign at the second seed and refresh-300 in between; null "
            f"when the gap < {NULL_GAP}; inconclusive otherwise.", "",
            f"Measured {mach['when']} on {mach['cpu_count']} CPUs (load average "
            f"{mach['load_average_1_5_15']}), {payload['wall_seconds']} s in all (target <= "
            f"{WALL_TARGET_SECONDS} s){', cut short' if payload.get('partial') else ''}. "
            f"Curves: {payload.get('name', 'knowledge_staleness')}_curves.png.", ""]
  if payload.get("notes"):  # what the figures alone do not say (set by hand after a run)
    lines += [payload["notes"], ""]
  return "\n".join(lines)


def plot(payload: dict, path: str):
  harness.plot_arm_curves(
      payload["arms"],
      [("curve", "heldout_span_accuracy", "held-out span accuracy"),
       ("curve", "overlap_at_k", "overlap@k, index searched vs exact"),
       ("curve", "top1_searched", "own-block top-1 (index searched)"),
       ("curve", "document_cosine_to_step0", "document cosine to step 0")],
      path, "Index refresh on the knowledge world (benchmarks/knowledge_staleness.py)",
      point_curves=("curve",))


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ints = lambda text: [int(x) for x in text.split(",") if x != ""]  # noqa: E731
  # The manipulation check's two arms first: a world where it fails shows it early.
  p.add_argument("--refresh", type=ints, default=[10, 0, 30, 100, 300],
                 help="refresh intervals in steps; 0 = never (the step-0 index)")
  p.add_argument("--second_seed_refresh", type=ints, default=[10, 0])
  p.add_argument("--towers", choices=("one", "two"), default="one",
                 help="the verdict's arms: one tower for queries and documents, or two")
  p.add_argument("--other_towers_refresh", type=ints, default=[10, 0],
                 help="intervals run with the other tower arrangement, beside the verdict")
  p.add_argument("--steps", type=int, default=600)
  p.add_argument("--batch_size", type=int, default=64)
  p.add_argument("--entities", type=int, default=600)
  p.add_argument("--x_templates", type=int, default=1)
  p.add_argument("--namesake_fraction", type=float, default=0.5,
                 help="share of entities with a namesake block (same first name)")
  p.add_argument("--blocks_per_entity", type=int, default=2, choices=(1, 2),
                 help="blocks stating all of an entity's facts, each in its own wording "
                      "(knowledge_world)")
  p.add_argument("--reader_steps", type=int, default=600)
  p.add_argument("--ict_steps", type=int, default=5)
  p.add_argument("--ict_learning_rate", type=float, default=3e-3,
                 help="the ICT warm start's rate (the start's strength stays put when the "
                      "arms' --learning_rate changes)")
  p.add_argument("--num_candidates", type=int, default=2)
  p.add_argument("--curve_every", type=int, default=100)
  p.add_argument("--learning_rate", type=float, default=3e-3)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--second_seed", type=int, default=1)
  p.add_argument("--config", action="append")
  p.add_argument("--override", action="append", help="extra dotted=value config overrides")
  p.add_argument("--work_dir", default="")
  p.add_argument("--fresh", action="store_true", help="start over, keeping no finished arm")
  p.add_argument("--no_write", action="store_true")
  p.add_argument("--name", default="knowledge_staleness")
  args = p.parse_args(argv)
  args.config = args.config or [os.path.join(harness.REPO, "configs", name)
                                for name in ("tiny.yaml", "knowledge.yaml")]
  for refresh in args.refresh + args.second_seed_refresh + args.other_towers_refresh:
    if refresh and args.steps % refresh:
      raise SystemExit(f"--steps {args.steps} must be a multiple of every refresh interval")
  if args.steps % args.curve_every:
    raise SystemExit(f"--steps {args.steps} must be a multiple of --curve_every")
  return args


def main(argv=None):
  args = parse_args(argv)
  started = time.time()
  payload = run(args, started)
  with open(harness.Output(args.name, directory=payload["work_dir"]).markdown_path) as f:
    print(f.read())
  if not args.no_write:
    log(f"wrote {harness.Output(args.name, markdown, plot).write(payload)}")


if __name__ == "__main__":
  main()
