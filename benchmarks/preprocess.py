"""Corpus pipeline benchmark: pages/s and blocks/s of `beam.preprocess` on the DirectRunner.

    python -m benchmarks.preprocess [--corpora wikipedia_xml,vital_articles,bbc]
                                    [beam options, e.g. --direct_num_workers 2
                                     --direct_running_mode multi_processing]

Each shared corpus runs the whole pipeline (read, parse, dedup, blocks, pre-training
examples with date spans, ICT examples, outputs, manifest) once, in this process, on the
full file. Seconds are wall time of `beam.preprocess.run`, start to published output, so
they include pipeline start-up (a few seconds, which dominates the small XML sample).
  pages/s   input records (pages or JSON lines) read per second;
  blocks/s  blocks written per second.
Results: the `pipelines` key of benchmarks/results/preprocess.json (the tagger benchmark
writes its own key into the same file), rendered with that key into preprocess.md
(`--markdown_only` re-renders it from the committed JSON).
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

from benchmarks import harness
from benchmarks.harness import SHARED_DATA, machine
from realm_tf.pipelines import preprocess
from realm_tf.pipelines.preprocess import PreprocessConfig

CORPORA = {
    "wikipedia_xml": ("wikipedia_xml", "wikipedia/enwiki-pages-articles-sample.xml.bz2"),
    "vital_articles": ("jsonl", "wikipedia/vital_articles.jsonl"),
    "bbc": ("ccnews", "news/bbc.jsonl"),
}


def measure(input_format: str, path: str, beam_args) -> dict:
  work = tempfile.mkdtemp(prefix="preprocess_bench_")
  try:
    config = PreprocessConfig(input_format=input_format, input=path,
                              output_dir=os.path.join(work, "out"))
    start = time.perf_counter()
    manifest = preprocess.run_preprocess(config, beam_args)
    seconds = time.perf_counter() - start
  finally:
    shutil.rmtree(work, ignore_errors=True)
  counts = manifest["counts"]
  return {"input": os.path.relpath(path, SHARED_DATA), "input_format": input_format,
          "seconds": round(seconds, 2),
          "pages_per_s": round(counts["records_in"] / seconds, 2),
          "blocks_per_s": round(counts["blocks"] / seconds, 2),
          "counts": counts}


def markdown(result: dict) -> str:
  """benchmarks/results/preprocess.md: one row per corpus, and the tagger's throughput."""
  lines = ["# Corpus pipeline benchmark (benchmarks/preprocess.py)", ""]
  pipelines = result.get("pipelines")
  if pipelines:
    m = pipelines["machine"]
    lines += [f"`beam.preprocess` on the {pipelines['runner']}, whole pipeline (read, parse, "
              "dedup, blocks, pre-training examples with date spans, ICT examples, manifest), "
              "one run per corpus; seconds are wall time including pipeline start-up. "
              f"Machine: {m['cpu_count']} CPUs, TF {m['tensorflow']}, {m['when']}; "
              f"Beam arguments: {' '.join(pipelines['beam_args']) or 'none'}.", "",
              "| corpus | format | seconds | pages/s | blocks/s | records in | accepted | "
              "blocks | pre-training sentences (with spans) | ICT examples | set aside |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name, row in pipelines["corpora"].items():
      c = row["counts"]
      aside = {**c["set_aside"].get("bad_input", {}), **c["set_aside"].get("by_rule", {})}
      lines.append(
          f"| {name} (`{row['input']}`) | {row['input_format']} | {row['seconds']} | "
          f"{row['pages_per_s']} | {row['blocks_per_s']} | {c['records_in']:,} | "
          f"{c['accepted']:,} | {c['blocks']:,} | {c['pretraining_examples']:,} "
          f"({c['pretraining_examples_with_spans']:,}) | {c['ict_examples']:,} | "
          f"{', '.join(f'{k} {v}' for k, v in sorted(aside.items())) or '-'} |")
    lines.append("")
  tagger = result.get("tagger")
  if tagger:
    lines += ["## Salient-span tagger throughput", "",
              f"Written by `benchmarks/tagger.py` (see tagger.md): {tagger['source']}, "
              f"{tagger['sentences']:,} sentences of {tagger['mean_characters']} characters "
              f"on average, batches of {tagger['batch_size']}: "
              f"**{tagger['sentences_per_second']} sentences/s** (best of {tagger['repeats']} "
              f"passes; median {tagger['sentences_per_second_median']}). Machine: "
              f"{tagger['machine']['cpu_count']} CPUs, {tagger['machine']['when']}.", ""]
  return "\n".join(lines)


def parse_args(argv=None):
  """The flags, and the Beam arguments passed through to every pipeline."""
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--corpora", default=",".join(CORPORA))
  parser.add_argument("--markdown_only", action="store_true",
                      help="only re-render preprocess.md from the committed preprocess.json")
  return parser.parse_known_args(argv)


def run(args, beam_args) -> dict:
  """Each corpus of --corpora through the whole pipeline."""
  results = {}
  for name in args.corpora.split(","):
    input_format, relative = CORPORA[name]
    results[name] = measure(input_format, os.path.join(SHARED_DATA, relative), beam_args)
    print(f"{name}: {results[name]['pages_per_s']} pages/s, "
          f"{results[name]['blocks_per_s']} blocks/s ({results[name]['seconds']} s)")
  return {"runner": "DirectRunner", "beam_args": beam_args, "machine": machine(),
          "corpora": results}


def main(argv=None) -> int:
  args, beam_args = parse_args(argv)
  output = harness.Output("preprocess", markdown)
  if args.markdown_only:
    print(f"wrote {output.render()}")
    return 0
  # Merged: the tagger's throughput (benchmarks/tagger.py) stays beside these.
  path = output.write({"pipelines": run(args, beam_args)}, merge=True)
  print(f"wrote {path} and {output.markdown_path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
