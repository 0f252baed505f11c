"""The index builder: re-embeds the corpus for each new retriever snapshot.

    python -m beam.index_builder --model_dir DIR [--blocks PATTERN] [--num_shards N]
        [--poll_seconds 5] [runner options, passed to beam.embed_corpus]

Runs beside the trainer (another process, or other machines sharing the file system):
  loop: newest <model_dir>/export/block_encoder/<step>  newer than the newest index?
          → beam.embed_corpus → <model_dir>/index/<step>   (older snapshots are skipped:
            only the newest one is ever embedded)
        until <model_dir>/TRAINING_DONE appears.
"""
import argparse
import logging
import os
import sys
import time
from typing import Optional, Sequence

from beam import embed_corpus
from realm_tf.configs import load_config
from realm_tf.data import files as data_files
from realm_tf.io import versioned
from realm_tf.training import snapshots


def parse_args(argv: Sequence[str]):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model_dir", required=True)
  parser.add_argument("--blocks", default="",
                      help="corpus dir or blocks file pattern (default: the run's config)")
  parser.add_argument("--num_shards", type=int, default=0,
                      help="index shards (default: index.num_shards of the run's config)")
  parser.add_argument("--poll_seconds", type=float, default=5.0)
  parser.add_argument("--max_builds", type=int, default=0, help="stop after N builds (0: no)")
  return parser.parse_known_args(argv)


def build_once(model_dir: str, blocks: str, index_dir: str, num_shards: int,
               backend: str, keep_versions: int, beam_args: Sequence[str]) -> Optional[str]:
  """Embeds the newest snapshot if the index is behind it; returns the new index path."""
  snapshot = versioned.latest_version(snapshots.block_encoder_dir(model_dir))
  index = versioned.latest_version(index_dir)
  if snapshot is None or (index is not None and index.version >= snapshot.version):
    return None
  logging.info("Building index %d from %s", snapshot.version, snapshot.path)
  args = ["--blocks", blocks, "--encoder", snapshot.path, "--output_dir", index_dir,
          "--num_shards", str(num_shards), "--version", str(snapshot.version),
          "--keep_versions", str(keep_versions)]
  if backend == "exact":
    args.append("--no_scann")
  return embed_corpus.run(args + list(beam_args))


def main(argv: Optional[Sequence[str]] = None) -> int:
  args, beam_args = parse_args(sys.argv[1:] if argv is None else argv)
  config = load_config(os.path.join(args.model_dir, "params.yaml"))
  blocks = args.blocks or data_files.pattern(config.data, data_files.BLOCKS)
  index_dir = snapshots.index_dir(args.model_dir, config.index.index_dir)
  num_shards = args.num_shards or config.index.num_shards
  builds = 0
  while not snapshots.training_done(args.model_dir):
    try:
      built = build_once(args.model_dir, blocks, index_dir, num_shards,
                         config.index.backend, config.index.keep_versions, beam_args)
    except Exception:  # pylint: disable=broad-except
      # e.g. the snapshot was garbage-collected mid-build: a newer one will come.
      logging.exception("Index build failed; retrying with the newest snapshot")
      built = None
    if built:
      builds += 1
      logging.info("Published %s", built)
      if args.max_builds and builds >= args.max_builds:
        break
    else:
      time.sleep(args.poll_seconds)
  logging.info("Index builder done after %d builds", builds)
  return 0


if __name__ == "__main__":
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
  sys.exit(main())
