"""The three tasks at TPU scale, on the tiny config: XLA-compiled steps, sharded in-graph
retrieval, 2-replica equivalence, exact resume, numeric-only inputs, in-place index swaps,
the builder lifecycle and the library's layering."""
import os

import numpy as np
import pytest
import tensorflow as tf

from realm_tf import tasks
from realm_tf.data.block_store import BlockStore
from realm_tf.io import layout, versioned
from realm_tf.retrieval.exact import ExactSearcher
from realm_tf.retrieval.knowledge_index import KnowledgeIndex, tokenize_blocks
from realm_tf.training import train_lib
from tests import task_fixtures as tf_


@pytest.fixture(scope="module")
def questions(tmp_path_factory):
  return tf_.write_questions(str(tmp_path_factory.mktemp("qa") / "questions.jsonl"))


def _config(repo_dir, corpus, questions, task, *overrides, **named):
  return tf_.tiny_config(repo_dir, corpus, task, questions, *overrides, **named)


@pytest.fixture(scope="module")
def built(repo_dir, corpus, questions, mirrored_strategy):
  """`built(task_type, replicas)`: (config, task, model), built once per module for the
  step-level tests below. One device: XLA on (the compile test); 2 replicas: off (XLA maps
  the logical CPUs to one device). Open-QA reads every block (k = 12), so each question has
  an answer to learn from. A test may step a model's weights; none depends on their
  values (the 2-replica test copies the single device's)."""
  made = {}

  def get(task_type, replicas):
    if (task_type, replicas) not in made:
      config = _config(repo_dir, corpus, questions, task_type, task__openqa__num_candidates=12,
                       runtime__enable_xla=replicas == 1)
      strategy = mirrored_strategy if replicas == 2 else None
      made[task_type, replicas] = (config, *tf_.build(config, strategy))
    return made[task_type, replicas]

  return get


# ------------------------------------------------------------------------------------- XLA


@pytest.mark.parametrize("task_type", tf_.TASKS)
def test_train_and_eval_steps_compile_with_xla(built, task_type):
  config, task, model = built(task_type, 1)
  assert task.jit_compile
  optimizer = task.create_task_optimizer()
  features = tf_.first_batch(task, config)
  metrics = task.build_metrics()
  logs = task.train_step(features, model, optimizer, metrics)
  assert np.isfinite(logs["loss"].numpy())
  compiled = task._compiled["forward_backward"]  # pylint: disable=protected-access
  # The whole forward + loss + backward lowers to one XLA computation.
  hlo = compiled.experimental_get_compiler_ir(features)(stage="hlo")
  assert "ENTRY" in hlo
  logs = task.validation_step(features, model, task.build_metrics(training=False))
  assert np.isfinite(np.asarray(logs["loss"])).all()
  assert "ENTRY" in task._compiled["validation"].experimental_get_compiler_ir(  # pylint: disable=protected-access
      features)(stage="hlo")
  assert all(np.isfinite(m.result().numpy()) for m in metrics)


# ---------------------------------------------------------------------- sharded retrieval


def _store(n=13, seed=0):
  rng = np.random.default_rng(seed)
  ids = np.sort(rng.choice(10**12, size=n, replace=False)).astype(np.int64)
  words = ["alpha", "beta", "gamma", "delta", "river", "city", "paris", "tower"]
  texts = [" ".join(rng.choice(words, size=3 + i % 5)) for i in range(n)]
  return BlockStore(ids, [f"doc{i // 2}" for i in range(n)], [f"T{i}" for i in range(n)],
                    texts)


@pytest.mark.parametrize("replicas", [1, 2])
def test_sharded_search_equals_numpy_top_k(tokenizer, mirrored_strategy, replicas):
  strategy = mirrored_strategy if replicas == 2 else tf.distribute.get_strategy()
  store = _store()
  index = KnowledgeIndex(store, tokenizer, block_seq_length=12, body_length=8, dimension=6,
                         strategy=strategy)
  assert index.shard_size == (7 if replicas == 2 else 13)  # 13 rows, padded to 2 x 7
  rng = np.random.default_rng(1)
  vectors = rng.normal(size=[13, 6]).astype(np.float32)
  index.set_embeddings(vectors, version=3)
  queries = rng.normal(size=[4, 6]).astype(np.float32)  # 2 per replica
  queries[0] = vectors[5] * 10  # its own block would win: exclusion must drop it
  exclude = store.block_ids[[5, 0, 12, 3]]
  k = 4

  def per_replica(context):
    i = context.replica_id_in_sync_group
    share = 4 // replicas
    return (tf.constant(queries[i * share:(i + 1) * share]),
            tf.constant(exclude[i * share:(i + 1) * share]))

  @tf.function
  def search(q, e):
    found = index.search(q, k, exclude_block_ids=e)
    blocks = index.gather(found.rows)
    return found, blocks

  inputs = strategy.experimental_distribute_values_from_function(per_replica)
  found, blocks = strategy.run(search, args=inputs)
  local = strategy.experimental_local_results
  rows = np.concatenate([r.numpy() for r in local(found.rows)])
  scores = np.concatenate([s.numpy() for s in local(found.scores)])
  block_ids = np.concatenate([b.numpy() for b in local(found.block_ids)])
  word_ids = np.concatenate([w.numpy() for w in local(blocks.document["input_word_ids"])])
  bodies = np.concatenate([b.numpy() for b in local(blocks.body_ids)])
  embeddings = np.concatenate([e.numpy() for e in local(blocks.embeddings)])

  reference = queries @ vectors.T  # [Q, N]
  for q in range(4):
    reference[q, np.searchsorted(store.block_ids, exclude[q])] = -np.inf
  want = np.argsort(-reference, axis=1, kind="stable")[:, :k]
  np.testing.assert_array_equal(rows, want)
  np.testing.assert_allclose(scores, np.take_along_axis(reference, want, 1), rtol=1e-5)
  np.testing.assert_array_equal(block_ids, store.block_ids[want])
  assert not np.any(block_ids == exclude[:, None])
  tables = tokenize_blocks(store, tokenizer, 12, 8)
  np.testing.assert_array_equal(word_ids, tables["word_ids"][want])
  np.testing.assert_array_equal(bodies, tables["body_ids"][want])
  np.testing.assert_allclose(embeddings, vectors[want])


def test_index_rejects_embeddings_of_another_corpus(tokenizer):
  index = KnowledgeIndex(_store(), tokenizer, 12, 8, dimension=6)
  with pytest.raises(ValueError, match="do not fit an index of 13 blocks x 6"):
    index.set_embeddings(np.zeros([12, 6], np.float32), version=1)


def test_an_in_graph_searcher_backs_the_same_index_api(tokenizer):
  """The exports' backend: a Searcher (TF ops) replaces the sharded exact search behind
  the same KnowledgeIndex, same SearchResult, rows and exclusion."""
  store = _store()
  index = KnowledgeIndex(store, tokenizer, block_seq_length=12, body_length=8, dimension=6)
  rng = np.random.default_rng(2)
  vectors = rng.normal(size=[13, 6]).astype(np.float32)
  index.set_embeddings(vectors, version=1)
  queries = tf.constant(rng.normal(size=[3, 6]).astype(np.float32))
  exclude = tf.constant(store.block_ids[[4, 0, 9]])
  exact = index.search(queries, 3, exclude_block_ids=exclude)
  with pytest.raises(ValueError, match="covers 12 blocks, the index 13"):
    index.search_with(ExactSearcher(vectors[:12], store.block_ids[:12]))
  index.search_with(ExactSearcher(vectors[::-1].copy(), store.block_ids[::-1].copy()))
  searched = tf.function(lambda q, e: index.search(q, 3, exclude_block_ids=e))(
      queries, exclude)
  for got, want in zip(searched, exact):
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5)
  scann = KnowledgeIndex(store, tokenizer, 12, 8, dimension=6, backend="scann")
  with pytest.raises(ValueError, match="replaces the 'exact' backend"):
    scann.search_with(ExactSearcher(vectors, store.block_ids))


# ---------------------------------------------------------------- 2 replicas = 1 device


def _loss_and_grads(task, model, features):
  with tf.GradientTape() as tape:
    loss, _ = task.forward(model, features, True)
  variables = model.trainable_variables
  grads = tape.gradient(loss, variables)
  return loss, [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                for g, v in zip(grads, variables)]


@pytest.mark.parametrize("task_type", tf_.TASKS)
def test_two_replica_step_equals_single_device(built, mirrored_strategy, task_type):
  config, single_task, single = built(task_type, 1)
  features = tf_.first_batch(single_task, config)  # global batch of 4
  single_loss, single_grads = _loss_and_grads(single_task, single, features)

  strategy = mirrored_strategy
  _, mirrored_task, mirrored = built(task_type, 2)
  for target, source in zip(mirrored.variables, single.variables):
    target.assign(source)

  def split(context):
    i = context.replica_id_in_sync_group
    return tf.nest.map_structure(lambda v: v[2 * i:2 * i + 2], features)

  @tf.function
  def step(batch):
    def replica(replica_batch):
      loss, grads = _loss_and_grads(mirrored_task, mirrored, replica_batch)
      context = tf.distribute.get_replica_context()
      return (context.all_reduce(tf.distribute.ReduceOp.SUM, loss),
              context.all_reduce(tf.distribute.ReduceOp.SUM, grads))
    return strategy.run(replica, args=(batch,))

  loss, grads = step(strategy.experimental_distribute_values_from_function(split))
  local = strategy.experimental_local_results
  np.testing.assert_allclose(local(loss)[0].numpy(), single_loss.numpy(), rtol=1e-5)
  used = 0
  for var, got, want in zip(mirrored.trainable_variables, grads, single_grads):
    np.testing.assert_allclose(local(got)[0].numpy(), want.numpy(), rtol=2e-3, atol=1e-6,
                               err_msg=var.name)
    used += int(np.abs(want.numpy()).max() > 0)
  assert used > len(single_grads) // 2


# -------------------------------------------------------------------------------- inputs


@pytest.mark.parametrize("task_type", tf_.TASKS)
def test_distributed_inputs_hold_numbers_only(built, mirrored_strategy, task_type):
  config, task, _ = built(task_type, 2)
  dataset = train_lib.distribute(mirrored_strategy, task, config.task_config.train_data)
  specs = tf.nest.flatten(dataset.element_spec, expand_composites=True)
  assert specs and all(s.dtype != tf.string for s in specs)
  if task_type == "pretrain":
    assert "doc_uid" not in str(dataset.element_spec)


def test_a_string_feature_is_refused_before_it_reaches_a_device():
  spec = {"query": tf.TensorSpec([2, 4], tf.int32), "doc_uid": tf.TensorSpec([2], tf.string)}
  with pytest.raises(TypeError, match="string tensor to the devices"):
    train_lib.check_numeric(spec, "x.tfrecord")


# -------------------------------------------------------------------------------- resume


def _losses(model_dir):
  return {r["step"]: r["loss"] for r in layout.read_metrics(model_dir) if "loss" in r}


def _slots(run) -> list:
  """A training Run's Adam moments (m, v) of every variable its step updates, as arrays."""
  optimizer = run.trainer.optimizer
  return [optimizer.get_slot(v, name).numpy()
          for v in run.task.updated_variables(run.model, optimizer) for name in ("m", "v")]


# Whole training runs (run_experiment to train_steps): resume, the in-place index swap,
# TRAINING_DONE.
def test_resumed_two_replica_run_sees_the_same_examples(tmp_path, repo_dir, corpus, questions,
                                                       mirrored_strategy):
  """Stopped at step 2 and resumed, the run's steps 3-4 equal an uninterrupted run's: the
  input skips exactly the 2 x 2 per-replica batches already consumed. TRAINING_DONE only
  once the schedule is complete: not after the slice stopped at step 2, then after the
  resumed run reaches train_steps (one set of runs checks both: each run costs a model
  build and a trace). The resumed run's Adam slots, created before the first step, are
  the stopped slice's, restored in place."""
  config = _config(repo_dir, corpus, questions, "pretrain", trainer__train_steps=4,
                   trainer__steps_per_loop=1, trainer__summary_interval=1,
                   trainer__checkpoint_interval=2, task__pretrain__refresh_every_steps=0)
  store = BlockStore.from_tfrecords(os.path.join(corpus, "blocks-*"))
  vectors = np.random.default_rng(0).normal(size=[len(store), 16])
  runs = {}
  for name in ("straight", "resumed"):
    runs[name] = str(tmp_path / name)
    tf_.publish_index(layout.index_dir(runs[name]), 0, store.block_ids, vectors)
  straight = train_lib.run_experiment(config, runs["straight"], mirrored_strategy)
  assert straight["step"] == 4 and layout.training_done(runs["straight"])
  train_lib.save_params(config, runs["resumed"])  # run_experiment's two parts, each Run kept
  stopped = train_lib.Run(config, runs["resumed"], mirrored_strategy)
  first = stopped.train(stop_at_step=2)
  assert first["step"] == 2 and not first["reached_train_steps"]
  assert not layout.training_done(runs["resumed"])
  resumed = train_lib.Run(config, runs["resumed"], mirrored_strategy)
  saved, restored = _slots(stopped), _slots(resumed)
  assert len(saved) == len(restored) > 0
  assert sum(int(np.any(m != 0)) for m in saved) > len(saved) // 4  # 2 steps moved them
  for a, b in zip(saved, restored):
    np.testing.assert_array_equal(b, a)
  second = resumed.train()
  assert second["start_step"] == 2 and second["step"] == 4 and second["reached_train_steps"]
  assert layout.training_done(runs["resumed"])
  a, b = _losses(runs["straight"]), _losses(runs["resumed"])
  assert sorted(a) == [1, 2, 3, 4] and sorted(b) == [1, 2, 3, 4]
  for step in (3, 4):
    np.testing.assert_allclose(b[step], a[step], rtol=1e-5, err_msg=f"step {step}")
  assert len({round(v, 4) for v in a.values()}) == 4  # each step saw other examples


# ------------------------------------------------------------ index swaps and the builder


@pytest.mark.parametrize("task_type, flag", [("pretrain", "retrieval"),
                                             ("openqa", "refresh_index")])
def test_the_refresh_flag_sets_loop_length_and_snapshots(repo_dir, task_type, flag):
  """A retrieval task refreshes its index exactly when its flag says so: then its train
  loops end on the snapshot interval and a snapshot action follows each loop."""
  for on in (True, False):
    config = tf_.tiny_config(repo_dir, "corpus", task_type, "",
                             f"task.{task_type}.{flag}={str(on).lower()}",
                             f"task.{task_type}.refresh_every_steps=7")
    task = tasks.get_task(config)
    assert task.refreshes_index is on
    assert task.steps_per_loop_divisors() == ([7] if on else [])
    assert len(task.train_actions(trainer=None)) == int(on)


def test_index_swapped_in_during_training_without_retracing(tmp_path, repo_dir, corpus,
                                                            questions):
  """Pre-training on an index built before training (as `beam.embed_corpus` would), a
  newer index published mid-run is swapped in place; the compiled step and the train loop
  are traced once (the optimizer's slots exist before the first loop, which would
  otherwise trace twice: once creating them, once more without), and never again after
  the swap; TRAINING_DONE appears only once train_steps is reached."""
  model_dir = str(tmp_path / "realm")
  index_dir = layout.index_dir(model_dir)
  config = _config(repo_dir, corpus, questions, "pretrain", trainer__train_steps=10,
                   trainer__steps_per_loop=5, task__pretrain__refresh_every_steps=0,
                   index__poll_seconds=0.0, index__first_index_timeout_seconds=5,
                   runtime__enable_xla=True)
  store = BlockStore.from_tfrecords(os.path.join(corpus, "blocks-*"))
  rng = np.random.default_rng(0)
  tf_.publish_index(index_dir, 0, store.block_ids, rng.normal(size=[len(store), 16]))
  train_lib.save_params(config, model_dir)
  run = train_lib.Run(config, model_dir)
  published = []

  traces = []

  def publish_after_first_loop(_):
    if not published:
      traces.append(run.trainer._train_loop_fn.experimental_get_tracing_count())  # pylint: disable=protected-access
      published.append(tf_.publish_index(index_dir, 7, store.block_ids,
                                         rng.normal(size=[len(store), 16])))

  controller = run.runner.controller
  controller.train_actions = (publish_after_first_loop, *controller.train_actions)
  result = run.train(stop_at_step=10)
  assert result["step"] == 10 and result["reached_train_steps"]
  assert run.task.index.version == 7 and run.task.index.num_swaps == 2
  history = layout.read_metrics(model_dir)
  assert [r["index_version"] for r in history] == [0.0, 7.0]
  compiled = run.task._compiled["forward_backward"]  # pylint: disable=protected-access
  assert compiled.experimental_get_tracing_count() == 1
  # The loop traced once, while training on index 0, and never again after the swap.
  loop = run.trainer._train_loop_fn  # pylint: disable=protected-access
  assert traces == [1]
  assert loop.experimental_get_tracing_count() == 1
  assert layout.training_done(model_dir)


def test_a_run_without_an_index_marks_training_done_too(tmp_path, repo_dir, corpus,
                                                       questions):
  """ICT and warm-ups have no refresher; "done" must not depend on having one."""
  model_dir = str(tmp_path / "ict")
  config = _config(repo_dir, corpus, questions, "ict", trainer__train_steps=2)
  assert train_lib.run_experiment(config, model_dir)["reached_train_steps"]
  assert layout.training_done(model_dir)


def test_waiting_for_a_first_index_is_bounded(tmp_path, repo_dir, corpus, questions):
  config = _config(repo_dir, corpus, questions, "pretrain",
                   index__first_index_timeout_seconds=1)
  with pytest.raises(TimeoutError, match="index.first_index_timeout_seconds"):
    train_lib.run_experiment(config, str(tmp_path / "realm"))
  assert not layout.training_done(str(tmp_path / "realm"))


def test_versions_under_the_index_dir_are_committed_exports(tmp_path):
  store = _store()
  tf_.publish_index(str(tmp_path), 4, store.block_ids, np.zeros([13, 6], np.float32))
  latest = versioned.latest_version(str(tmp_path))
  assert latest.version == 4 and latest.manifest["num_blocks"] == 13
