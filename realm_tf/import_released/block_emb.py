"""The released block_emb as the run's committed index version, not re-embedded."""
from collections.abc import Sequence

import numpy as np

from realm_tf.import_released.release import BLOCK_EMB, Progress
from realm_tf.pretrained import released
from realm_tf.retrieval.index_export import ShardData, write_export


class BlockEmbShards(Sequence):
  """block_emb [N, P] as index shards of consecutive rows, each read when asked for (a
  lazy sequence, so write_export's one commit protocol writes them one at a time)."""

  def __init__(self, prefix: str, shape: tuple[int, int], num_shards: int):
    self.prefix, self.shape = prefix, shape
    self.bounds = [round(i * shape[0] / num_shards) for i in range(num_shards + 1)]
    self.progress = Progress("block_emb", shape[0])

  def __len__(self) -> int:
    return len(self.bounds) - 1

  def __getitem__(self, i: int):
    if not 0 <= i < len(self):
      raise IndexError(i)
    start, end = self.bounds[i], self.bounds[i + 1]
    rows = released.read_rows(self.prefix, BLOCK_EMB, self.shape, start, end - start)
    self.progress.update(end, force=True)
    return ShardData(rows, np.arange(start, end, dtype=np.int64))


def publish_block_emb(prefix: str, shape: tuple[int, int], index_dir: str, version: int,
                      num_shards: int, build_scann: bool) -> str:
  """Publishes block_emb as a committed index version, a shard at a time (write_export,
  the one commit protocol). Its document tower is the run's, at the run's step, so the
  index is not stale.

  Args:
    prefix: the checkpoint holding block_emb.
    shape: block_emb's shape [N, P].
    index_dir: the run's index directory.
    version: the version (the run's step).
    num_shards: shards of consecutive rows.
    build_scann: also build a ScaNN searcher per shard.
  Returns:
    The committed version's directory.
  """
  shards = BlockEmbShards(prefix, shape, min(num_shards, shape[0]))
  return write_export(index_dir, version, shards, build_scann=build_scann,
                      extra=dict(encoder=dict(step=version),
                                 source=dict(checkpoint=prefix, tensor=BLOCK_EMB)))
