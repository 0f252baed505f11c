"""Command line of realm_tf.pipelines.embed: blocks → sharded, versioned ScaNN index.

    python -m beam.embed_corpus --blocks corpus/ --encoder model_dir/export/block_encoder \\
        --output_dir index/ --num_shards 8 [--version V] [--batch_size 64] \\
        [--scann_overrides '{"num_leaves_to_search": 100}'] [--embedding_dtype float16] \\
        [--no_scann] [--large_model] [--model_copies N] [--unpublished_blocks]
        [runner options, e.g. --runner
        DataflowRunner --project P --region R --temp_location gs://... --setup_file ./setup.py]

Flags this module does not know go untouched to Beam's PipelineOptions.
"""
import argparse
import json
import logging
import sys
from typing import Optional, Sequence

from realm_tf.io import command_line
from realm_tf.pipelines.embed import EmbedConfig, embed_corpus, resolve_encoder  # noqa: F401


def parse_args(argv: Sequence[str]):
  """Known flags → an EmbedConfig; the rest is for Beam, untouched."""
  parser = argparse.ArgumentParser(prog="python -m beam.embed_corpus", allow_abbrev=False,
                                   description=__doc__.split("\n")[0])
  parser.add_argument("--blocks", required=True,
                      help="corpus pipeline output directory (its blocks-* TFRecords), "
                           "or a blocks file pattern inside one; read through its "
                           "manifest.json")
  parser.add_argument("--unpublished_blocks", action="store_true",
                      help="--blocks names TFRecords made by another tool (no "
                           "manifest.json): read what the pattern matches, unchecked")
  parser.add_argument("--encoder", required=True,
                      help="a committed block-encoder export, or a directory of them "
                           "(the newest is used)")
  parser.add_argument("--output_dir", required=True, help="index directory (versions go here)")
  parser.add_argument("--num_shards", type=int, default=1)
  parser.add_argument("--version", type=int, default=None,
                      help="export version (default: the encoder's training step)")
  parser.add_argument("--batch_size", type=int, default=64, help="blocks per encoder call")
  parser.add_argument("--no_scann", action="store_true",
                      help="write embeddings only (exact search)")
  parser.add_argument("--scann_overrides", default="{}",
                      help="JSON of ScannParams fields to override, e.g. num_leaves")
  parser.add_argument("--embedding_dtype", default="float32", choices=["float32", "float16"])
  parser.add_argument("--keep_versions", type=int, default=3)
  parser.add_argument("--large_model", action="store_true",
                      help="RunInference: one encoder per worker VM, shared by its SDK "
                           "processes, instead of one per process")
  parser.add_argument("--verbosity", choices=command_line.VERBOSITY_CHOICES, default="info",
                      help="debug: errors with their traceback (default: one line)")
  parser.add_argument("--model_copies", type=int, default=0,
                      help="RunInference: at most this many encoder copies per worker VM "
                           "(implies --large_model; 0: not capped)")
  args, beam_args = parser.parse_known_args(argv)
  try:
    overrides = json.loads(args.scann_overrides)
  except ValueError as e:
    parser.error(f"--scann_overrides is not JSON: {e}")
  config = EmbedConfig(
      blocks=args.blocks, encoder=args.encoder, output_dir=args.output_dir,
      num_shards=args.num_shards, version=args.version, batch_size=args.batch_size,
      build_scann=not args.no_scann, scann_overrides=overrides,
      embedding_dtype=args.embedding_dtype, keep_versions=args.keep_versions,
      large_model=args.large_model, model_copies=args.model_copies,
      unpublished_blocks=args.unpublished_blocks)
  try:
    config.validate()
  except ValueError as e:
    parser.error(str(e))
  return config, beam_args


def run(argv: Optional[Sequence[str]] = None) -> str:
  """Parses flags and runs the pipeline; returns the committed export path."""
  config, beam_args = parse_args(sys.argv[1:] if argv is None else argv)
  return embed_corpus(config, beam_args)


def main(argv: Optional[Sequence[str]] = None) -> int:
  debug, argv = command_line.split_verbosity(argv)
  with command_line.errors_reported("beam.embed_corpus", debug):
    print(run(argv))
  return 0


if __name__ == "__main__":
  logging.getLogger().setLevel(logging.INFO)
  sys.exit(main())
