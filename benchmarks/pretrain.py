"""REALM pre-training benchmark: speed with and without the index builder, and whether
retrieval becomes useful, against the same run with a frozen index.

    python -m benchmarks.pretrain [--steps 200] [--tagger_dir DIR] [--work_dir DIR]

Knowledge corpus Z: the first --wiki_records pages of the Wikipedia pages-articles sample,
cut into blocks by beam.preprocess. Pre-training corpus X: the same articles (REALM's
Wikipedia X = Z setting, where blocks of x's own article are excluded) plus the first
--news_records BBC articles, with salient spans from the tagger (--tagger_dir) and dates.
Sizes are cut to what a 2-core CPU can step through in minutes (see `overrides`). The
retriever is warm-started by a short ICT run; encoders start from MiniLM (configs/demo.yaml
with the overrides below, sized for a 2-core CPU). Two pre-training runs from the same
start: `refresh` (the index builder re-embeds Z every --refresh_every steps while training
goes on) and `frozen` (the first index is never refreshed, and no builder runs).
Results: benchmarks/results/pretrain.json.
"""
import argparse
import json
import os
import shutil
import tempfile
import time

import numpy as np
import tensorflow as tf

from benchmarks.common import SHARED_DATA, machine, write_result

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _preprocess(input_format: str, path: str, output_dir: str, tagger_dir: str = "",
                max_records: int = 0):
  from beam import preprocess  # pylint: disable=g-import-not-at-top
  if os.path.exists(os.path.join(output_dir, "manifest.json")):
    return
  args = ["--input_format", input_format, "--input", path, "--output_dir", output_dir,
          "--max_block_length", "128", "--query_length", "32",
          "--max_records", str(max_records)]
  if tagger_dir:
    args += ["--tagger_dir", tagger_dir]
  preprocess.main(args)


def _history(model_dir):
  """The train loops of a pre-training run (metrics.jsonl also holds evaluations)."""
  from realm_tf.io import layout  # pylint: disable=g-import-not-at-top
  return [r for r in layout.read_metrics(model_dir) if r.get("mode") == "pretrain"]


def _summary(history, batch_size: int, skip_first: int = 1) -> dict:
  """Means over the run's halves; the first loop (tracing, first index) is left out."""
  rows = history[skip_first:] or history
  half = len(rows) // 2
  mean = lambda key, part: float(np.mean([r[key] for r in part])) if part else float("nan")
  return dict(
      steps_per_second=mean("examples_per_second", rows) / batch_size,
      examples_per_second=mean("examples_per_second", rows),
      retrieval_utility_first_half=mean("retrieval_utility", rows[:half]),
      retrieval_utility_second_half=mean("retrieval_utility", rows[half:]),
      mlm_accuracy_first_half=mean("mlm_accuracy", rows[:half]),
      mlm_accuracy_second_half=mean("mlm_accuracy", rows[half:]),
      loss_first_half=mean("loss", rows[:half]), loss_second_half=mean("loss", rows[half:]),
      mean_index_staleness_steps=mean("index_staleness_steps", rows),
      index_refreshes=int(rows[-1]["index_refreshes"]))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=60)
  parser.add_argument("--ict_steps", type=int, default=30)
  parser.add_argument("--refresh_every", type=int, default=10)
  parser.add_argument("--batch_size", type=int, default=4)
  parser.add_argument("--tagger_dir", default="")
  parser.add_argument("--wiki_records", type=int, default=100)
  parser.add_argument("--news_records", type=int, default=300)
  parser.add_argument("--work_dir", default="")
  parser.add_argument("--runs", nargs="+", default=["refresh", "frozen"],
                      choices=["refresh", "frozen"],
                      help="which arms to (re)run; others are kept from the last result")
  args = parser.parse_args()

  from realm_tf.configs import load_config  # pylint: disable=g-import-not-at-top
  from realm_tf.training import train_lib  # pylint: disable=g-import-not-at-top

  work = args.work_dir or tempfile.mkdtemp(prefix="pretrain-bench-")
  wiki, news = os.path.join(work, "wiki"), os.path.join(work, "news")
  start = time.time()
  _preprocess("wikipedia_xml", os.path.join(SHARED_DATA, "wikipedia",
                                            "enwiki-pages-articles-sample.xml.bz2"), wiki,
              args.tagger_dir, args.wiki_records)
  _preprocess("ccnews", os.path.join(SHARED_DATA, "news", "bbc.jsonl"), news, args.tagger_dir,
              args.news_records)
  preprocess_seconds = time.time() - start
  overrides = [
      f"index.blocks={wiki}",
      f"task.pretrain.train_data.input_path={wiki}/pretraining-*,{news}/pretraining-*",
      f"task.pretrain.train_data.global_batch_size={args.batch_size}",
      "trainer.learning_rate=5e-5", "trainer.warmup_steps=20",
      f"trainer.summary_interval={args.refresh_every}",
      f"trainer.steps_per_loop={args.refresh_every}",
      f"trainer.checkpoint_interval={args.steps}", "model.retriever.query_seq_length=32",
      "model.retriever.block_seq_length=128", "model.reader.seq_length=128",
      "task.pretrain.num_candidates=4", "task.pretrain.max_predictions_per_seq=6",
      "index.backend=exact", "index.num_shards=1", "index.poll_seconds=2",
      "model.encoder.dropout_rate=0.0", "model.encoder.attention_dropout_rate=0.0"]
  demo = os.path.join(REPO, "configs", "demo.yaml")

  ict_dir = os.path.join(work, "ict")
  start = time.time()
  if not os.path.exists(os.path.join(ict_dir, "export")):
    train_lib.run_experiment(load_config(demo, overrides + [
        "task.type=ict", f"task.ict.train_data.input_path={wiki}/ict-*",
        f"trainer.train_steps={args.ict_steps}", "task.ict.train_data.global_batch_size=8"]),
                             ict_dir, tf.distribute.get_strategy())
  ict_seconds = time.time() - start

  results = {}
  # `frozen`: the builder embeds the step-0 snapshot once (same ICT start as `refresh`),
  # then idles, since no further snapshots are exported.
  for name, refresh in (("refresh", args.refresh_every), ("frozen", 0)):
    if name not in args.runs:
      continue
    model_dir = os.path.join(work, name)
    shutil.rmtree(model_dir, ignore_errors=True)
    config = load_config(demo, overrides + [
        "task.type=pretrain", f"trainer.train_steps={args.steps}",
        f"task.pretrain.refresh_every_steps={refresh}",
        f"task.pretrain.init_checkpoint={ict_dir}", "task.pretrain.start_index_builder=true"])
    start = time.time()
    result = train_lib.run_experiment(config, model_dir, tf.distribute.get_strategy())
    history = _history(model_dir)
    results[name] = dict(seconds=time.time() - start, result=result,
                         summary=_summary(history, args.batch_size),
                         curve=[{k: r[k] for k in (
                             "step", "loss", "mlm_accuracy", "retrieval_utility",
                             "null_document_probability", "index_version",
                             "index_staleness_steps", "examples_per_second")}
                                for r in history])
    print(name, json.dumps(results[name]["summary"]), flush=True)
  previous = os.path.join(os.path.dirname(__file__), "results", "pretrain.json")
  if set(args.runs) != {"refresh", "frozen"} and os.path.exists(previous):
    with open(previous) as f:
      results = dict(json.load(f)["runs"], **results)

  payload = dict(machine=machine(), settings=dict(
      steps=args.steps, ict_steps=args.ict_steps, refresh_every_steps=args.refresh_every,
      batch_size=args.batch_size, overrides=overrides, config="configs/demo.yaml",
      salient_spans="tagger + dates" if args.tagger_dir else "dates only"),
      corpus=dict(Z=f"wikipedia/enwiki-pages-articles-sample.xml.bz2 (first "
                    f"{args.wiki_records} pages)",
                  X=[f"wikipedia/enwiki-pages-articles-sample.xml.bz2 (same pages)",
                     f"news/bbc.jsonl (first {args.news_records} articles)"]),
      preprocess_seconds=preprocess_seconds, ict_seconds=ict_seconds, runs=results)
  print(write_result("pretrain", payload))


if __name__ == "__main__":
  main()
