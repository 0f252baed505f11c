"""Building REALM models from an ExperimentConfig, warm-started as the config says.

Call these under `strategy.scope()` so that variables are created on the right devices,
after `set_precision` (the dtype policy layers take when they are built): the trainer and
the serving exports both build the networks here, so both set the policy here.
"""
import logging
from typing import Optional

import tensorflow as tf
import tf_keras
from official.modeling import performance

from realm_tf.configs.experiment import WARM_START_SOURCES, ExperimentConfig, WarmStartConfig
from realm_tf.modeling.models import KnowledgeAugmentedEncoder, Reader, RealmPretrainer, Retriever
from realm_tf.modeling.networks import Embedder, build_encoder, dummy_bert_inputs
from realm_tf.modeling.networks.embedder import output_size as embedder_output_size
from realm_tf.modeling.networks.encoder import ACTIVATIONS
from realm_tf.pretrained import load_google_bert_checkpoint, load_minilm

def set_precision(config: ExperimentConfig):
  """Sets Keras' global mixed-precision policy from runtime.mixed_precision_dtype."""
  dtype = config.runtime.mixed_precision_dtype or "float32"
  performance.set_mixed_precision_policy(tf.dtypes.as_dtype(dtype))


def warm_start(encoder, config: WarmStartConfig, masked_lm=None):
  """Loads pretrained weights into a built encoder (and MLM head, where the source has one).

  Args:
    encoder: a built BERT encoder (build_encoder).
    config: model.warm_start: source '' (nothing loaded), 'minilm' or 'google_bert'.
    masked_lm: the MLM head to load too ('google_bert' only; MiniLM ships none).

  Returns:
    The loader's report (what was loaded), or None without a warm start.

  Raises:
    ValueError: an unknown source, or 'google_bert' without a path.
  """
  if config.source not in WARM_START_SOURCES:
    raise ValueError(f"warm_start.source must be one of {WARM_START_SOURCES}, "
                     f"got {config.source!r}")
  if config.source == "minilm":
    return load_minilm(encoder, path=config.path or None)
  if config.source == "google_bert":
    if not config.path:
      raise ValueError("warm_start.source=google_bert needs warm_start.path "
                       "(a checkpoint prefix such as .../bert_model.ckpt)")
    return load_google_bert_checkpoint(encoder, config.path, masked_lm=masked_lm)
  logging.info("No warm start for %s: random initialisation", encoder.name)
  return None


def retriever_output_size(config: ExperimentConfig) -> int:
  """The width of the retriever's embeddings under `config` (the index dimension), known
  before any model is built."""
  r = config.model.retriever
  return embedder_output_size(r.projection, r.projection_size, config.model.encoder.hidden_size)


def build_embedder(config: ExperimentConfig, name: str) -> Embedder:
  """One retriever tower: a warm-started BERT encoder, pooling and projection (model.retriever).

  Args:
    config: the run's ExperimentConfig.
    name: the Keras name ('query_embedder' or 'document_embedder').

  Returns:
    The Embedder (build_retriever creates its projection variables before copying weights).
  """
  encoder = build_encoder(config.model.encoder, name=f"{name}_encoder")
  warm_start(encoder, config.model.warm_start)
  r = config.model.retriever
  return Embedder(encoder, r.projection_size, pooling=r.pooling,
                  projection_initializer=r.projection_initializer,
                  initializer_range=config.model.encoder.initializer_range,
                  projection=r.projection, normalize=r.normalize, scale=r.scale,
                  learn_scale=r.learn_scale, hidden_size=config.model.encoder.hidden_size,
                  layer_norm_epsilon=(r.projection_layer_norm_epsilon
                                      if r.projection_layer_norm else None),
                  name=name)


def build_retriever(config: ExperimentConfig) -> Retriever:
  """Query and document towers, both warm-started (shared when the config says so).

  Args:
    config: the run's ExperimentConfig (model.encoder, warm_start, retriever).

  Returns:
    The Retriever; separate towers start with identical weights.
  """
  query = build_embedder(config, "query_embedder")
  document = None
  if not config.model.retriever.share_towers:
    document = build_embedder(config, "document_embedder")
    # Separate towers start identical (same BERT, same projection) and drift apart only
    # through training; independently drawn projections would make the inner product of
    # an untrained retriever meaningless.
    _build_embedder_variables(query, config)
    _build_embedder_variables(document, config)
    document.set_weights(query.get_weights())
  return Retriever(query, document, name="retriever")


def _build_embedder_variables(embedder: Embedder, config: ExperimentConfig):
  del config  # the embedder knows its input width
  embedder.build_projection()


def build_knowledge_augmented_encoder(config: ExperimentConfig) -> KnowledgeAugmentedEncoder:
  """The pre-training reader: a warm-started BERT encoder with its MLM head, built.

  Args:
    config: the run's ExperimentConfig (model.encoder, warm_start, reader).

  Returns:
    The KnowledgeAugmentedEncoder; with reader.tie_output_embeddings=false its MLM output
    matrix is a copy of the (warm-started) word embeddings.
  """
  encoder = build_encoder(config.model.encoder, name="reader_encoder")
  model = KnowledgeAugmentedEncoder(
      encoder, activation=ACTIVATIONS[config.model.encoder.hidden_activation],
      initializer_range=config.model.encoder.initializer_range, name="knowledge_augmented_encoder")
  _build_masked_lm(model, config.model.encoder.hidden_size)
  warm_start(encoder, config.model.warm_start, masked_lm=model.masked_lm)
  if not config.model.reader.tie_output_embeddings:
    model.untie_output_embeddings()  # after the warm start: a copy of the warm table
  return model


def _build_masked_lm(model: KnowledgeAugmentedEncoder, hidden_size: int):
  model.masked_lm(tf.zeros([1, 2, hidden_size]), masked_positions=tf.zeros([1, 1], tf.int32))


def build_reader(config: ExperimentConfig) -> Reader:
  """The Open-QA reader: a warm-started BERT encoder and a fresh span scorer, built.

  Args:
    config: the run's ExperimentConfig (model.encoder, warm_start, reader).

  Returns:
    The Reader, every variable created.
  """
  encoder = build_encoder(config.model.encoder, name="reader_encoder")
  warm_start(encoder, config.model.warm_start)
  reader = Reader(encoder, max_span_width=config.model.reader.max_span_width,
                  span_hidden_size=config.model.reader.span_hidden_size,
                  initializer_range=config.model.encoder.initializer_range, name="reader")
  # Build every variable now (the span head is otherwise built on the first call, inside
  # the first traced train step, which would then create optimizer slots on a retrace).
  reader({k: v[:, None] for k, v in dummy_bert_inputs(1, 4).items()})
  return reader


def build_realm_pretrainer(config: ExperimentConfig,
                           retriever: Optional[Retriever] = None) -> RealmPretrainer:
  """The pre-training model; pass `retriever` to start from an ICT-trained one."""
  return RealmPretrainer(retriever or build_retriever(config),
                         build_knowledge_augmented_encoder(config), name="realm_pretrainer")


def count_parameters(model: tf_keras.Model) -> int:
  """The number of trainable parameters of `model`."""
  return int(sum(v.shape.num_elements() for v in model.trainable_variables))
