"""The Beam embedding pipeline: block TFRecords → sharded, versioned ScaNN export."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from beam import embed_corpus
from realm_tf.corpus import published, schema
from realm_tf.retrieval.encoders import BlockEncoder, QueryEncoder, export_encoder, load_encoder
from realm_tf.modeling import factory
from realm_tf.retrieval import list_exports, load_searcher

TOPICS = ["rivers and lakes", "mountain climbing", "violin music", "bread baking",
          "chess openings", "ocean tides", "honey bees", "volcanic eruptions"]


@pytest.fixture(scope="module")
def encoder_exports(tmp_path_factory, tiny_config, tokenizer):
  root = tmp_path_factory.mktemp("export")
  retriever = factory.build_retriever(tiny_config)
  block = export_encoder(BlockEncoder(retriever.document_embedder, tokenizer,
                                      tiny_config.model.retriever.block_seq_length),
                         str(root / "block_encoder"), step=40)
  query = export_encoder(QueryEncoder(retriever.query_embedder, tokenizer,
                                      tiny_config.model.retriever.query_seq_length),
                         str(root / "query_encoder"), step=40)
  return block, query


@pytest.fixture(scope="module")
def blocks_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("corpus")
  rows = [dict(block_id=1000 + 37 * i, doc_uid=f"doc{i // 3}", title=f"Topic {i % 8}",
               text=f"A passage about {TOPICS[i % 8]}, number {i}.") for i in range(60)]
  published.publish_records(str(path), dict(blocks=(rows, schema.BLOCK)), num_shards=2)
  return path, rows


def test_pipeline_writes_a_sharded_versioned_export(tmp_path, encoder_exports, blocks_dir):
  block_encoder, query_encoder = encoder_exports
  blocks, rows = blocks_dir
  index_dir = tmp_path / "index"
  path = embed_corpus.run([
      "--blocks", str(blocks), "--encoder", os.path.dirname(block_encoder),
      "--output_dir", str(index_dir), "--num_shards", "3", "--batch_size", "16",
      "--scann_overrides", json.dumps({"reorder_num_neighbors": 50})])
  assert os.path.basename(path).startswith("000000000040.")  # version = encoder step
  [export] = list_exports(str(index_dir))
  manifest = export.manifest
  assert manifest["num_blocks"] == 60 and manifest["num_shards"] == 3
  assert manifest["encoder"]["step"] == 40 and manifest["encoder"]["fingerprint"]
  assert manifest["dimension"] == 16 and manifest["build_seconds"] > 0
  assert all(s["scann"]["mode"] == "brute_force" for s in manifest["shards"])
  # Only the committed data directory and its manifest: nothing uncommitted is left.
  assert sorted(os.listdir(index_dir)) == sorted(
      [os.path.basename(path), "000000000040.manifest.json"])

  # The index holds exactly the block encoder's embeddings of every block.
  encode = load_encoder(block_encoder)
  want = encode(title=tf.constant([r["title"] for r in rows]),
                text=tf.constant([r["text"] for r in rows]))["embeddings"].numpy()
  exact = load_searcher(str(index_dir), backend="exact")
  assert exact.num_blocks == 60
  ids = np.array([r["block_id"] for r in rows])
  query = load_encoder(query_encoder)(text=tf.constant(["a passage about honey bees"]))
  q = query["embeddings"].numpy()
  result = exact.search(tf.constant(q), 5)
  order = np.argsort(-(q @ want.T)[0], kind="stable")[:5]
  np.testing.assert_allclose(result.scores.numpy()[0], (q @ want.T)[0][order], rtol=1e-4,
                             atol=1e-5)
  scann = load_searcher(str(index_dir), backend="scann").search(tf.constant(q), 5)
  assert set(scann.block_ids.numpy()[0]) == set(ids[order])


def test_more_shards_than_blocks_still_commits(tmp_path, encoder_exports, blocks_dir):
  block_encoder, _ = encoder_exports
  blocks, _ = blocks_dir
  path = embed_corpus.run([
      "--blocks", str(blocks), "--encoder", block_encoder, "--output_dir",
      str(tmp_path / "index"), "--num_shards", "80", "--version", "7", "--no_scann",
      "--embedding_dtype", "float16"])
  [export] = list_exports(str(tmp_path / "index"))
  assert export.path == path and export.manifest["num_blocks"] == 60
  assert sum(1 for s in export.manifest["shards"] if s["num_blocks"] == 0) >= 20
  assert load_searcher(path, backend="exact").num_blocks == 60
