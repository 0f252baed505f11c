"""Zero-shot retrieval recall (realm_tf.retrieval.recall) against a NumPy reference: the
corpus embedded by the document tower, top-k by inner product, answer containment."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf.data.block_store import BlockStore
from realm_tf.modeling import factory
from realm_tf.text.answers import contains_answer
from realm_tf.data.openqa_inputs import QAExample
from realm_tf.retrieval import recall
from realm_tf.retrieval.knowledge_index import KnowledgeIndex
from tests import task_fixtures as tf_


def test_recall_matches_a_numpy_reference(repo_dir, tmp_path, tokenizer):
  config = tf_.tiny_config(repo_dir, str(tmp_path), "pretrain")
  words = ["river", "city", "tower", "bridge", "castle", "harbour", "valley", "forest"]
  rng = np.random.default_rng(0)
  texts = [" ".join(rng.choice(words, size=6)) + f" item{i}" for i in range(23)]
  store = BlockStore(np.arange(100, 123), [f"d{i}" for i in range(23)],
                     [f"T{i}" for i in range(23)], texts)
  retriever = factory.build_retriever(config)
  block_length = config.model.retriever.block_seq_length
  index = KnowledgeIndex(store, tokenizer, block_length, body_length=8,
                         dimension=factory.retriever_output_size(config))
  embeddings = recall.embed_corpus(retriever, index, tokenizer, block_length, batch_size=5)
  assert embeddings.shape == (23, index.dimension)
  # Row r of the embeddings is the document tower's embedding of row r's block.
  packed = tokenizer.encode(tf.constant(store.title_strings[3:4]), block_length,
                            pair_texts=tf.constant(store.text_strings[3:4])).as_dict()
  np.testing.assert_allclose(embeddings[3], retriever.embed_documents(packed)[0].numpy(),
                             rtol=1e-4, atol=1e-5)
  index.set_embeddings(embeddings, version=0)

  questions = [QAExample(f"where is the {w}?", [f"item{i}"]) for i, w in
               zip(range(0, 23, 3), words)]
  got = recall.recall_at(retriever, index, tokenizer, questions, 16, ks=(1, 3, 10),
                         batch_size=3)
  query = retriever.embed_queries(tokenizer.encode(
      tf.constant([q.question for q in questions]), 16).as_dict()).numpy()
  order = np.argsort(-(query @ embeddings.T), axis=1, kind="stable")
  for k in (1, 3, 10):
    expected = np.mean([any(contains_answer(texts[r], q.answers, False) for r in row[:k])
                        for q, row in zip(questions, order)])
    assert got[f"recall@{k}"] == pytest.approx(expected)
  assert got["recall@1"] <= got["recall@3"] <= got["recall@10"]
  with pytest.raises(ValueError, match="at least one question"):
    recall.recall_at(retriever, index, tokenizer, [], 16)
