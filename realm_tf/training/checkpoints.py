"""The checkpoint a run resumes from: the newest one that reads back whole.

tf.train.CheckpointManager writes a checkpoint's files first and names it in the
`checkpoint` state file last (written atomically), so a trainer killed while saving leaves
the previous checkpoint as the newest; nothing more is needed for that. Damage on disk
afterwards (a truncated copy, a flipped bit) is another matter: the manager would pick the
damaged checkpoint and fail on restore, or worse, only later, when the optimizer creates
the slot variable whose tensor is damaged (those restores are deferred).

TensorFlow's tensor bundles already carry what is needed: the .index file lists every
tensor with its CRC32C, and reading a tensor checks it. `refuse_damaged` reads every tensor
of the newest checkpoint once, before the run restores anything; a damaged one is moved to
`<checkpoint dir>/damaged/`, dropped from the state file with a log line naming the
problem, and the next newest is tried. It costs one extra read of one checkpoint at start.
"""
import logging
import os
from typing import Optional

import tensorflow as tf

DAMAGED_DIR = "damaged"


class DamagedCheckpointsError(RuntimeError):
  """Every checkpoint of a run is damaged: starting over would silently lose the run."""


def verify_checkpoint(prefix: str) -> int:
  """Reads every tensor of the checkpoint at `prefix` (each read checks the tensor's
  CRC32C); returns the number of tensors. Raises (see refuse_damaged) for a missing,
  truncated or corrupted file."""
  # NewCheckpointReader takes the prefix as is (see layout.checkpoint_step on ram://).
  reader = tf.compat.v1.train.NewCheckpointReader(prefix)
  names = sorted(reader.get_variable_to_dtype_map())
  for name in names:
    reader.get_tensor(name)
  return len(names)


def _set_aside(prefix: str) -> str:
  """Moves the checkpoint's files into <dir>/damaged/ (kept for inspection, out of the
  manager's way: a later save with the same step number writes fresh files)."""
  directory, name = os.path.split(prefix)
  target_dir = os.path.join(directory, DAMAGED_DIR)
  tf.io.gfile.makedirs(target_dir)
  for path in tf.io.gfile.glob(prefix + ".*"):
    tf.io.gfile.rename(path, os.path.join(target_dir, os.path.basename(path)),
                       overwrite=True)
  return os.path.join(target_dir, name)


def refuse_damaged(directory: str) -> Optional[str]:
  """The newest checkpoint under `directory` that reads back whole (None: no checkpoint).

  Damaged newer checkpoints are set aside and dropped from the state file, so
  tf.train.CheckpointManager (and layout.checkpoint_step) see the good one as the newest.
  Raises DamagedCheckpointsError if checkpoints exist and none is readable.
  """
  state = tf.train.get_checkpoint_state(directory)
  if state is None or not state.model_checkpoint_path:
    return None
  paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
  times = list(state.all_model_checkpoint_timestamps)
  if len(times) != len(paths):
    times = []
  good = list(paths)
  while good:
    newest = good[-1]
    try:
      verify_checkpoint(newest)
      break
    # TF's reader raises OpError (DataLoss, NotFound, ...), IndexError ("Read less bytes
    # than requested") or ValueError depending on where the damage is.
    except (tf.errors.OpError, IndexError, ValueError) as e:
      moved = _set_aside(newest)
      good.pop()
      logging.error("Checkpoint %s is damaged and is refused (moved to %s): %s. Resuming "
                    "from %s.", newest, moved, str(e).splitlines()[0],
                    good[-1] if good else "nothing")
  if len(good) == len(paths):
    return good[-1]
  if not good:
    raise DamagedCheckpointsError(
        f"{directory}: every checkpoint is damaged (moved to {DAMAGED_DIR}/); refusing to "
        f"start the run over on top of them. Restore a copy, or remove the directory to "
        f"start from scratch.")
  tf.compat.v1.train.update_checkpoint_state(
      directory, os.path.basename(good[-1]),
      all_model_checkpoint_paths=[os.path.basename(p) for p in good],
      all_model_checkpoint_timestamps=times[:len(good)] or None,
      last_preserved_timestamp=state.last_preserved_timestamp)
  return good[-1]
