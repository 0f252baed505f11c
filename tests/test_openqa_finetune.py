"""Open-QA fine-tuning and evaluation end to end on the tiny config and an invented corpus.

Whether fine-tuning reaches answers (exact match up by at least 4 of the 24 questions)
takes 300 steps: a learning check for the system tier (tests/conftest.py). The fine-tuning
and evaluation mechanics, and a loss that must fall, run at 40 steps in make test.
"""
import json
import os
import types

import numpy as np
import pytest
import tensorflow as tf

from realm_tf import tasks
from realm_tf.configs import load_config
from realm_tf.data.block_store import BlockStore
from realm_tf.evaluate import evaluate_run
from realm_tf.io import layout, versioned
from realm_tf.modeling import factory
from realm_tf.tasks.openqa import restore_from_pretraining, restore_reader
from realm_tf.training import train_lib
from tests.synthetic_corpus import _CITIES, write_corpus
from tests import task_fixtures as tf_

# Exact match rises only after about 300 steps at this learning rate (a higher one
# diverges); 40 steps lower the answers' loss by nats.
STEPS, BRIEF_STEPS = 300, 40
# What the STEPS run must reach: it answers 6 of the 24 questions right (0 at step 0) and
# lowers the answers' loss by 5.1 nats (9.46 to 4.34); asked for two questions and two
# nats less, so that one answer flipping does not turn the learning check red.
EM_RISE_QUESTIONS, LOSS_FALL_NATS = 4, 3.0


def _config(repo_dir, corpus="", questions="", **overrides):
  base = {"task.type": "openqa", "index.blocks": corpus,
          "task.openqa.train_data.input_path": questions,
          "task.openqa.validation_data.input_path": questions,
          "task.openqa.train_data.global_batch_size": 8, "trainer.summary_interval": 50,
          "trainer.steps_per_loop": 50, "trainer.checkpoint_interval": 100,
          # One evaluation, at the end of the schedule, over every question.
          "trainer.validation_interval": overrides.get("trainer.train_steps", 20),
          "trainer.validation_steps": -1}
  base.update(overrides)
  return load_config(str(repo_dir / "configs" / "tiny.yaml"),
                     [f"{k}={v}" for k, v in base.items()])


def _evaluations(model_dir, name="validation"):
  return [r for r in layout.read_metrics(model_dir) if r["mode"] == f"eval:{name}"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  root = tmp_path_factory.mktemp("openqa")
  write_corpus(str(root / "corpus"))
  questions = tf_.write_questions(str(root / "questions.jsonl"))
  return str(root / "corpus"), questions


def _finetune(model_dir, repo_dir, data, steps: int, loop: int, warmup: int):
  """Evaluated at step 0, then resumed, trained to `steps` and evaluated inside training.

  Retrieval covers the whole 12-block corpus (k=12), so what is measured is whether the
  step learns to find answers in what it retrieved, not the luck of a random retriever.
  """
  corpus, questions = data
  config = _config(repo_dir, corpus, questions, **{
      "task.openqa.num_candidates": 12, "trainer.train_steps": steps,
      "trainer.summary_interval": loop, "trainer.steps_per_loop": loop,
      "trainer.learning_rate": 1e-2, "trainer.warmup_steps": warmup})
  strategy = tf.distribute.get_strategy()
  start = train_lib.run_experiment(config, model_dir, strategy, stop_at_step=0)
  before, _ = train_lib.evaluate_checkpoint(config, model_dir, strategy=strategy,
                                            name="validation")
  # Resumed from the step-0 checkpoint: trains to `steps`, evaluating at the end.
  run = train_lib.Run(config, model_dir, strategy)
  after = run.train()
  # The in-training evaluation as written to eval/ (the one evaluation of the schedule).
  files = dict(metrics=os.path.join(layout.eval_dir(model_dir), f"validation-{steps}.json"),
               predictions=os.path.join(layout.eval_dir(model_dir),
                                        f"validation-{steps}.predictions.jsonl"))
  with open(files["metrics"]) as f:
    after["eval"] = dict(json.load(f), files=files)
  in_training = _evaluations(model_dir)
  # Evaluated again outside training (same weights): adds the validation loss.
  after["reevaluated"] = run.evaluate()
  return types.SimpleNamespace(model_dir=model_dir, steps=steps, loop=loop, start=start,
                               before=before, after=after, in_training=in_training)


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, repo_dir, data):
  """STEPS of fine-tuning: the learning check's run."""
  return _finetune(str(tmp_path_factory.mktemp("finetune")), repo_dir, data, STEPS, loop=50,
                   warmup=20)


@pytest.fixture(scope="module")
def finetuned_briefly(tmp_path_factory, repo_dir, data):
  """BRIEF_STEPS of the same fine-tuning: the mechanics' run."""
  return _finetune(str(tmp_path_factory.mktemp("finetune_briefly")), repo_dir, data,
                   BRIEF_STEPS, loop=20, warmup=10)


def _check_the_run(run):
  """What any fine-tuning run of _finetune shows: its steps, evaluations and records."""
  before, after = run.before, run.after
  assert run.start["step"] == 0 and not run.start["reached_train_steps"]
  assert before["step"] == 0
  assert after["start_step"] == 0 and after["step"] == run.steps and after["reached_train_steps"]
  # Step 0 was evaluated by evaluate_checkpoint, the last step inside train_and_evaluate.
  assert [r["step"] for r in run.in_training] == [0, run.steps]
  again = after["reevaluated"]
  assert again["exact_match"] == pytest.approx(after["eval"]["exact_match"])
  history = [r for r in layout.read_metrics(run.model_dir) if r["mode"] == "openqa"]
  assert [r["step"] for r in history] == list(range(run.loop, run.steps + 1, run.loop))
  assert history[-1]["loss"] < history[0]["loss"]
  assert all(r["answer_retrieved"] == 1.0 for r in history)  # k covers the corpus
  # The index was built once, from the step-0 retriever, and never refreshed.
  assert after["index_refreshes"] == 0 and after["final_index_version"] == 0


def test_finetuning_lowers_the_loss_and_raises_training_em(finetuned):
  _check_the_run(finetuned)
  before, after = finetuned.before, finetuned.after
  questions = after["eval"]["num_questions"]
  assert questions == 24
  right = [round(m["exact_match"] * questions) for m in (before, after["eval"])]
  assert right[1] >= right[0] + EM_RISE_QUESTIONS, (right, before, after["eval"])
  assert after["reevaluated"]["loss"] < before["loss"] - LOSS_FALL_NATS, (
      before["loss"], after["reevaluated"]["loss"])
  # Answers come back as written in the block (cased), not as lower-cased wordpieces.
  with open(after["eval"]["files"]["predictions"]) as f:
    records = [json.loads(line) for line in f]
  capitals = [r for r in records
              if r["correct"] and r["question"].startswith("What is the capital")]
  assert capitals and all(r["prediction"] in _CITIES for r in capitals)


def test_finetuning_briefly_lowers_the_answers_loss(finetuned_briefly):
  """The learning check at BRIEF_STEPS: -log p(answer | question), over every question,
  falls by more than a nat (from about 8.3: chance over 12 blocks and their spans). It
  stays put if the step stops learning (e.g. no gradient reaches the reader)."""
  _check_the_run(finetuned_briefly)
  before, again = finetuned_briefly.before, finetuned_briefly.after["reevaluated"]
  assert again["loss"] < before["loss"] - 1.0, (before["loss"], again["loss"])


def test_evaluation_output_schema(finetuned_briefly, data):
  after = finetuned_briefly.after
  metrics = after["eval"]
  for key in ("exact_match", "recall@1", "recall@5", "recall@20", "reader_oracle"):
    assert 0.0 <= metrics[key] <= 1.0
  assert metrics["recall@1"] <= metrics["recall@5"] <= metrics["recall@20"] == 1.0
  assert metrics["num_questions"] == 24 and metrics["num_read"] == 12
  assert metrics["step"] == BRIEF_STEPS
  with open(after["eval"]["files"]["predictions"]) as f:
    records = [json.loads(line) for line in f]
  assert len(records) == 24
  with open(data[1]) as f:
    questions = [json.loads(line) for line in f]
  store = BlockStore.from_tfrecords(os.path.join(data[0], "blocks-*"))
  texts = dict(zip(store.block_ids.tolist(), store.text_strings))
  for record, question in zip(records, questions):
    assert set(record) == {"question", "gold", "prediction", "correct", "reader_oracle",
                           "chosen", "retrieved"}
    assert record["question"] == question["question"]
    assert record["gold"] == question["answer"]
    assert set(record["chosen"]) == {"rank", "block_id", "title", "start_wordpiece",
                                     "end_wordpiece", "span_logit"}
    retrieved = record["retrieved"]
    assert [r["rank"] for r in retrieved] == list(range(12))
    assert set(retrieved[0]) == {"rank", "block_id", "title", "score", "p_z_given_x", "read",
                                 "has_answer"}
    assert abs(sum(r["p_z_given_x"] for r in retrieved) - 1.0) < 1e-6
    chosen = retrieved[record["chosen"]["rank"]]
    assert chosen["block_id"] == record["chosen"]["block_id"] and chosen["read"]
    assert record["chosen"]["start_wordpiece"] <= record["chosen"]["end_wordpiece"]
    # Answers come back as written in the block (cased), not as lower-cased wordpieces.
    assert record["prediction"] and record["prediction"] in texts[chosen["block_id"]]
  assert any(r["prediction"] != r["prediction"].lower() for r in records)
  correct = [r for r in records if r["correct"]]
  assert all(r["reader_oracle"] for r in correct)
  assert len(correct) == round(metrics["exact_match"] * 24)


def test_evaluate_command_matches_the_training_evaluation(finetuned_briefly, data, tmp_path):
  model_dir, after = finetuned_briefly.model_dir, finetuned_briefly.after
  output = str(tmp_path / "predictions.jsonl")
  result = evaluate_run(model_dir, data[1], output=output)
  assert result["step"] == BRIEF_STEPS
  assert result["checkpoint"] == layout.latest_checkpoint(model_dir)
  for key in ("exact_match", "recall@1", "recall@5", "reader_oracle"):
    assert result[key] == pytest.approx(after["eval"][key]), key
  with open(output) as f:
    assert len(f.readlines()) == 24
  # The run itself is left as training left it.
  assert layout.training_done(model_dir)
  assert [r["step"] for r in _evaluations(model_dir)] == [0, BRIEF_STEPS, BRIEF_STEPS]
  # Without --output: <model_dir>/eval/<questions name>-<step>.*
  result = evaluate_run(model_dir, data[1], max_questions=5)
  assert result["num_questions"] == 5
  assert result["files"]["metrics"] == os.path.join(layout.eval_dir(model_dir),
                                                    f"questions-{BRIEF_STEPS}.json")
  with open(result["files"]["predictions"]) as f:
    assert len(f.readlines()) == 5


def test_refresh_index_re_embeds_the_corpus_during_finetuning(tmp_path, repo_dir, data):
  """task.openqa.refresh_index: the document tower trains, the trainer hands snapshots to
  a child index builder and swaps in the indexes it builds. index.max_staleness_steps
  makes the refresh certain on a loaded machine (the trainer waits for the builder): a
  loop's record comes before its end's staleness wait, so the record at step 6 shows an
  index of step 6 - 2 - 2 or later, a refreshed one."""
  corpus, questions = data
  config = _config(repo_dir, corpus, questions, **{
      "task.openqa.refresh_index": True, "task.openqa.refresh_every_steps": 2,
      "trainer.train_steps": 6, "trainer.summary_interval": 2, "trainer.steps_per_loop": 2,
      "trainer.checkpoint_interval": 6, "index.max_staleness_steps": 2,
      "index.first_index_timeout_seconds": 300, "index.poll_seconds": 0.5})
  model_dir = str(tmp_path / "refresh")
  result = train_lib.run_experiment(config, model_dir, tf.distribute.get_strategy())
  assert result["step"] == 6 and not result["snapshot_errors"]
  assert len(result["snapshots_exported"]) >= 2 and result["index_refreshes"] >= 1, result
  assert result["final_index_version"] > 0
  history = [r for r in layout.read_metrics(model_dir) if r["mode"] == "openqa"]
  versions = [r["index_version"] for r in history]
  assert versions == sorted(versions) and versions[-1] > 0, versions
  assert all(r["index_staleness_steps"] <= 2 + 2 for r in history), history
  assert layout.training_done(model_dir)


def test_bm25_feeds_the_same_reader(tmp_path, repo_dir, data):
  corpus, questions = data
  config = _config(repo_dir, corpus, questions,
                   **{"task.openqa.retrieval": "bm25", "trainer.train_steps": 4,
                      "trainer.summary_interval": 2, "trainer.steps_per_loop": 2,
                      "trainer.checkpoint_interval": 2})
  model_dir = str(tmp_path / "bm25")
  run = train_lib.Run(config, model_dir, tf.distribute.get_strategy())
  result = run.train()
  assert result["step"] == 4
  assert "final_index_version" not in result  # no dense index was built
  assert versioned.latest_version(layout.index_dir(model_dir)) is None
  assert run.model.retriever is None
  reader = factory.build_reader(config)
  length = config.task.openqa.reader_seq_length
  reader({k: tf.ones([1, 1, length], tf.int32)
          for k in ("input_word_ids", "input_mask", "input_type_ids")})  # builds the span head
  assert factory.count_parameters(run.model) == factory.count_parameters(reader)
  # BM25 puts the block that names the country (or city) first for every question.
  (evaluation,) = _evaluations(model_dir)
  assert evaluation["step"] == 4 and evaluation["recall@1"] == 1.0


def test_realm_initialisation_takes_retriever_and_reader_bert(tmp_path, repo_dir):
  config = _config(repo_dir)
  pretrainer = factory.build_realm_pretrainer(config)
  rng = np.random.default_rng(0)
  for variable in pretrainer.trainable_variables:
    variable.assign(rng.normal(size=variable.shape).astype(np.float32))
  path = tf.train.Checkpoint(model=pretrainer).save(str(tmp_path / "checkpoints" / "ckpt"))
  config = config.replace(task={"openqa": {"init_from": "realm",
                                           "init_checkpoint": str(tmp_path)}})
  task = tasks.get_task(config)
  model = task.build_model()
  task.initialize(model)  # init_from=realm: the newest checkpoint of the run at tmp_path
  pairs = [(model.retriever, pretrainer.retriever),
           (model.reader.encoder, pretrainer.knowledge_augmented_encoder.encoder)]
  for ours, theirs in pairs:
    assert ours.weights and len(ours.weights) == len(theirs.weights)
    for a, b in zip(ours.weights, theirs.weights):
      np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.name)
  assert restore_from_pretraining(task.build_model(), str(tmp_path)) == path


def test_openqa_reader_initialisation_takes_the_reader_only(tmp_path, repo_dir):
  """init_from=openqa_reader: reader BERT and span head from another Open-QA run's
  checkpoint (as its trainer saves it, the retriever and step beside them); the retriever
  keeps the warm start."""
  config = _config(repo_dir)
  source = tasks.get_task(config).build_model()
  rng = np.random.default_rng(0)
  for variable in source.trainable_variables:
    variable.assign(rng.normal(size=variable.shape).astype(np.float32))
  tf.train.Checkpoint(model=source, global_step=tf.Variable(7, dtype=tf.int64)).save(
      str(tmp_path / "checkpoints" / "ckpt"))
  task = tasks.get_task(config.replace(task={"openqa": {
      "init_from": "openqa_reader", "init_checkpoint": str(tmp_path)}}))
  model = task.build_model()
  fresh = [w.numpy() for w in model.retriever.weights]
  task.initialize(model)
  span_head = model.reader.span_scorer.weights
  assert span_head and len(model.reader.weights) == len(source.reader.weights)
  for a, b in zip(model.reader.weights, source.reader.weights):
    np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.name)
  for a, before in zip(model.retriever.weights, fresh):
    np.testing.assert_array_equal(a.numpy(), before, err_msg=a.name)
  # A checkpoint without a reader (REALM pre-training's) is refused, not half-loaded.
  pretrainer = factory.build_realm_pretrainer(config)
  tf.train.Checkpoint(model=pretrainer).save(str(tmp_path / "pretrain" / "checkpoints" / "c"))
  with pytest.raises(AssertionError):
    restore_reader(task.build_model(), str(tmp_path / "pretrain"))


@pytest.mark.parametrize("override, message", [
    ({"task.openqa.init_from": "bert"}, "task.openqa.init_from must be one of"),
    ({"task.openqa.init_from": "ict"}, "needs task.openqa.init_checkpoint"),
    ({"task.openqa.retrieval": "bm25", "task.openqa.refresh_index": True},
     "task.openqa.refresh_index needs dense"),
    ({"task.openqa.query_seq_length": 62}, "task.openqa.query_seq_length 62 leaves no room"),
])
def test_bad_finetune_configs_are_refused(repo_dir, override, message):
  with pytest.raises(ValueError, match=message):
    _config(repo_dir, **override)


def test_two_replicas_train_and_evaluate(tmp_path, repo_dir, data, mirrored_strategy):
  """The step under MirroredStrategy: per-replica retrieval, losses over the global batch,
  and evaluation outputs gathered from both replicas. The index is committed beforehand
  (a child builder making the first one is the other runs' path)."""
  corpus, questions = data
  strategy = mirrored_strategy
  config = _config(repo_dir, corpus, questions, **{
      "trainer.train_steps": 2, "trainer.summary_interval": 2, "trainer.steps_per_loop": 2,
      "trainer.checkpoint_interval": 2, "runtime.enable_xla": False})
  model_dir = str(tmp_path / "mirrored")
  store = BlockStore.from_tfrecords(os.path.join(corpus, "blocks-*"))
  tf_.publish_index(layout.index_dir(model_dir), 0, store.block_ids,
                    np.random.default_rng(0).normal(
                        size=[len(store), config.model.retriever.projection_size]))
  result = train_lib.run_experiment(config, model_dir, strategy)
  assert strategy.num_replicas_in_sync == 2
  assert result["step"] == 2 and result["reached_train_steps"]
  assert np.isfinite(result["last_train_loop"]["loss"])
  (evaluation,) = _evaluations(model_dir)
  assert evaluation["step"] == 2 and evaluation["num_questions"] == 24
  assert not os.path.exists(layout.builder_log_path(model_dir))
