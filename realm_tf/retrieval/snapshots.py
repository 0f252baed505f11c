"""Retriever snapshots handed from the trainer to the index builder, via the file system.

  <model_dir>/export/query_encoder/<step>/   QueryEncoder SavedModel (input pipeline)
  <model_dir>/export/block_encoder/<step>/   BlockEncoder SavedModel (index builder)
  <model_dir>/index/<step>/                  index built from that block encoder
  <model_dir>/TRAINING_DONE                  tells the index builder to stop
(paths from realm_tf.io.layout)

Writing a SavedModel of BERT takes seconds to minutes; the step loop must not wait for it.
A snapshot therefore copies the live weights into a shadow retriever (a fast in-memory
assign, so the snapshot is consistent) and saves the shadow on a background thread. If the
previous save is still running, that snapshot is skipped: the builder would have skipped
it anyway, as it always embeds the newest snapshot only.
"""
import logging
import threading
import time
from typing import Callable, Optional

from realm_tf.retrieval.encoders import BlockEncoder, QueryEncoder, export_encoder
from realm_tf.io import layout, versioned


def export_retriever(model_dir: str, step: int, retriever, tokenizer, config,
                     keep: int = 5) -> dict:
  """Exports both towers as version `step` (query encoder first: the index follows the
  block encoder, and the input pipeline may then pair a new index with its query side).

  Older snapshots beyond the newest `keep` are garbage-collected (leased ones stay).

  Args:
    model_dir: the run's directory (export/query_encoder/, export/block_encoder/).
    step: the training step, the snapshot's version.
    retriever: the Retriever whose towers are exported.
    tokenizer: the run's Tokenizer (saved with each tower).
    config: the run's ExperimentConfig (its retriever section is recorded).
    keep: snapshots kept per tower.

  Returns:
    {'query_encoder': path, 'block_encoder': path} of the committed versions.
  """
  retriever_config = config.model.retriever
  extra = dict(config=retriever_config.as_dict())
  paths = dict(
      query_encoder=export_encoder(
          QueryEncoder(retriever.query_embedder, tokenizer, retriever_config.query_seq_length),
          layout.query_encoder_dir(model_dir), step, extra),
      block_encoder=export_encoder(
          BlockEncoder(retriever.document_embedder, tokenizer,
                       retriever_config.block_seq_length),
          layout.block_encoder_dir(model_dir), step, extra))
  for root in (layout.query_encoder_dir(model_dir), layout.block_encoder_dir(model_dir)):
    versioned.garbage_collect(root, keep=keep)
  return paths


def latest_snapshot_step(model_dir: str) -> Optional[int]:
  """The step of the run's newest committed block-encoder snapshot, or None."""
  latest = versioned.latest_version(layout.block_encoder_dir(model_dir))
  return None if latest is None else latest.version


class SnapshotExporter:
  """Exports retriever snapshots without blocking training (see module docstring).

  Args:
    model_dir: the run's directory.
    live_retriever: the training model's retriever.
    build_shadow: builds a retriever of the same architecture; the live weights are copied
      into it (quickly, between train loops) and it is saved on a thread.
    tokenizer: the run's Tokenizer.
    config: the run's ExperimentConfig.
    keep: snapshots kept per tower.
  """

  def __init__(self, model_dir: str, live_retriever, build_shadow: Callable[[], object],
               tokenizer, config, keep: int = 5):
    self.model_dir = model_dir
    self.live = live_retriever
    self.shadow = build_shadow()
    self.tokenizer = tokenizer
    self.config = config
    self.keep = keep
    self._thread: Optional[threading.Thread] = None
    self.exported: list[int] = []
    self.skipped: list[int] = []
    self.errors: list[str] = []

  @property
  def busy(self) -> bool:
    """Whether an export is still saving."""
    return self._thread is not None and self._thread.is_alive()

  def snapshot(self, step: int, wait: bool = False) -> bool:
    """Starts exporting version `step` on a thread.

    Args:
      step: the training step (the snapshot's version).
      wait: wait for a running export first, and for this one to finish.

    Returns:
      True if started; False (recorded in `skipped`) if the previous export is still
      running and `wait` is False.
    """
    if self.busy:
      if not wait:
        self.skipped.append(step)
        logging.info("Snapshot at step %d skipped: the previous export is still saving", step)
        return False
      self._thread.join()
    for shadow_var, live_var in zip(self.shadow.variables, self.live.variables):
      shadow_var.assign(live_var.read_value())
    self._thread = threading.Thread(target=self._export, args=(step,),
                                    name=f"snapshot-{step}", daemon=True)
    self._thread.start()
    if wait:
      self._thread.join()
    return True

  def _export(self, step: int):
    start = time.time()
    try:
      export_retriever(self.model_dir, step, self.shadow, self.tokenizer, self.config,
                       self.keep)
      self.exported.append(step)
      logging.info("Snapshot of step %d exported in %.1fs", step, time.time() - start)
    except Exception as e:  # pylint: disable=broad-except
      # Training goes on with the previous snapshot; the error is reported at the end.
      self.errors.append(f"step {step}: {e}")
      logging.exception("Snapshot of step %d failed", step)

  def wait(self):
    """Blocks until the running export (if any) has finished."""
    if self._thread is not None:
      self._thread.join()
