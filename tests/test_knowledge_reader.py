"""The pre-training reader's MLM output matrix: tied to the word embeddings (BERT) or its
own (model.reader.tie_output_embeddings=false), why a random-init reader needs its own,
and REALM's learning signal once the reader reads.

The learning test trains the knowledge-augmented encoder of configs/tiny.yaml +
configs/knowledge.yaml alone, on each training sentence of a small knowledge world packed
with its entity's own block (`[CLS] x [SEP] own block [SEP]`, retrieval taken out of the
question), and scores the held-out sentences, whose values only the block states. With its
own output matrix the reader copies every attribute's value; tied, learning the closed
sets' priors pulls each set's rows of the shared table together, and at least one
attribute stays near chance.

Those learning checks train for minutes (the system tier, tests/conftest.py); the other
tests run the same code paths at a handful of steps on a 24-entity world.
"""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from benchmarks import knowledge
from realm_tf.configs import load_config
from realm_tf.corpus import knowledge_world
from realm_tf.modeling import factory
from realm_tf.retrieval import recall
from realm_tf.training import own_block_reader, train_lib

STEPS = 400
# The mechanics tests' size: enough steps for Adam's first updates to lower the loss.
FEW_STEPS, FEW_ENTITIES = 6, 24


def _config(repo_dir, *overrides):
  return load_config([str(repo_dir / "configs" / "tiny.yaml"),
                      str(repo_dir / "configs" / "knowledge.yaml")],
                     ["task.type=pretrain", *overrides])


def own_block_reader_accuracy(config, world, tokenizer, steps=STEPS, seed=0) -> dict:
  """Held-out accuracy per attribute of a reader trained on (sentence, own block) pairs."""
  model, _ = own_block_reader.train(config, world, tokenizer, steps, seed)
  return own_block_reader.heldout_accuracy(model, config, world, tokenizer)


@pytest.fixture(scope="module")
def small_world():
  return knowledge_world.make_world(knowledge_world.WorldConfig(
      seed=0, entities=600, x_templates=1))


@pytest.fixture(scope="module")
def few_entities():
  return knowledge_world.make_world(knowledge_world.WorldConfig(
      seed=0, entities=FEW_ENTITIES, x_templates=1))


def test_a_sentence_is_packed_before_its_own_block(repo_dir, tokenizer, few_entities):
  """What the reader tests read: `[CLS] sentence with [MASK] [SEP] own block [SEP]`, the
  mask at masked_lm_positions, its value (the label) in the block's segment only."""
  config = _config(repo_dir)
  blocks = {b["block_id"]: b["text"] for b in few_entities["blocks"]}
  inputs, labels = own_block_reader.packed(few_entities["x"], blocks, tokenizer, config)
  ids = inputs["input_word_ids"].numpy()[:, 0]  # [N, Lr]
  segment = inputs["input_type_ids"].numpy()[:, 0]
  positions = inputs["masked_lm_positions"].numpy()[:, 0]
  assert len(ids) == len(few_entities["x"]) == len(labels)
  np.testing.assert_array_equal(inputs["masked_lm_ids"].numpy()[:, 0], labels)
  for row, position, label, kinds in zip(ids, positions, labels, segment):
    assert row[0] == tokenizer.cls_id and row[position] == tokenizer.mask_id
    assert kinds[position] == 0 and label not in row[kinds == 0]
    assert label in row[kinds == 1]  # the value is there to be copied
    assert list(row[kinds == 1][-1:]) == [tokenizer.sep_id]


@pytest.mark.parametrize("tied", [False, True])
def test_the_own_block_reader_trains_and_is_scored_on_held_out_sentences(
    repo_dir, tokenizer, few_entities, tied):
  """The reader learning tests below at a handful of steps, with the output matrix tied
  and untied: the compiled step lowers the loss and the held-out scoring covers every
  attribute."""
  config = _config(repo_dir, f"model.reader.tie_output_embeddings={str(tied).lower()}")
  model, losses = own_block_reader.train(config, few_entities, tokenizer, steps=FEW_STEPS)
  assert model.tied == tied
  assert np.all(np.isfinite(losses)) and losses[-1] < losses[0] - 0.1, losses
  accuracy = own_block_reader.heldout_accuracy(model, config, few_entities, tokenizer)
  # The same figures from the model's predictions for every held-out sentence at once,
  # against each value's wordpiece, counted per attribute.
  blocks = {b["block_id"]: b["text"] for b in few_entities["blocks"]}
  inputs, _ = own_block_reader.packed(few_entities["held_out"], blocks, tokenizer, config)
  predicted = np.argmax(model(inputs)["log_probs"].numpy()[:, 0, 0], axis=-1)  # [H]
  assert accuracy == _accuracy_per_attribute(few_entities["held_out"], predicted, tokenizer)


def _accuracy_per_attribute(rows: list, predicted, tokenizer) -> dict:
  """attribute → the share of `rows` (held-out sentences) of it whose predicted wordpiece
  is its value's."""
  values = tokenizer.tokenize(tf.constant([r["value"] for r in rows])).flat_values.numpy()
  right, count = {}, {}
  for row, value, guess in zip(rows, values, predicted):
    count[row["attribute"]] = count.get(row["attribute"], 0) + 1
    right[row["attribute"]] = right.get(row["attribute"], 0) + int(value == guess)
  return {a: right[a] / count[a] for a in count}


def test_the_held_out_accuracy_is_each_attributes_share_of_right_values(
    repo_dir, tokenizer, few_entities):
  """heldout_accuracy of a stand-in reader that is right exactly for the sentences whose
  value's wordpiece id is even (one above it otherwise): each attribute's share of even
  values, counted here from the values themselves."""
  config = _config(repo_dir)
  vocab = tokenizer.vocab_size

  def reader(inputs):
    labels = inputs["masked_lm_ids"][:, 0]  # [N]: the values, one wordpiece each
    guesses = tf.where(labels % 2 == 0, labels, labels + 1)
    return dict(log_probs=tf.math.log(tf.one_hot(guesses, vocab) + 1e-9)[:, None, None, :])

  rows = few_entities["held_out"]
  values = tokenizer.tokenize(tf.constant([r["value"] for r in rows])).flat_values.numpy()
  even = {a: np.mean([v % 2 == 0 for v, r in zip(values, rows) if r["attribute"] == a])
          for a in knowledge_world.ATTRIBUTES}
  assert 0 < min(even.values()) and max(even.values()) < 1  # neither all right nor none
  accuracy = own_block_reader.heldout_accuracy(reader, config, few_entities, tokenizer)
  assert accuracy == pytest.approx(even, abs=1e-12)


def test_a_random_init_reader_with_its_own_output_matrix_reads_every_attribute(
    repo_dir, tokenizer, small_world):
  config = _config(repo_dir)
  assert not config.model.reader.tie_output_embeddings  # knowledge.yaml's choice
  accuracy = own_block_reader_accuracy(config, small_world, tokenizer)
  assert min(accuracy.values()) >= 0.9, accuracy


def test_the_same_reader_tied_to_its_word_embeddings_does_not(repo_dir, tokenizer, small_world):
  """The control: the collapse the own matrix fixes (fails if tying stops mattering, in
  which case the option and knowledge.yaml's choice should be revisited)."""
  config = _config(repo_dir, "model.reader.tie_output_embeddings=true")
  accuracy = own_block_reader_accuracy(config, small_world, tokenizer)
  assert min(accuracy.values()) < 0.5, accuracy


def test_an_untied_head_starts_as_a_copy_of_the_table_and_trains_apart(repo_dir):
  config = _config(repo_dir, "model.reader.tie_output_embeddings=false")
  tf_keras.utils.set_random_seed(0)
  model = factory.build_knowledge_augmented_encoder(config)
  table = model.encoder.get_embedding_table()
  own = model.output_embeddings
  assert not model.tied and own is model.masked_lm.embedding_table
  assert own.ref() != table.ref()
  np.testing.assert_array_equal(own.numpy(), table.numpy())
  trained = {v.ref() for v in model.trainable_variables}
  assert own.ref() in trained and table.ref() in trained
  with pytest.raises(ValueError, match="already untied"):
    model.untie_output_embeddings()
  tied = factory.build_knowledge_augmented_encoder(
      _config(repo_dir, "model.reader.tie_output_embeddings=true"))
  assert tied.tied and tied.masked_lm.embedding_table is tied.encoder.get_embedding_table()
  # One gradient step moves the two matrices apart: each gets its own gradient.
  inputs = dict(input_word_ids=tf.constant([[[101, 2000, 103, 102, 2001, 102]]], tf.int32),
                input_mask=tf.ones([1, 1, 6], tf.int32),
                input_type_ids=tf.constant([[[0, 0, 0, 0, 1, 1]]], tf.int32),
                masked_lm_positions=tf.constant([[2]]), masked_lm_ids=tf.constant([[2002]]))
  with tf.GradientTape() as tape:
    loss = -tf.reduce_sum(model(inputs, training=True)["token_log_probs"])
  grads = tape.gradient(loss, [own, table])
  tf_keras.optimizers.SGD(1.0).apply_gradients(zip(grads, [own, table]))
  assert not np.array_equal(own.numpy(), table.numpy())


def test_the_untied_matrix_is_saved_restored_and_copied_from_a_warm_table(repo_dir, tmp_path):
  """A checkpoint round trip keeps the own matrix apart from the table; the copy is made
  after the warm start (here: weights restored into the encoder before untying)."""
  config = _config(repo_dir, "model.reader.tie_output_embeddings=false")
  tf_keras.utils.set_random_seed(0)
  model = factory.build_knowledge_augmented_encoder(config)
  model.output_embeddings.assign(model.output_embeddings + 1.0)
  path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
  tf_keras.utils.set_random_seed(1)
  restored = factory.build_knowledge_augmented_encoder(config)
  tf.train.Checkpoint(model=restored).read(path).assert_consumed()
  np.testing.assert_array_equal(restored.output_embeddings.numpy(),
                                model.output_embeddings.numpy())
  np.testing.assert_array_equal(restored.encoder.get_embedding_table().numpy(),
                                model.encoder.get_embedding_table().numpy())
  assert not np.array_equal(restored.output_embeddings.numpy(),
                            restored.encoder.get_embedding_table().numpy())
  # Untying copies the table as it is at that moment (factory: after the warm start).
  tied = factory.build_knowledge_augmented_encoder(
      _config(repo_dir, "model.reader.tie_output_embeddings=true"))
  tied.encoder.get_embedding_table().assign(model.encoder.get_embedding_table() * 2.0)
  tied.untie_output_embeddings()
  np.testing.assert_array_equal(tied.output_embeddings.numpy(),
                                model.encoder.get_embedding_table().numpy() * 2.0)


def _weak_start(work, repo_dir, tokenizer, entities: int, batch_size: int, reader_steps: int,
                ict_steps: int, realm_steps: int):
  """A world of `entities`, a reader that reads (trained on own blocks, as above) saved as a
  pre-training checkpoint, and a weak ICT warm start of the retriever; the knowledge
  benchmark's arguments for `realm_steps` of REALM from them."""
  args = knowledge.parse_args(
      ["--entities", str(entities), "--batch_size", str(batch_size), "--ict_steps",
       str(ict_steps), "--steps", str(realm_steps), "--curve_every", str(realm_steps),
       "--refresh_every", str(realm_steps), "--work_dir", str(work),
       "--no_write", "--override=trainer.retriever_frozen_steps=0",
       # The reader reads from step 0 here: the retriever moves at the reader's rate.
       "--override=trainer.retriever_learning_rate_multiplier=1.0"])
  world = knowledge_world.write_world(str(work / "world"), knowledge_world.WorldConfig(
      seed=0, entities=entities, x_templates=1))
  world["dir"] = str(work / "world")
  reader, _ = own_block_reader.train(_config(repo_dir), world, tokenizer, steps=reader_steps)
  reader_checkpoint = own_block_reader.save_for_pretraining(reader, str(work / "reader" / "ckpt-1"))
  tf_keras.backend.clear_session()
  ict_dir = str(work / "ict")
  train_lib.run_experiment(knowledge.ict_config(world["dir"], args), ict_dir)
  tf_keras.backend.clear_session()
  return work, args, world, reader_checkpoint, ict_dir


@pytest.fixture(scope="module")
def weak_start(tmp_path_factory, repo_dir, tokenizer):
  """300 entities, a reader trained 300 steps, ICT 3 steps; REALM 200 steps."""
  return _weak_start(tmp_path_factory.mktemp("signal"), repo_dir, tokenizer, entities=300,
                     batch_size=32, reader_steps=300, ict_steps=3, realm_steps=200)


@pytest.fixture(scope="module")
def weak_start_briefly(tmp_path_factory, repo_dir, tokenizer):
  """The same chain at the mechanics size. The reader is saved untrained (its training is
  the test above's; a random reader's p(y|z,x) still differs between blocks, so the MLM
  loss still has a gradient on the retriever); the schedules' learning rate is 0 at the
  first step, so 2 ICT and 4 REALM steps are about the fewest that move anything."""
  return _weak_start(tmp_path_factory.mktemp("signal_briefly"), repo_dir, tokenizer,
                     entities=FEW_ENTITIES, batch_size=8, reader_steps=0, ict_steps=2,
                     realm_steps=4)


def _realm_from(weak_start, name: str, *overrides) -> dict:
  """REALM's MLM loss over the step-0 index (benchmarks.knowledge's frozen arm: the query
  tower trains, the documents stay): the own-block top-1 at step 0 and after, and the
  retriever's weights at both."""
  work, args, world, reader_checkpoint, ict_dir = weak_start
  config = knowledge.arm_config("frozen", world["dir"], args, ict_dir).replace(
      task=dict(pretrain=dict(mlm_init_checkpoint=reader_checkpoint)))
  if overrides:
    config = config.replace(**overrides[0])
  start = knowledge.retriever_from(config)
  step0 = knowledge.gold_top1(config, start, start, world)
  model_dir = str(work / name)
  knowledge.publish_index(config, start, model_dir)
  train_lib.run_experiment(config, model_dir)
  trained = knowledge.retriever_from(config, model_dir)
  after = knowledge.gold_top1(config, trained, start, world)
  weights = [w.numpy() for w in start.weights], [w.numpy() for w in trained.weights]
  tf_keras.backend.clear_session()
  return dict(step0=step0, after=after, weights=weights, config=config, start=start,
              trained=trained)


def _own_top1_by_brute_force(config, world, queries_from, documents_from) -> float:
  """The share of held-out sentences whose best block by inner product, the query tower
  of `queries_from` against the document tower of `documents_from`, is one of their
  entity's own: what knowledge.gold_top1 must compute."""
  task, index = knowledge.world_index(config)
  queries = knowledge.heldout_queries(config, task, queries_from, world)  # [H, P]
  documents = recall.embed_corpus(documents_from, index, task.tokenizer,
                                  config.model.retriever.block_seq_length)  # [N, P]
  best = np.asarray(index.store.block_ids)[np.argsort(-(queries @ documents.T), axis=1)[:, 0]]
  return float(np.mean([b in r["gold_block_ids"] for b, r in zip(best, world["held_out"])]))


def test_the_mlm_loss_alone_teaches_the_retriever_its_own_blocks(weak_start):
  """REALM's learning signal: from a weak warm start (step-0 own-block top-1 about 0.2),
  200 steps of the MLM loss, with no supervision naming any block, raise the own block's
  top-1 on held-out sentences well above its start; with the retriever's gradient
  stopped (its learning rate multiplier 0: the gradient is neither computed nor
  applied) the same run leaves it where it started."""
  realm = _realm_from(weak_start, "realm")
  step0, after = realm["step0"], realm["after"]
  assert step0 <= 0.4, step0  # a weak start
  assert after >= step0 + 0.3, (step0, after)
  stopped = _realm_from(
      weak_start, "stopped", dict(trainer=dict(retriever_learning_rate_multiplier=0.0)))
  assert stopped["step0"] == step0
  assert stopped["after"] == pytest.approx(step0, abs=1e-9), (step0, stopped["after"])


def test_the_mlm_loss_reaches_the_retriever_through_the_knowledge_chain(weak_start_briefly):
  """The test above at 4 steps on 24 entities: the reader checkpoint (mlm_init_checkpoint),
  the ICT warm start, the published step-0 index and the frozen arm's run wired as there;
  the MLM loss moves the retriever, the own-block top-1 after it is the trained query
  tower's against the step-0 documents (by brute force), and with its gradient stopped
  not one weight moves and the own-block top-1 stays exactly where it started."""
  realm = _realm_from(weak_start_briefly, "realm")
  start, trained = realm["weights"]
  assert len(start) == len(trained) > 0
  assert any(not np.array_equal(a, b) for a, b in zip(start, trained))
  world = weak_start_briefly[2]
  assert realm["after"] == _own_top1_by_brute_force(realm["config"], world, realm["trained"],
                                                    realm["start"])
  stopped = _realm_from(
      weak_start_briefly, "stopped", dict(trainer=dict(retriever_learning_rate_multiplier=0.0)))
  start, trained = stopped["weights"]
  assert all(np.array_equal(a, b) for a, b in zip(start, trained))
  assert stopped["step0"] == realm["step0"] and stopped["after"] == stopped["step0"]
