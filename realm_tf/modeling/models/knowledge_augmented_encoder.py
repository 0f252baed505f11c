"""The knowledge-augmented encoder for pre-training: BERT over join_bert(x, z_body) + MLM."""
import tensorflow as tf
import tf_keras
from official.nlp.modeling import layers

from realm_tf.modeling.networks.embedder import flatten_bert_inputs


class KnowledgeAugmentedEncoder(tf_keras.Model):
  """log p(y_m | z, x) for every masked position m and every retrieved z.

  The MLM head is tf-models-official's `MaskedLM`. Its output matrix is the encoder's word
  embedding table (BERT's tying) until `untie_output_embeddings` gives it a matrix of its
  own. Why a reader may need its own: in a random-init reader whose answers come from a
  closed set, the first steps learn each answer slot's prior, which pulls that set's rows
  of the shared table together; the input embeddings of the values then no longer tell the
  values apart, and the reader cannot copy an answer from the retrieved block.

  Masked positions index into x, which comes first in `[CLS] x [SEP] z_body [SEP]` (packed
  with waterfall truncation), so one set of positions serves all K documents.
  """

  def __init__(self, encoder: tf_keras.layers.Layer, activation=None,
               initializer_range: float = 0.02, **kwargs):
    super().__init__(**kwargs)
    self.encoder = encoder
    self.masked_lm = layers.MaskedLM(
        embedding_table=encoder.get_embedding_table(), activation=activation,
        initializer=tf_keras.initializers.TruncatedNormal(stddev=initializer_range),
        output="logits", name="masked_lm")
    self.output_embeddings = None  # [V, H] once untied; None: tied to the input table

  @property
  def tied(self) -> bool:
    """Whether the MLM output matrix is the encoder's word embedding table."""
    return self.output_embeddings is None

  def untie_output_embeddings(self):
    """Gives the MLM head an output matrix of its own, started as a copy of the encoder's
    word embedding table as it is now.

    Call it after any warm start (so the copy is of the warm table) and before the model
    is checkpointed or traced. The new variable is the head's `embedding_table`, so a
    checkpoint holds it at the same object path as the tied table: a tied checkpoint
    restores into an untied model as a copy of its table.

    Raises:
      ValueError: the head already has its own matrix.
    """
    if not self.tied:
      raise ValueError(f"{self.name}: the MLM output matrix is already untied")
    table = self.encoder.get_embedding_table()  # [V, H]
    value = tf.identity(table)
    self.output_embeddings = self.add_weight(
        "mlm_output_embeddings", shape=table.shape, dtype=table.dtype,
        initializer=lambda shape, dtype=None: value, trainable=True)
    # MaskedLM reads `embedding_table` at call time; reassigning the attribute also moves
    # Keras's tracking (and the checkpoint edge `embedding_table`) to the new variable.
    self.masked_lm.embedding_table = self.output_embeddings

  def call(self, inputs: dict, training=None) -> dict[str, tf.Tensor]:
    """Token log-likelihoods.

    Args:
      inputs: 'input_word_ids', 'input_mask', 'input_type_ids' [B, K, L];
        'masked_lm_positions', 'masked_lm_ids' [B, M].
    Returns:
      token_log_probs [B, K, M]: log p(y_m | z_k, x);
      log_probs [B, K, M, V]: the whole distributions (for predictions and accuracy).
    """
    flat, leading = flatten_bert_inputs(inputs)  # [B*K, L], leading = [B, K]
    num_docs = leading[1]
    sequence = self.encoder(flat, training=training)["sequence_output"]  # [B*K, L, H]
    positions = tf.repeat(tf.cast(inputs["masked_lm_positions"], tf.int32), num_docs,
                          axis=0)  # [B*K, M]
    logits = self.masked_lm(sequence, masked_positions=positions)  # [B*K, M, V]
    log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
    ids = tf.repeat(tf.cast(inputs["masked_lm_ids"], tf.int32), num_docs, axis=0)  # [B*K, M]
    token_log_probs = tf.gather(log_probs, ids, axis=-1, batch_dims=2)  # [B*K, M]
    return dict(
        token_log_probs=tf.reshape(token_log_probs,
                                   tf.concat([leading, [-1]], axis=0)),  # [B, K, M]
        log_probs=tf.reshape(log_probs, tf.concat(
            [leading, tf.shape(log_probs)[1:]], axis=0)))  # [B, K, M, V]
