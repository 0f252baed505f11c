"""The token classifier: BERT (BertEncoderV2) → dropout → one dense layer per wordpiece."""
import tensorflow as tf
import tf_keras

from realm_tf.modeling.factory import warm_start
from realm_tf.modeling.networks import build_encoder, dummy_bert_inputs
from realm_tf.tagger.config import TaggerConfig
from realm_tf.tagger.conll import LABELS


class TokenClassifier(tf_keras.Model):
  """Logits over the BIO labels for every wordpiece.

  tf-models-official's `BertTokenClassifier` is the same head, but it is built from a
  functional network's `.inputs`, which the subclassed `BertEncoderV2` does not have.
  """

  def __init__(self, encoder: tf_keras.layers.Layer, num_labels: int,
               dropout_rate: float = 0.1, initializer_range: float = 0.02, **kwargs):
    super().__init__(**kwargs)
    self.encoder = encoder
    self.dropout = tf_keras.layers.Dropout(dropout_rate)
    self.classifier = tf_keras.layers.Dense(
        num_labels,
        kernel_initializer=tf_keras.initializers.TruncatedNormal(stddev=initializer_range),
        name="logits")

  def call(self, inputs: dict, training=None) -> tf.Tensor:
    """BERT inputs [B, L] → logits [B, L, num_labels] (float32)."""
    sequence = self.encoder(inputs, training=training)["sequence_output"]  # [B, L, H]
    logits = self.classifier(self.dropout(sequence, training=training))
    return tf.cast(logits, tf.float32)


def build_token_classifier(config: TaggerConfig) -> TokenClassifier:
  """A built classifier whose encoder is warm-started as `config.warm_start` says."""
  encoder = build_encoder(config.encoder, name="tagger_encoder")
  warm_start(encoder, config.warm_start)
  model = TokenClassifier(encoder, len(LABELS), dropout_rate=config.head_dropout_rate,
                          initializer_range=config.encoder.initializer_range,
                          name="token_classifier")
  model(dummy_bert_inputs())
  return model


def masked_loss(logits: tf.Tensor, labels: tf.Tensor, weights: tf.Tensor) -> tf.Tensor:
  """Mean cross-entropy over the labelled wordpieces (weights [B, L], 1 where labelled)."""
  per_piece = tf_keras.losses.sparse_categorical_crossentropy(
      labels, logits, from_logits=True)  # [B, L]
  weights = tf.cast(weights, per_piece.dtype)
  return tf.reduce_sum(per_piece * weights) / tf.maximum(tf.reduce_sum(weights), 1.0)
