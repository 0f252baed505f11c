"""The corpus as the fine-tuning step sees it: block tables and the fixed dense index."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf.data.block_store import BlockStore
from realm_tf.openqa.corpus import BlockTable, DocumentIndex
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


def test_block_table_rows_and_bodies(tokenizer):
  store = _store(6)
  table = BlockTable(store, tokenizer, body_length=8, block_seq_length=12)
  rows = table.rows(tf.constant([[store.block_ids[3], store.block_ids[0]]]))
  assert rows.numpy().tolist() == [[3, 0]]
  body, lengths = table.bodies(rows)
  expected = tokenizer.tokenize(tf.constant([store.texts[3]]))[0].numpy()[:8]
  np.testing.assert_array_equal(body[0, 0, :len(expected)].numpy(), expected)
  assert int(lengths[0, 0]) == min(len(expected), 8)
  inputs = table.block_inputs(rows)
  packed = tokenizer.encode(tf.constant([store.titles[3]]), 12,
                            pair_texts=tf.constant([store.texts[3]]))
  for key, value in packed.as_dict().items():
    np.testing.assert_array_equal(inputs[key][0, 0].numpy(), value[0].numpy(), err_msg=key)


@pytest.mark.parametrize("backend", ["exact", "scann"])
def test_document_index_search_and_refresh(tmp_path, tokenizer, backend):
  store = _store(40)
  table = BlockTable(store, tokenizer, body_length=8)
  rng = np.random.default_rng(0)
  vectors = rng.normal(size=(40, 8)).astype(np.float32)
  index = DocumentIndex(table, _export(tmp_path, store, vectors, 0, backend == "scann"),
                        backend=backend)
  queries = rng.normal(size=(3, 8)).astype(np.float32)
  found = index.search(tf.constant(queries), k=4)
  exact_rows = np.argsort(-(queries @ vectors.T), axis=1)[:, :4]
  np.testing.assert_array_equal(found.block_ids.numpy(), exact_rows)
  np.testing.assert_allclose(index.document_embeddings(found.block_ids).numpy(),
                             vectors[exact_rows], rtol=1e-6)
  # A refresh: new embeddings for the same blocks, swapped in place (ScaNN must retrace).
  new_vectors = rng.normal(size=(40, 8)).astype(np.float32)
  retrace = index.swap(_export(tmp_path, store, new_vectors, 1, backend == "scann"))
  assert retrace == (backend == "scann") and index.version == 1
  found = index.search(tf.constant(queries), k=4)
  np.testing.assert_array_equal(found.block_ids.numpy(),
                                np.argsort(-(queries @ new_vectors.T), axis=1)[:, :4])


def test_an_index_of_another_corpus_is_refused(tmp_path, tokenizer):
  store = _store(10)
  vectors = np.ones([10, 4], np.float32)
  export = _export(tmp_path, store, vectors, 0, False)
  with pytest.raises(ValueError, match="rebuild it from these blocks"):
    DocumentIndex(BlockTable(_store(12), tokenizer, body_length=8), export)
