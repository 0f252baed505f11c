"""The released weights in realm_tf's model: the model they fill, every variable loaded by a
named rule (realm_tf.pretrained.released), and the run's checkpoint and vocabulary."""
import os

import tensorflow as tf

from realm_tf.import_released.release import ReleasedFiles
from realm_tf.io import layout
from realm_tf.modeling import factory
from realm_tf.modeling.models.openqa import OpenQAModel
from realm_tf.pretrained import released
from realm_tf.text.tokenization import Tokenizer


def build_model(config, kind: str, vocab_file: str = ""):
  """The realm_tf model the released tensors fill, built (random init).

  Args:
    config: the run's config (released_config or the run's params.yaml).
    kind: 'openqa' (OpenQAModel) or 'pretrain' (RealmPretrainer).
    vocab_file: the vocabulary giving the reader's [SEP] id (default the config's).
  Returns:
    The model, every variable created.
  """
  if kind == "pretrain":
    return factory.build_realm_pretrainer(config)
  o = config.task.openqa
  tokenizer = Tokenizer(vocab_file or config.model.tokenizer.vocab_file,
                        config.model.tokenizer.lower_case)
  return OpenQAModel(factory.build_reader(config), factory.build_retriever(config),
                     reader_seq_length=o.reader_seq_length, sep_id=tokenizer.sep_id,
                     answer_logits=o.loss, name="openqa_model")


def load_released_weights(model, kind: str, files: ReleasedFiles, dims, orqa_prefix: str):
  """Fills every variable of `model` from the released checkpoints.

  Every checkpoint's plan is checked whole (released.LoadPlan.check) before any variable
  is assigned.

  Args:
    model: build_model's model of `kind`.
    kind: 'openqa' or 'pretrain'.
    files: the released files.
    dims: the BERTs' sizes.
    orqa_prefix: the Open-QA checkpoint ('openqa' only).
  Returns:
    {checkpoint prefix: {'loaded': n, 'skipped': m}}.
  Raises:
    ReleasedFormatError: an unknown, missing or mis-shaped tensor (one line).
  """
  retriever = model.retriever
  embedder = released.ReleasedCheckpoint.load(files.embedder_variables)
  plans = {files.embedder_variables: released.LoadPlan(embedder)}
  released.plan_embedder(plans[files.embedder_variables], retriever.document_embedder, dims)
  if kind == "openqa":
    orqa = released.ReleasedCheckpoint.load(orqa_prefix)
    plan = plans[orqa_prefix] = released.LoadPlan(orqa)
    released.plan_embedder(plan, retriever.query_embedder, dims, exclude=released.READER_SCOPE)
    released.plan_reader(plan, model.reader, dims)
  else:
    # REALM's pre-training exports one embedder module; both towers start from it.
    released.plan_embedder(plans[files.embedder_variables], retriever.query_embedder, dims)
    bert = released.ReleasedCheckpoint.load(files.bert_variables)
    plan = plans[files.bert_variables] = released.LoadPlan(bert)
    kae = model.knowledge_augmented_encoder
    released.plan_bert(plan, kae.encoder, bert.one_bert(), dims, masked_lm=kae.masked_lm)
  for plan in plans.values():
    plan.check()
  return {path: plan.apply() for path, plan in plans.items()}


def save_checkpoint(model, output_dir: str, step: int) -> str:
  """Saves <output_dir>/checkpoints/ckpt-<step> as the trainer lays it out (model and
  global_step), so evaluation's restore_model and Open-QA's init_from read it.

  Args:
    model: the filled model.
    output_dir: the run directory.
    step: the global step to record.
  Returns:
    The checkpoint prefix.
  """
  global_step = tf.Variable(step, dtype=tf.int64, trainable=False)
  checkpoint = tf.train.Checkpoint(model=model, global_step=global_step)
  # CheckpointManager names the checkpoint in its state file last (atomically).
  manager = tf.train.CheckpointManager(checkpoint, layout.checkpoint_dir(output_dir),
                                       max_to_keep=1, step_counter=global_step)
  return manager.save(checkpoint_number=step)


def copy_vocab(files: ReleasedFiles, output_dir: str) -> str:
  """Copies the embedder module's assets/vocab.txt to <output_dir>/vocab.txt (through a
  temporary name); returns the copy's path."""
  path = os.path.join(output_dir, "vocab.txt")
  if not tf.io.gfile.exists(files.vocab_file):
    raise FileNotFoundError(f"{files.vocab_file}: the embedder module has no vocabulary")
  tmp = path + ".tmp"
  tf.io.gfile.copy(files.vocab_file, tmp, overwrite=True)
  tf.io.gfile.rename(tmp, path, overwrite=True)
  return path
