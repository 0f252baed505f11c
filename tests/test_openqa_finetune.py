"""Open-QA fine-tuning and evaluation end to end on the tiny config and an invented corpus."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from realm_tf.configs import load_config
from realm_tf.evaluate import evaluate_run
from realm_tf.modeling import factory
from realm_tf.training import finetune
from tests.synthetic_corpus import _CITIES, _COUNTRIES, _RIVERS, write_corpus

STEPS = 300


def _config(repo_dir, **overrides):
  base = {"trainer.batch_size": 8, "trainer.summary_every_steps": 50,
          "trainer.checkpoint_every_steps": 100, "trainer.eval_every_steps": 0}
  base.update(overrides)
  return load_config(str(repo_dir / "configs" / "tiny.yaml"),
                     [f"{k}={v}" for k, v in base.items()])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  root = tmp_path_factory.mktemp("openqa")
  write_corpus(str(root / "corpus"))
  questions = root / "questions.jsonl"
  with open(questions, "w") as f:
    for country, city, river in zip(_COUNTRIES, _CITIES, _RIVERS):
      f.write(json.dumps({"question": f"What is the capital of {country}?",
                          "answer": [city]}) + "\n")
      f.write(json.dumps({"question": f"Which river flows through {city}?",
                          "answer": [f"the {river}"]}) + "\n")
  return str(root / "corpus"), str(questions)


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, repo_dir, data):
  """Evaluated at step 0, then resumed and trained to STEPS.

  Retrieval covers the whole 12-block corpus (k=12), so what is measured is whether the
  step learns to find answers in what it retrieved, not the luck of a random retriever.
  """
  corpus, questions = data
  model_dir = str(tmp_path_factory.mktemp("finetune"))
  config = _config(repo_dir, **{"finetune.num_candidates": 12, "trainer.train_steps": STEPS,
                                "trainer.learning_rate": 1e-2, "trainer.warmup_steps": 20})
  strategy = tf.distribute.get_strategy()
  before = finetune.run_finetune(config, model_dir, strategy, questions, questions,
                                 corpus=corpus, stop_at_step=0)
  after = finetune.run_finetune(config, model_dir, strategy, questions, questions,
                                corpus=corpus)
  return model_dir, before, after


def test_finetuning_lowers_the_loss_and_raises_training_em(finetuned):
  model_dir, before, after = finetuned
  assert before["step"] == 0 and after["step"] == STEPS
  assert after["eval"]["exact_match"] >= before["eval"]["exact_match"] + 0.25, (
      before["eval"], after["eval"])
  assert after["eval"]["step_loss"] < before["eval"]["step_loss"]
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    history = [json.loads(line) for line in f]
  assert [r["step"] for r in history] == list(range(50, STEPS + 1, 50))
  assert history[-1]["loss"] < history[0]["loss"]
  assert all(r["answer_retrieved"] == 1.0 for r in history)  # k covers the corpus


def test_evaluation_output_schema(finetuned, data):
  model_dir, _, after = finetuned
  metrics = after["eval"]
  for key in ("exact_match", "recall@1", "recall@5", "recall@20", "reader_oracle"):
    assert 0.0 <= metrics[key] <= 1.0
  assert metrics["recall@1"] <= metrics["recall@5"] <= metrics["recall@20"] == 1.0
  assert metrics["num_questions"] == 24 and metrics["num_read"] == 12
  with open(metrics_path := after["eval"]["files"]["metrics"]) as f:
    assert json.load(f)["exact_match"] == metrics["exact_match"], metrics_path
  with open(after["eval"]["files"]["predictions"]) as f:
    records = [json.loads(line) for line in f]
  assert len(records) == 24
  with open(data[1]) as f:
    questions = [json.loads(line) for line in f]
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
  correct = [r for r in records if r["correct"]]
  assert correct and all(r["reader_oracle"] for r in correct)
  # Answers come back as written in the block (cased), not as lower-cased wordpieces.
  capitals = [r for r in correct if r["question"].startswith("What is the capital")]
  assert capitals and all(r["prediction"] in _CITIES for r in capitals)


def test_evaluate_command_matches_the_training_evaluation(finetuned, data, tmp_path):
  model_dir, _, after = finetuned
  output = str(tmp_path / "predictions.jsonl")
  result = evaluate_run(model_dir, data[1], output=output)
  assert result["step"] == STEPS
  for key in ("exact_match", "recall@1", "recall@5", "reader_oracle"):
    assert result[key] == pytest.approx(after["eval"][key]), key
  with open(output) as f:
    assert len(f.readlines()) == 24


def test_bm25_feeds_the_same_reader(tmp_path, repo_dir, data):
  corpus, questions = data
  config = _config(repo_dir, **{"finetune.retrieval": "bm25", "trainer.train_steps": 4})
  result = finetune.run_finetune(config, str(tmp_path / "bm25"), tf.distribute.get_strategy(),
                                 questions, questions, corpus=corpus)
  assert result["index_version"] is None  # no dense index was built
  reader = factory.build_reader(config)
  length = config.finetune.reader_seq_length
  reader({k: tf.ones([1, 1, length], tf.int32)
          for k in ("input_word_ids", "input_mask", "input_type_ids")})  # builds the span head
  assert result["parameters"] == factory.count_parameters(reader)  # the reader alone
  # BM25 puts the block that names the country (or city) first for every question.
  assert result["eval"]["recall@1"] == 1.0


def test_realm_initialisation_takes_retriever_and_reader_bert(tmp_path, repo_dir):
  config = _config(repo_dir)
  pretrainer = factory.build_realm_pretrainer(config)
  rng = np.random.default_rng(0)
  for variable in pretrainer.trainable_variables:
    variable.assign(rng.normal(size=variable.shape).astype(np.float32))
  path = tf.train.Checkpoint(model=pretrainer).save(str(tmp_path / "checkpoints" / "ckpt"))
  model = finetune.build_model(
      config.replace(finetune={"init_from": "realm", "init_checkpoint": str(tmp_path)}), 102)
  pairs = [(model.retriever, pretrainer.retriever),
           (model.reader.encoder, pretrainer.knowledge_augmented_encoder.encoder)]
  for ours, theirs in pairs:
    for a, b in zip(ours.weights, theirs.weights):
      np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.name)
  assert path


@pytest.mark.parametrize("override, message", [
    ({"finetune.init_from": "bert"}, "init_from must be one of"),
    ({"finetune.init_from": "ict"}, "needs finetune.init_checkpoint"),
    ({"finetune.retrieval": "bm25", "finetune.refresh_index": True}, "needs dense"),
    ({"finetune.query_seq_length": 62}, "leaves no room"),
])
def test_bad_finetune_configs_are_refused(repo_dir, override, message):
  with pytest.raises(ValueError, match=message):
    finetune.check_config(_config(repo_dir, **override))


def test_two_replicas_train_and_evaluate(tmp_path, repo_dir, data, mirrored_strategy):
  """The step under MirroredStrategy: per-replica retrieval, losses over the global batch,
  and evaluation outputs gathered from both replicas."""
  corpus, questions = data
  strategy = mirrored_strategy
  config = _config(repo_dir, **{"trainer.train_steps": 2, "trainer.summary_every_steps": 2})
  result = finetune.run_finetune(config, str(tmp_path / "mirrored"), strategy, questions,
                                 questions, corpus=corpus)
  assert result["step"] == 2
  assert result["eval"]["num_questions"] == 24
  assert np.isfinite(result["eval"]["step_loss"])
