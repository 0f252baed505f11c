"""A knowledge-augmented encoder trained to read: each training sentence of a knowledge
world packed with its entity's own block (`[CLS] x [SEP] own block [SEP]`), retrieval
taken out of the question.

    python -m realm_tf.training.own_block_reader --config configs/tiny.yaml \
        --config configs/knowledge.yaml --world_dir runs/world --output_dir runs/reader \
        [--steps 600] [--seed 0] [--override k=v]

writes <output_dir>/ckpt-1 (what task.pretrain.mlm_init_checkpoint reads) and
<output_dir>/reader.json (its held-out accuracy per attribute, each sentence read with its
own block, and its last loss), and prints the latter. The world is one written by
realm_tf.corpus.knowledge_world (its world.json names each sentence's own blocks).

Why: a random-init reader cannot read for its first hundreds of steps, and until it does
the MLM loss's gradient on the retriever only rewards blocks that narrow the answer set.
Starting REALM from a reader that already reads removes that reason to hold the retriever
still (benchmarks.knowledge_staleness), and scoring it on the held-out sentences measures
the reader's part apart from the retriever's (tests/test_knowledge_reader.py). It lives in
realm_tf (the knowledge benchmarks and the demo's act 1 both start from it; the demo may
not import benchmarks).
"""
import json
import os

import numpy as np
import tensorflow as tf
import tf_keras
from absl import flags

from realm_tf import tasks
from realm_tf.configs import load_config
from realm_tf.corpus import knowledge_world
from realm_tf.io import command_line, storage
from realm_tf.modeling import factory
from realm_tf.modeling.spans import pack_reader_inputs

BATCH, LEARNING_RATE = 64, 3e-3


def packed(rows: list, blocks: dict, tokenizer, config) -> tuple:
  """Reader inputs with each sentence before its own block, and its labels.

  Args:
    rows: a world's sentences (world["x"] or world["held_out"]).
    blocks: block id → block text.
    tokenizer: the experiment's tokenizer.
    config: the experiment (its retriever's query_seq_length, reader's seq_length).

  Returns:
    (inputs: reader tensors [N, 1, Lr] plus masked_lm_positions / masked_lm_ids [N, 1],
    labels [N]: each sentence's value, one wordpiece).
  """
  ids, labels = [], []
  for row in rows:
    text = row["text"]
    prefix, value, suffix = text[:row["start"]], text[row["start"]:row["end"]], text[row["end"]:]
    pieces = tokenizer.tokenize(tf.constant([prefix, value, suffix])).to_list()
    if len(pieces[1]) != 1:
      raise ValueError(f"{row}: the value is {len(pieces[1])} wordpieces; the knowledge "
                       f"world's values are one each")
    ids.append([tokenizer.cls_id, *pieces[0], tokenizer.mask_id, *pieces[2], tokenizer.sep_id])
    labels.append(pieces[1][0])
  query_length = config.model.retriever.query_seq_length
  longest = max(len(q) for q in ids)
  if longest > query_length:
    raise ValueError(f"a sentence of {longest} wordpieces is longer than the retriever's "
                     f"query_seq_length {query_length}")
  word_ids = np.zeros([len(ids), query_length], np.int32)
  for i, q in enumerate(ids):
    word_ids[i, :len(q)] = q
  bodies = tokenizer.tokenize(tf.constant([blocks[r["gold_block_id"]] for r in rows]))
  body_ids = bodies.to_tensor()[:, None, :]  # [N, 1, Lb]
  reader = pack_reader_inputs(tf.constant(word_ids), tf.constant((word_ids > 0).astype(np.int32)),
                              body_ids, bodies.row_lengths()[:, None],
                              config.model.reader.seq_length, tokenizer.sep_id)
  positions = np.array([q.index(tokenizer.mask_id) for q in ids], np.int32)[:, None]  # [N, 1]
  inputs = {k: reader[k] for k in ("input_word_ids", "input_mask", "input_type_ids")}
  return dict(inputs, masked_lm_positions=tf.constant(positions),
              masked_lm_ids=tf.constant(np.array(labels, np.int32)[:, None])), np.array(labels)


def train(config, world: dict, tokenizer, steps: int, seed: int = 0) -> tuple:
  """A knowledge-augmented encoder of `config` trained `steps` steps of batch BATCH on X's
  (sentence, own block) pairs with Adam at LEARNING_RATE: every own block of the sentence's
  entity (a world of several sources per entity: each states the fact). Why every one: a
  reader that reads only the first source makes the second an unhelpful retrieval, which
  REALM's gradient then pushes down in favour of a distractor.

  Returns:
    (the encoder, its loss at each step).
  """
  blocks = {b["block_id"]: b["text"] for b in world["blocks"]}
  pairs = [dict(r, gold_block_id=b) for r in world["x"] for b in r["gold_block_ids"]]
  inputs, _ = packed(pairs, blocks, tokenizer, config)
  tf_keras.utils.set_random_seed(seed)
  model = factory.build_knowledge_augmented_encoder(config)
  optimizer = tf_keras.optimizers.Adam(LEARNING_RATE)
  n = int(inputs["masked_lm_ids"].shape[0])

  @tf.function(jit_compile=True)
  def step(batch):
    with tf.GradientTape() as tape:
      loss = -tf.reduce_mean(model(batch, training=True)["token_log_probs"])
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                  model.trainable_variables))
    return loss

  rng = np.random.default_rng(seed)
  losses = []
  for _ in range(steps):
    rows = rng.choice(n, min(BATCH, n), replace=False)
    losses.append(float(step({k: tf.gather(v, rows) for k, v in inputs.items()})))
  return model, losses


def heldout_accuracy(model, config, world: dict, tokenizer) -> dict:
  """`model`'s accuracy per attribute on the held-out sentences, each with its own block."""
  blocks = {b["block_id"]: b["text"] for b in world["blocks"]}
  inputs, labels = packed(world["held_out"], blocks, tokenizer, config)
  predictions = np.concatenate([
      np.argmax(model({k: v[i:i + 256] for k, v in inputs.items()})["log_probs"].numpy(),
                axis=-1)[:, 0, 0]
      for i in range(0, len(labels), 256)])
  right = predictions == labels
  attributes = np.array([r["attribute"] for r in world["held_out"]])
  return {a: float(right[attributes == a].mean()) for a in knowledge_world.ATTRIBUTES}


def save_for_pretraining(model, path: str) -> str:
  """Writes `model` where task.pretrain.mlm_init_checkpoint reads a knowledge-augmented
  encoder (a pre-training run's checkpoint layout); returns the checkpoint's path."""
  return tf.train.Checkpoint(model=tf.train.Checkpoint(
      knowledge_augmented_encoder=model)).write(path)


def trained_checkpoint(config, world: dict, steps: int, seed: int, path: str,
                       log=print) -> dict:
  """A reader of `config` trained `steps` steps at `seed` on `world` and saved at `path`
  for task.pretrain.mlm_init_checkpoint; kept when `path` holds it (a rerun).

  Returns:
    {checkpoint: `path`, heldout_accuracy: {attribute: share} (each held-out sentence read
    with its own block), last_loss}; the last two None when a rerun kept the checkpoint.
  """
  if storage.exists(path + ".index"):
    return dict(checkpoint=path, heldout_accuracy=None, last_loss=None)
  log(f"the own-block reader: {steps} steps, seed {seed}")
  tokenizer = tasks.get_task(config).tokenizer
  reader, losses = train(config, world, tokenizer, steps, seed)
  accuracy = heldout_accuracy(reader, config, world, tokenizer)
  log(f"the own-block reader's held-out accuracy with the own block: "
      f"{ {k: round(v, 3) for k, v in accuracy.items()} }, last loss {losses[-1]:.3f}")
  save_for_pretraining(reader, path + ".tmp")
  for suffix in (".data-00000-of-00001", ".index"):  # the .index last: it marks complete
    tf.io.gfile.rename(path + ".tmp" + suffix, path + suffix, overwrite=True)
  tf_keras.backend.clear_session()
  return dict(checkpoint=path, heldout_accuracy=accuracy, last_loss=losses[-1])


def read_world(world_dir: str) -> dict:
  """The world.json that realm_tf.corpus.knowledge_world wrote in `world_dir`.

  Raises:
    FileNotFoundError: naming the file, when `world_dir` holds no world.
  """
  path = os.path.join(world_dir, "world.json")
  if not tf.io.gfile.exists(path):
    raise FileNotFoundError(f"{path}: no knowledge world there (realm_tf.corpus."
                            f"knowledge_world writes one)")
  with tf.io.gfile.GFile(path) as f:
    return json.load(f)


def main():
  """The command line of the module docstring; returns what reader.json holds."""
  flags_ = flags.FLAGS
  if flags_.steps < 1:
    raise command_line.UsageError(f"--steps must be positive, got {flags_.steps}")
  config = load_config(flags_.config, flags_.override, experiment="realm/pretrain")
  world = read_world(flags_.world_dir)
  tf.io.gfile.makedirs(flags_.output_dir)
  result = trained_checkpoint(config, world, flags_.steps, flags_.seed,
                              os.path.join(flags_.output_dir, "ckpt-1"))
  summary = os.path.join(flags_.output_dir, "reader.json")
  if result["heldout_accuracy"] is None and tf.io.gfile.exists(summary):
    with tf.io.gfile.GFile(summary) as f:  # a rerun: the first run's figures
      return json.load(f)
  result = dict(result, steps=flags_.steps, seed=flags_.seed, world_dir=flags_.world_dir)
  with tf.io.gfile.GFile(summary + ".tmp", "w") as f:
    json.dump(result, f, indent=2)
  tf.io.gfile.rename(summary + ".tmp", summary, overwrite=True)
  return result


if __name__ == "__main__":
  flags.DEFINE_multi_string("config", [], "Config YAML files, in order (the model's sizes).")
  flags.DEFINE_multi_string("override", [], "Config overrides: key=value[,key=value].")
  flags.DEFINE_string("world_dir", None, "A knowledge world (its world.json).", required=True)
  flags.DEFINE_string("output_dir", None, "Where ckpt-1 and reader.json are written.",
                      required=True)
  flags.DEFINE_integer("steps", 600, "Training steps of batch 64.")
  flags.DEFINE_integer("seed", 0, "Seed of the initialisation and of the batches.")
  command_line.run_absl("realm_tf.training.own_block_reader", main)
