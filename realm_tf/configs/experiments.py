"""One registered experiment per REALM stage (tf-models' `exp_factory`).

    python -m realm_tf.train --experiment realm/ict --config my_sizes.yaml --model_dir D

An experiment is the stage's defaults: its task type, its task settings and its own
trainer section (steps, learning rate, warm-up), so a stage never borrows another stage's
schedule. `--config` files and `--override`s then change any field, in that order.

  realm/ict         Inverse Cloze Task warm start of the retriever (ORQA: batch 4096,
                    lr 1e-4, 100k steps).
  realm/mlm_warmup  the knowledge-augmented encoder's MLM head alone, no retrieval: for warm
                    starts that ship no MLM head (MiniLM), whose fresh head would otherwise
                    start REALM at chance.
  realm/pretrain    REALM pre-training (paper: batch 512, lr 3e-5, 200k steps, k=8 with the
                    null document, an index refresh about every 500 steps).
  realm/openqa      Open-QA fine-tuning (paper: k=5; ORQA's fine-tuning lr 1e-5).
"""
from official.core import exp_factory

from realm_tf.configs.experiment import ExperimentConfig

ICT = "realm/ict"
MLM_WARMUP = "realm/mlm_warmup"
PRETRAIN = "realm/pretrain"
OPENQA = "realm/openqa"
EXPERIMENTS = (ICT, MLM_WARMUP, PRETRAIN, OPENQA)


def _stage(task: dict, train_steps: int, learning_rate: float, warmup_steps: int,
           steps_per_loop: int) -> ExperimentConfig:
  """A stage's task settings and its own schedule (summaries every loop, checkpoints
  every 1000 steps)."""
  return ExperimentConfig(task=task, trainer=dict(
      train_steps=train_steps, learning_rate=learning_rate, warmup_steps=warmup_steps,
      steps_per_loop=steps_per_loop, summary_interval=steps_per_loop,
      checkpoint_interval=1000))


@exp_factory.register_config_factory(ICT)
def realm_ict() -> ExperimentConfig:
  """realm/ict: ICT, 100k steps at lr 1e-4 (10k warm-up), batch 4096 (the task's default)."""
  return _stage(dict(type="ict"), train_steps=100_000, learning_rate=1e-4,
                warmup_steps=10_000, steps_per_loop=500)


@exp_factory.register_config_factory(MLM_WARMUP)
def realm_mlm_warmup() -> ExperimentConfig:
  """realm/mlm_warmup: the MLM head alone, no retrieval, 10k steps at lr 1e-4."""
  return _stage(dict(type="pretrain", pretrain=dict(retrieval=False, trainable="mlm_head",
                                                    refresh_every_steps=0)),
                train_steps=10_000, learning_rate=1e-4, warmup_steps=1000, steps_per_loop=500)


@exp_factory.register_config_factory(PRETRAIN)
def realm_pretrain() -> ExperimentConfig:
  """realm/pretrain: k=8 with the null document, a snapshot every 500 steps, 200k steps
  at lr 3e-5 (10k warm-up)."""
  return _stage(dict(type="pretrain", pretrain=dict(num_candidates=8,
                                                    include_null_document=True,
                                                    refresh_every_steps=500)),
                train_steps=200_000, learning_rate=3e-5, warmup_steps=10_000,
                steps_per_loop=500)


@exp_factory.register_config_factory(OPENQA)
def realm_openqa() -> ExperimentConfig:
  """realm/openqa: k=5 from a REALM pre-training run (init_from=realm), 10k steps at
  lr 1e-5 (1k warm-up)."""
  return _stage(dict(type="openqa", openqa=dict(num_candidates=5, init_from="realm")),
                train_steps=10_000, learning_rate=1e-5, warmup_steps=1000, steps_per_loop=100)


def experiment_config(name: str) -> ExperimentConfig:
  """The registered experiment `name`.

  Args:
    name: one of EXPERIMENTS (realm/ict, realm/mlm_warmup, realm/pretrain, realm/openqa).

  Returns:
    A fresh ExperimentConfig with the stage's defaults.

  Raises:
    ValueError: naming the registered experiments, if `name` is not one.
  """
  if name not in EXPERIMENTS:
    raise ValueError(f"unknown experiment {name!r}; registered: {', '.join(EXPERIMENTS)}")
  return exp_factory.get_exp_config(name)
