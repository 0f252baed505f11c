"""Command line: `python -m realm_tf.tagger train ...` and `... evaluate ...`.

  train     fine-tunes on <conll_dir>/eng.train, scores eng.testa (dev) and eng.testb
            (test), exports SavedModel + manifest.json to --output_dir
  evaluate  entity-level F1 of an exported tagger on one CoNLL-2003 file (JSON on stdout)
"""
import argparse
import json
import logging
import sys
from typing import Optional, Sequence

from realm_tf.io import command_line
from realm_tf.configs.loading import load_config
from realm_tf.tagger.config import TaggerConfig
from realm_tf.tagger.conll import read_sentences
from realm_tf.tagger.evaluation import evaluate_sentences
from realm_tf.tagger.inference import SavedTagger
from realm_tf.tagger.train import train_and_export

# Flags that override TaggerConfig fields of the same name.
_SCHEDULE_FLAGS = {"epochs": int, "max_steps": int, "batch_size": int, "seq_length": int,
                   "learning_rate": float, "seed": int}


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="python -m realm_tf.tagger", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  commands = parser.add_subparsers(dest="command", required=True)
  train = commands.add_parser("train", help="fine-tune, score and export the tagger")
  train.add_argument("--conll_dir", required=True,
                     help="directory with eng.train, eng.testa, eng.testb")
  train.add_argument("--output_dir", required=True, help="where the export is published")
  train.add_argument("--config", default=None, help="optional YAML of TaggerConfig fields")
  train.add_argument("--override", action="append", default=[],
                     help="TaggerConfig override such as encoder.dropout_rate=0.2")
  for flag, kind in _SCHEDULE_FLAGS.items():
    train.add_argument(f"--{flag}", type=kind, default=None,
                       help="overrides the config's value (defaults: TaggerConfig)")
  evaluate = commands.add_parser("evaluate", help="entity F1 of an exported tagger")
  evaluate.add_argument("--tagger_dir", required=True)
  evaluate.add_argument("--conll_file", required=True)
  evaluate.add_argument("--batch_size", type=int, default=64)
  return parser


def config_from_args(args):
  """TaggerConfig defaults, then --config YAML, then --override, then the schedule flags."""
  overrides = list(args.override) + [
      f"{flag}={getattr(args, flag)}" for flag in _SCHEDULE_FLAGS
      if getattr(args, flag) is not None]
  return load_config(args.config, overrides, config_cls=TaggerConfig)


def _train(args) -> dict:
  manifest = train_and_export(args.conll_dir, args.output_dir, config_from_args(args))
  return {"output_dir": args.output_dir, "scores": manifest["scores"],
          "training": manifest["training"]}


def _evaluate(args) -> dict:
  scores = evaluate_sentences(SavedTagger(args.tagger_dir), read_sentences(args.conll_file),
                              batch_size=args.batch_size)
  return {"tagger_dir": args.tagger_dir, "conll_file": args.conll_file, **scores}


def main(argv: Optional[Sequence[str]] = None) -> int:
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
  debug, argv = command_line.split_verbosity(argv)
  args = build_parser().parse_args(argv)
  with command_line.errors_reported("realm_tf.tagger", debug):
    result = _train(args) if args.command == "train" else _evaluate(args)
  json.dump(result, sys.stdout, indent=2)
  sys.stdout.write("\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
