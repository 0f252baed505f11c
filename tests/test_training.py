"""ICT warm start and REALM pre-training with the asynchronous index builder (tiny config)."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from realm_tf.configs import load_config
from realm_tf.data.block_store import BlockStore
from realm_tf.data.candidates import CandidateRetriever
from realm_tf.data.pretraining_inputs import pretraining_dataset
from realm_tf.io import versioned
from realm_tf.training import runs, snapshots
from tests.synthetic_corpus import write_corpus


def _config(repo_dir, corpus, **overrides):
  base = dict(data__corpus_dir=corpus, trainer__batch_size=4, data__shuffle_buffer=64,
              trainer__summary_every_steps=5, trainer__checkpoint_every_steps=5,
              pretrain__index_poll_seconds=0.5, pretrain__first_index_timeout_seconds=300)
  base.update(overrides)
  return load_config(str(repo_dir / "configs" / "tiny.yaml"),
                     [f"{k.replace('__', '.')}={v}" for k, v in base.items()])


def _history(model_dir):
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  path = tmp_path_factory.mktemp("corpus")
  info = write_corpus(str(path))
  return str(path), info


@pytest.fixture(scope="module")
def ict_run(tmp_path_factory, repo_dir, corpus):
  model_dir = str(tmp_path_factory.mktemp("ict"))
  config = _config(repo_dir, corpus[0], trainer__train_steps=20, trainer__batch_size=8)
  result = runs.run_ict(config, model_dir, tf.distribute.get_strategy())
  return model_dir, result


def test_ict_trains_and_exports_the_retriever(ict_run):
  model_dir, result = ict_run
  assert result["step"] == 20
  history = _history(model_dir)
  assert [r["step"] for r in history] == [5, 10, 15, 20]
  assert all(np.isfinite(r["loss"]) for r in history)
  assert history[-1]["loss"] < history[0]["loss"]
  for kind in ("query_encoder", "block_encoder"):
    latest = versioned.latest_version(os.path.join(model_dir, "export", kind))
    assert latest.version == 20 and latest.manifest["kind"] == kind


def test_pretraining_refreshes_the_index_while_training(tmp_path, repo_dir, corpus, ict_run):
  model_dir = str(tmp_path / "realm")
  config = _config(repo_dir, corpus[0], trainer__train_steps=600,
                   trainer__summary_every_steps=20, trainer__checkpoint_every_steps=200,
                   pretrain__refresh_every_steps=20,
                   pretrain__retriever_checkpoint=ict_run[0])
  result = runs.run_pretrain(config, model_dir, tf.distribute.get_strategy(),
                             start_index_builder=True)
  history = _history(model_dir)
  versions = [r["index_version"] for r in history]
  assert result["index_refreshes"] >= 2, (versions, result)
  assert len(set(versions)) >= 3  # the first index and at least two refreshes
  for before, after in zip(history, history[1:]):
    if after["index_version"] != before["index_version"]:
      # A newer index was built from a newer snapshot: staleness falls back.
      assert after["index_version"] > before["index_version"]
      assert after["index_staleness_steps"] < before["index_staleness_steps"] + 20
  assert all(r["index_staleness_steps"] >= 0 for r in history)
  assert all(np.isfinite(r["loss"]) for r in history)
  assert history[-1]["loss"] < history[0]["loss"]
  assert snapshots.training_done(model_dir)
  assert not result["snapshot_errors"]
  assert any(r["trivial_blocks_dropped"] > 0 for r in history)


def test_resume_gives_the_same_next_steps(tmp_path, repo_dir, corpus):
  shared_index = str(tmp_path / "index")
  common = dict(pretrain__refresh_every_steps=0, index__index_dir=shared_index,
                index__backend="exact", trainer__checkpoint_every_steps=5)
  straight = str(tmp_path / "straight")
  runs.run_pretrain(_config(repo_dir, corpus[0], trainer__train_steps=10, **common),
                    straight, tf.distribute.get_strategy(), start_index_builder=True)
  resumed = str(tmp_path / "resumed")
  runs.run_pretrain(_config(repo_dir, corpus[0], trainer__train_steps=10, **common), resumed,
                    tf.distribute.get_strategy(), stop_at_step=5)
  runs.run_pretrain(_config(repo_dir, corpus[0], trainer__train_steps=10, **common), resumed,
                    tf.distribute.get_strategy())
  a = {r["step"]: r for r in _history(straight)}
  b = {r["step"]: r for r in _history(resumed)}
  assert sorted(b) == [5, 10]
  np.testing.assert_allclose(b[5]["loss"], a[5]["loss"], rtol=1e-5)
  np.testing.assert_allclose(b[10]["loss"], a[10]["loss"], rtol=1e-4)
  assert len(versioned.list_versions(shared_index)) == 1  # the index never changed


def test_trivial_blocks_never_appear_among_candidates(tmp_path, repo_dir, corpus, ict_run):
  corpus_dir, info = corpus
  config = _config(repo_dir, corpus_dir, pretrain__num_candidates=4, index__backend="exact")
  ict_dir = ict_run[0]
  # Index the blocks with the ICT block encoder; retrieve with its query encoder.
  from beam import embed_corpus  # pylint: disable=g-import-not-at-top
  index_dir = str(tmp_path / "index")
  embed_corpus.run(["--blocks", corpus_dir, "--encoder",
                    snapshots.block_encoder_dir(ict_dir), "--output_dir", index_dir,
                    "--no_scann"])
  store = BlockStore.from_tfrecords(os.path.join(corpus_dir, "blocks-*"))
  retriever = CandidateRetriever(store, index_dir, snapshots.query_encoder_dir(ict_dir),
                                 num_retrieved=3, exclusion_margin=4).start(timeout=60)
  try:
    from realm_tf.text import Tokenizer  # pylint: disable=g-import-not-at-top
    dataset = pretraining_dataset(os.path.join(corpus_dir, "pretraining-*"), Tokenizer(),
                                  retriever, config, batch_size=8, seed=0, repeat=False)
    checked = 0
    for batch in dataset.take(9):
      ids = batch["candidate_block_ids"].numpy()  # [B, K]
      for uid, row, mask in zip(batch["doc_uid"].numpy(), ids, batch["candidate_mask"]):
        assert row[0] == -1  # the null document comes first
        for block_id in row[1:][mask.numpy()[1:] > 0]:
          assert info["doc_uids"][int(block_id)] != uid.decode()
          checked += 1
    assert checked > 100
    assert retriever.stats.trivial_dropped > 0  # exclusion really had work to do
  finally:
    retriever.stop()


def test_multi_replica_pretraining(tmp_path, repo_dir, corpus, ict_run, mirrored_strategy):
  strategy = mirrored_strategy
  model_dir = str(tmp_path / "mirrored")
  config = _config(repo_dir, corpus[0], trainer__train_steps=10, pretrain__refresh_every_steps=0,
                   index__backend="exact", pretrain__retriever_checkpoint=ict_run[0])
  result = runs.run_pretrain(config, model_dir, strategy, start_index_builder=True)
  assert strategy.num_replicas_in_sync == 2 and result["step"] == 10
  history = _history(model_dir)
  assert all(np.isfinite(r["loss"]) and 0 <= r["mlm_accuracy"] <= 1 for r in history)
