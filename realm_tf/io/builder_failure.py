"""An index builder that gave up, as the trainer reads it: <model_dir>/INDEX_BUILDER_FAILED.

An index builder (realm_tf.pipelines.index_builder) retries a failed build at its next
poll: a snapshot deleted under it or a store that did not answer may do better next time.
One that fails every build (an encoder snapshot that cannot run, a corpus it cannot read)
would retry for ever, while the trainer waited out index.first_index_timeout_seconds (an
hour) for an index that never comes, every worker of a multi-worker job idle with it. So
after its --max_consecutive_failures failed builds in a row a builder publishes its last
error here and exits non-zero, and the trainer's waits for an index
(realm_tf.retrieval.refresh.IndexRefresher) read this object at every poll: a builder on
any machine sharing model_dir, not only the trainer's child, ends the wait within one poll,
with one line naming the builder's error and its log.

The record is one small JSON object written whole (versioned.write_json_atomic: a reader
sees all of it or nothing): builder (who, host:pid), snapshot (the version it failed on;
None if it failed before reading one), error_type and error (the exception's first line,
bounded), failures (the failed builds in a row), time (the builder's clock, seconds since
the epoch) and log_path (its log, '' when it was not told).

Who removes it: the trainer's chief when it starts a new training slice (as it clears
TRAINING_DONE), and a builder when it starts and when it commits an index. Each says that
a builder may publish again, so an old failure must not end a new wait.

With several builders sharing model_dir (scale-out), one that gives up ends a wait even
while the others run, unless one of them commits first: builds that fail N times in a row
are most often the snapshot's or the corpus's fault, which every builder would hit.
"""
import logging
import time
from typing import Optional

import tensorflow as tf

from realm_tf.io import command_line, layout, versioned

# The most of an error message published (its first line; the log keeps the traceback).
ERROR_CHARS = 500


def publish(model_dir: str, builder: str, snapshot: Optional[int], error: BaseException,
            failures: int, log_path: str = "") -> dict:
  """Publishes a builder's last error for the trainer (replacing an earlier one).

  Args:
    model_dir: the training run's directory.
    builder: who gave up (index_builder.builder_name()).
    snapshot: the snapshot version of the failed build (None: none was read).
    error: the last build's exception.
    failures: the failed builds in a row.
    log_path: where the builder's output is kept ('' when not known).

  Returns:
    The record published.
  """
  record = dict(builder=builder, snapshot=None if snapshot is None else int(snapshot),
                error_type=type(error).__name__,
                error=command_line.one_line(error)[:ERROR_CHARS], failures=int(failures),
                time=time.time(), log_path=log_path)
  versioned.write_json_atomic(layout.builder_failure_path(model_dir), record)
  return record


def read(model_dir: str) -> Optional[dict]:
  """The published failure of an index builder of the run, or None.

  Args:
    model_dir: the training run's directory.

  Returns:
    The record `publish` wrote; None if there is none.

  Raises:
    versioned.VersionError: the object is not JSON (it names the path).
    realm_tf.io.storage.StorageError: the store could not be asked.
  """
  try:
    return versioned.read_json(layout.builder_failure_path(model_dir))
  except FileNotFoundError:
    return None


def clear(model_dir: str) -> None:
  """Removes a published failure, if any (a builder may publish again: see the module
  docstring). Two removers racing is fine: the one that finds nothing is done."""
  path = layout.builder_failure_path(model_dir)
  try:
    tf.io.gfile.remove(path)
  except tf.errors.NotFoundError:
    return
  logging.info("Removed %s (an index builder may publish again)", path)


def describe(record: dict) -> str:
  """One line: who gave up, after how many failed builds, on which snapshot, with which
  error, and where its log is."""
  snapshot = record.get("snapshot")
  on = (f"the last on snapshot {snapshot}" if snapshot is not None
        else "the last before it could read a snapshot")
  when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(record.get("time", 0))))
  log = (record.get("log_path")
         or "not recorded (a builder started without --log_path: see its own output)")
  return (f"{record.get('builder', 'an index builder')} gave up after "
          f"{record.get('failures', '?')} failed builds in a row ({on}, at {when}): "
          f"{record.get('error_type', 'Error')}: {record.get('error', '')}; its log: {log}")


__all__ = ["ERROR_CHARS", "clear", "describe", "publish", "read"]
