"""The block text store and the knowledge index's text layout (what evaluation and the
exports read at Wikipedia scale): the same tokens, embeddings and search results as the
token-table layout, embeddings loaded a row block at a time from shards in any order, a
broken export refused with the current version kept, and no text or table of every block
held in the text layout."""
import os

import numpy as np
import pytest
import tensorflow as tf

from realm_tf.configs import experiments
from realm_tf.data import block_texts
from realm_tf.data.block_store import BlockStore
from realm_tf.io import versioned
from realm_tf.retrieval import row_blocks
from realm_tf.retrieval.index_export import ShardData, write_export
from realm_tf.retrieval.knowledge_index import KnowledgeIndex

LC, LB, P, N = 16, 10, 6, 23


def _store(n=N, seed=0):
  rng = np.random.default_rng(seed)
  ids = np.sort(rng.choice(10**12, size=n, replace=False)).astype(np.int64)
  words = ["alpha", "beta", "gamma", "river", "city", "café", "naïve", "[SEP]", "tower"]
  texts = [" ".join(rng.choice(words, size=2 + i % 13)) for i in range(n)]
  titles = [f"Title {i} {'ü' * (i % 3)}" for i in range(n)]
  return BlockStore(ids, [f"doc{i}" for i in range(n)], titles, texts)


@pytest.fixture(scope="module")
def store():
  return _store()


@pytest.fixture(scope="module")
def vectors():
  return np.random.default_rng(1).normal(size=[N, P]).astype(np.float32)


@pytest.fixture(scope="module")
def text_dir(store, tmp_path_factory):
  directory = str(tmp_path_factory.mktemp("store") / "texts")
  block_texts.store_from_blocks(directory, store, blocks_per_chunk=4)
  return directory


def _text_index(store_dir, tokenizer):
  return KnowledgeIndex(block_texts.HostBlockTexts(store_dir), tokenizer, LC, LB, P,
                        texts=block_texts.BlockTexts(store_dir))


def test_host_rows_read_what_was_written_and_only_committed_stores(store, text_dir, tmp_path):
  host = block_texts.HostBlockTexts(text_dir)
  assert len(host) == N and host.num_chunks == 6
  np.testing.assert_array_equal(host.block_ids, store.block_ids)
  assert host.text_strings[7] == store.text_strings[7]
  assert host.titles[2:5] == store.title_strings[2:5]
  assert list(host.rows(store.block_ids[[3, 0]])) == [3, 0]
  with pytest.raises(IndexError):
    host.row(N)
  manifest = versioned.read_json(os.path.join(text_dir, versioned.MANIFEST))
  assert {f["name"] for f in manifest["files"]} >= {block_texts.chunk_name(5),
                                                    block_texts.IDS_FILE}
  # Being written (no manifest yet) is not a store.
  partial = str(tmp_path / "partial")
  os.makedirs(partial)
  with open(os.path.join(partial, block_texts.DESCRIPTION_FILE), "w") as f:
    f.write("{}")
  with pytest.raises(FileNotFoundError, match="no committed block text store"):
    block_texts.HostBlockTexts(partial)
  with pytest.raises(ValueError, match="not above"):
    block_texts.write_block_texts(str(tmp_path / "unsorted"), [(2, "a", "b"), (1, "c", "d")], 2)


def test_the_text_layout_gathers_and_searches_what_the_tables_give(store, vectors,
                                                                   text_dir, tokenizer):
  tables = KnowledgeIndex(store, tokenizer, LC, LB, P)
  tables.set_embeddings(vectors, version=1)
  texts = _text_index(text_dir, tokenizer)
  texts.set_embeddings(vectors, version=1)
  assert not hasattr(texts, "word_ids") and not hasattr(texts, "body_ids")
  rows = tf.constant([[0, 3, 4, 22], [21, 9, 9, 1]])
  want, got = tables.gather(rows), texts.gather(rows)
  for key in want.document:
    np.testing.assert_array_equal(got.document[key].numpy(), want.document[key].numpy(), key)
  np.testing.assert_array_equal(got.body_ids.numpy(), want.body_ids.numpy())
  np.testing.assert_array_equal(got.body_lengths.numpy(), want.body_lengths.numpy())
  np.testing.assert_array_equal(got.embeddings.numpy(), want.embeddings.numpy())
  queries = tf.random.stateless_normal([3, P], seed=[2, 3])
  np.testing.assert_array_equal(texts.search(queries, 5).rows.numpy(),
                                tables.search(queries, 5).rows.numpy())


def test_row_blocks_search_and_take_as_one_table(vectors, monkeypatch):
  blocks = row_blocks.RowBlocks.from_array(vectors, rows_per_block=5)  # 5 blocks, last of 3
  assert len(blocks.blocks) == 5 and blocks.shape == (N, P)
  queries = np.random.default_rng(4).normal(size=[7, P]).astype(np.float32)
  scores, rows = blocks.top_k(tf.constant(queries), 6)
  exact = queries @ vectors.T
  want = np.argsort(-exact, axis=1, kind="stable")[:, :6]
  np.testing.assert_array_equal(rows.numpy(), want)
  np.testing.assert_allclose(scores.numpy(), np.take_along_axis(exact, want, 1), rtol=1e-5)
  picked = tf.constant([[22, 0, 4], [5, 9, 10]])
  np.testing.assert_array_equal(blocks.take(picked).numpy(), vectors[picked.numpy()])
  np.testing.assert_array_equal(blocks.numpy(), vectors)
  with pytest.raises(ValueError, match="do not fit"):
    blocks.assign(vectors[:-1])


def test_row_blocks_cast_block_by_block_keeps_the_layout(vectors):
  """cast: the same blocks' bounds, the values as NumPy casts them, new variables (the
  original's stay float32)."""
  blocks = row_blocks.RowBlocks.from_array(vectors, rows_per_block=5)
  half = blocks.cast("float16")
  assert half.dtype == tf.float16 and blocks.dtype == tf.float32
  assert half.bounds == blocks.bounds
  np.testing.assert_array_equal(half.numpy(), vectors.astype(np.float16))
  assert not {id(v) for v in half.blocks} & {id(v) for v in blocks.blocks}


def test_unfilled_row_blocks_hold_nothing_until_filled(vectors):
  """An index's blocks before its first version: no values (a search fails rather than
  ranking a zero table), then the filled table searches as the NumPy reference."""
  blocks = row_blocks.RowBlocks.unfilled(N, P, rows_per_block=5)
  assert blocks.shape == (N, P) and len(blocks.blocks) == 5
  assert not any(bool(v.is_initialized()) for v in blocks.blocks)
  queries = np.random.default_rng(5).normal(size=[3, P]).astype(np.float32)
  with pytest.raises(ValueError, match="static shape"):
    blocks.top_k(tf.constant(queries), 2)
  blocks.assign_blocks(lambda start, end: vectors[start:end])
  scores, rows = blocks.top_k(tf.constant(queries), 4)
  exact = queries @ vectors.T
  want = np.argsort(-exact, axis=1, kind="stable")[:, :4]
  np.testing.assert_array_equal(rows.numpy(), want)
  np.testing.assert_allclose(scores.numpy(), np.take_along_axis(exact, want, 1), rtol=1e-5)


def test_embeddings_stream_from_shards_in_any_order_into_row_blocks(
    store, vectors, text_dir, tokenizer, tmp_path, monkeypatch):
  """Shards partition the blocks by id modulo 3 (not in row order); the index fills 4
  row blocks of 7 rows, each from every shard, and searches as the whole table would."""
  monkeypatch.setattr(row_blocks, "ROWS_PER_BLOCK", 7)
  index_dir = str(tmp_path / "index")
  parts = [np.arange(N)[np.arange(N) % 3 == s][::-1] for s in range(3)]
  write_export(index_dir, 5, [ShardData(vectors[r], store.block_ids[r]) for r in parts],
               build_scann=False)
  index = KnowledgeIndex(block_texts.HostBlockTexts(text_dir), tokenizer, LC, LB, P,
                         texts=block_texts.BlockTexts(text_dir))
  assert len(index.embedding_blocks.blocks) == 4
  assert index.maybe_swap(index_dir) and index.version == 5
  np.testing.assert_array_equal(index.embedding_blocks.numpy(), vectors)
  queries = tf.random.stateless_normal([2, P], seed=[7, 8])
  want = np.argsort(-(queries.numpy() @ vectors.T), axis=1, kind="stable")[:, :4]
  np.testing.assert_array_equal(index.search(queries, 4).rows.numpy(), want)
  # An export missing a block is refused; the current version keeps serving.
  write_export(index_dir, 6, [ShardData(vectors[1:], store.block_ids[1:])], build_scann=False)
  assert not index.maybe_swap(index_dir)
  assert index.version == 5
  np.testing.assert_array_equal(index.embedding_blocks.numpy(), vectors)


def test_ensure_store_builds_once_from_the_corpus_and_reuses_it(store, tmp_path):
  corpus = str(tmp_path / "corpus")
  from realm_tf.corpus import published, schema
  published.publish_records(corpus, dict(blocks=([dict(
      block_id=int(store.block_ids[i]), doc_uid=str(store.doc_uids[i]),
      title=store.title_strings[i], text=store.text_strings[i])
      for i in range(len(store))], schema.BLOCK)))
  config = experiments.experiment_config(experiments.OPENQA).replace(
      index=dict(blocks=corpus))
  run = str(tmp_path / "run")
  made = block_texts.ensure_store(config, run)
  directory = made.index.text_store
  assert directory.startswith(os.path.join(run, "block_texts"))
  host = block_texts.HostBlockTexts(directory)
  assert host.text_strings[:] == store.text_strings
  stamp = os.path.getmtime(os.path.join(directory, versioned.MANIFEST))
  assert block_texts.ensure_store(config, run).index.text_store == directory
  assert os.path.getmtime(os.path.join(directory, versioned.MANIFEST)) == stamp
