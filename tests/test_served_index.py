"""The QA export's corpus layout (realm_tf.export.served_index) and the trainer's narrow
token tables: the same blocks, tokens, embeddings and search results as the training-time
KnowledgeIndex, with texts read from compressed chunk files that survive a save and load,
and type ids derived instead of stored."""
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from realm_tf.data import block_texts
from realm_tf.data.block_store import BlockStore
from realm_tf.export import served_index
from realm_tf.export.exporter import copy_asset_files
from realm_tf.retrieval import scann_index
from realm_tf.retrieval.knowledge_index import KnowledgeIndex, token_dtype, type_ids_of
from realm_tf.retrieval.searcher import Searcher, SearchResult

LC, LB, P = 16, 10, 6


def _store(n=23, seed=0):
  rng = np.random.default_rng(seed)
  ids = np.sort(rng.choice(10**12, size=n, replace=False)).astype(np.int64)
  words = ["alpha", "beta", "gamma", "delta", "river", "city", "paris", "tower", "café",
           "naïve", "[SEP]"]
  texts = [" ".join(rng.choice(words, size=2 + i % 13)) for i in range(n)]
  titles = [f"Title {i} {'ü' * (i % 3)}" for i in range(n)]
  return BlockStore(ids, [f"doc{i}" for i in range(n)], titles, texts)


@pytest.fixture(scope="module")
def index(tokenizer):
  store = _store()
  index = KnowledgeIndex(store, tokenizer, block_seq_length=LC, body_length=LB, dimension=P)
  index.set_embeddings(np.random.default_rng(1).normal(size=[len(store), P]), version=3)
  return index


def test_token_tables_are_narrow_and_type_ids_derive_from_word_ids(tokenizer, index):
  assert token_dtype(tokenizer.vocab_size) == np.uint16  # 30,522 entries
  assert token_dtype(70_000) == np.int32
  assert index.word_ids.dtype == tf.uint16 and index.body_ids.dtype == tf.uint16
  assert not hasattr(index, "type_ids")
  store = index.store
  packed = tokenizer.encode(tf.constant(store.title_strings), LC,
                            pair_texts=tf.constant(store.text_strings))
  np.testing.assert_array_equal(
      type_ids_of(packed.input_word_ids, tokenizer.sep_id).numpy(),
      packed.input_type_ids.numpy())
  rows = tf.constant([[0, 5, 22], [7, 7, 1]])
  blocks = index.gather(rows)
  np.testing.assert_array_equal(blocks.document["input_word_ids"].numpy(),
                                tf.gather(packed.input_word_ids, rows).numpy())
  np.testing.assert_array_equal(blocks.document["input_type_ids"].numpy(),
                                tf.gather(packed.input_type_ids, rows).numpy())
  assert blocks.body_ids.dtype == tf.int32


def test_served_index_gathers_what_the_knowledge_index_gathers(tokenizer, index):
  served = served_index.served_index_from(index, tokenizer, blocks_per_chunk=4)
  assert served.version == 3 and served.texts.num_chunks == 6
  rows = tf.constant([[0, 3, 4, 22], [21, 9, 9, 1]])
  want, got = index.gather(rows), served.gather(rows)
  for key in want.document:
    np.testing.assert_array_equal(got.document[key].numpy(), want.document[key].numpy(), key)
  np.testing.assert_array_equal(got.body_ids.numpy(), want.body_ids.numpy())
  np.testing.assert_array_equal(got.body_lengths.numpy(), want.body_lengths.numpy())
  np.testing.assert_array_equal(got.embeddings.numpy(), want.embeddings.numpy())
  store = index.store
  assert [[t.decode() for t in row] for row in got.titles.numpy()] == [
      [store.title_strings[r] for r in row] for row in rows.numpy()]
  assert [[t.decode() for t in row] for row in got.texts.numpy()] == [
      [store.text_strings[r] for r in row] for row in rows.numpy()]
  queries = tf.random.stateless_normal([3, P], seed=[2, 3])
  expected = index.search(queries, 5)
  found = served.search(queries, 5)
  np.testing.assert_array_equal(found.rows.numpy(), expected.rows.numpy())
  np.testing.assert_array_equal(found.block_ids.numpy(), expected.block_ids.numpy())
  np.testing.assert_allclose(found.scores.numpy(), expected.scores.numpy(), rtol=1e-6)
  np.testing.assert_array_equal(served.rows(expected.block_ids).numpy(), expected.rows.numpy())


def test_texts_are_read_from_the_loaded_copy_of_a_saved_model(tokenizer, index, tmp_path):
  served = served_index.served_index_from(index, tokenizer, texts_dir=str(tmp_path / "src"),
                                          blocks_per_chunk=5)

  class Module(tf.Module):

    def __init__(self):
      super().__init__()
      self.served = served
      self.asset_files = served.texts.asset_files

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
    def lookup(self, rows):
      return served.texts.lookup(rows)

  module = Module()
  saved = str(tmp_path / "saved")
  tf.saved_model.save(module, saved)
  assert copy_asset_files(module, saved) == 5
  moved = str(tmp_path / "moved")
  shutil.move(saved, moved)
  shutil.rmtree(tmp_path / "src")  # the loaded model must read its own copy
  loaded = tf.saved_model.load(moved)
  rows = np.array([[22, 0], [13, 14]])
  titles, texts = loaded.lookup(tf.constant(rows, tf.int32))
  store = index.store
  assert [[t.decode() for t in r] for r in titles.numpy()] == [
      [store.title_strings[i] for i in r] for r in rows]
  assert [[t.decode() for t in r] for r in texts.numpy()] == [
      [store.text_strings[i] for i in r] for r in rows]
  # Not one string variable holds the texts: the checkpoint holds offsets, not text.
  dtypes = tf.train.load_checkpoint(os.path.join(moved, "variables", "variables")
                                    ).get_variable_to_dtype_map()
  strings = [name for name, dtype in dtypes.items()
             if dtype == tf.string and name != "_CHECKPOINTABLE_OBJECT_GRAPH"]
  assert not strings and len(dtypes) > 3, dtypes


def _triples(n):
  return [(i, "t", "x") for i in range(n)]


def test_a_store_of_another_format_or_size_is_refused(tokenizer, index, tmp_path):
  directory = str(tmp_path / "texts")
  block_texts.write_block_texts(directory, _triples(3), 3)
  description = os.path.join(directory, block_texts.DESCRIPTION_FILE)
  with open(description) as f:
    record = json.load(f)
  with open(description, "w") as f:
    json.dump(dict(record, format_version=block_texts.FORMAT_VERSION + 1), f)
  with pytest.raises(ValueError, match="format"):
    block_texts.BlockTexts(directory)
  with pytest.raises(ValueError, match="announced"):
    block_texts.write_block_texts(str(tmp_path / "short"), _triples(2), 3)
  block_texts.write_block_texts(str(tmp_path / "three"), _triples(3), 3)
  texts = block_texts.BlockTexts(str(tmp_path / "three"))
  with pytest.raises(ValueError, match="text store holds 3 blocks"):
    served_index.ServedIndex(np.zeros([4, P], np.float32), np.arange(4), texts, tokenizer,
                             LC, LB)


def test_float16_embeddings_and_row_blocks_served_as_they_are(tokenizer, index):
  """float16 halves the embeddings and finds the same blocks here; row blocks (a text-layout
  KnowledgeIndex's, float32) are served as they are, not copied; no embeddings at all
  needs a searcher."""
  half = served_index.served_index_from(index, tokenizer, embedding_dtype="float16")
  assert half.embeddings.dtype == tf.float16
  full = served_index.served_index_from(index, tokenizer)
  queries = tf.random.stateless_normal([4, P], seed=[5, 6])
  np.testing.assert_array_equal(half.search(queries, 3).rows.numpy(),
                                full.search(queries, 3).rows.numpy())
  assert full.embeddings is index.embedding_blocks  # float32: evaluation's own variables
  with pytest.raises(ValueError, match="needs a searcher"):
    served_index.ServedIndex(None, index.store.block_ids, full.texts, tokenizer, LC, LB)


class _Proposer(Searcher):
  """Proposes blocks in a wrong order (exact scores plus noise large enough to reorder
  them), as a quantized searcher misorders near-ties; `found` caps the real candidates,
  the rest padded as ScannSearcher pads a short result (block 0, the lowest score)."""

  def __init__(self, embeddings, block_ids, found=None):
    super().__init__()
    self.embeddings = tf.constant(embeddings, tf.float32)
    self.ids = tf.constant(block_ids)
    self.found = found

  @property
  def num_blocks(self):
    return int(self.ids.shape[0])

  @property
  def dimension(self):
    return int(self.embeddings.shape[1])

  def search(self, queries, k):
    noisy = (tf.matmul(queries, self.embeddings, transpose_b=True)
             + tf.random.stateless_normal([tf.shape(queries)[0], self.num_blocks], [1, 2],
                                          stddev=3.0))
    top = tf.math.top_k(noisy, k=k)
    ids, scores = tf.gather(self.ids, top.indices), top.values
    if self.found is not None:
      real = tf.range(k)[None, :] < self.found
      ids = tf.where(real, ids, self.ids[0])
      scores = tf.where(real, scores, tf.float32.min)
    return SearchResult(ids, scores)


def test_a_searchers_candidates_are_rescored_by_the_embeddings(tokenizer, index):
  """With embeddings and a searcher, the searcher proposes RESCORED_PER_NEIGHBOUR x k
  candidates and the embeddings rank and score them: here every block is a candidate,
  so the result is exact search's (ids, rows and scores), where the searcher's own order
  is not; with no embedding dtype the searcher's order and scores are served. A short
  result's padding stays last."""
  embeddings = index.embedding_blocks.numpy()
  ids = index.store.block_ids
  assert 3 * served_index.RESCORED_PER_NEIGHBOUR >= len(ids)  # every block proposed
  proposer = _Proposer(embeddings, ids)
  exact = served_index.served_index_from(index, tokenizer)
  rescored = served_index.served_index_from(index, tokenizer, searcher=proposer,
                                            embedding_dtype="float32")
  own = served_index.served_index_from(index, tokenizer, searcher=proposer,
                                       embedding_dtype=None)
  assert own.embeddings is None and rescored.embeddings is not None
  queries = tf.random.stateless_normal([6, P], seed=[7, 8])
  want = exact.search(queries, 3)
  got = rescored.search(queries, 3)
  np.testing.assert_array_equal(got.block_ids.numpy(), want.block_ids.numpy())
  np.testing.assert_array_equal(got.rows.numpy(), want.rows.numpy())
  np.testing.assert_allclose(got.scores.numpy(), want.scores.numpy(), rtol=1e-6, atol=1e-6)
  proposed = own.search(queries, 3)
  assert not np.array_equal(proposed.block_ids.numpy(), want.block_ids.numpy())
  half = served_index.served_index_from(index, tokenizer, searcher=proposer,
                                        embedding_dtype="float16").search(queries, 3)
  np.testing.assert_array_equal(half.block_ids.numpy(), want.block_ids.numpy())
  np.testing.assert_allclose(half.scores.numpy(), want.scores.numpy(), rtol=2e-3, atol=2e-3)
  short = served_index.ServedIndex(embeddings, ids, exact.texts, tokenizer, LC, LB,
                                   searcher=_Proposer(embeddings, ids, found=2))
  result = short.search(queries, 3)
  assert (result.scores.numpy()[:, :2] > tf.float32.min).all()
  assert (result.scores.numpy()[:, 2] == tf.float32.min).all()
  with pytest.raises(ValueError, match="needs a searcher"):
    served_index.served_index_from(index, tokenizer, embedding_dtype=None)


def test_a_request_chooses_how_many_candidates_are_rescored(tokenizer, index):
  """reorder_num_neighbors bound by scann_index.searching_with is the number of the
  searcher's candidates the embeddings re-score: k of them gives the searcher's own top k
  ranked by exact scores (a NumPy reference), every block gives exact search's top k; a
  count in a tensor (a served request's) chooses the same in a traced function, and 0
  there leaves k x RESCORED_PER_NEIGHBOUR."""
  embeddings = index.embedding_blocks.numpy()
  ids = index.store.block_ids
  proposer = _Proposer(embeddings, ids)
  rescored = served_index.served_index_from(index, tokenizer, searcher=proposer,
                                            embedding_dtype="float32")
  queries = tf.random.stateless_normal([6, P], seed=[7, 8])
  k = 3
  assert served_index.rescored_candidates(k, len(ids)) == len(ids)  # 60 clipped to N
  assert served_index.rescored_candidates(k, 1000, 7) == 7
  assert served_index.rescored_candidates(k, 1000, 1) == k
  proposed = proposer.search(queries, k).block_ids.numpy()  # the searcher's own top k
  exact_scores = queries.numpy() @ embeddings.T  # [6, N]
  row_of = {int(b): r for r, b in enumerate(ids)}
  want = [sorted(row, key=lambda b, q=q: -exact_scores[q, row_of[int(b)]])
          for q, row in enumerate(proposed)]
  with scann_index.searching_with(scann_index.SearchOptions(reorder_num_neighbors=k)):
    few = rescored.search(queries, k)
  np.testing.assert_array_equal(few.block_ids.numpy(), want)
  everything = rescored.search(queries, k).block_ids.numpy()  # N candidates by default
  order = np.argsort(-exact_scores, axis=1, kind="stable")[:, :k]
  np.testing.assert_array_equal(everything, ids[order])
  assert not np.array_equal(few.block_ids.numpy(), everything)

  @tf.function(input_signature=[tf.TensorSpec([], tf.int32)])
  def served(reorder):
    with scann_index.searching_with(scann_index.SearchOptions(reorder_num_neighbors=reorder)):
      return rescored.search(queries, k).block_ids

  np.testing.assert_array_equal(served(tf.constant(k)).numpy(), want)
  np.testing.assert_array_equal(served(tf.constant(0)).numpy(), everything)
