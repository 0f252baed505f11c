"""Distribution strategy and optimizer, from tf-models-official's utilities."""
import json
import logging
import os
from typing import Optional

import tensorflow as tf
from official.common import distribute_utils
from official.modeling import optimization

from realm_tf.configs.experiment import ExperimentConfig, TrainerConfig

STRATEGIES = ("", "tpu", "mirrored", "multi_worker_mirrored", "one_device", "off")


def choose_strategy_name(configured: str = "", tpu: str = "") -> str:
  """--tpu → TPUStrategy; a configured name; TF_CONFIG → multi-worker; GPUs → mirrored;
  else the default strategy."""
  if configured not in STRATEGIES:
    raise ValueError(f"distribution_strategy must be one of {STRATEGIES}, got {configured!r}")
  if tpu:
    return "tpu"
  if configured:
    return configured
  if json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster"):
    return "multi_worker_mirrored"
  if tf.config.list_physical_devices("GPU"):
    return "mirrored"
  return "off"


def make_strategy(config: ExperimentConfig, tpu: str = "") -> tf.distribute.Strategy:
  name = choose_strategy_name(config.distribution_strategy, tpu)
  num_gpus = len(tf.config.list_physical_devices("GPU"))
  strategy = distribute_utils.get_distribution_strategy(
      distribution_strategy=name, num_gpus=num_gpus if name != "off" else 0,
      tpu_address=tpu or None)
  strategy = strategy or tf.distribute.get_strategy()
  logging.info("Strategy %s with %d replicas", type(strategy).__name__,
               strategy.num_replicas_in_sync)
  return strategy


def build_optimizer(trainer: TrainerConfig, total_steps: Optional[int] = None):
  """AdamW with linear warm-up and linear decay to zero (BERT's schedule)."""
  steps = total_steps or trainer.train_steps
  config = optimization.OptimizationConfig({
      "optimizer": {"type": "adamw", "adamw": {
          "weight_decay_rate": trainer.weight_decay,
          "exclude_from_weight_decay": ["LayerNorm", "layer_norm", "bias"],
          "global_clipnorm": 1.0}},
      "learning_rate": {"type": "polynomial", "polynomial": {
          "initial_learning_rate": trainer.learning_rate, "decay_steps": steps,
          "end_learning_rate": 0.0}},
      "warmup": {"type": "linear", "linear": {
          "warmup_steps": min(trainer.warmup_steps, max(1, steps // 2))}},
  })
  factory = optimization.OptimizerFactory(config)
  return factory.build_optimizer(factory.build_learning_rate())
