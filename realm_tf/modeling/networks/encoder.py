"""The BERT transformer stack: tf-models-official's BertEncoderV2, built from config."""
import tensorflow as tf
import tf_keras
from official.modeling import activations
from official.nlp.modeling import networks

from realm_tf.configs.experiment import EncoderConfig

# Serialisable activations (BertEncoderV2 serialises its config).
ACTIVATIONS = {
    "gelu": tf_keras.activations.gelu,  # exact erf form by default
    "gelu_approximate": activations.gelu,  # tanh form, registered by tf-models-official
    "relu": tf_keras.activations.relu,
}


def dummy_bert_inputs(batch_size: int = 1, seq_length: int = 2) -> dict[str, tf.Tensor]:
  shape = [batch_size, seq_length]
  return dict(input_word_ids=tf.zeros(shape, tf.int32), input_mask=tf.ones(shape, tf.int32),
              input_type_ids=tf.zeros(shape, tf.int32))


def build_encoder(config: EncoderConfig, name: str = "bert_encoder") -> networks.BertEncoderV2:
  """A built BertEncoderV2 (variables exist, so weights can be loaded by name at once)."""
  if config.hidden_activation not in ACTIVATIONS:
    raise ValueError(f"encoder.hidden_activation must be one of {sorted(ACTIVATIONS)}, "
                     f"got {config.hidden_activation!r}")
  encoder = networks.BertEncoderV2(
      vocab_size=config.vocab_size,
      hidden_size=config.hidden_size,
      num_layers=config.num_layers,
      num_attention_heads=config.num_attention_heads,
      inner_dim=config.intermediate_size,
      inner_activation=ACTIVATIONS[config.hidden_activation],
      output_dropout=config.dropout_rate,
      attention_dropout=config.attention_dropout_rate,
      max_sequence_length=config.max_position_embeddings,
      type_vocab_size=config.type_vocab_size,
      initializer=tf_keras.initializers.TruncatedNormal(stddev=config.initializer_range),
      name=name)
  encoder(dummy_bert_inputs())
  return encoder
