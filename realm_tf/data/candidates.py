"""Host-side retrieval of pre-training candidates.

REALM retrieves for each masked query x the top-k blocks under the *exported* query
encoder and the newest committed index; both are followed by watchers and swapped in while
training goes on. Blocks of x's own source document are dropped (no trivial retrievals).
Runs on the host, inside the input pipeline, so accelerators only see finished batches.
"""
import dataclasses
import logging
import threading
import time
from typing import Optional

import numpy as np
import tensorflow as tf

from realm_tf.data.block_store import BlockStore
from realm_tf.export.encoders import load_encoder
from realm_tf.io.versioned import Version
from realm_tf.io.watcher import VersionWatcher
from realm_tf.retrieval.watcher import IndexWatcher


@dataclasses.dataclass
class RetrievalStats:
  """What the last batches saw; read by the trainer for its metrics."""
  index_version: int = -1
  index_encoder_step: int = -1
  index_snapshot_time: float = 0.0
  query_encoder_step: int = -1
  trivial_dropped: int = 0
  padded: int = 0
  batches: int = 0


class CandidateRetriever:
  """retrieve(query inputs, doc uids) → the top `num_retrieved` non-trivial blocks."""

  def __init__(self, store: BlockStore, index_dir: str, query_encoder_dir: str,
               num_retrieved: int, exclusion_margin: int = 16, backend: str = "exact",
               rescore: bool = False, poll_seconds: float = 5.0):
    self.store = store
    self.num_retrieved = num_retrieved
    self.fetch = num_retrieved + exclusion_margin
    self.index = IndexWatcher(index_dir, backend=backend, rescore=rescore,
                              poll_seconds=poll_seconds)
    self.query_encoder = VersionWatcher(
        query_encoder_dir, lambda v: load_encoder(v.path, "embed_tokens"),
        poll_seconds=poll_seconds, name="query-encoder-watcher")
    self.stats = RetrievalStats()
    self._lock = threading.Lock()

  def start(self, timeout: Optional[float] = None) -> "CandidateRetriever":
    """Starts following both directories; waits only until each has a first version."""
    self.index.start()
    self.query_encoder.start()
    deadline = None if timeout is None else time.time() + timeout
    for watcher in (self.query_encoder, self.index):
      left = None if deadline is None else max(0.0, deadline - time.time())
      logging.info("Waiting for a first version under %s", watcher.root)
      if not watcher.wait_until_ready(left):
        raise TimeoutError(f"{watcher.root}: nothing committed within {timeout}s")
    return self

  def stop(self):
    self.index.stop()
    self.query_encoder.stop()

  def retrieve(self, input_word_ids: np.ndarray, input_mask: np.ndarray,
               input_type_ids: np.ndarray, doc_uids: np.ndarray):
    """Top non-trivial blocks for a batch of packed (masked) queries.

    Returns numpy arrays [B, n] (n = num_retrieved): block ids, titles, texts, and a
    float mask that is 0 where fewer than n non-trivial blocks were found.
    """
    index_version, searcher = self.index.current
    encoder_version, encode = self.query_encoder.current
    queries = encode(input_word_ids=tf.constant(input_word_ids, tf.int32),
                     input_mask=tf.constant(input_mask, tf.int32),
                     input_type_ids=tf.constant(input_type_ids, tf.int32))["embeddings"]
    found = searcher.search(queries, self.fetch).block_ids.numpy()  # [B, fetch]
    rows = self.store.rows(found)  # [B, fetch]
    trivial = self.store.doc_uids[rows] == np.asarray(doc_uids, object)[:, None]
    batch, n = len(found), self.num_retrieved
    out_rows = np.zeros([batch, n], np.int64)
    mask = np.zeros([batch, n], np.float32)
    for i in range(batch):  # B is small; per row keeps the rank order of what remains
      keep = rows[i][~trivial[i]][:n]
      out_rows[i, :len(keep)] = keep
      mask[i, :len(keep)] = 1.0
    with self._lock:
      self.stats = dataclasses.replace(
          self.stats, index_version=index_version.version,
          index_encoder_step=int(index_version.manifest.get("encoder", {}).get(
              "step", index_version.version)),
          index_snapshot_time=_snapshot_time(index_version),
          query_encoder_step=encoder_version.version,
          trivial_dropped=self.stats.trivial_dropped + int(trivial.sum()),
          padded=self.stats.padded + int((mask == 0).sum()), batches=self.stats.batches + 1)
    titles = np.where(mask > 0, self.store.titles[out_rows], b"")
    texts = np.where(mask > 0, self.store.texts[out_rows], b"")
    block_ids = np.where(mask > 0, self.store.block_ids[out_rows], -1)
    return block_ids, titles.astype(object), texts.astype(object), mask


def _snapshot_time(index_version: Version) -> float:
  """When the encoder snapshot behind an index was exported (its commit time)."""
  encoder = index_version.manifest.get("encoder", {})
  return float(encoder.get("committed_at") or index_version.manifest.get("started_at") or
               index_version.manifest.get("committed_at", 0.0))
