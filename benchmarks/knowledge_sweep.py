"""Where REALM's asynchronous index refresh matters: a sweep of the retriever's warm start
(ICT steps) against the refresh interval, on the knowledge world.

    python -m benchmarks.knowledge_sweep [--ict_steps 0,30,100,300]
        [--refresh 10,100,0] [--steps 600] [--batch_size 64] [--entities 2000] [--seed 0]
        [--override k=v] [--work_dir DIR] [--no_write] [--name knowledge_sweep]

Why: the paper's ablation (Guu et al., 2020, Table 2) refreshes the index 30x less often
and loses about 10 EM; with a strong ICT warm start on this world the frozen index's query
tower adapts on its own (benchmarks/results/knowledge.md), so the question is at which
warm-start strength a stale document tower costs something.

Per ICT setting: one ICT run (0: none, the seeded random retriever) and its step-0
own-block top-1; then per refresh interval one REALM pre-training run from it (0 = never:
the step-0 index, published once, as benchmarks.knowledge's frozen arm) with the same
seed, steps and batch. Measured per run: held-out span accuracy and the own-block top-1
under that run's final towers (query tower against the document tower its index was built
with: the trained one when refreshed, the step-0 one when never). Lean on purpose (no
curves, no knowledge edit, no per-attribute split: benchmarks.knowledge has them), so a
cell is minutes. Results: benchmarks/results/<--name>.{json,md}.
"""
import argparse
import gc
import json
import os
import tempfile
import time

import tf_keras

from benchmarks import harness, knowledge
from realm_tf.training import train_lib


log = harness.logger("knowledge_sweep")


def run_cell(world: dict, args, work: str, ict_dir: str, refresh: int) -> dict:
  """One REALM pre-training run: refresh every `refresh` steps (0: the step-0 index)."""
  arm = "realm" if refresh else "frozen"
  cell_args = argparse.Namespace(**dict(vars(args), refresh_every=refresh or args.steps,
                                        curve_every=args.steps))
  model_dir = os.path.join(work, f"refresh-{refresh}")
  config = knowledge.arm_config(arm, world["dir"], cell_args, ict_dir)
  result, final, wall, start, trained, _ = knowledge.train_arm(arm, config, model_dir)
  # With whether refreshing could have mattered: the last index searched against the last
  # towers.
  kinds, staleness = knowledge.final_point(config, model_dir, world, start, trained,
                                           frozen=arm == "frozen")
  tf_keras.backend.clear_session()
  gc.collect()
  return dict(refresh_every=refresh, heldout_span_accuracy=final.get("span_accuracy"),
              gold_top1=kinds["own"], top1_kinds=kinds, staleness=staleness,
              index_refreshes=result.get("index_refreshes", 0), wall_seconds=round(wall, 1))


def run(args) -> dict:
  work = args.work_dir or tempfile.mkdtemp(prefix="realm_tf_knowledge_sweep_")
  world = knowledge.write_world(work, args)
  world_dir = world["dir"]
  log(f"world: {len(world['blocks'])} blocks, {len(world['x'])} x, "
      f"{len(world['held_out'])} held out")
  rows = []
  for ict_steps in args.ict_steps:
    setting = os.path.join(work, f"ict-{ict_steps}")
    ict_dir = ""
    if ict_steps:
      ict_dir = os.path.join(setting, "ict")
      train_lib.run_experiment(knowledge.ict_config(
          world_dir, argparse.Namespace(**dict(vars(args), ict_steps=ict_steps))), ict_dir)
      tf_keras.backend.clear_session()
    config = knowledge.arm_config("realm", world_dir, argparse.Namespace(
        **dict(vars(args), refresh_every=args.steps, curve_every=args.steps)), ict_dir)
    start = knowledge.retriever_from(config)
    step0 = knowledge.gold_top1(config, start, start, world)
    tf_keras.backend.clear_session()
    log(f"ICT {ict_steps} steps: step-0 own-block top-1 {step0:.3f}")
    for refresh in args.refresh:
      cell = run_cell(world, args, setting, ict_dir, refresh)
      cell.update(ict_steps=ict_steps, step0_gold_top1=step0)
      rows.append(cell)
      with open(os.path.join(work, "cells.jsonl"), "a") as f:  # kept if the sweep is cut
        f.write(json.dumps(cell) + "\n")
      log(f"ICT {ict_steps}, refresh {refresh or 'never'}: held-out "
          f"{cell['heldout_span_accuracy']:.3f}, own-block top-1 {cell['gold_top1']:.3f}, "
          f"{cell['wall_seconds']} s")
  return dict(settings=dict(steps=args.steps, batch_size=args.batch_size,
                            entities=args.entities, x_templates=args.x_templates,
                            num_candidates=args.num_candidates, seed=args.seed,
                            learning_rate=args.learning_rate, ict_steps=args.ict_steps,
                            refresh=args.refresh, overrides=args.override or [],
                            config=[os.path.relpath(c, knowledge.REPO) for c in args.config]),
              world=dict(blocks=len(world["blocks"]), x=len(world["x"]),
                         held_out=len(world["held_out"]), chance=knowledge.chance(world)),
              cells=rows, refresh_gains=refresh_gains(rows), machine=harness.machine(),
              work_dir=work)


def refresh_gains(rows: list[dict]) -> list[dict]:
  """Per ICT setting: the best refreshed cell minus the never-refreshed one, on held-out
  accuracy and own-block top-1, and whether either gain reaches knowledge.REFRESH_MARGIN."""
  out = []
  for ict in sorted({r["ict_steps"] for r in rows}):
    cells = [r for r in rows if r["ict_steps"] == ict]
    never = next((r for r in cells if not r["refresh_every"]), None)
    refreshed = [r for r in cells if r["refresh_every"]]
    if never is None or not refreshed:
      continue
    accuracy = max(r["heldout_span_accuracy"] for r in refreshed) - never["heldout_span_accuracy"]
    top1 = max(r["gold_top1"] for r in refreshed) - never["gold_top1"]
    out.append(dict(ict_steps=ict, accuracy_gain=round(accuracy, 4), top1_gain=round(top1, 4),
                    met=max(accuracy, top1) >= knowledge.REFRESH_MARGIN))
  return out


def markdown(payload: dict) -> str:
  s, w = payload["settings"], payload["world"]
  lines = ["# Where the index refresh matters (benchmarks/knowledge_sweep.py)", "",
           f"World: {w['blocks']} blocks, {w['x']} training sentences, {w['held_out']} "
           f"held out (chance {w['chance'] if w['chance'] is None else format(w['chance'], '.3f')}). Each cell: REALM pre-training, "
           f"{s['steps']} steps of batch {s['batch_size']}, k={s['num_candidates']}, "
           f"learning rate {s['learning_rate']}, seed {s['seed']}, configs "
           f"{' + '.join(s['config'])} with {' '.join(s['overrides']) or 'no overrides'}; "
           "refresh 'never' is the step-0 index (its query tower still trains).", "",
           "| ICT steps | step-0 own-block top-1 | refresh every | held-out span accuracy | "
           "own-block top-1 after | index refreshes | train s |",
           "|---|---|---|---|---|---|---|"]
  for r in payload["cells"]:
    lines.append(f"| {r['ict_steps']} | {r['step0_gold_top1']:.3f} | "
                 f"{r['refresh_every'] or 'never'} | {r['heldout_span_accuracy']:.3f} | "
                 f"{r['gold_top1']:.3f} | {r['index_refreshes']} | {r['wall_seconds']} |")
  stale = [r for r in payload["cells"] if r.get("staleness")]
  if stale:
    lines += ["", "Staleness at the last step: the overlap of the top-k of the last index "
              "searched with an exact search of the last document tower (1.000: a refresh "
              "could not have changed what was retrieved), and the document embeddings' mean "
              "cosine to their step-0 rows (1.000: the document tower has not moved):", "",
              "| ICT steps | refresh every | index version searched | overlap@k | "
              "document cosine to step 0 |", "|---|---|---|---|---|"]
    for r in stale:
      t = r["staleness"]
      lines.append(f"| {r['ict_steps']} | {r['refresh_every'] or 'never'} | "
                   f"{t['index_version']} | {t['overlap_at_k']:.3f}@{t['k']} | "
                   f"{t['document_cosine_to_step0']:.3f} |")
  lines += ["", f"Refresh minus never (best refreshed cell; target: either gain >= "
            f"{knowledge.REFRESH_MARGIN} in at least one setting):", "",
            "| ICT steps | held-out accuracy gain | own-block top-1 gain | met |",
            "|---|---|---|---|"]
  for g in payload["refresh_gains"]:
    lines.append(f"| {g['ict_steps']} | {g['accuracy_gain']:+.3f} | {g['top1_gain']:+.3f} | "
                 f"{'yes' if g['met'] else 'no'} |")
  m = payload["machine"]
  lines += ["", f"Measured {m['when']} on {m['cpu_count']} CPUs (load average "
            f"{m['load_average_1_5_15']}), {payload['wall_seconds']} s in all.", ""]
  if payload.get("notes"):  # what the figures alone do not say, e.g. why a sweep was cut
    lines += [payload["notes"], ""]
  return "\n".join(lines)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
  p.add_argument("--ict_steps", type=ints, default=[0, 30, 100, 300])
  p.add_argument("--refresh", type=ints, default=[10, 100, 0],
                 help="refresh intervals in steps; 0 = never (the step-0 index)")
  p.add_argument("--steps", type=int, default=600)
  p.add_argument("--batch_size", type=int, default=64)
  p.add_argument("--entities", type=int, default=2000)
  p.add_argument("--x_templates", type=int, default=1)
  p.add_argument("--num_candidates", type=int, default=2)
  p.add_argument("--learning_rate", type=float, default=3e-3)
  p.add_argument("--curve_sentences", type=int, default=512)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--config", action="append")
  p.add_argument("--override", action="append", help="extra dotted=value config overrides")
  p.add_argument("--work_dir", default="")
  p.add_argument("--no_write", action="store_true")
  p.add_argument("--name", default="knowledge_sweep")
  args = p.parse_args(argv)
  args.config = args.config or [os.path.join(knowledge.REPO, "configs", name)
                                for name in ("tiny.yaml", "knowledge.yaml")]
  for refresh in args.refresh:
    if refresh and args.steps % refresh:
      raise SystemExit(f"--steps {args.steps} must be a multiple of every --refresh interval")
  return args


def main(argv=None):
  args = parse_args(argv)
  start = time.time()
  payload = run(args)
  payload["wall_seconds"] = round(time.time() - start, 1)
  payload["name"] = args.name
  # Kept with the run, written or not.
  work_output = harness.Output(args.name, markdown, directory=payload["work_dir"])
  work_output.write(payload)
  with open(work_output.markdown_path) as f:
    print(f.read())
  if not args.no_write:
    log(f"wrote {harness.Output(args.name, markdown).write(payload)}")


if __name__ == "__main__":
  main()
