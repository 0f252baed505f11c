"""The Open-QA model: retrieve top-k blocks in the step, read them, score answer spans.

p(y|x) = Σ_z p(y|z,x) p(z|x) over the top-k blocks of the fixed index (ORQA / REALM
fine-tuning). The query tower and the reader train; the document tower trains only when
the index is refreshed during fine-tuning (then retrieved blocks are re-embedded live, as in
REALM pre-training, so the gradient reaches it). With BM25 retrieval there is no retriever
model: the top-k and their scores come with the features.
"""
from typing import Optional

import tensorflow as tf
import tf_keras

from realm_tf.modeling.models.reader import Reader
from realm_tf.modeling.models.retriever import Retriever
from realm_tf.openqa import spans
from realm_tf.openqa.corpus import Corpus

BERT_KEYS = ("input_word_ids", "input_mask", "input_type_ids")


def _sub(features: dict, prefix: str) -> dict:
  return {k: features[f"{prefix}_{k}"] for k in BERT_KEYS}


class OpenQAModel(tf_keras.Model):
  """Retriever (None for BM25) and reader; the checkpoint holds exactly these two.

  The corpus (tables, index) is passed to each call rather than owned, so checkpoints stay
  the size of the networks and one model can be evaluated against another corpus.
  """

  def __init__(self, reader: Reader, retriever: Optional[Retriever] = None,
               reader_seq_length: int = 320, sep_id: int = 102,
               train_document_encoder: bool = False, **kwargs):
    super().__init__(**kwargs)
    self.reader = reader
    self.retriever = retriever
    self.reader_seq_length = reader_seq_length
    self.sep_id = sep_id
    self.train_document_encoder = train_document_encoder

  def retrieve(self, features: dict, corpus: Corpus, k: int,
               training=None) -> tuple[tf.Tensor, tf.Tensor]:
    """Table rows [B, k] of the top-k blocks and their relevance logits [B, k]."""
    if self.retriever is None:
      rows = corpus.table.rows(features["bm25_block_ids"][:, :k])
      return rows, tf.cast(features["bm25_scores"][:, :k], tf.float32)
    if corpus.index is None:
      raise ValueError("dense retrieval needs a DocumentIndex in the corpus")
    query = self.retriever.embed_queries(_sub(features, "query"), training=training)  # [B, P]
    # MIPS picks the blocks; the logits are recomputed below so that they carry gradient.
    rows = corpus.index.search(tf.stop_gradient(query), k).block_ids  # [B, k]
    if self.train_document_encoder:
      documents = self.retriever.embed_documents(corpus.table.block_inputs(rows),
                                                 training=training)  # [B, k, P]
    else:
      documents = corpus.index.document_embeddings(rows)  # [B, k, P]
    logits = Retriever.relevance(query, tf.cast(documents, query.dtype))
    return rows, tf.cast(logits, tf.float32)

  def read(self, features: dict, corpus: Corpus, rows: tf.Tensor, training=None) -> dict:
    """Reader inputs [B, K, Lr] for the given rows and span logits [B, K, S]."""
    body_ids, body_lengths = corpus.table.bodies(rows)  # [B, K, Lb], [B, K]
    inputs = spans.pack_reader_inputs(
        features["query_input_word_ids"], features["query_input_mask"], body_ids,
        body_lengths, self.reader_seq_length, self.sep_id)
    outputs = self.reader({k: inputs[k] for k in BERT_KEYS}, training=training)
    return dict(outputs, reader_inputs=inputs)

  def call(self, features: dict, corpus: Corpus, num_retrieved: int, num_read: int,
           training=None) -> dict:
    """Retrieves `num_retrieved` blocks and reads the best `num_read` of them.

    Returns rows and retrieval_logits [B, num_retrieved], span_logits [B, num_read, S],
    span_starts/ends [S], reader_inputs (BERT inputs [B, num_read, Lr], body_start [B]).
    """
    rows, logits = self.retrieve(features, corpus, num_retrieved, training=training)
    out = self.read(features, corpus, rows[:, :num_read], training=training)
    out.update(rows=rows, retrieval_logits=logits)
    return out
