"""The tagger's typed config: encoder, warm start, and a schedule sized for a 2-core CPU.

The defaults fine-tune all-MiniLM-L6-v2 for two epochs of CoNLL-2003 (about 880 steps of
32 sentences, up to 128 wordpieces each): about ten minutes on a 2-core CPU. A small,
warm-started model takes a higher learning rate than BERT-base's usual 3e-5 to 5e-5. For BERT-base on an accelerator, override `encoder`,
`warm_start` (source 'google_bert') and the schedule from a YAML file or flags.
"""
import dataclasses

from official.modeling.hyperparams import base_config

from realm_tf.configs.experiment import EncoderConfig, WarmStartConfig


def _minilm_encoder() -> EncoderConfig:
  # all-MiniLM-L6-v2: 6 layers, 384 hidden, 12 heads, exact-erf GELU.
  return EncoderConfig(hidden_size=384, num_layers=6, num_attention_heads=12,
                       intermediate_size=1536, hidden_activation="gelu")


@dataclasses.dataclass
class TaggerConfig(base_config.Config):
  """Model and training settings for the CoNLL-2003 token classifier."""
  encoder: EncoderConfig = dataclasses.field(default_factory=_minilm_encoder)
  warm_start: WarmStartConfig = dataclasses.field(
      default_factory=lambda: WarmStartConfig(source="minilm"))
  head_dropout_rate: float = 0.1
  seq_length: int = 128  # training examples, [CLS] and [SEP] included
  batch_size: int = 32
  epochs: int = 2
  max_steps: int = 0  # > 0 caps the steps that `epochs` implies
  learning_rate: float = 1e-4
  warmup_fraction: float = 0.1
  seed: int = 0
  log_every_steps: int = 50
  # Exported model: longer texts are tagged in their first serving_max_seq_length - 2
  # wordpieces only (BERT's position embeddings end there).
  serving_max_seq_length: int = 512
