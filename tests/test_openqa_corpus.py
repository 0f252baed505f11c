"""The knowledge index as a step sees it, loaded from committed index exports: block tables,
search with both backends, and refreshes swapped in place."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf.data.block_store import BlockStore
from realm_tf.retrieval.knowledge_index import KnowledgeIndex
from realm_tf.retrieval import ShardData, latest_export, write_export


def _store(n):
  ids = np.arange(n, dtype=np.int64) * 7919 % 100003  # unsorted, distinct
  return BlockStore(ids, [f"d{i}" for i in range(n)], [f"Title {i}".encode() for i in range(n)],
                    [f"Block number {i} says word{i}.".encode() for i in range(n)])


def _export(tmp_path, store, vectors, version, build_scann):
  order = np.argsort(-store.block_ids)  # shards hold blocks in any order
  halves = np.array_split(order, 2)
  shards = [ShardData(vectors[h], store.block_ids[h]) for h in halves]
  write_export(str(tmp_path), version, shards, build_scann=build_scann)
  return latest_export(str(tmp_path))


def test_index_rows_and_blocks(tokenizer):
  store = _store(6)
  index = KnowledgeIndex(store, tokenizer, block_seq_length=12, body_length=8, dimension=4)
  rows = index.rows(tf.constant([[store.block_ids[3], store.block_ids[0]]]))
  assert rows.numpy().tolist() == [[3, 0]]
  # No index version yet (as under BM25): the blocks' inputs without embeddings.
  blocks = index.gather(rows, embeddings=False)
  assert blocks.embeddings is None
  expected = tokenizer.tokenize(tf.constant([store.texts[3]]))[0].numpy()[:8]
  np.testing.assert_array_equal(blocks.body_ids[0, 0, :len(expected)].numpy(), expected)
  assert int(blocks.body_lengths[0, 0]) == min(len(expected), 8)
  packed = tokenizer.encode(tf.constant([store.titles[3]]), 12,
                            pair_texts=tf.constant([store.texts[3]]))
  for key, value in packed.as_dict().items():
    np.testing.assert_array_equal(blocks.document[key][0, 0].numpy(), value[0].numpy(),
                                  err_msg=key)


@pytest.mark.parametrize("backend", ["exact", "scann"])
def test_index_search_and_refresh_from_exports(tmp_path, tokenizer, backend):
  store = _store(40)
  index = KnowledgeIndex(store, tokenizer, block_seq_length=12, body_length=8, dimension=8,
                         backend=backend)
  rng = np.random.default_rng(0)
  vectors = rng.normal(size=(40, 8)).astype(np.float32)
  index.swap(_export(tmp_path, store, vectors, 0, backend == "scann"))
  queries = rng.normal(size=(3, 8)).astype(np.float32)
  search = tf.function(lambda q: index.search(q, k=4))  # traced once, kept across swaps
  found = search(tf.constant(queries))
  exact_rows = np.argsort(-(queries @ vectors.T), axis=1)[:, :4]
  np.testing.assert_array_equal(found.rows.numpy(), exact_rows)
  np.testing.assert_allclose(index.gather(found.rows).embeddings.numpy(), vectors[exact_rows],
                             rtol=1e-6)
  # A refresh: new embeddings for the same blocks, swapped in place, the same compiled
  # search now follows them (ScaNN's host searcher is a reference that swap replaces).
  new_vectors = rng.normal(size=(40, 8)).astype(np.float32)
  index.swap(_export(tmp_path, store, new_vectors, 1, backend == "scann"))
  assert index.version == 1 and index.num_swaps == 2
  found = search(tf.constant(queries))
  np.testing.assert_array_equal(found.rows.numpy(),
                                np.argsort(-(queries @ new_vectors.T), axis=1)[:, :4])
  assert search.experimental_get_tracing_count() == 1


def test_an_index_of_another_corpus_is_refused(tmp_path, tokenizer):
  store = _store(10)
  export = _export(tmp_path, store, np.ones([10, 4], np.float32), 0, False)
  index = KnowledgeIndex(_store(12), tokenizer, block_seq_length=12, body_length=8,
                         dimension=4)
  with pytest.raises(ValueError, match="rebuild it from these blocks"):
    index.swap(export)
  assert not index.maybe_swap(str(tmp_path))  # logged and skipped, never half-loaded
  assert index.version is None
