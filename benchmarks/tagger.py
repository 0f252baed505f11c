"""Salient-span tagger benchmark: entity F1 and tagging throughput of an exported tagger.

    python -m benchmarks.tagger [--tagger_dir runs/tagger] [--batch_size 64]

Train the tagger first (`python -m realm_tf.tagger train --conll_dir ../shared/data/ner/
conll2003 --output_dir runs/tagger`). Measured on the export itself, through the same
serving signature the Beam step calls:
  F1         entity-level (seqeval) on eng.testb (test) and eng.testa (dev), per type too;
  throughput sentences/s over eng.testb's sentences as raw text, in file order (so batches
             mix lengths, as in a pipeline), batched, after one warm-up batch.
Results: benchmarks/results/tagger.json and tagger.md, and the `tagger` key of
preprocess.json (the corpus pipeline's throughput figures). `--markdown_only` re-renders
tagger.md from the committed tagger.json.
"""
import argparse
import os
import statistics
import time

from benchmarks import harness, preprocess
from benchmarks.harness import SHARED_DATA, machine
from realm_tf.tagger.conll import read_sentences
from realm_tf.tagger.evaluation import evaluate_sentences
from realm_tf.tagger.export import read_manifest
from realm_tf.tagger.inference import SavedTagger



def throughput(tagger: SavedTagger, texts: list[str], batch_size: int, repeats: int) -> dict:
  """Sentences/s of batched tagging; the best of `repeats` passes (others share the CPU)."""
  tagger(texts[:batch_size])  # warm-up: first-call tracing and memory allocation
  rates = []
  for _ in range(repeats):
    start = time.perf_counter()
    for begin in range(0, len(texts), batch_size):
      tagger(texts[begin:begin + batch_size])
    rates.append(len(texts) / (time.perf_counter() - start))
  return {"sentences_per_second": round(max(rates), 1),
          "sentences_per_second_median": round(statistics.median(rates), 1),
          "batch_size": batch_size, "sentences": len(texts), "repeats": repeats,
          "mean_characters": round(sum(map(len, texts)) / len(texts), 1)}


def markdown(result: dict) -> str:
  """benchmarks/results/tagger.md: entity F1 per split and type, and throughput."""
  model, speed, m = result["model"], result["throughput"], result["machine"]
  enc = model["encoder"]
  types = sorted(result["test"]["per_type_f1"])
  lines = ["# Salient-span tagger benchmark (benchmarks/tagger.py)", "",
           f"The exported tagger: a {enc['num_layers']}-layer, {enc['hidden_size']}-wide BERT "
           f"token classifier warm-started from {model['warm_start']}, fine-tuned on "
           f"CoNLL-2003 eng.train for {model['epochs']} epochs ({result['training_steps']} "
           f"steps of {model['batch_size']}, {result['training_examples']:,} examples, "
           f"sequence length {model['seq_length']}, learning rate {model['learning_rate']}) "
           f"in {result['training_seconds']:.0f} s. Machine: {m['cpu_count']} CPUs, "
           f"TF {m['tensorflow']}, {m['when']}.", "",
           "Entity-level F1 (seqeval), measured on the export through the serving signature "
           "the Beam step calls:", "",
           "| split | sentences | precision | recall | F1 | "
           + " | ".join(f"F1 {t}" for t in types) + " |",
           "|---|---:|---:|---:|---:|" + "---:|" * len(types)]
  for label, key in (("eng.testa (dev)", "dev"), ("eng.testb (test)", "test")):
    s = result[key]
    lines.append(f"| {label} | {s['sentences']:,} | {s['precision']:.3f} | {s['recall']:.3f} | "
                 f"**{s['f1']:.3f}** | "
                 + " | ".join(f"{s['per_type_f1'][t]:.3f}" for t in types) + " |")
  lines += ["", f"Throughput: {speed['source']}, {speed['sentences']:,} sentences of "
            f"{speed['mean_characters']} characters on average, batches of "
            f"{speed['batch_size']}: **{speed['sentences_per_second']} sentences/s** (best of "
            f"{speed['repeats']} passes; median {speed['sentences_per_second_median']}).", ""]
  return "\n".join(lines)


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--tagger_dir", default=os.path.join(harness.REPO, "runs", "tagger"))
  parser.add_argument("--conll_dir", default=os.path.join(SHARED_DATA, "ner", "conll2003"))
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--markdown_only", action="store_true",
                      help="only re-render tagger.md from the committed tagger.json")
  return parser.parse_args(argv)


def run(args) -> dict:
  """The export's F1 on dev and test and its throughput."""
  manifest = read_manifest(args.tagger_dir)
  tagger = SavedTagger(args.tagger_dir)
  test = read_sentences(os.path.join(args.conll_dir, "eng.testb"))
  dev = read_sentences(os.path.join(args.conll_dir, "eng.testa"))
  test_scores = evaluate_sentences(tagger, test, batch_size=args.batch_size)
  dev_scores = evaluate_sentences(tagger, dev, batch_size=args.batch_size)
  speed = throughput(tagger, [" ".join(s.tokens) for s in test], args.batch_size,
                     args.repeats)
  speed["source"] = "eng.testb sentences as raw text, file order"

  training = manifest["training"]
  config = manifest["config"]
  result = {
      "test_f1": test_scores["f1"],
      "dev_f1": dev_scores["f1"],
      "test": test_scores,
      "dev": dev_scores,
      "per_type_test_f1": test_scores["per_type_f1"],
      "training_seconds": round(training["seconds"], 1),
      "training_steps": training["steps"],
      "training_examples": training["examples"],
      "model": {"encoder": config["encoder"], "warm_start": config["warm_start"]["source"],
                "epochs": config["epochs"], "batch_size": config["batch_size"],
                "seq_length": config["seq_length"], "learning_rate": config["learning_rate"]},
      "throughput": speed,
      "tagger_dir": os.path.abspath(args.tagger_dir),
      "machine": machine(),
  }
  print(f"test F1 {result['test_f1']:.4f}  dev F1 {result['dev_f1']:.4f}  "
        f"{speed['sentences_per_second']} sentences/s (batch {args.batch_size})")
  return result


def main(argv=None) -> None:
  args = parse_args(argv)
  output = harness.Output("tagger", markdown)
  if args.markdown_only:
    print(output.render())
    return
  result = run(args)
  output.write(result)
  print(output.markdown_path)
  # The corpus pipeline's throughput figures are read together: the tagger's beside them.
  pipelines = harness.Output("preprocess", preprocess.markdown)
  pipelines.write({"tagger": {**result["throughput"], "machine": result["machine"]}},
                  merge=True)
  print(pipelines.markdown_path)


if __name__ == "__main__":
  main()
