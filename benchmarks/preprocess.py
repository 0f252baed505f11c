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
writes its own key into the same file).
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

from benchmarks.common import SHARED_DATA, machine, write_result
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


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--corpora", default=",".join(CORPORA))
  args, beam_args = parser.parse_known_args(argv)
  results = {}
  for name in args.corpora.split(","):
    input_format, relative = CORPORA[name]
    results[name] = measure(input_format, os.path.join(SHARED_DATA, relative), beam_args)
    print(f"{name}: {results[name]['pages_per_s']} pages/s, "
          f"{results[name]['blocks_per_s']} blocks/s ({results[name]['seconds']} s)")
  path = write_result("preprocess", {"pipelines": {
      "runner": "DirectRunner", "beam_args": beam_args, "machine": machine(),
      "corpora": results}}, merge=True)
  print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
