"""REALM pre-training model: retriever scores + knowledge-augmented encoder."""
from typing import NamedTuple, Optional

import tensorflow as tf
import tf_keras

from realm_tf.modeling.models.knowledge_augmented_encoder import KnowledgeAugmentedEncoder
from realm_tf.modeling.models.retriever import Retriever

# Relevance logit of a padding candidate: p(z|x) is zero to float precision.
PADDING_LOGIT = -1e9


class RealmPretrainerOutputs(NamedTuple):
  retrieval_logits: tf.Tensor  # [B, K] (padding candidates at about -1e9)
  token_log_probs: tf.Tensor  # [B, K, M] log p(y_m | z_k, x)
  mlm_predictions: tf.Tensor  # [B, M] argmax of the marginal p(y_m | x)


class RealmPretrainer(tf_keras.Model):
  """Scores retrieved candidates with live parameters and computes the MLM likelihoods.

  The candidates (the null document among them) come from MIPS over the stale index; here
  the document tower re-embeds them so that the gradient of log p(y|x) reaches both towers.

  Features (a nest; names say which network reads them):
    query       BERT inputs [B, Lq]      x for the query tower
    candidates  BERT inputs [B, K, Lc]   the retrieved blocks for the document tower, or
                                         None when the only candidate is the null document
                                         (no retrieval): p(z|x) = 1, no retriever runs
    reader      BERT inputs [B, K, Lr]   join_bert(x, z_body) for the encoder
    masked_lm   positions, ids [B, M]
    candidate_mask [B, K]                optional: 0 for padding candidates
  """

  def __init__(self, retriever: Retriever, encoder: KnowledgeAugmentedEncoder, **kwargs):
    super().__init__(**kwargs)
    self.retriever = retriever
    self.knowledge_augmented_encoder = encoder

  def call(self, features: dict, query_embeddings: Optional[tf.Tensor] = None,
           training=None) -> RealmPretrainerOutputs:
    """query_embeddings [B, P]: pass the ones the step already computed for the search."""
    if features.get("candidates") is None:
      shape = tf.shape(features["reader"]["input_word_ids"])
      retrieval_logits = tf.zeros(shape[:2], tf.float32)  # [B, 1]: the null document
    else:
      if query_embeddings is None:
        query_embeddings = self.retriever.embed_queries(features["query"], training=training)
      documents = self.retriever.embed_documents(features["candidates"],
                                                 training=training)  # [B, K, P]
      retrieval_logits = tf.cast(Retriever.relevance(
          query_embeddings, tf.cast(documents, query_embeddings.dtype)), tf.float32)  # [B, K]
    reader_inputs = dict(features["reader"],
                         masked_lm_positions=features["masked_lm"]["positions"],
                         masked_lm_ids=features["masked_lm"]["ids"])
    outputs = self.knowledge_augmented_encoder(reader_inputs, training=training)
    if "candidate_mask" in features:
      retrieval_logits = tf.where(tf.cast(features["candidate_mask"], tf.bool),
                                  retrieval_logits, PADDING_LOGIT)
    log_pz = tf.nn.log_softmax(retrieval_logits, axis=-1)[:, :, None, None]  # [B, K, 1, 1]
    marginal = tf.reduce_logsumexp(log_pz + outputs["log_probs"], axis=1)  # [B, M, V]
    return RealmPretrainerOutputs(
        retrieval_logits=retrieval_logits, token_log_probs=outputs["token_log_probs"],
        mlm_predictions=tf.argmax(marginal, axis=-1, output_type=tf.int32))
