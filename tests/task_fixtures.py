"""Shared set-up for task tests: tiny configs over the invented corpus, a built task with an
index of random embeddings, and index exports written directly."""
import json
import os

import numpy as np
import tensorflow as tf

from realm_tf import tasks
from realm_tf.configs import load_config
from realm_tf.retrieval.index_export import ShardData, write_export
from tests.synthetic_corpus import _CITIES, _COUNTRIES, _RIVERS

TASKS = ("ict", "pretrain", "openqa")


def write_questions(path: str) -> str:
  with open(path, "w") as f:
    for country, city, river in zip(_COUNTRIES, _CITIES, _RIVERS):
      f.write(json.dumps({"question": f"What is the capital of {country}?",
                          "answer": [city]}) + "\n")
      f.write(json.dumps({"question": f"Which river flows through {city}?",
                          "answer": [f"the {river}"]}) + "\n")
  return path


def tiny_config(repo_dir, corpus_dir: str, task: str, questions: str = "", *overrides: str,
                **named):
  """configs/tiny.yaml for `task` over the invented corpus; `named` as dotted=value with
  '__' for dots."""
  items = [f"task.type={task}", f"index.blocks={corpus_dir}",
           f"task.ict.train_data.input_path={os.path.join(corpus_dir, 'ict-*')}",
           f"task.pretrain.train_data.input_path={os.path.join(corpus_dir, 'pretraining-*')}"]
  if questions:
    items += [f"task.openqa.train_data.input_path={questions}"]
  items += list(overrides) + [f"{k.replace('__', '.')}={v}" for k, v in named.items()]
  return load_config(str(repo_dir / "configs" / "tiny.yaml"), items)


def random_embeddings(index, seed: int = 0) -> np.ndarray:
  rng = np.random.default_rng(seed)
  return rng.normal(size=[index.num_blocks, index.dimension]).astype(np.float32)


def build(config, strategy=None, model_dir: str = "", seed: int = 0):
  """(task, model) with the index (if the task has one) holding random embeddings."""
  strategy = strategy or tf.distribute.get_strategy()
  task = tasks.get_task(config, model_dir)
  with strategy.scope():
    model = task.build_model()
  index = task.build_index(strategy) if hasattr(task, "build_index") else None
  if index is not None:  # None: a pre-training run without retrieval
    index.set_embeddings(random_embeddings(index, seed), version=0)
  return task, model


def first_batch(task, config, training: bool = True):
  data = config.task_config.train_data if training else config.task_config.validation_data
  return next(iter(task.build_inputs(data)))


def publish_index(index_dir: str, version: int, block_ids: np.ndarray,
                  embeddings: np.ndarray) -> str:
  """A committed index export (exact search files only), as the embedding job writes it."""
  return write_export(index_dir, version, [ShardData(embeddings, block_ids)],
                      build_scann=False, extra=dict(encoder=dict(step=version)))
