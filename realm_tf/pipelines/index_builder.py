"""The index builder: re-embeds the corpus for each new retriever snapshot.

Runs beside the trainer (another process, or other machines sharing model_dir on GCS):
  loop: newest <model_dir>/export/block_encoder version newer than the newest index?
          → embed.build_index → <model_dir>/index/<step>   (older snapshots are skipped:
            only the newest one is ever embedded)
        until <model_dir>/TRAINING_DONE appears (or max_builds builds are done).
"""
import dataclasses
import logging
import time
from typing import Optional, Sequence

from realm_tf.configs import load_config
from realm_tf.data.block_store import blocks_pattern
from realm_tf.io import layout, versioned
from realm_tf.pipelines import embed


@dataclasses.dataclass
class IndexBuilderConfig:
  model_dir: str
  blocks: str = ""  # corpus dir or blocks pattern ('': the run's data config)
  num_shards: int = 0  # 0: index.num_shards of the run's config
  poll_seconds: float = 5.0
  max_builds: int = 0  # stop after this many builds (0: until TRAINING_DONE)
  batch_size: int = 64
  large_model: bool = False
  model_copies: int = 0


def build_once(model_dir: str, blocks: str, index_dir: str, num_shards: int,
               backend: str, keep_versions: int, pipeline_args: Sequence[str] = (),
               batch_size: int = 64, large_model: bool = False,
               model_copies: int = 0) -> Optional[str]:
  """Embeds the newest snapshot if the index is behind it; returns the new index path."""
  snapshot = versioned.latest_version(layout.block_encoder_dir(model_dir))
  index = versioned.latest_version(index_dir)
  if snapshot is None or (index is not None and index.version >= snapshot.version):
    return None
  logging.info("Building index %d from %s", snapshot.version, snapshot.path)
  return embed.build_index(embed.EmbedConfig(
      blocks=blocks, encoder=snapshot.path, output_dir=index_dir, num_shards=num_shards,
      version=snapshot.version, build_scann=backend != "exact",
      keep_versions=keep_versions, batch_size=batch_size, large_model=large_model,
      model_copies=model_copies), pipeline_args)


def run_index_builder(config: IndexBuilderConfig, pipeline_args: Sequence[str] = ()) -> int:
  """Builds indexes until training is done; returns the number of builds."""
  run_config = load_config(layout.params_path(config.model_dir))
  blocks = blocks_pattern(config.blocks or run_config.index.blocks)
  index_dir = layout.index_dir(config.model_dir, run_config.index.index_dir)
  num_shards = config.num_shards or run_config.index.num_shards
  builds = 0
  while not layout.training_done(config.model_dir):
    try:
      built = build_once(config.model_dir, blocks, index_dir, num_shards,
                         run_config.index.backend, run_config.index.keep_versions,
                         pipeline_args, config.batch_size, config.large_model,
                         config.model_copies)
    except Exception:  # pylint: disable=broad-except
      # e.g. the snapshot went away before its lease was taken: a newer one will come.
      logging.exception("Index build failed; retrying with the newest snapshot")
      built = None
    if built:
      builds += 1
      logging.info("Published %s", built)
      if config.max_builds and builds >= config.max_builds:
        break
    else:
      time.sleep(config.poll_seconds)
  logging.info("Index builder done after %d builds", builds)
  return builds
