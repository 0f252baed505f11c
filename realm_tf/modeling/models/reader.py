"""The Open-QA reader: span scores over join_bert(x, z_body)."""
import tensorflow as tf
import tf_keras

from realm_tf.modeling.layers.span_scorer import SpanScorer
from realm_tf.modeling.networks.embedder import flatten_bert_inputs


def block_body_positions(inputs: dict[str, tf.Tensor]) -> tf.Tensor:
  """[N, L] bool: the z_body tokens of `[CLS] x [SEP] z_body [SEP]` (segment 1, real token,
  not the final [SEP]). Answers may only start and end there."""
  mask = tf.cast(inputs["input_mask"], tf.bool)
  lengths = tf.reduce_sum(tf.cast(mask, tf.int32), axis=1, keepdims=True)  # [N, 1]
  positions = tf.range(tf.shape(mask)[1])[None, :]  # [1, L]
  second_segment = tf.equal(tf.cast(inputs["input_type_ids"], tf.int32), 1)
  return mask & second_segment & (positions < lengths - 1)


class Reader(tf_keras.Model):
  """Span logits for every retrieved block; softmax over a block's spans gives p(s|z,x)."""

  def __init__(self, encoder: tf_keras.layers.Layer, max_span_width: int = 10,
               span_hidden_size: int = 256, initializer_range: float = 0.02, **kwargs):
    super().__init__(**kwargs)
    self.encoder = encoder
    self.span_scorer = SpanScorer(
        max_span_width, span_hidden_size,
        initializer=tf_keras.initializers.TruncatedNormal(stddev=initializer_range),
        name="span_scorer")

  def call(self, inputs: dict, training=None) -> dict[str, tf.Tensor]:
    """inputs: BERT inputs [B, K, L] → span_logits [B, K, S], span_starts/ends [S]."""
    flat, leading = flatten_bert_inputs(inputs)  # [B*K, L]
    sequence = self.encoder(flat, training=training)["sequence_output"]  # [B*K, L, H]
    logits, starts, ends = self.span_scorer(sequence, block_body_positions(flat))
    logits = tf.reshape(tf.cast(logits, tf.float32),
                        tf.concat([leading, [-1]], axis=0))  # [B, K, S]
    return dict(span_logits=logits, span_starts=starts, span_ends=ends)
