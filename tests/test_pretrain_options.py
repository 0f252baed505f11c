"""Pre-training set-ups of the paper's ablations on the tiny config: sentences
without a salient span skipped, the no-retrieval arm (null document only), the MLM-head
warm-up on a frozen encoder and a run starting from it, held-out masking fixed across
masking ablations, and span-level accuracy against a NumPy reference."""
import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from realm_tf.configs.experiment import ConfigValueError
from realm_tf.corpus import published, schema
from realm_tf.data import pretraining_inputs
from realm_tf.training import train_lib
from tests import task_fixtures as tf_


def _config(repo_dir, corpus, *overrides, **named):
  return tf_.tiny_config(repo_dir, corpus, "pretrain", "", *overrides, **named)


def _write_sentences(directory, rows):
  """The sentences published as pre-training examples; returns their file pattern."""
  records = []
  for text, spans in rows:
    starts = [text.encode().index(s.encode()) for s in spans]
    records.append(dict(
        text=text, block_id=7, doc_uid="d", salient_span_starts=starts,
        salient_span_ends=[a + len(s.encode()) for a, s in zip(starts, spans)],
        salient_span_labels=["LOC"] * len(spans)))
  published.publish_records(directory, dict(pretraining=(records, schema.PRETRAINING)))
  return os.path.join(directory, "pretraining-*")


def test_sentences_without_a_salient_span_are_skipped_unless_asked(tmp_path, tokenizer):
  rows = [("Talmont is the capital of Veloria.", ["Talmont"]),
          ("It rained all week long there.", []),
          ("The river Amsel flows through Ruvik.", ["Amsel"]),
          ("Nobody knows why.", [])]
  path = _write_sentences(str(tmp_path / "x"), rows)

  def masked_texts(skip, mode="salient_spans"):
    data = pretraining_inputs.masked_query_dataset(
        path, tokenizer, 16, mode, 4, seed=0, repeat=False, shuffle_buffer=0,
        skip_unsalient=skip)
    return [tuple(e["query"]["input_word_ids"].numpy()) for e in data]

  kept = masked_texts(True)
  assert len(kept) == 2  # only the two sentences with a span
  assert len(masked_texts(False)) == 4  # random spans for the other two
  assert len(masked_texts(True, "random_spans")) == 4  # the flag is about salient spans
  # Numbering comes before the filter: the kept sentences get the masks they get unfiltered.
  assert kept == [t for t, (_, spans) in zip(masked_texts(False), rows) if spans]


def test_no_retrieval_reads_the_null_document_alone(repo_dir, corpus):
  config = _config(repo_dir, corpus, task__pretrain__retrieval=False,
                   index__blocks="", runtime__enable_xla=True)
  task, model = tf_.build(config)
  assert task.index is None and task.num_retrieved == 0
  optimizer = task.create_task_optimizer()
  features = tf_.first_batch(task, config)
  metrics = task.build_metrics()
  logs = task.train_step(features, model, optimizer, metrics)
  assert np.isfinite(logs["loss"].numpy())
  values = {m.name: m.result().numpy() for m in metrics}
  assert values["null_document_probability"] == pytest.approx(1.0)
  assert values["retrieval_utility"] == pytest.approx(0.0)
  assert values["trivial_block_retrieved"] == 0.0

  # The loss is the plain MLM loss of the encoder reading [CLS] x [SEP] [SEP].
  query, mlm = features["query"], features["masked_lm"]
  length = config.model.reader.seq_length
  ids = query["input_word_ids"].numpy()
  reader_ids = np.zeros([ids.shape[0], length], np.int32)
  mask = np.zeros_like(reader_ids)
  for b, row in enumerate(ids):
    n = int(query["input_mask"].numpy()[b].sum())
    reader_ids[b, :n] = row[:n]
    reader_ids[b, n] = task.tokenizer.sep_id
    mask[b, :n + 1] = 1
  out = model.knowledge_augmented_encoder(dict(
      input_word_ids=reader_ids[:, None], input_mask=mask[:, None],
      input_type_ids=np.where(np.arange(length)[None, :] >= (mask.sum(1) - 1)[:, None], 1,
                              0).astype(np.int32)[:, None] * mask[:, None],
      masked_lm_positions=mlm["positions"], masked_lm_ids=mlm["ids"]), training=False)
  weights = mlm["weights"].numpy()
  expected = -(out["token_log_probs"].numpy()[:, 0] * weights).sum() / weights.sum()
  loss, _ = task.forward(model, features, False)
  assert float(loss) == pytest.approx(expected, rel=1e-4)


def test_mlm_head_warm_up_trains_the_head_alone(repo_dir, corpus):
  config = _config(repo_dir, corpus, task__pretrain__retrieval=False,
                   task__pretrain__trainable="mlm_head", index__blocks="")
  task, model = tf_.build(config)
  optimizer = task.create_task_optimizer()
  trained = task.trainable_variables(model)
  head = model.knowledge_augmented_encoder.masked_lm
  table = model.knowledge_augmented_encoder.encoder.get_embedding_table()
  assert trained and all(v.ref() in {w.ref() for w in head.trainable_variables}
                         for v in trained)
  assert table.ref() not in {v.ref() for v in trained}  # the tied output matrix is frozen
  before = {v.ref(): v.numpy().copy() for v in model.trainable_variables}
  for _ in range(2):  # the warm-up schedule's learning rate is 0 at the first step
    task.train_step(tf_.first_batch(task, config), model, optimizer, task.build_metrics())
  changed = {v.ref() for v in model.trainable_variables
             if not np.array_equal(before[v.ref()], v.numpy())}
  assert changed == {v.ref() for v in trained}


@pytest.mark.parametrize("multiplier", [0.0, 0.25])
def test_the_retriever_learning_rate_multiplier_scales_the_retriever_steps(repo_dir, corpus,
                                                                          multiplier):
  """The retriever's first Adam steps are `multiplier` x those it takes at 1 (same start,
  same batch); 0 freezes it while the reader trains."""
  batch = {}

  def steps(value):
    config = _config(repo_dir, corpus, trainer__retriever_learning_rate_multiplier=value,
                     trainer__warmup_steps=1, trainer__weight_decay=0.0)
    tf_keras.utils.set_random_seed(0)
    task, model = tf_.build(config)
    optimizer = task.create_task_optimizer(model)
    retriever = {v.ref() for v in model.retriever.trainable_variables}
    before = {v.ref(): v.numpy().copy() for v in model.trainable_variables}
    batch.setdefault("features", tf_.first_batch(task, config))
    for _ in range(2):  # the schedule's learning rate is 0 at the first step
      task.train_step(batch["features"], model, optimizer, task.build_metrics())
    deltas = {v.ref(): v.numpy() - before[v.ref()] for v in model.trainable_variables}
    split = lambda inside: np.concatenate([d.ravel() for r, d in deltas.items()  # noqa: E731
                                           if (r in retriever) == inside])
    return split(True), split(False)

  base_retriever, base_reader = steps(1.0)
  retriever, reader = steps(multiplier)
  assert np.abs(base_retriever).max() > 0 and np.abs(reader).max() > 0
  np.testing.assert_allclose(reader, base_reader, rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(retriever, multiplier * base_retriever, rtol=1e-3, atol=1e-7)


def test_the_retriever_is_held_for_retriever_frozen_steps_then_moves(repo_dir, corpus):
  """trainer.retriever_frozen_steps: the retriever's variables stay exactly as they were
  for that many steps while the reader trains, and move on the step after."""
  config = _config(repo_dir, corpus, trainer__retriever_frozen_steps=2,
                   trainer__warmup_steps=1, trainer__weight_decay=0.0)
  tf_keras.utils.set_random_seed(0)
  task, model = tf_.build(config)
  optimizer = task.create_task_optimizer(model)
  retriever = model.retriever.trainable_variables
  reader = [v for v in model.trainable_variables
            if v.ref() not in {r.ref() for r in retriever}]
  features = tf_.first_batch(task, config)
  start = [v.numpy().copy() for v in retriever]
  reader_start = [v.numpy().copy() for v in reader]
  for _ in range(2):
    task.train_step(features, model, optimizer, task.build_metrics())
  assert all(np.array_equal(a, v.numpy()) for a, v in zip(start, retriever))
  assert any(not np.array_equal(a, v.numpy()) for a, v in zip(reader_start, reader))
  task.train_step(features, model, optimizer, task.build_metrics())
  assert any(not np.array_equal(a, v.numpy()) for a, v in zip(start, retriever))


def test_negative_retriever_frozen_steps_are_refused(repo_dir, corpus):
  with pytest.raises(ConfigValueError, match="retriever_frozen_steps must be >= 0"):
    _config(repo_dir, corpus, trainer__retriever_frozen_steps=-1)


def test_a_negative_retriever_learning_rate_multiplier_is_refused(repo_dir, corpus):
  with pytest.raises(ConfigValueError, match="retriever_learning_rate_multiplier must be >= 0"):
    _config(repo_dir, corpus, trainer__retriever_learning_rate_multiplier=-1.0)


def test_a_run_starts_from_the_warm_up_encoder_and_head(tmp_path, repo_dir, corpus):
  warm_dir = str(tmp_path / "warmup")
  warm = _config(repo_dir, corpus, task__pretrain__retrieval=False,
                 task__pretrain__trainable="mlm_head", index__blocks="",
                 trainer__train_steps=2, trainer__checkpoint_interval=2,
                 trainer__steps_per_loop=2, trainer__summary_interval=2,
                 trainer__learning_rate=0.1)
  run = train_lib.Run(warm, warm_dir, evaluate=False)
  run.train()
  head = {v.name: v.numpy() for v in run.model.knowledge_augmented_encoder.masked_lm.variables}

  config = _config(repo_dir, corpus, task__pretrain__mlm_init_checkpoint=warm_dir)
  task, model = tf_.build(config)
  fresh = {v.name: v.numpy() for v in model.knowledge_augmented_encoder.masked_lm.variables}
  assert any(not np.allclose(fresh[k], head[k]) for k in head)
  task.initialize(model)
  for v in model.knowledge_augmented_encoder.masked_lm.variables:
    np.testing.assert_allclose(v.numpy(), head[v.name])


def test_held_out_masking_is_salient_spans_whatever_training_masks(repo_dir, corpus):
  pattern = os.path.join(corpus, "pretraining-*")
  config = _config(repo_dir, corpus, task__pretrain__masking="random_tokens",
                   task__pretrain__validation_data__input_path=pattern)
  salient = _config(repo_dir, corpus, task__pretrain__validation_data__input_path=pattern)
  task, _ = tf_.build(config)
  reference, _ = tf_.build(salient)
  held_out = tf_.first_batch(task, config, training=False)
  expected = tf_.first_batch(reference, salient, training=False)
  np.testing.assert_array_equal(held_out["masked_lm"]["ids"], expected["masked_lm"]["ids"])
  train = tf_.first_batch(task, config)
  train_salient = tf_.first_batch(reference, salient)
  assert not np.array_equal(train["query"]["input_word_ids"],
                            train_salient["query"]["input_word_ids"])


def test_span_accuracy_matches_numpy(repo_dir, corpus):
  config = _config(repo_dir, corpus)
  task, model = tf_.build(config)
  features = tf_.first_batch(task, config)
  _, out = task.forward(model, features, False)
  # Make some spans right by construction: copy the gold ids into the predictions.
  ids = features["masked_lm"]["ids"].numpy()
  weights = features["masked_lm"]["weights"].numpy()
  predictions = out["mlm_predictions"].numpy().copy()
  predictions[::2] = ids[::2]
  out = dict(out, mlm_predictions=tf.constant(predictions))
  metrics = task.build_metrics(training=False)
  task._logs(features, out, metrics)  # pylint: disable=protected-access
  got = {m.name: m.result().numpy() for m in metrics}["span_accuracy"]
  has = weights.sum(1) > 0
  right = ((predictions == ids) | (weights == 0)).all(1)
  assert got == pytest.approx(right[has].mean())


def test_warm_up_needs_retrieval_off(repo_dir, corpus):
  with pytest.raises(ConfigValueError, match="task.pretrain.retrieval=false"):
    _config(repo_dir, corpus, task__pretrain__trainable="mlm_head")
  with pytest.raises(ConfigValueError, match="salient_span_fallback"):
    _config(repo_dir, corpus, task__pretrain__salient_span_fallback="drop")



def _two_variable_steps(held_gradient: float, steps: int = 2, frozen_steps: int = 1):
  """Adam steps of a 'reader' variable b and a held 'retriever' variable a (frozen for
  `frozen_steps`), b's gradient above the clip norm, a's gradient `held_gradient`."""
  from realm_tf.modeling.optimization import AdamWeightDecayWithVariableRates  # noqa: PLC0415
  a, b = tf.Variable([0.0, 0.0]), tf.Variable([0.0, 0.0])
  optimizer = AdamWeightDecayWithVariableRates(learning_rate=0.1, global_clipnorm=1.0)
  optimizer.set_group_multiplier([a], 1.0, frozen_steps=frozen_steps)
  trace = []
  for _ in range(steps):
    optimizer.apply_gradients([(tf.constant([held_gradient, 0.0]), a),
                               (tf.constant([3.0, 4.0]), b)])  # |g_b| = 5 > 1
    trace.append((a.numpy().copy(), b.numpy().copy(),
                  optimizer.get_slot(a, "m").numpy().copy()))
  return trace


def test_a_held_variable_stays_out_of_the_clip_norm_and_keeps_its_moments():
  """While held, the retriever's gradient neither moves it nor shrinks the reader's step
  (the clip norm is the moving variables'), yet it reaches Adam's moments (so its first
  steps after the release are not inflated by zero moments); once released it counts."""
  small, large = _two_variable_steps(0.0), _two_variable_steps(100.0)
  (_, b_small, _), (a_large, b_large, m_large) = small[0], large[0]
  np.testing.assert_array_equal(a_large, [0.0, 0.0])  # held: not moved
  np.testing.assert_allclose(b_large, b_small, rtol=1e-6)  # held: not in b's clip norm
  assert m_large[0] != 0.0  # held: its gradient reached the first moment
  # Step 2 (released): a moves and its gradient now shrinks b's step.
  (a2, b2, _), (_, b2_small, _) = large[1], small[1]
  assert a2[0] != 0.0
  assert np.abs(b2 - b_large).max() < np.abs(b2_small - b_small).max()


def _applied_gradients(optimizer):
  """Records the (gradient, variable) pairs each apply_gradients call receives."""
  calls = []
  apply = optimizer.apply_gradients

  def recording(grads_and_vars, *args, **kwargs):
    grads_and_vars = list(grads_and_vars)
    calls.append([(None if g is None else tf.convert_to_tensor(g).numpy(), v)
                  for g, v in grads_and_vars])
    return apply(grads_and_vars, *args, **kwargs)

  optimizer.apply_gradients = recording
  return calls


def test_a_retriever_frozen_for_good_gets_no_gradient(repo_dir, corpus):
  """retriever_learning_rate_multiplier=0: the retriever never moves, so its gradient is not
  computed at all (the optimizer receives none of its variables); held for some first
  steps (retriever_frozen_steps) its gradients are computed and passed on (the optimizer
  leaves them out of the clip norm: the test above)."""
  frozen = _config(repo_dir, corpus, trainer__retriever_learning_rate_multiplier=0.0)
  task, model = tf_.build(frozen)
  optimizer = task.create_task_optimizer(model)
  calls = _applied_gradients(optimizer)
  task.train_step(tf_.first_batch(task, frozen), model, optimizer, task.build_metrics())
  retriever = {v.ref() for v in model.retriever.trainable_variables}
  assert calls[0] and not any(v.ref() in retriever for _, v in calls[0])

  held = _config(repo_dir, corpus, trainer__retriever_frozen_steps=5)
  task, model = tf_.build(held)
  optimizer = task.create_task_optimizer(model)
  calls = _applied_gradients(optimizer)
  task.train_step(tf_.first_batch(task, held), model, optimizer, task.build_metrics())
  retriever = {v.ref() for v in model.retriever.trainable_variables}
  passed = [g for g, v in calls[0] if v.ref() in retriever]
  assert passed and any(np.abs(g).max() > 0 for g in passed)
