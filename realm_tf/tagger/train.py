"""Fine-tuning the tagger on CoNLL-2003, scoring it, and exporting it with a manifest.

A plain custom loop over one device: the tagger is a one-off, minutes-long job whose model
fits anywhere, so it does not need the distributed machinery of REALM pre-training.
"""
import dataclasses
import datetime
import logging
import math
import os
import time
from typing import Mapping, Optional

import tensorflow as tf
import tf_keras
from official.nlp import optimization

from realm_tf.pretrained.encoder_weights import sha256_of
from realm_tf.tagger import signature
from realm_tf.tagger.config import TaggerConfig
from realm_tf.tagger.conll import ENTITY_TYPES, LABELS, read_sentences
from realm_tf.tagger.evaluation import evaluate_sentences
from realm_tf.tagger.export import export_tagger
from realm_tf.tagger.features import sentence_examples, training_dataset
from realm_tf.tagger.inference import module_tag_fn
from realm_tf.tagger.model import TokenClassifier, build_token_classifier, masked_loss
from realm_tf.tagger.serving import SpanTagger
from realm_tf.text import Tokenizer

TRAIN_FILE = "eng.train"
DEV_FILE = "eng.testa"
TEST_FILE = "eng.testb"


@dataclasses.dataclass
class TrainingRun:
  steps: int
  examples: int
  seconds: float
  final_loss: float


def conll_files(conll_dir: str) -> dict[str, str]:
  """The three CoNLL-2003 files of a directory, checked to exist."""
  files = {"train": TRAIN_FILE, "dev": DEV_FILE, "test": TEST_FILE}
  paths = {split: os.path.join(conll_dir, name) for split, name in files.items()}
  missing = [p for p in paths.values() if not tf.io.gfile.exists(p)]
  if missing:
    raise FileNotFoundError(f"{conll_dir}: CoNLL-2003 files missing: {missing}")
  return paths


def planned_steps(num_examples: int, config: TaggerConfig) -> int:
  """Steps for `epochs` passes over the data, capped by `max_steps` when that is set."""
  steps = config.epochs * math.ceil(num_examples / config.batch_size)
  if config.max_steps > 0:
    steps = min(steps, config.max_steps)
  if steps < 1:
    raise ValueError(f"no training steps: epochs={config.epochs}, max_steps="
                     f"{config.max_steps}, {num_examples} examples")
  return steps


def fit(model: TokenClassifier, dataset: tf.data.Dataset, num_steps: int,
        config: TaggerConfig) -> tuple[float, float]:
  """Runs num_steps optimizer steps; returns (final smoothed loss, seconds).

  tf-models' AdamWeightDecay: BERT's fine-tuning optimizer (linear warmup and decay, no
  decay on LayerNorm and biases, gradients clipped to global norm 1).
  """
  optimizer = optimization.create_optimizer(
      init_lr=config.learning_rate, num_train_steps=num_steps,
      num_warmup_steps=int(config.warmup_fraction * num_steps), optimizer_type="adamw")
  ids_spec = tf.TensorSpec([None, None], tf.int32)
  inputs_spec = dict(input_word_ids=ids_spec, input_mask=ids_spec, input_type_ids=ids_spec)

  @tf.function(input_signature=[inputs_spec, ids_spec, tf.TensorSpec([None, None],
                                                                     tf.float32)])
  def train_step(inputs, labels, weights):
    with tf.GradientTape() as tape:
      loss = masked_loss(model(inputs, training=True), labels, weights)
    gradients = tape.gradient(loss, model.trainable_variables)
    # The encoder's pooler is not on the path to the token logits: its gradient is None.
    optimizer.apply_gradients([(g, v) for g, v in zip(gradients, model.trainable_variables)
                               if g is not None])
    return loss

  smoothed = None
  start = time.time()
  for step, (inputs, labels, weights) in enumerate(dataset.take(num_steps), start=1):
    loss = float(train_step(inputs, labels, weights))
    smoothed = loss if smoothed is None else 0.95 * smoothed + 0.05 * loss
    if step % config.log_every_steps == 0 or step == num_steps:
      logging.info("step %d/%d  loss %.4f  (%.1f s)", step, num_steps, smoothed,
                   time.time() - start)
  return smoothed, time.time() - start


def train_tagger(train_file: str, config: TaggerConfig,
                 tokenizer: Optional[Tokenizer] = None) -> tuple[SpanTagger, TrainingRun]:
  """A trained, ready-to-export SpanTagger and the facts of its training run."""
  tf_keras.utils.set_random_seed(config.seed)
  tokenizer = tokenizer or Tokenizer()
  examples = sentence_examples(read_sentences(train_file), tokenizer, config.seq_length)
  num_steps = planned_steps(len(examples), config)
  dataset = training_dataset(examples, config.batch_size, seed=config.seed)
  model = build_token_classifier(config)
  final_loss, seconds = fit(model, dataset, num_steps, config)
  tagger = SpanTagger(model, tokenizer, config.serving_max_seq_length)
  return tagger, TrainingRun(steps=num_steps, examples=len(examples), seconds=seconds,
                             final_loss=final_loss)


def build_manifest(config: TaggerConfig, run: TrainingRun, scores: Mapping[str, dict],
                   inputs: Mapping[str, str], tokenizer: Tokenizer) -> dict:
  return {
      "kind": "realm_tf.tagger",
      "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "labels": list(LABELS),
      "entity_types": list(ENTITY_TYPES),
      "signature": {"key": signature.SIGNATURE_KEY, "input": signature.INPUT_KEY,
                    "outputs": list(signature.OUTPUT_KEYS), "offsets": "utf-8 bytes"},
      "scores": dict(scores),
      "training": dataclasses.asdict(run),
      "config": config.as_dict(),
      "inputs": {name: {"path": path, "sha256": sha256_of(path)}
                 for name, path in inputs.items()},
      "vocab_sha256": sha256_of(tokenizer.vocab_file),
  }


def train_and_export(conll_dir: str, output_dir: str, config: TaggerConfig,
                     evaluate_on: tuple[str, ...] = ("dev", "test")) -> dict:
  """Trains on eng.train, scores the named splits, exports; returns the manifest."""
  paths = conll_files(conll_dir)
  tokenizer = Tokenizer()
  tagger, run = train_tagger(paths["train"], config, tokenizer)
  tag = module_tag_fn(tagger)
  scores = {}
  for split in evaluate_on:
    scores[split] = evaluate_sentences(tag, read_sentences(paths[split]))
    logging.info("%s (%s): entity F1 %.4f", split, os.path.basename(paths[split]),
                 scores[split]["f1"])
  manifest = build_manifest(config, run, scores, paths, tokenizer)
  export_tagger(tagger, output_dir, manifest)
  logging.info("exported tagger to %s", output_dir)
  return manifest
