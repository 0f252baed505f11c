"""Embed the corpus blocks with a block-encoder snapshot into a sharded, versioned index.

    python -m beam.embed_corpus --blocks corpus/ --encoder model_dir/export/block_encoder \\
        --output_dir index/ --num_shards 8 [--version V] [--batch_size 64] \\
        [--scann_overrides '{"num_leaves_to_search": 100}'] [--embedding_dtype float16] \\
        [--no_scann] [runner options, e.g. --runner DataflowRunner --project P
         --region R --temp_location gs://... --setup_file ./setup.py]

  ReadBlocks ─ EmbedBlocks (RunInference) ─ WriteIndexShards ─ CommitIndex
                                              (ScaNN per shard)  (manifest, rename, GC)

Shards are written into a temporary export directory; the version (by default the
encoder's training step) becomes visible only when CommitIndex commits it. Flags this
module does not know go untouched to Beam's PipelineOptions.
"""
import argparse
import json
import logging
import sys
import time
from typing import Optional, Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from beam.transforms.embedding import (
    CommitIndex, EmbedBlocks, ReadBlocks, WriteIndexShards, blocks_pattern)
from realm_tf.io import versioned


def parse_args(argv: Sequence[str]):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--blocks", required=True,
                      help="corpus pipeline output directory (its blocks-* TFRecords)")
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
  return parser.parse_known_args(argv)


def resolve_encoder(path: str) -> versioned.Version:
  try:
    return versioned.read_version(path)
  except versioned.VersionError:
    latest = versioned.latest_version(path)
    if latest is None:
      raise SystemExit(f"{path}: no committed encoder export") from None
    return latest


def run(argv: Optional[Sequence[str]] = None) -> str:
  """Runs the pipeline to completion; returns the committed export path."""
  args, beam_args = parse_args(sys.argv[1:] if argv is None else argv)
  if args.num_shards < 1:
    raise SystemExit("--num_shards must be at least 1")
  encoder = resolve_encoder(args.encoder)
  version = encoder.manifest.get("step", 0) if args.version is None else args.version
  export_dir = versioned.new_tmp_dir(args.output_dir, version)
  manifest = dict(
      encoder=dict(path=encoder.path, step=encoder.manifest.get("step"),
                   fingerprint=encoder.manifest.get("fingerprint"),
                   kind=encoder.manifest.get("kind"),
                   committed_at=encoder.manifest.get("committed_at")),
      blocks=args.blocks, dimension=encoder.manifest.get("dimension", 0),
      embedding_dtype=args.embedding_dtype, started_at=time.time())
  logging.info("Embedding %s with %s into %s (version %d, %d shards)", args.blocks,
               encoder.path, args.output_dir, version, args.num_shards)
  with beam.Pipeline(options=PipelineOptions(beam_args, save_main_session=False)) as p:
    _ = (p
         | "ReadBlocks" >> ReadBlocks(blocks_pattern(args.blocks))
         | "EmbedBlocks" >> EmbedBlocks(encoder.path, args.batch_size)
         | "WriteIndexShards" >> WriteIndexShards(
             export_dir, args.num_shards, build_scann=not args.no_scann,
             scann_overrides=json.loads(args.scann_overrides),
             embedding_dtype=args.embedding_dtype)
         | "CommitIndex" >> CommitIndex(export_dir, args.output_dir, version, manifest,
                                        args.num_shards, args.keep_versions))
  return versioned.read_version(
      f"{args.output_dir.rstrip('/')}/{versioned.version_name(version)}").path


if __name__ == "__main__":
  logging.getLogger().setLevel(logging.INFO)
  print(run())
