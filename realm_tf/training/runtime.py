"""The distribution strategy, from tf-models-official's utilities and the runtime config."""
import json
import logging
import os

import tensorflow as tf
from official.common import distribute_utils

from realm_tf.configs.experiment import STRATEGIES, ExperimentConfig


def choose_strategy_name(configured: str = "", tpu: str = "") -> str:
  """--tpu → TPUStrategy; a configured name; TF_CONFIG → multi-worker; GPUs → mirrored;
  else the default strategy."""
  if configured not in STRATEGIES:
    raise ValueError(f"runtime.distribution_strategy must be one of {STRATEGIES}, "
                     f"got {configured!r}")
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
  tpu = tpu or config.runtime.tpu or ""
  name = choose_strategy_name(config.runtime.distribution_strategy, tpu)
  num_gpus = len(tf.config.list_physical_devices("GPU"))
  strategy = distribute_utils.get_distribution_strategy(
      distribution_strategy=name, num_gpus=num_gpus if name != "off" else 0,
      tpu_address=tpu or None)
  strategy = strategy or tf.distribute.get_strategy()
  logging.info("Strategy %s with %d replicas", type(strategy).__name__,
               strategy.num_replicas_in_sync)
  return strategy
