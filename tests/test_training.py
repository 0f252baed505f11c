"""ICT warm start, then REALM pre-training with the asynchronous index builder, end to end
through `python -m realm_tf.train`'s library path (tiny config, invented corpus)."""
import os
import time
import types

import numpy as np
import pytest

from realm_tf.data.block_store import BlockStore
from realm_tf.io import layout, versioned
from realm_tf.retrieval import refresh
from realm_tf.retrieval.refresh import IndexRefresher, RefreshSettings
from realm_tf.training import train_lib
from tests import task_fixtures as tf_


@pytest.fixture(scope="module")
def ict_run(tmp_path_factory, repo_dir, corpus):
  model_dir = str(tmp_path_factory.mktemp("ict"))
  config = tf_.tiny_config(repo_dir, corpus, "ict", trainer__train_steps=20,
                           task__ict__train_data__global_batch_size=8)
  return model_dir, train_lib.run_experiment(config, model_dir)


def test_ict_trains_and_exports_the_retriever(ict_run):
  model_dir, result = ict_run
  assert result["step"] == 20 and result["reached_train_steps"]
  history = layout.read_metrics(model_dir)
  assert [r["step"] for r in history] == [5, 10, 15, 20]
  assert all(np.isfinite(r["loss"]) for r in history)
  assert history[-1]["loss"] < history[0]["loss"]
  for root in (layout.query_encoder_dir(model_dir), layout.block_encoder_dir(model_dir)):
    latest = versioned.latest_version(root)
    assert latest.version == 20
  # params.yaml describes the whole run: loading it gives the same config back.
  from realm_tf.configs import load_config  # pylint: disable=g-import-not-at-top
  assert load_config(layout.params_path(model_dir)).task.type == "ict"


def test_pretraining_refreshes_the_index_while_training(tmp_path, repo_dir, corpus, ict_run):
  """The trainer hands snapshots to a child `beam.index_builder`, which re-embeds the
  corpus; newer indexes are swapped in while training goes on. index.max_staleness_steps
  makes the trainer wait for the builder (a state, polled, within
  index.first_index_timeout_seconds), so the test does not depend on the relative speed
  of trainer and builder on a loaded machine."""
  model_dir = str(tmp_path / "realm")
  loop, every, bound, steps = 2, 4, 2, 12
  # A loop's record is written before the loop end's snapshot and staleness wait, so the
  # record at step t shows an index from a snapshot in [t - loop - bound, t - loop], and
  # snapshots fall every 4 steps: the records at 2 and 4 show the first index (0), at 6
  # and 8 the snapshot of step 4, at 10 and 12 that of step 8. These are the fewest
  # snapshots and builds (0, 4, 8 and the one the last step's wait asks for) that show two
  # refreshes in the records whatever the relative speed of trainer and builder.
  config = tf_.tiny_config(
      repo_dir, corpus, "pretrain", trainer__train_steps=steps, trainer__steps_per_loop=loop,
      trainer__summary_interval=loop, trainer__checkpoint_interval=steps,
      task__pretrain__refresh_every_steps=every, task__pretrain__init_checkpoint=ict_run[0],
      task__pretrain__start_index_builder=True, index__max_staleness_steps=bound,
      index__first_index_timeout_seconds=300)
  result = train_lib.run_experiment(config, model_dir)
  history = layout.read_metrics(model_dir)
  versions = [r["index_version"] for r in history]
  assert [r["step"] for r in history] == list(range(loop, steps + 1, loop))
  assert result["index_refreshes"] >= 2, (versions, result)
  assert len(set(versions)) >= 3, versions  # the first index and at least two refreshes
  for before, after in zip(history, history[1:]):
    if after["index_version"] != before["index_version"]:
      # A newer index was built from a newer snapshot: staleness falls back.
      assert after["index_version"] > before["index_version"]
      assert after["index_staleness_steps"] < before["index_staleness_steps"] + loop
  assert all(0 <= r["index_staleness_steps"] <= bound + loop for r in history), history
  assert all(np.isfinite(r["loss"]) for r in history)
  assert history[-1]["loss"] < history[0]["loss"]
  assert all(r["trivial_block_retrieved"] == 0.0 for r in history)
  assert layout.training_done(model_dir)
  assert not result["snapshot_errors"]


def test_multi_replica_pretraining(tmp_path, repo_dir, corpus, ict_run, mirrored_strategy):
  """Two replicas over a committed index. refresh_every_steps 0 with start_index_builder:
  the builder would have nothing to build, so none is started (no builder log)."""
  model_dir = str(tmp_path / "mirrored")
  config = tf_.tiny_config(repo_dir, corpus, "pretrain", trainer__train_steps=10,
                           task__pretrain__refresh_every_steps=0,
                           task__pretrain__init_checkpoint=ict_run[0],
                           task__pretrain__start_index_builder=True)
  store = BlockStore.from_tfrecords(os.path.join(corpus, "blocks-*"))
  tf_.publish_index(layout.index_dir(model_dir), 0, store.block_ids,
                    np.random.default_rng(0).normal(
                        size=[len(store), config.model.retriever.projection_size]))
  result = train_lib.run_experiment(config, model_dir, mirrored_strategy)
  assert mirrored_strategy.num_replicas_in_sync == 2 and result["step"] == 10
  assert result["final_index_version"] == 0
  assert not os.path.exists(layout.builder_log_path(model_dir))
  history = layout.read_metrics(model_dir)
  assert all(np.isfinite(r["loss"]) and 0 <= r["mlm_accuracy"] <= 1 for r in history)


class _StartedBuilder:
  """Stands in for refresh.IndexBuilderProcess: records the arguments it was started with."""

  def __init__(self, model_dir, extra_args=()):
    self.model_dir, self.extra_args = model_dir, tuple(extra_args)


@pytest.mark.parametrize("refresh_every, committed, expected", [
    (5, False, ()), (5, True, ()),  # refreshes: builds every snapshot until TRAINING_DONE
    (0, False, ("--max_builds", "1")),  # a fixed index: its first build, then it exits
    (0, True, None),  # a fixed index already committed: nothing to build, no child
])
def test_the_builder_child_is_started_only_for_builds_it_will_have(
    tmp_path, monkeypatch, refresh_every, committed, expected):
  monkeypatch.setattr(refresh, "IndexBuilderProcess", _StartedBuilder)
  settings = RefreshSettings(index_dir=str(tmp_path / "index"),
                             refresh_every_steps=refresh_every, train_steps=20,
                             first_index_timeout_seconds=1, poll_seconds=0, start_builder=True)
  if committed:
    tf_.publish_index(settings.index_dir, 0, np.arange(4, dtype=np.int64),
                      np.ones([4, 16], np.float32))
  builder = IndexRefresher(str(tmp_path / "run"), None, settings).start_builder()
  assert (builder.extra_args if builder else None) == expected


def test_staleness_wait_exports_a_snapshot_when_the_due_ones_were_skipped(tmp_path):
  """The index is from snapshot 120; the snapshots due at 140-180 were skipped (the previous
  export still saving on a loaded machine) and none is due at the last step, 200. With
  index.max_staleness_steps=60 the refresher must export one itself before it waits, or
  the builder has nothing newer to build and the wait ends in the timeout (seen in CI-like
  runs of the test above under load)."""

  class Exporter:
    def __init__(self):
      self.calls = []

    def wait(self):
      pass

    def snapshot(self, step, wait=False):
      self.calls.append((step, wait))
      return True

  class Index:  # the builder: an index from the newest snapshot once one is exported
    export = types.SimpleNamespace(manifest={})

    def __init__(self, exporter):
      self.exporter, self.encoder_step, self.version = exporter, 120, 120

    def maybe_swap(self, index_dir):
      del index_dir
      if self.exporter.calls and self.exporter.calls[-1][0] > self.encoder_step:
        self.encoder_step = self.version = self.exporter.calls[-1][0]
        return True
      return False

  settings = RefreshSettings(index_dir=str(tmp_path / "index"), refresh_every_steps=20,
                             train_steps=200, first_index_timeout_seconds=5, poll_seconds=0,
                             max_staleness_steps=60)
  exporter = Exporter()
  refresher = IndexRefresher(str(tmp_path / "run"), Index(exporter), settings)
  refresher.exporter = exporter
  refresher.after_loop(200)
  assert exporter.calls == [(200, True)]
  assert refresher.index_step() == 200


def test_index_staleness_counts_the_steps_of_this_run(tmp_path):
  """An index built from a warm start's encoder (ICT's step 200) is as old as this run,
  not 200 steps in its future; one from this run's snapshot counts from that snapshot."""
  model_dir = str(tmp_path / "run")

  class Export:  # the parts of a versioned index export the refresher reads
    def __init__(self, encoder_path, step):
      self.manifest = dict(encoder=dict(path=encoder_path, step=step))

  class Index:
    def __init__(self, export):
      self.export, self.version = export, 1
      self.snapshot_time, self.num_swaps = time.time(), 1

    @property
    def encoder_step(self):
      return self.export.manifest["encoder"]["step"] if self.export else -1

  settings = RefreshSettings(index_dir=str(tmp_path / "index"), refresh_every_steps=5,
                             train_steps=100, first_index_timeout_seconds=1, poll_seconds=0)
  foreign = IndexRefresher(model_dir, Index(Export(
      str(tmp_path / "ict" / "export" / "block_encoder" / "000000000200.ab"), 200)), settings)
  assert foreign.logs(30)["index_staleness_steps"] == 30
  own = IndexRefresher(model_dir, Index(Export(
      os.path.join(model_dir, "export", "block_encoder", "000000000020.cd"), 20)), settings)
  assert own.logs(30)["index_staleness_steps"] == 10
  assert IndexRefresher(model_dir, Index(None), settings).logs(3)["index_staleness_steps"] == 4


class _DeadBuilder:
  """Stands in for refresh.IndexBuilderProcess: a child that has exited."""
  log_path = "/run/index_builder.log"
  process = types.SimpleNamespace(terminate=lambda: None)

  def exited(self):
    return f"the index builder child (pid 1) exited with code 1; its log: {self.log_path}"

  def stop(self, timeout=0.0):
    del timeout


def test_a_dead_builder_ends_the_wait_at_once_naming_its_log(tmp_path):
  """Waiting for an index that no builder will build: the refresher says so now, with the
  builder's exit and log, instead of waiting out first_index_timeout_seconds (300 s here)."""

  class Index:  # never refreshed: from snapshot 120 for good
    export = types.SimpleNamespace(manifest={})
    encoder_step, version, swaps = 120, 120, 0

    def maybe_swap(self, index_dir):
      del index_dir
      self.swaps += 1
      return False

  settings = RefreshSettings(index_dir=str(tmp_path / "index"), refresh_every_steps=20,
                             train_steps=400, first_index_timeout_seconds=300,
                             poll_seconds=0, max_staleness_steps=60)
  index = Index()
  refresher = IndexRefresher(str(tmp_path / "run"), index, settings)
  refresher.builder = _DeadBuilder()
  begin = time.time()
  with pytest.raises(RuntimeError, match=r"80 steps behind step 200.*exited with code 1; "
                                         r"its log: /run/index_builder.log"):
    refresher.after_loop(200)
  assert time.time() - begin < 30 and index.swaps >= 2  # one more look before giving up

  index.version = None  # no index at all: the first wait ends the same way
  refresher.exporter = types.SimpleNamespace(snapshot=lambda step, wait=False: True,
                                             wait=lambda: None)
  with pytest.raises(RuntimeError, match="no index yet, and the index builder child"):
    refresher.start(0, training=False)
  assert time.time() - begin < 30
