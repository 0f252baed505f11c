"""Span scores for the Open-QA reader."""
import numpy as np
import tensorflow as tf
import tf_keras
from official.modeling import tf_utils

# Logit given to spans that may not be chosen: finite, so that log-sum-exps over a block
# with no valid span (the null document) and their gradients stay finite.
INVALID_SPAN_LOGIT = -1e9


def enumerate_spans(seq_length: int, max_span_width: int) -> tuple[np.ndarray, np.ndarray]:
  """All (start, end) with 0 <= end - start < max_span_width, end < seq_length.

  Static numpy so the number of spans S is known at graph-construction time (TPU/XLA).
  """
  starts = np.repeat(np.arange(seq_length), max_span_width)  # [L*W]
  ends = starts + np.tile(np.arange(max_span_width), seq_length)  # [L*W]
  keep = ends < seq_length
  return starts[keep].astype(np.int32), ends[keep].astype(np.int32)


class SpanScorer(tf_keras.layers.Layer):
  """score(s, e) = v · LayerNorm(relu(W [h_s; h_e] + b)) + c over every span.

  The first layer of the MLP over the concatenation [h_s; h_e] equals W_s h_s + W_e h_e, so
  each position is projected once ([N, L, hidden]) and spans only gather and add, instead
  of materialising [N, S, 2H] concatenations. The LayerNorm follows the REALM authors' reader.
  """

  def __init__(self, max_span_width: int, hidden_size: int,
               initializer="glorot_uniform", **kwargs):
    super().__init__(**kwargs)
    self.max_span_width = max_span_width
    self.hidden_size = hidden_size
    init = tf_keras.initializers.get(initializer)

    def dense(units, name, use_bias=True):
      # A fresh initializer per layer: one shared instance gives every layer equal weights.
      return tf_keras.layers.Dense(units, use_bias=use_bias, name=name,
                                   kernel_initializer=tf_utils.clone_initializer(init))

    self.start_projection = dense(hidden_size, "start_projection")
    self.end_projection = dense(hidden_size, "end_projection", use_bias=False)
    self.layer_norm = tf_keras.layers.LayerNormalization(epsilon=1e-3, name="layer_norm")
    self.output_projection = dense(1, "output_projection")

  def call(self, sequence: tf.Tensor, valid_positions: tf.Tensor):
    """Scores spans.

    Args:
      sequence: [N, L, H] final hidden states; L must be static.
      valid_positions: [N, L] bool, where a span may start or end (the block body).
    Returns:
      logits [N, S] (INVALID_SPAN_LOGIT where a span leaves the valid positions),
      starts [S] and ends [S] int32 token positions (inclusive).
    """
    seq_length = sequence.shape[1]
    if seq_length is None:
      raise ValueError("SpanScorer needs a static sequence length (pad inputs to a fixed L)")
    starts, ends = enumerate_spans(seq_length, self.max_span_width)
    start_hidden = tf.gather(self.start_projection(sequence), starts, axis=1)  # [N, S, Hs]
    end_hidden = tf.gather(self.end_projection(sequence), ends, axis=1)  # [N, S, Hs]
    hidden = self.layer_norm(tf.nn.relu(start_hidden + end_hidden))
    logits = tf.squeeze(self.output_projection(hidden), axis=-1)  # [N, S]
    valid = tf.logical_and(tf.gather(valid_positions, starts, axis=1),
                           tf.gather(valid_positions, ends, axis=1))  # [N, S]
    logits = tf.where(valid, logits, tf.cast(INVALID_SPAN_LOGIT, logits.dtype))
    return logits, tf.constant(starts), tf.constant(ends)

  def get_config(self):
    return dict(super().get_config(), max_span_width=self.max_span_width,
                hidden_size=self.hidden_size)
