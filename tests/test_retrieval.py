"""MIPS: exact and ScaNN backends, sharding, atomic versioned exports."""
import os
import time

import numpy as np
import pytest
import tensorflow as tf

from realm_tf.io import versioned

from realm_tf.retrieval import (
    ExactSearcher, ScannSearcher, ShardData, ShardedSearcher, garbage_collect,
    latest_export, list_exports, load_searcher, new_export_dir, scann_params_for,
    write_export, write_shard)
from realm_tf.retrieval.index_export import ExportError, commit_export
from realm_tf.retrieval.scann_index import (
    MAX_REORDER_NUM_NEIGHBORS, SearchOptions, ShardLayout, check_search_options,
    leaves_to_search, searching_with)
from realm_tf.retrieval.synthetic import clustered_vectors, queries_near


@pytest.fixture(scope="module")
def corpus():
  vectors = clustered_vectors(30_000, 32, num_clusters=300, seed=0)
  ids = np.arange(30_000, dtype=np.int64) * 7 + 3  # block ids are not row numbers
  queries = queries_near(vectors, 64, seed=1)
  return vectors, ids, queries


def _exact_top(vectors, ids, queries, k):
  scores = queries @ vectors.T
  order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
  return ids[order], np.take_along_axis(scores, order, axis=1)


def _recall(got, want):
  return np.mean([len(set(g) & set(w)) / len(w) for g, w in zip(got, want)])


def test_exact_equals_numpy_argsort(corpus):
  vectors, ids, queries = corpus
  result = ExactSearcher(vectors, ids).search(tf.constant(queries), 10)
  want_ids, want_scores = _exact_top(vectors, ids, queries, 10)
  np.testing.assert_allclose(result.scores.numpy(), want_scores, rtol=1e-5, atol=1e-5)
  assert _recall(result.block_ids.numpy(), want_ids) == 1.0
  assert result.block_ids.dtype == tf.int64


def test_exact_search_runs_in_tf_function_and_caps_k():
  searcher = ExactSearcher(np.eye(4, dtype=np.float32))

  @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
  def search(q):
    return searcher.search(q, 10)

  result = search(tf.constant([[0.0, 0.0, 5.0, 1.0]]))
  assert result.block_ids.numpy().tolist() == [[2, 3, 0, 1]]


def test_sharded_equals_unsharded(corpus):
  vectors, ids, queries = corpus
  whole = ExactSearcher(vectors, ids).search(tf.constant(queries), 10)
  cuts = [0, 7000, 7001, 19000, 30000]  # uneven shards, one with a single vector
  shards = [ExactSearcher(vectors[a:b], ids[a:b]) for a, b in zip(cuts, cuts[1:])]
  sharded = ShardedSearcher(shards)
  assert sharded.num_blocks == 30_000
  result = sharded.search(tf.constant(queries), 10)
  np.testing.assert_array_equal(result.block_ids.numpy(), whole.block_ids.numpy())
  np.testing.assert_allclose(result.scores.numpy(), whole.scores.numpy(), rtol=1e-6)


def test_scann_params_follow_the_guidance_by_size():
  assert scann_params_for(5_000).mode == "brute_force"
  assert scann_params_for(50_000).mode == "ah_reorder"
  big = scann_params_for(1_000_000)
  assert big.mode == "tree_ah_reorder" and big.num_leaves == 1000
  assert scann_params_for(1_000_000, num_leaves=500).num_leaves == 500


def test_scann_recall_at_10_against_exact(corpus):
  vectors, ids, queries = corpus
  want, _ = _exact_top(vectors, ids, queries, 10)
  params = scann_params_for(len(vectors), mode="tree_ah_reorder", num_leaves=173,
                            num_leaves_to_search=20)
  searcher = ScannSearcher.build(vectors, ids, params=params)
  got = searcher.search(tf.constant(queries), 10).block_ids.numpy()
  assert _recall(got, want) >= 0.9
  rescored = ScannSearcher.build(vectors, ids, params=params, rescore=True)
  result = rescored.search(tf.constant(queries), 10)
  assert _recall(result.block_ids.numpy(), want) >= 0.9
  # Re-scored scores are exact inner products of the returned blocks.
  rows = {int(b): i for i, b in enumerate(ids)}
  exact = np.array([[queries[q] @ vectors[rows[int(b)]] for b in row]
                    for q, row in enumerate(result.block_ids.numpy())])
  np.testing.assert_allclose(result.scores.numpy(), exact, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def tree_shard():
  """A tree + AH + float32 reordering shard over loosely clustered vectors (100 leaves,
  5 searched by default), where the leaves searched matter; and its queries."""
  vectors = clustered_vectors(10_000, 16, num_clusters=100, spread=1.0, seed=0)
  ids = np.arange(10_000, dtype=np.int64) * 3 + 1
  params = scann_params_for(len(vectors), mode="tree_ah_reorder", reorder_dtype="float32")
  searcher = ScannSearcher.build(vectors, ids, params=params)
  return searcher, vectors, ids, queries_near(vectors, 64, seed=1)


def _search(searcher, queries, k, options=None):
  with searching_with(options or SearchOptions()):
    return searcher.search(tf.constant(queries), k)


def test_every_leaf_and_every_candidate_reordered_is_exact_search(tree_shard):
  """leaves_fraction 1.0 and as many candidates reordered as the shard has points: the
  float32 reordering scores every point exactly, so the top-k is NumPy's."""
  searcher, vectors, ids, queries = tree_shard
  assert searcher.layout == ShardLayout(num_leaves=100, num_leaves_to_search=20,
                                        reorder_num_neighbors=100)
  result = _search(searcher, queries, 10, SearchOptions(1.0, len(vectors)))
  want_ids, want_scores = _exact_top(vectors, ids, queries, 10)
  np.testing.assert_array_equal(result.block_ids.numpy(), want_ids)
  np.testing.assert_allclose(result.scores.numpy(), want_scores, rtol=1e-5, atol=1e-5)


def test_recall_grows_with_the_leaves_searched_and_defaults_are_the_build(tree_shard):
  """recall@10 does not fall as leaves_fraction grows (and a twentieth of the leaves
  misses what all of them find); no options search as the build said: the same results
  as passing its own leaves (a fraction that rounds up to 20 of 100) and reorder count."""
  searcher, vectors, ids, queries = tree_shard
  want, _ = _exact_top(vectors, ids, queries, 10)
  recall = [_recall(_search(searcher, queries, 10, SearchOptions(f, 100)).block_ids.numpy(),
                    want) for f in (0.05, 0.2, 1.0)]
  assert recall == sorted(recall), recall
  assert recall[2] - recall[0] > 0.05, recall
  layout = searcher.layout
  fraction = (layout.num_leaves_to_search - 0.5) / layout.num_leaves
  assert leaves_to_search(fraction, layout) == layout.num_leaves_to_search
  assert int(leaves_to_search(tf.constant(fraction), layout)) == layout.num_leaves_to_search
  own = _search(searcher, queries, 10)
  passed = _search(searcher, queries, 10,
                   SearchOptions(fraction, layout.reorder_num_neighbors))
  np.testing.assert_array_equal(passed.block_ids.numpy(), own.block_ids.numpy())
  np.testing.assert_array_equal(passed.scores.numpy(), own.scores.numpy())


def test_leaves_holding_fewer_points_than_k_still_give_k_results():
  """One leaf of a tree of 100 over 300 points holds a few points: ScaNN then returns
  fewer columns than asked for the whole batch; the searcher pads them (ranked last) and
  returns k, the points it found first, in exact order (float32 reordering)."""
  vectors = clustered_vectors(300, 8, num_clusters=10, seed=5)
  params = scann_params_for(300, mode="tree_ah_reorder", num_leaves=100,
                            num_leaves_to_search=1, reorder_dtype="float32",
                            training_sample_size=300)
  searcher = ScannSearcher.build(vectors, params=params)
  queries = queries_near(vectors, 4, seed=6)
  result = _search(searcher, queries, 20, SearchOptions(0.01, 20))  # one leaf
  assert result.block_ids.shape == (4, 20)
  scores = result.scores.numpy()
  found = scores > np.finfo(np.float32).min
  # Not every query need find a point: ScaNN's k-means can leave a leaf empty, and which
  # leaf varies from build to build (seen: 1 run in 6 found nothing for one query).
  assert found.any() and not found.all(), found.sum(axis=1)
  for q in range(4):
    ids = result.block_ids.numpy()[q][found[q]]
    np.testing.assert_allclose(scores[q][found[q]], vectors[ids] @ queries[q], rtol=1e-5,
                               atol=1e-5)
    assert list(scores[q][found[q]]) == sorted(scores[q][found[q]], reverse=True)


def test_search_options_out_of_range_are_refused_by_name():
  """InvalidArgument naming the option: a fraction of 0 or above 1, fewer candidates
  reordered than the neighbours asked for or more than MAX_REORDER_NUM_NEIGHBORS; and an
  option the search cannot vary (no tree, nothing re-scored) unless it has the value that
  says what the search does anyway."""
  too_many = MAX_REORDER_NUM_NEIGHBORS + 1
  for fraction, reorder, named, how in (
      (0.0, 10, "leaves_fraction", {}), (1.5, 10, "leaves_fraction", {}),
      (0.5, 9, "reorder_num_neighbors", {}), (0.5, too_many, "reorder_num_neighbors", {}),
      (0.5, 10, "leaves_fraction: no shard", dict(has_tree=False)),
      (1.0, 20, "reorder_num_neighbors: nothing", dict(rescores=False))):
    with pytest.raises(tf.errors.InvalidArgumentError, match=named):
      check_search_options(fraction, reorder, k=10, **how)
  for how in ({}, dict(has_tree=False), dict(rescores=False)):
    checked = check_search_options(1.0, 10, k=10, **how)
    assert (float(checked.leaves_fraction), int(checked.reorder_num_neighbors)) == (1.0, 10)
  checked = check_search_options(0.5, MAX_REORDER_NUM_NEIGHBORS, k=10)
  assert int(checked.reorder_num_neighbors) == MAX_REORDER_NUM_NEIGHBORS


def test_a_shard_without_a_tree_or_reordering_ignores_the_options():
  """Brute force has no leaves and no reordering: the options change nothing (the search
  op is given -1, its own)."""
  vectors = clustered_vectors(500, 8, num_clusters=10, seed=3)
  searcher = ScannSearcher.build(vectors)
  assert searcher.layout == ShardLayout(0, 0, 0)
  assert leaves_to_search(0.5, searcher.layout) == -1
  queries = queries_near(vectors, 8, seed=4)
  own = _search(searcher, queries, 5)
  tuned = _search(searcher, queries, 5, SearchOptions(0.05, 5))
  np.testing.assert_array_equal(tuned.block_ids.numpy(), own.block_ids.numpy())


def _export(index_dir, version, vectors, ids, num_shards=2, **kw):
  parts = np.array_split(np.arange(len(vectors)), num_shards)
  return write_export(str(index_dir), version,
                      [ShardData(vectors[p], ids[p]) for p in parts], **kw)


def test_export_round_trip_both_backends(tmp_path, corpus):
  vectors, ids, queries = corpus
  sub_v, sub_i = vectors[:6000], ids[:6000]
  path = _export(tmp_path, 100, sub_v, sub_i, num_shards=3, extra={"step": 100})
  assert os.path.basename(path).startswith("000000000100.")  # <version>.<writer id>
  export = latest_export(str(tmp_path))
  assert export.version == 100 and export.manifest["num_blocks"] == 6000
  assert export.manifest["step"] == 100 and len(export.manifest["shards"]) == 3
  assert export.manifest["shards"][0]["scann"]["mode"] == "brute_force"
  want, _ = _exact_top(sub_v, sub_i, queries, 5)
  for backend in ("exact", "scann"):
    result = load_searcher(str(tmp_path), backend=backend).search(tf.constant(queries), 5)
    assert _recall(result.block_ids.numpy(), want) >= (1.0 if backend == "exact" else 0.95)


def test_partial_exports_are_never_read(tmp_path, corpus):
  vectors, ids, _ = corpus
  _export(tmp_path, 1, vectors[:500], ids[:500], build_scann=False)
  # A crash before the rename: shards written into a temporary dir, never committed.
  crashed = new_export_dir(str(tmp_path), 2)
  write_shard(crashed, 0, 2, ShardData(vectors[:10], ids[:10]), build_scann=False)
  # A data directory that no manifest commits (written without the protocol): ignored too.
  os.makedirs(tmp_path / "000000000003" / "shard-00000-of-00001")
  assert [e.version for e in list_exports(str(tmp_path))] == [1]
  assert load_searcher(str(tmp_path), backend="exact").num_blocks == 500
  with pytest.raises(ExportError, match="shards missing"):
    commit_export(crashed, str(tmp_path), 2, {"shards": [{"shard": 0}, {"shard": 1}]})
  with pytest.raises(ExportError, match="no committed index export"):
    load_searcher(str(tmp_path / "empty"))


def test_garbage_collection_keeps_the_newest(tmp_path, corpus):
  vectors, ids, _ = corpus
  for version in (5, 10, 15, 20):
    _export(tmp_path, version, vectors[:100], ids[:100], num_shards=1, build_scann=False)
  stale = new_export_dir(str(tmp_path), 25)  # a writer that crashed 10 hours ago
  marker = os.path.join(stale, versioned.WRITER_MARKER)
  versioned.write_json_atomic(marker, {"started_at": time.time() - 10 * 3600})
  os.utime(marker, (time.time() - 10 * 3600,) * 2)
  fresh = new_export_dir(str(tmp_path), 30)  # a writer still at work
  deleted = garbage_collect(str(tmp_path), keep=2)
  assert [e.version for e in list_exports(str(tmp_path))] == [15, 20]
  assert stale in deleted and os.path.isdir(fresh)


def test_scann_searcher_saved_in_a_savedmodel(tmp_path, corpus):
  """The searcher's state and the search op travel together in one SavedModel."""
  vectors, ids, queries = corpus
  searcher = ScannSearcher.build(vectors[:3000], ids[:3000])
  module = tf.Module()
  module.scann_state = searcher.state
  module.block_ids = searcher.block_ids

  @tf.function(input_signature=[tf.TensorSpec([None, 32], tf.float32)])
  def search(q):
    from scann.scann_ops.py import scann_ops  # pylint: disable=g-import-not-at-top
    handle = scann_ops.searcher_from_module(module.scann_state)
    idx, scores = handle.search_batched(q, final_num_neighbors=5)
    return {"block_ids": tf.gather(module.block_ids, idx), "scores": scores}

  module.search = search
  tf.saved_model.save(module, str(tmp_path / "model"),
                      signatures={"serving_default": search})
  loaded = tf.saved_model.load(str(tmp_path / "model"))
  out = loaded.signatures["serving_default"](tf.constant(queries[:3]))
  want, _ = _exact_top(vectors[:3000], ids[:3000], queries[:3], 5)
  assert _recall(out["block_ids"].numpy(), want) >= 0.9


@pytest.mark.parametrize("scattered", [False, True])
def test_streamed_embeddings_give_numpy_row_order_a_row_block_at_a_time(tmp_path, scattered):
  """StreamedEmbeddings.rows over shards of consecutive rows (read by slices) and over
  shards holding scattered rows (read by masks): every row block, including ones that
  cross shard boundaries, is the NumPy row-ordered array's; the shard arrays read are
  read-only views of the verified bytes."""
  from realm_tf.retrieval.index_export import (  # noqa: PLC0415
      ShardData, latest_export, load_shard_array, write_export)
  from realm_tf.retrieval.knowledge_index import StreamedEmbeddings  # noqa: PLC0415
  rng = np.random.default_rng(4)
  block_ids = np.sort(rng.choice(10_000, size=103, replace=False)).astype(np.int64)
  vectors = rng.normal(size=[103, 6]).astype(np.float32)
  rows = rng.permutation(103) if scattered else np.arange(103)
  pieces = np.array_split(rows, 4)
  path = write_export(str(tmp_path / "index"), 1,
                      [ShardData(vectors[p], block_ids[p]) for p in pieces],
                      build_scann=False)
  export = latest_export(str(tmp_path / "index"))
  assert export.path == path
  streamed = StreamedEmbeddings(export, block_ids)
  assert streamed.shape == (103, 6)
  for start, end in ((0, 103), (0, 10), (20, 60), (25, 26), (90, 103)):
    np.testing.assert_array_equal(streamed.rows(start, end), vectors[start:end])
  shard = load_shard_array(export, 0, 4, "embeddings.npy")
  np.testing.assert_array_equal(shard, vectors[pieces[0]])
  assert not shard.flags.writeable
