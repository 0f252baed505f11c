"""The index builder: re-embeds the corpus for each new retriever snapshot.

Runs beside the trainer (another process, or other machines sharing model_dir on GCS):
  loop: newest <model_dir>/export/block_encoder version newer than the newest index?
          → claim that version (versioned.Claim under the index dir; lost: wait a poll)
          → embed.embed_corpus → <model_dir>/index/<step>   (older snapshots are skipped:
            only the newest one is ever embedded)
        until <model_dir>/TRAINING_DONE appears (or max_builds builds are done).
A failed build is retried with the newest snapshot at the next poll (a snapshot deleted
under it, a store that did not answer: the next try may work). After
max_consecutive_failures failed builds in a row (a success resets the count) the builder
gives up: it publishes its last error in <model_dir>/INDEX_BUILDER_FAILED
(realm_tf.io.builder_failure), which ends the trainer's wait for an index within one poll,
and exits non-zero (BuilderGaveUp). Without that, a builder that fails every build (an
encoder snapshot that cannot run, say) would keep the trainer waiting out
index.first_index_timeout_seconds. A builder removes an old failure when it starts and when
it commits an index: there is a builder that may publish again.
While it waits it watches the trainer (realm_tf.io.trainer_watch): after
runtime.progress_stall_seconds without a new snapshot or checkpoint it logs that the
trainer is stalled, and its last line says so; it does not stop for that.

Several builders may share one model_dir (scale-out: while one embeds snapshot 1000,
another takes 1500 as soon as it appears). The claim keeps two of them from embedding the
same snapshot at the same time; a builder that died holding one stops refreshing it, and
after claim_ttl_seconds another takes the snapshot over. Publication does not depend on
claims: each index version is committed by the create-if-absent of its manifest, so even
two builds of one snapshot publish one version (the second finds the first's identical
commit and drops its copy).
"""
import dataclasses
import logging
import os
import socket
import time
from typing import Optional, Sequence

from realm_tf.configs import load_config
from realm_tf.data import files as data_files
from realm_tf.data.block_store import blocks_pattern
from realm_tf.io import builder_failure, layout, versioned
from realm_tf.io.trainer_watch import TrainerWatch
from realm_tf.pipelines import embed


@dataclasses.dataclass
class IndexBuilderConfig:
  model_dir: str
  blocks: str = ""  # corpus dir or blocks pattern ('': the run's data config)
  num_shards: int = 0  # 0: index.num_shards of the run's config
  # How often to look for a new snapshot (0: index.poll_seconds of the run's config, the
  # trainer's own poll: a trainer that waits for each refresh would otherwise also wait
  # out the builder's idle sleep, half of 5 s on average at every refresh).
  poll_seconds: float = 0.0
  max_builds: int = 0  # stop after this many builds (0: until TRAINING_DONE)
  batch_size: int = 64
  large_model: bool = False
  model_copies: int = 0
  # A claim on a snapshot lapses this long after its builder stopped refreshing it (died);
  # refreshed every third of it while the build runs. Far above clock skew between hosts.
  claim_ttl_seconds: float = 600.0
  # The trainer that started this builder as its child (0: a stand-alone builder). Once
  # that process is gone the builder stops: a builder orphaned by a killed trainer would
  # otherwise wait for a TRAINING_DONE that never comes, and go on publishing into
  # model_dir (a re-created one, say) while holding a core.
  parent_pid: int = 0
  # Give up after this many failed builds in a row (0: never): see the module docstring.
  max_consecutive_failures: int = 3
  # Where this builder's output is kept, named in its published failure ('': not known).
  # The trainer that starts it as its child passes layout.builder_log_path.
  log_path: str = ""


class BuilderGaveUp(RuntimeError):
  """The builder stopped after max_consecutive_failures failed builds in a row; its last
  error is published in <model_dir>/INDEX_BUILDER_FAILED (the message is that record's
  line, realm_tf.io.builder_failure.describe)."""


class FailedBuilds:
  """Counts a builder's failed builds in a row; at the limit, publishes the last error for
  the trainer and gives up (see the module docstring).

  Args:
    model_dir: the training run's directory (where the failure is published).
    limit: failed builds in a row before giving up (0: never).
    log_path: the builder's log, named in the published failure ('': not known).
  """

  def __init__(self, model_dir: str, limit: int, log_path: str = ""):
    if limit < 0:
      raise ValueError(f"max_consecutive_failures must be >= 0, got {limit}")
    self.model_dir = model_dir
    self.limit = limit
    self.log_path = log_path
    self.count = 0

  def succeeded(self) -> None:
    """A build was committed: the count starts again."""
    self.count = 0

  def failed(self, error: BaseException, snapshot: Optional[int]) -> None:
    """Counts a failed build; publishes it and gives up when it is the limit-th in a row.

    Args:
      error: the build's exception.
      snapshot: the snapshot version it was building (None: it failed before reading one).

    Raises:
      BuilderGaveUp: this was the limit-th failed build in a row (the failure is
        published first).
    """
    self.count += 1
    if not self.limit or self.count < self.limit:
      logging.warning("%s: %d failed build(s) in a row (gives up at %s)", builder_name(),
                      self.count, self.limit or "never")
      return
    record = builder_failure.publish(self.model_dir, builder_name(), snapshot, error,
                                     self.count, self.log_path)
    line = builder_failure.describe(record)
    logging.error("Giving up: %s (published in %s)", line,
                  layout.builder_failure_path(self.model_dir))
    raise BuilderGaveUp(line) from error


def parent_gone(parent_pid: int) -> bool:
  """Whether the process that started this builder has exited (its children are then
  re-parented, so the parent pid changes)."""
  return bool(parent_pid) and os.getppid() != parent_pid


def builder_name() -> str:
  """Who builds: 'index builder <host>:<pid>', in claims, manifests and log lines."""
  return f"index builder {socket.gethostname()}:{os.getpid()}"


def claim_snapshot(index_dir: str, version: int, ttl_seconds: float
                   ) -> tuple[bool, versioned.Claim]:
  """Claims index version `version` for this builder: (won, claim)."""
  claim = versioned.Claim(index_dir, version, holder=builder_name(), ttl_seconds=ttl_seconds)
  return claim.acquire(), claim


_reported_waits: set = set()  # (index_dir, version, claim path) already logged as waited on


def build_once(model_dir: str, blocks: str, index_dir: str, num_shards: int,
               backend: str, keep_versions: int, pipeline_args: Sequence[str] = (),
               batch_size: int = 64, large_model: bool = False,
               model_copies: int = 0, claim_ttl_seconds: float = 600.0,
               snapshot: Optional[versioned.Version] = None,
               unpublished_blocks: bool = False) -> Optional[str]:
  """Embeds the newest snapshot if the index is behind it and no other builder holds its
  claim; returns the new index path (None: nothing to do, or another builder's work).
  `snapshot`: the newest snapshot when the caller has read it (None: read here).
  `unpublished_blocks`: the blocks have no manifest (index.unpublished_blocks)."""
  if snapshot is None:
    snapshot = versioned.latest_version(layout.block_encoder_dir(model_dir))
  index = versioned.latest_version(index_dir)
  if snapshot is None or (index is not None and index.version >= snapshot.version):
    return None
  won, claim = claim_snapshot(index_dir, snapshot.version, claim_ttl_seconds)
  if not won:
    key = (index_dir, snapshot.version, (claim.current or {}).get("path"))
    if key not in _reported_waits:
      _reported_waits.add(key)
      logging.info("Snapshot %d is being built by %s; %s waits for a newer snapshot (or "
                   "for that claim to lapse, if its holder died)", snapshot.version,
                   versioned.describe_claim(claim.current), builder_name())
    return None
  try:
    # A builder commits before it releases its claim, so a claim won after another
    # builder's release sees that commit here.
    index = versioned.latest_version(index_dir)
    if index is not None and index.version >= snapshot.version:
      claim.release(outcome=f"index {index.version} already committed")
      return None
    logging.info("Building index %d from %s: %s (claim generation %s)", snapshot.version,
                 snapshot.path, builder_name(), claim.generation)
    path = embed.embed_corpus(embed.EmbedConfig(
        blocks=blocks, encoder=snapshot.path, output_dir=index_dir, num_shards=num_shards,
        version=snapshot.version, build_scann=backend != "exact",
        keep_versions=keep_versions, batch_size=batch_size, large_model=large_model,
        model_copies=model_copies, builder=builder_name(),
        unpublished_blocks=unpublished_blocks), pipeline_args)
  except BaseException as e:
    claim.release(outcome="failed", error=f"{type(e).__name__}: {e}"[:1000])
    raise
  built_by = versioned.read_version(path).manifest.get("builder", "")
  if built_by == builder_name():
    claim.release(outcome="committed", index=path)
    logging.info("Index %d built by %s: %s", snapshot.version, built_by, path)
  else:  # possible only if claims failed (a takeover of a live builder, ram://)
    claim.release(outcome="duplicate", index=path, built_by=built_by)
    logging.warning("Index %d was committed first by %s (%s); the copy %s built is dropped "
                    "(duplicate work)", snapshot.version, built_by or "another writer", path,
                    builder_name())
  return path


def run_index_builder(config: IndexBuilderConfig, pipeline_args: Sequence[str] = ()) -> int:
  """Builds indexes until training is done (see the module docstring).

  Args:
    config: IndexBuilderConfig.
    pipeline_args: Beam runner options, passed untouched to every embedding job.

  Returns:
    The number of builds committed.

  Raises:
    BuilderGaveUp: config.max_consecutive_failures builds failed in a row (the last
      error is published in <model_dir>/INDEX_BUILDER_FAILED first).
  """
  failures = FailedBuilds(config.model_dir, config.max_consecutive_failures, config.log_path)
  run_config = load_config(layout.params_path(config.model_dir))
  blocks = blocks_pattern(config.blocks or run_config.index.blocks)
  # Refused here, before any wait, rather than at every build: a corpus that is not
  # published (its writer died, or an --overwrite re-run is replacing it) is the user's
  # to fix, and a builder that waited for snapshots would only fail later, build by build.
  data_files.files(blocks, run_config.index.unpublished_blocks)
  index_dir = layout.index_dir(config.model_dir, run_config.index.index_dir)
  num_shards = config.num_shards or run_config.index.num_shards
  logging.info("%s watching %s (index %s)", builder_name(), config.model_dir, index_dir)
  # Never a busy loop over the store (a run may poll its index every loop: 0).
  poll_seconds = max(config.poll_seconds or run_config.index.poll_seconds, 0.1)
  watch = TrainerWatch(config.model_dir, run_config.runtime.progress_stall_seconds,
                       builder_name())
  # A failure published before this builder started was given up on by another (or an
  # earlier) builder; this one may build: the trainer must not stop for that one.
  builder_failure.clear(config.model_dir)
  builds = 0
  while not layout.training_done(config.model_dir):
    if parent_gone(config.parent_pid):
      logging.warning("%s: the trainer that started it (pid %d) is gone; stopping",
                      builder_name(), config.parent_pid)
      break
    snapshot = None
    try:
      # Read here, not in build_once, so that a failure names the snapshot it was on.
      snapshot = versioned.latest_version(layout.block_encoder_dir(config.model_dir))
      built = build_once(config.model_dir, blocks, index_dir, num_shards,
                         run_config.index.backend, run_config.index.keep_versions,
                         pipeline_args, config.batch_size, config.large_model,
                         config.model_copies, config.claim_ttl_seconds,
                         snapshot=snapshot,
                         unpublished_blocks=run_config.index.unpublished_blocks,
                         ) if snapshot is not None else None
    except Exception as e:  # pylint: disable=broad-except
      # e.g. the snapshot went away before its lease was taken: a newer one will come. A
      # builder that fails every build gives up instead (FailedBuilds).
      logging.exception("Index build failed; retrying with the newest snapshot")
      failures.failed(e, snapshot.version if snapshot is not None else None)
      built = None
    if built:
      failures.succeeded()
      builder_failure.clear(config.model_dir)
      builds += 1
      logging.info("Published %s", built)
      if config.max_builds and builds >= config.max_builds:
        break
    else:
      watch.check()
      time.sleep(poll_seconds)
  watch.check(force=True)
  logging.info("Index builder done after %d builds (%s); the trainer: %s", builds,
               builder_name(), watch.status())
  return builds
