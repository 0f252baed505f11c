"""Command line of realm_tf.pipelines.index_builder: re-embeds each new snapshot.

    python -m beam.index_builder --model_dir DIR [--blocks PATTERN] [--num_shards N]
        [--poll_seconds S] [--max_builds N] [--large_model] [--model_copies N]
        [--claim_ttl_seconds 600] [--parent_pid PID] [--max_consecutive_failures 3]
        [--log_path PATH]
        [runner options, passed untouched to every embedding job]

  exit 3   it gave up after --max_consecutive_failures failed builds in a row; its last
           error is published in <model_dir>/INDEX_BUILDER_FAILED, where the trainer's
           wait for an index reads it (and on stderr, one line)
  (exit 2 and 1: usage and storage errors, as every command line: realm_tf.io.command_line)
"""
import argparse
import logging
import sys
from typing import Optional, Sequence

from realm_tf.io import command_line
from realm_tf.pipelines.index_builder import (  # noqa: F401
  BuilderGaveUp, IndexBuilderConfig, build_once, run_index_builder)

GAVE_UP_EXIT = 3


def _non_negative(text: str) -> int:
  value = int(text)
  if value < 0:
    raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
  return value


def parse_args(argv: Sequence[str]):
  parser = argparse.ArgumentParser(prog="python -m beam.index_builder", allow_abbrev=False,
                                   description=__doc__.split("\n")[0])
  parser.add_argument("--model_dir", required=True)
  parser.add_argument("--blocks", default="",
                      help="corpus dir or blocks file pattern (default: the run's config)")
  parser.add_argument("--num_shards", type=int, default=0,
                      help="index shards (default: index.num_shards of the run's config)")
  parser.add_argument("--poll_seconds", type=float, default=0.0,
                      help="seconds between looks for a new snapshot (default: "
                      "index.poll_seconds of the run's config)")
  parser.add_argument("--max_builds", type=int, default=0, help="stop after N builds (0: no)")
  parser.add_argument("--batch_size", type=int, default=64, help="blocks per encoder call")
  parser.add_argument("--large_model", action="store_true",
                      help="RunInference: one encoder per worker VM shared by its processes")
  parser.add_argument("--model_copies", type=int, default=0,
                      help="RunInference: at most this many encoder copies per worker VM")
  parser.add_argument("--claim_ttl_seconds", type=float, default=600.0,
                      help="several builders may share model_dir: a snapshot claimed by a "
                      "builder that died is taken over after this long")
  parser.add_argument("--parent_pid", type=int, default=0,
                      help="stop once this process (the trainer that started the builder) "
                      "has exited (0: never)")
  parser.add_argument("--max_consecutive_failures", type=_non_negative, default=3,
                      help="give up after N failed builds in a row: publish the last error "
                      "in model_dir/INDEX_BUILDER_FAILED (the trainer stops waiting) and "
                      f"exit {GAVE_UP_EXIT} (0: never give up)")
  parser.add_argument("--log_path", default="",
                      help="where this builder's output is kept, named in its published "
                      "failure (the trainer that starts it passes model_dir/"
                      "index_builder.log)")
  args, beam_args = parser.parse_known_args(argv)
  return IndexBuilderConfig(**vars(args)), beam_args


def main(argv: Optional[Sequence[str]] = None) -> int:
  debug, argv = command_line.split_verbosity(argv)
  with command_line.errors_reported("beam.index_builder", debug):
    config, beam_args = parse_args(argv)
    try:
      run_index_builder(config, beam_args)
    except BuilderGaveUp as e:  # not a bug: the failure is published, the log has the rest
      print(f"beam.index_builder: error: {e}", file=sys.stderr)
      return GAVE_UP_EXIT
  return 0


if __name__ == "__main__":
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
  sys.exit(main())
