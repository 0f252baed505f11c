"""The retriever's towers: BERT → pooled vector → projection → (optional) L2 normalisation.

Scoring options (model.retriever in the config), and why they exist:
  projection  'dense' (the paper: Dense(projection_size), 128-d), 'identity' (a trainable
              square Dense initialised to the identity, so a warm start loses nothing at
              step 0 and the retriever may still learn a projection), or 'none' (the
              pooled vector itself, hidden_size wide).
  layer_norm_epsilon
              A LayerNorm after the projection (None: none). The released REALM embedder
              ends with one (BERT pooled [CLS] → Dense → LayerNorm, as in the authors' ICT
              module): its epsilon depends on which code wrote the checkpoint, so it is
              a number rather than a switch.
  normalize   L2-normalise the embedding. Mean-pooled sentence encoders (MiniLM) were
              trained on cosine similarity: their vector norms shrink as texts grow, so a
              raw inner product prefers short fragments. BERT/ICT starts keep the paper's
              raw inner product (normalize=false).
  scale       With normalize, relevance = scale · cos(q, d) (a softmax temperature; MiniLM
              was trained with about 20). learn_scale makes it a trained log-scale
              initialised to log(scale).

The scale is applied to QUERY embeddings only (`call(..., query=True)`): block embeddings
stay unit vectors, so the index (and every index builder or export of the document tower)
does not depend on the scale, MIPS rankings are unchanged by it, and a learned scale never
makes the index stale. relevance = (scale · q̂) · d̂ wherever it is computed: ICT, REALM
pre-training, Open-QA fine-tuning, the exported query encoder.
"""
import math
from typing import Optional

import numpy as np
import tensorflow as tf
import tf_keras

POOLINGS = ("pooled", "cls", "mean")
PROJECTIONS = ("dense", "identity", "none")
BERT_INPUT_KEYS = ("input_word_ids", "input_mask", "input_type_ids")


def flatten_bert_inputs(inputs: dict[str, tf.Tensor]) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
  """[..., L] BERT inputs → [N, L] and the leading shape to restore outputs with."""
  word_ids = inputs["input_word_ids"]
  leading = tf.shape(word_ids)[:-1]
  seq_length = word_ids.shape[-1] if word_ids.shape[-1] is not None else tf.shape(word_ids)[-1]
  flat = {k: tf.reshape(inputs[k], [-1, seq_length]) for k in BERT_INPUT_KEYS}  # [N, L]
  return flat, leading


def output_size(projection: str, projection_size: int, hidden_size: int) -> int:
  """The embedding width an Embedder with these options produces (the index dimension)."""
  if projection not in PROJECTIONS:
    raise ValueError(f"projection must be one of {PROJECTIONS}, got {projection!r}")
  return projection_size if projection == "dense" else hidden_size


class Embedder(tf_keras.Model):
  """Maps BERT inputs of any leading shape [..., L] to embeddings [..., output_size]."""

  def __init__(self, encoder: tf_keras.layers.Layer, projection_size: int,
               pooling: str = "pooled", projection_initializer: str = "truncated_normal",
               initializer_range: float = 0.02, projection: str = "dense",
               normalize: bool = False, scale: float = 1.0, learn_scale: bool = False,
               hidden_size: int = 0, layer_norm_epsilon: Optional[float] = None, **kwargs):
    super().__init__(**kwargs)
    if pooling not in POOLINGS:
      raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    if projection not in PROJECTIONS:
      raise ValueError(f"projection must be one of {PROJECTIONS}, got {projection!r}")
    if scale <= 0:
      raise ValueError(f"scale must be positive, got {scale!r}")
    hidden_size = hidden_size or int(getattr(encoder, "get_config", dict)().get(
        "hidden_size", 0) or projection_size)
    if projection == "identity" and projection_size != hidden_size:
      raise ValueError(f"projection 'identity' keeps the width: projection_size "
                       f"{projection_size} must equal the hidden size {hidden_size}")
    self.encoder = encoder
    self.pooling = pooling
    self.projection_type = projection
    self.normalize = normalize
    self.learn_scale = learn_scale
    self.hidden_size = hidden_size
    self.output_size = output_size(projection, projection_size, hidden_size)
    if projection == "identity":
      init = tf_keras.initializers.Identity()
    elif projection_initializer == "orthogonal":
      init = tf_keras.initializers.Orthogonal()
    elif projection_initializer == "truncated_normal":
      init = tf_keras.initializers.TruncatedNormal(stddev=initializer_range)
    else:
      raise ValueError(f"unknown projection_initializer {projection_initializer!r}")
    self.projection = None
    if projection != "none":
      self.projection = tf_keras.layers.Dense(self.output_size, kernel_initializer=init,
                                              name="projection")
    # An attribute only when used, so checkpoints of embedders without it are unchanged.
    self.projection_layer_norm = None
    if layer_norm_epsilon is not None:
      self.projection_layer_norm = tf_keras.layers.LayerNormalization(
          epsilon=layer_norm_epsilon, name="projection_layer_norm")
    # A variable only when learned: a fixed scale is a constant, so configs and checkpoints
    # without one are unchanged.
    self._fixed_log_scale = math.log(scale)
    self.log_scale = None
    if learn_scale:
      self.log_scale = self.add_weight(
          name="log_scale", shape=[], trainable=True,
          initializer=tf_keras.initializers.Constant(self._fixed_log_scale))

  def build_projection(self):
    """Creates the projection's variables now (towers copy weights before a first call)."""
    if self.projection is not None and not self.projection.built:
      self.projection.build([None, self.hidden_size])
    if self.projection_layer_norm is not None and not self.projection_layer_norm.built:
      self.projection_layer_norm.build([None, self.output_size])

  @property
  def scale(self) -> tf.Tensor:
    """The relevance scale applied to query embeddings (1 without normalisation)."""
    if self.log_scale is not None:
      return tf.exp(self.log_scale)
    return tf.constant(float(np.exp(self._fixed_log_scale)))

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

  def call(self, inputs: dict[str, tf.Tensor], training=None, query: bool = False) -> tf.Tensor:
    """Embeddings [..., output_size]; `query=True` multiplies by the relevance scale."""
    flat, leading = flatten_bert_inputs(inputs)
    embeddings = self.pool(flat, training=training)  # [N, H]
    if self.projection is not None:
      embeddings = self.projection(embeddings)  # [N, P]
    if self.projection_layer_norm is not None:
      embeddings = self.projection_layer_norm(embeddings)
    if self.normalize:
      embeddings = tf.math.l2_normalize(embeddings, axis=-1)
    if query and (self.normalize or self.log_scale is not None
                  or self._fixed_log_scale != 0.0):
      embeddings = embeddings * tf.cast(self.scale, embeddings.dtype)
    embeddings = tf.reshape(embeddings, tf.concat([leading, [-1]], axis=0))  # [..., P]
    # Keep the static shape (XLA and the index's shape checks need it).
    embeddings.set_shape(inputs["input_word_ids"].shape[:-1].concatenate([self.output_size]))
    return embeddings
