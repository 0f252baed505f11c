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

An outage of the store is not damage (realm_tf.io.storage's rule: a store that cannot be
asked is neither "nothing there" nor a bad file). Setting a good checkpoint aside because
of a 503 at start-up would resume the run from an older one, or stop it. Two things make
that easy to get wrong:

- TF's checkpoint reader loses the error's kind: whatever failed underneath, it raises a
  plain OpError (code UNKNOWN), a ValueError ("Failed to get matching files on ...:
  ABORTED", what a 503 or a timeout on gs:// gives after TF's own retries) or an
  IndexError, as it does for a CRC mismatch or a truncated file. So a failed read is only
  a suspicion. It is proven damage when the checkpoint's files, copied whole through
  tf.io.gfile (whose errors keep their kind) to a local temporary directory, fail the same
  check there, where no store can be unavailable; if the copy reads back whole, the
  checkpoint is good and is kept. The copy needs local disk for one checkpoint, and only
  after a failed read.
- tf.train.get_checkpoint_state returns None ("no checkpoint") for any error reading the
  state file, so the state file is read here instead (`_read_state`).

Every read and write of the checkpoint directory here (the state file, the check, the
copy, setting aside, the state update) waits out an outage: OUTAGE_ERRORS are retried
with exponential backoff for up to `outage_seconds` (runtime.storage_outage_seconds), then
raised as realm_tf.io.storage.StorageError naming the path. Any other error of the store
is raised at once, the same way. Neither moves anything.
"""
import logging
import os
import tempfile
import time
from typing import Callable, Optional, TypeVar

import tensorflow as tf
from google.protobuf import text_format
# The state file's message; TF's public reader of it cannot be used (see _read_state).
from tensorflow.python.training.checkpoint_state_pb2 import CheckpointState

from realm_tf.io import storage

DAMAGED_DIR = "damaged"
STATE_FILE = "checkpoint"  # tf.train.CheckpointManager's state file
DEFAULT_OUTAGE_SECONDS = 300.0  # runtime.storage_outage_seconds

# What TF's file systems raise when the store could not answer: gs:// raises AbortedError
# once its own retries are spent ("All 10 retry attempts failed"), and Unavailable,
# DeadlineExceeded, ResourceExhausted (429), PermissionDenied (401/403, also while a grant
# propagates) or Internal for single failures. Never a sign that a file is damaged.
OUTAGE_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                 tf.errors.AbortedError, tf.errors.ResourceExhaustedError,
                 tf.errors.PermissionDeniedError, tf.errors.InternalError)
# What TF's checkpoint reader raises on damage (OpError: DataLoss, NotFound, UNKNOWN;
# IndexError "Read less bytes than requested"; ValueError) and, with the same types, when
# the store failed under it: a suspicion, settled by _proven_damage.
_READER_ERRORS = (tf.errors.OpError, IndexError, ValueError)
_FIRST_DELAY_SECONDS = 1.0
_MAX_DELAY_SECONDS = 30.0

T = TypeVar("T")


class DamagedCheckpointsError(RuntimeError):
  """Every checkpoint of a run is damaged: starting over would silently lose the run."""


def _first_line(error: BaseException) -> str:
  text = str(error).strip()
  return text.splitlines()[0] if text else type(error).__name__


def verify_checkpoint(prefix: str) -> int:
  """Reads every tensor of a checkpoint (each read checks the tensor's CRC32C).

  Args:
    prefix: the checkpoint's prefix (.../ckpt-<step>).

  Returns:
    The number of tensors.

  Raises:
    tf.errors.OpError, IndexError or ValueError: a file is missing, truncated or corrupted,
      or the store failed while it was read (the reader does not tell which: see
      refuse_damaged).
  """
  # NewCheckpointReader takes the prefix as is (see layout.checkpoint_step on ram://).
  reader = tf.compat.v1.train.NewCheckpointReader(prefix)
  names = sorted(reader.get_variable_to_dtype_map())
  for name in names:
    reader.get_tensor(name)
  return len(names)


class _OutageWait:
  """Runs one read or write of the checkpoint directory, waiting out an outage.

  OUTAGE_ERRORS are retried after 1, 2, 4, ... 30 s (the clock and sleep are injectable,
  for tests) until `seconds` have passed since the call began, then raised as a
  StorageError naming the path; every other tf.errors.OpError is raised as a StorageError
  at once (only "not found" means nothing is there, and the callers handle that first).
  """

  def __init__(self, seconds: float, sleep: Callable[[float], None],
               clock: Callable[[], float]):
    self.seconds = seconds
    self._sleep = sleep
    self._clock = clock

  def run(self, path: str, what: str, call: Callable[[], T]) -> T:
    """`call()`, retried through an outage.

    Args:
      path: the file or checkpoint the call reads or writes (named in logs and errors).
      what: what the call does, for the log ('checking it', 'setting it aside').
      call: the read or write.

    Returns:
      What `call` returns.

    Raises:
      storage.StorageError: the store was unavailable for `seconds`, or failed otherwise.
    """
    deadline = self._clock() + self.seconds
    delay = _FIRST_DELAY_SECONDS
    while True:
      try:
        return call()
      except OUTAGE_ERRORS as e:
        left = deadline - self._clock()
        if left <= 0:
          raise storage.StorageError(
              f"{path}: storage unavailable for {self.seconds:.0f} s "
              f"(runtime.storage_outage_seconds) while {what} ({type(e).__name__}: "
              f"{_first_line(e)}); an outage is not damage: nothing was set aside") from e
        wait = min(delay, left)
        logging.warning("%s: storage unavailable while %s (%s: %s); not taken for damage, "
                        "retrying in %.0f s (giving up %.0f s from now)", path, what,
                        type(e).__name__, _first_line(e), wait, left)
        self._sleep(wait)
        delay = min(2 * delay, _MAX_DELAY_SECONDS)
      except tf.errors.OpError as e:
        raise storage.StorageError(
            f"{path}: storage failed while {what} ({type(e).__name__}: {_first_line(e)}); "
            f"not taken for damage: nothing was set aside") from e


def _read_state(directory: str) -> Optional[CheckpointState]:
  """The directory's checkpoint state (None: there is no state file).

  tf.train.get_checkpoint_state, except that only a missing file reads as "no checkpoint":
  TF's returns None for every error reading it, so a 503 would start the run over on top of
  its checkpoints. Parsed as TF parses it (paths relative to `directory` made whole).

  Raises:
    tf.errors.OpError: the store failed (retried by the caller).
    DamagedCheckpointsError: the state file is not a checkpoint state.
  """
  path = os.path.join(directory, STATE_FILE)
  try:
    text = storage.read_bytes(path).decode("utf-8", errors="replace")
  except tf.errors.NotFoundError:
    return None
  state = CheckpointState()
  try:
    text_format.Merge(text, state)
    problem = "" if state.model_checkpoint_path else "no model_checkpoint_path"
  except text_format.ParseError as e:
    problem = _first_line(e)
  if problem:
    raise DamagedCheckpointsError(
        f"{path}: not a checkpoint state ({problem}); refusing to start the run over on "
        f"top of its checkpoints. Restore the file, or remove the directory to start from "
        f"scratch.")
  if not os.path.isabs(state.model_checkpoint_path):
    state.model_checkpoint_path = os.path.join(directory, state.model_checkpoint_path)
  for i, p in enumerate(state.all_model_checkpoint_paths):
    if not os.path.isabs(p):
      state.all_model_checkpoint_paths[i] = os.path.join(directory, p)
  return state


def _proven_damage(prefix: str) -> Optional[str]:
  """What is wrong with the checkpoint at `prefix` (one line), or None if it reads back
  whole.

  Raises:
    tf.errors.OpError: the store failed (the check is retried by the caller).
  """
  try:
    verify_checkpoint(prefix)
    return None
  except OUTAGE_ERRORS:
    raise
  except _READER_ERRORS as e:
    suspicion = e
  # The reader's error does not say whether the bytes or the store failed (module
  # docstring): the same check on a whole local copy does.
  directory = os.path.dirname(prefix)
  with tempfile.TemporaryDirectory(prefix="realm_tf_checkpoint_") as local_dir:
    local_prefix = os.path.join(local_dir, os.path.basename(prefix))
    for path in tf.io.gfile.glob(prefix + ".*"):
      tf.io.gfile.copy(path, os.path.join(local_dir, os.path.basename(path)), overwrite=True)
    try:
      verify_checkpoint(local_prefix)
    except _READER_ERRORS as e:  # the copy's own path is nothing to the reader of the log
      return _first_line(e).replace(local_prefix, prefix).replace(local_dir, directory)
  logging.warning("Checkpoint %s failed to read (%s: %s) but its files, copied, read back "
                  "whole: a storage fault, not damage; it is kept.", prefix,
                  type(suspicion).__name__, _first_line(suspicion))
  return None


def _set_aside(prefix: str) -> str:
  """Moves the checkpoint's files into <dir>/damaged/ (kept for inspection, out of the
  manager's way: a later save with the same step number writes fresh files). Repeatable
  after an outage part-way: the files already moved are no longer listed."""
  directory, name = os.path.split(prefix)
  target_dir = os.path.join(directory, DAMAGED_DIR)
  tf.io.gfile.makedirs(target_dir)
  for path in tf.io.gfile.glob(prefix + ".*"):
    tf.io.gfile.rename(path, os.path.join(target_dir, os.path.basename(path)),
                       overwrite=True)
  return os.path.join(target_dir, name)


def refuse_damaged(directory: str, outage_seconds: float = DEFAULT_OUTAGE_SECONDS,
                   sleep: Callable[[float], None] = time.sleep,
                   clock: Callable[[], float] = time.monotonic) -> Optional[str]:
  """The newest checkpoint under `directory` that reads back whole (None: no checkpoint).

  Damaged newer checkpoints are set aside and dropped from the state file, so
  tf.train.CheckpointManager (and layout.checkpoint_step) see the good one as the newest.
  A checkpoint is damaged only when a whole local copy of it fails the check too; a store
  that fails is waited for, never taken for damage (module docstring).

  Args:
    directory: the run's checkpoint directory (layout.checkpoint_dir).
    outage_seconds: how long each read or write waits out an outage of the store
      (OUTAGE_ERRORS, retried with backoff) before giving up.
    sleep: waits between retries (time.sleep; injectable for tests).
    clock: monotonic seconds (time.monotonic; injectable for tests).

  Returns:
    The prefix of the newest whole checkpoint, or None if the directory has no state file.

  Raises:
    DamagedCheckpointsError: checkpoints exist and none is readable, or the state file is
      not a checkpoint state.
    storage.StorageError: the store was unavailable for `outage_seconds`, or failed in
      another way than "not found" (the path is named; nothing was set aside).
  """
  wait = _OutageWait(outage_seconds, sleep, clock)
  state_path = os.path.join(directory, STATE_FILE)
  state = wait.run(state_path, "reading it", lambda: _read_state(directory))
  if state is None:
    return None
  paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
  times = list(state.all_model_checkpoint_timestamps)
  if len(times) != len(paths):
    times = []
  good = list(paths)
  while good:
    newest = good[-1]
    damage = wait.run(newest, "checking it", lambda: _proven_damage(newest))
    if damage is None:
      break
    moved = wait.run(newest, "setting it aside", lambda: _set_aside(newest))
    good.pop()
    logging.error("Checkpoint %s is damaged and is refused (moved to %s): %s. Resuming "
                  "from %s.", newest, moved, damage,
                  good[-1] if good else "nothing")
  if len(good) == len(paths):
    return good[-1]
  if not good:
    raise DamagedCheckpointsError(
        f"{directory}: every checkpoint is damaged (moved to {DAMAGED_DIR}/); refusing to "
        f"start the run over on top of them. Restore a copy, or remove the directory to "
        f"start from scratch.")
  wait.run(state_path, "dropping the damaged checkpoints from it",
           lambda: tf.compat.v1.train.update_checkpoint_state(
               directory, os.path.basename(good[-1]),
               all_model_checkpoint_paths=[os.path.basename(p) for p in good],
               all_model_checkpoint_timestamps=times[:len(good)] or None,
               last_preserved_timestamp=state.last_preserved_timestamp))
  return good[-1]
