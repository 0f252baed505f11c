"""The Open-QA model: retrieve top-k blocks in the step, read them, score answer spans.

p(y|x) = Σ_z p(y|z,x) p(z|x) over the top-k blocks of the index (ORQA / REALM fine-tuning).
The query tower and the reader train; the document tower trains only when the index is
refreshed during fine-tuning (then retrieved blocks are re-embedded live, as in REALM
pre-training, so the gradient reaches it). With BM25 retrieval there is no retriever model:
the top-k and their scores come with the features.
"""
from typing import NamedTuple, Optional

import tensorflow as tf
import tf_keras

from realm_tf.modeling.models.reader import Reader
from realm_tf.modeling.models.retriever import Retriever
from realm_tf.openqa import spans
from realm_tf.retrieval.knowledge_index import KnowledgeIndex

BERT_KEYS = ("input_word_ids", "input_mask", "input_type_ids")


class OpenQAOutputs(NamedTuple):
  rows: tf.Tensor  # [B, R] index rows of the retrieved blocks, best first
  retrieval_logits: tf.Tensor  # [B, R] relevance scores (the logits of p(z|x))
  span_logits: tf.Tensor  # [B, K, S] over the K <= R blocks read
  span_starts: tf.Tensor  # [S] token positions in the reader inputs
  span_ends: tf.Tensor  # [S]
  reader_inputs: dict  # BERT inputs [B, K, Lr] and body_start [B]


class OpenQAModel(tf_keras.Model):
  """Retriever (None for BM25) and reader; the checkpoint holds exactly these two.

  The KnowledgeIndex is passed to each call rather than owned, so checkpoints stay the size
  of the networks and one model can be evaluated against another corpus.
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

  def retrieve(self, features: dict, index: KnowledgeIndex, k: int,
               training=None) -> tuple[tf.Tensor, tf.Tensor, object]:
    """Rows [B, k] of the top-k blocks, relevance logits [B, k], and the gathered blocks."""
    if self.retriever is None:
      rows = index.rows(features["bm25"]["block_ids"][:, :k])
      return rows, tf.cast(features["bm25"]["scores"][:, :k], tf.float32), index.gather(rows)
    query = self.retriever.embed_queries(features["query"], training=training)  # [B, P]
    # MIPS picks the blocks; the logits are recomputed below so that they carry gradient.
    rows = index.search(query, k).rows  # [B, k]
    blocks = index.gather(rows)
    if self.train_document_encoder:
      documents = self.retriever.embed_documents(blocks.document, training=training)
    else:
      documents = blocks.embeddings  # [B, k, P] the index's (fixed) embeddings
    logits = Retriever.relevance(query, tf.cast(documents, query.dtype))
    return rows, tf.cast(logits, tf.float32), blocks

  def call(self, features: dict, index: KnowledgeIndex, num_retrieved: int, num_read: int,
           training=None) -> OpenQAOutputs:
    """Retrieves `num_retrieved` blocks and reads the best `num_read` of them."""
    rows, logits, blocks = self.retrieve(features, index, num_retrieved, training=training)
    inputs = spans.pack_reader_inputs(
        features["query"]["input_word_ids"], features["query"]["input_mask"],
        blocks.body_ids[:, :num_read], blocks.body_lengths[:, :num_read],
        self.reader_seq_length, self.sep_id)
    outputs = self.reader({k: inputs[k] for k in BERT_KEYS}, training=training)
    return OpenQAOutputs(rows, logits, outputs["span_logits"], outputs["span_starts"],
                         outputs["span_ends"], inputs)
