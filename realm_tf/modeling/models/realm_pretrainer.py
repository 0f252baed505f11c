"""REALM pre-training model: retriever scores + knowledge-augmented encoder."""
import tensorflow as tf
import tf_keras

from realm_tf.modeling.models.knowledge_augmented_encoder import KnowledgeAugmentedEncoder
from realm_tf.modeling.models.retriever import Retriever


# Relevance logit of a padding candidate: p(z|x) is zero to float precision.
_PADDING_LOGIT = -1e9


def _sub(features: dict, prefix: str) -> dict:
  return {key: features[f"{prefix}_{key}"]
          for key in ("input_word_ids", "input_mask", "input_type_ids")}


class RealmPretrainer(tf_keras.Model):
  """Rescoring of retrieved candidates with live parameters, plus the MLM likelihoods.

  The candidates (the null document among them) come from MIPS in the input pipeline; here
  both towers re-embed them so that the gradient of log p(y|x) reaches the retriever.

  Features (prefixes name which network reads them):
    query_*      [B, Lq]     x for the query tower
    candidate_*  [B, K, Lc]  the retrieved blocks for the document tower
    reader_*     [B, K, Lr]  join_bert(x, z_body) for the knowledge-augmented encoder
    masked_lm_positions, masked_lm_ids [B, M]
    candidate_mask [B, K]    optional: 0 for padding candidates (too few non-trivial hits)
  Outputs: retrieval_logits [B, K] (padding candidates at about -1e9), token_log_probs
  [B, K, M], and mlm_predictions [B, M], the argmax of the marginal p(y_m|x).
  """

  def __init__(self, retriever: Retriever, encoder: KnowledgeAugmentedEncoder, **kwargs):
    super().__init__(**kwargs)
    self.retriever = retriever
    self.knowledge_augmented_encoder = encoder

  def call(self, features: dict, training=None) -> dict[str, tf.Tensor]:
    retrieval_logits = self.retriever(
        dict(query=_sub(features, "query"), candidates=_sub(features, "candidate")),
        training=training)
    reader_inputs = dict(_sub(features, "reader"),
                         masked_lm_positions=features["masked_lm_positions"],
                         masked_lm_ids=features["masked_lm_ids"])
    outputs = self.knowledge_augmented_encoder(reader_inputs, training=training)
    retrieval_logits = tf.cast(retrieval_logits, tf.float32)
    if "candidate_mask" in features:
      retrieval_logits = tf.where(tf.cast(features["candidate_mask"], tf.bool),
                                  retrieval_logits, _PADDING_LOGIT)
    log_pz = tf.nn.log_softmax(retrieval_logits, axis=-1)[:, :, None, None]  # [B, K, 1, 1]
    marginal = tf.reduce_logsumexp(log_pz + outputs["log_probs"], axis=1)  # [B, M, V]
    return dict(retrieval_logits=retrieval_logits,
                token_log_probs=outputs["token_log_probs"],
                mlm_predictions=tf.argmax(marginal, axis=-1, output_type=tf.int32))
