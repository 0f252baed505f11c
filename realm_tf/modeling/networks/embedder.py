"""The retriever's towers: BERT → pooled vector → linear projection."""
import tensorflow as tf
import tf_keras

POOLINGS = ("pooled", "cls", "mean")
BERT_INPUT_KEYS = ("input_word_ids", "input_mask", "input_type_ids")


def flatten_bert_inputs(inputs: dict[str, tf.Tensor]) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
  """[..., L] BERT inputs → [N, L] and the leading shape to restore outputs with."""
  word_ids = inputs["input_word_ids"]
  leading = tf.shape(word_ids)[:-1]
  seq_length = word_ids.shape[-1] if word_ids.shape[-1] is not None else tf.shape(word_ids)[-1]
  flat = {k: tf.reshape(inputs[k], [-1, seq_length]) for k in BERT_INPUT_KEYS}  # [N, L]
  return flat, leading


class Embedder(tf_keras.Model):
  """Maps BERT inputs of any leading shape [..., L] to embeddings [..., projection_size]."""

  def __init__(self, encoder: tf_keras.layers.Layer, projection_size: int,
               pooling: str = "pooled", projection_initializer: str = "truncated_normal",
               initializer_range: float = 0.02, **kwargs):
    super().__init__(**kwargs)
    if pooling not in POOLINGS:
      raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    self.encoder = encoder
    self.pooling = pooling
    if projection_initializer == "orthogonal":
      init = tf_keras.initializers.Orthogonal()
    elif projection_initializer == "truncated_normal":
      init = tf_keras.initializers.TruncatedNormal(stddev=initializer_range)
    else:
      raise ValueError(f"unknown projection_initializer {projection_initializer!r}")
    self.projection = tf_keras.layers.Dense(projection_size, kernel_initializer=init,
                                            name="projection")

  def pool(self, inputs: dict[str, tf.Tensor], training=None) -> tf.Tensor:
    """[N, L] inputs → [N, H] pooled encoder states (before projection)."""
    outputs = self.encoder(inputs, training=training)
    if self.pooling == "pooled":
      return outputs["pooled_output"]
    sequence = outputs["sequence_output"]  # [N, L, H]
    if self.pooling == "cls":
      return sequence[:, 0]
    mask = tf.cast(inputs["input_mask"], sequence.dtype)[..., None]  # [N, L, 1]
    return tf.reduce_sum(sequence * mask, axis=1) / tf.maximum(
        tf.reduce_sum(mask, axis=1), 1.0)

  def call(self, inputs: dict[str, tf.Tensor], training=None) -> tf.Tensor:
    flat, leading = flatten_bert_inputs(inputs)
    embeddings = self.projection(self.pool(flat, training=training))  # [N, P]
    embeddings = tf.reshape(embeddings, tf.concat([leading, [-1]], axis=0))  # [..., P]
    # Keep the static shape (XLA and the index's shape checks need it).
    embeddings.set_shape(inputs["input_word_ids"].shape[:-1].concatenate(
        [self.projection.units]))
    return embeddings
