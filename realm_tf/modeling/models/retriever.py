"""The knowledge retriever: relevance(x, z) = Embed_query(x) · Embed_doc(z)."""
from typing import Optional

import tensorflow as tf
import tf_keras

from realm_tf.modeling.networks.embedder import Embedder


class Retriever(tf_keras.Model):
  """Query and document towers (the same object when towers are shared).

  call() scores the candidates it is given: p(z|x) = softmax over those candidates. MIPS
  over the whole corpus uses the same towers through `embed_queries`/`embed_documents`;
  the scoring options (projection, L2 normalisation, scale) live in the Embedder, so every
  user of these two methods scores alike.
  """

  def __init__(self, query_embedder: Embedder, document_embedder: Optional[Embedder] = None,
               **kwargs):
    super().__init__(**kwargs)
    self.query_embedder = query_embedder
    self.document_embedder = document_embedder or query_embedder

  @property
  def shares_towers(self) -> bool:
    return self.document_embedder is self.query_embedder

  def embed_queries(self, inputs, training=None) -> tf.Tensor:
    """[B, Lq] inputs → [B, P], carrying the relevance scale (see Embedder)."""
    return self.query_embedder(inputs, training=training, query=True)

  def embed_documents(self, inputs, training=None) -> tf.Tensor:
    """[..., Lc] block inputs → [..., P] (unit vectors when the towers normalise)."""
    return self.document_embedder(inputs, training=training)

  @property
  def output_size(self) -> int:
    """The embedding width (the knowledge index's dimension)."""
    return self.query_embedder.output_size

  @staticmethod
  def relevance(query_embeddings: tf.Tensor, document_embeddings: tf.Tensor) -> tf.Tensor:
    """[B, P] · [B, K, P] → [B, K] inner products (the logits of p(z|x))."""
    return tf.einsum("bp,bkp->bk", query_embeddings, document_embeddings)

  def call(self, inputs: dict, training=None) -> tf.Tensor:
    """inputs: {'query': [B, Lq] BERT inputs, 'candidates': [B, K, Lc]} → logits [B, K]."""
    query = self.embed_queries(inputs["query"], training=training)
    documents = self.embed_documents(inputs["candidates"], training=training)
    return self.relevance(query, documents)
