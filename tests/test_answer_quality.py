"""Retriever scoring that keeps the MiniLM warm start, ORQA's joint answer logits
and beam-labelled retriever loss, the gold-block (reading-comprehension) stage, and the
span head's learning rate."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from realm_tf import tasks
from realm_tf.configs import load_config
from realm_tf.configs.experiment import ConfigValueError, TrainerConfig
from realm_tf.modeling import factory, losses
from realm_tf.modeling.networks import Embedder
from realm_tf.data import openqa_inputs as inputs
from realm_tf.modeling import spans
from realm_tf.text import answers
from realm_tf.tasks import openqa_evaluation as evaluation
from realm_tf.modeling.models.openqa import gold_first
from realm_tf.modeling import optimization
from tests import task_fixtures
from tests.synthetic_corpus import _CITIES, _COUNTRIES, write_corpus

# A question, a block that answers it in other words, and short fragments that share only
# the question's form. Mean-pooled MiniLM vectors of short texts are about twice as long
# as those of a 70-word block, so the raw inner product puts the fragments first.
QUESTION = "When was the telephone invented?"
PARAPHRASE = ("Alexander Graham Bell", (
    "Bell's experiments with transmitting speech over wires, carried out in Boston with his "
    "assistant Thomas Watson, led to a patent granted in March 1876. Rival claims by Elisha "
    "Gray and Antonio Meucci were contested in court for years, and the company that grew "
    "out of the patent dominated the industry in North America for a century."))
FRAGMENTS = [("When", "When?"), ("Dates", "In what year?")]


@pytest.fixture
def rng():
  return np.random.default_rng(0)


@pytest.fixture(scope="module")
def minilm_scores(repo_dir, tokenizer):
  """Relevance of the paraphrase and the fragments under configs/demo.yaml's scoring
  (normalised, scale 20) and under the raw inner product, same MiniLM weights."""
  config = load_config(str(repo_dir / "configs" / "demo.yaml"),
                       ["model.encoder.dropout_rate=0.0"])
  normalised = factory.build_embedder(config, "query_embedder")
  raw = Embedder(normalised.encoder, 384, pooling="mean", projection="none")
  blocks = [PARAPHRASE] + FRAGMENTS
  block_inputs = tokenizer.encode(tf.constant([t for t, _ in blocks]), 128,
                                  pair_texts=tf.constant([b for _, b in blocks])).as_dict()
  query_inputs = tokenizer.encode(tf.constant([QUESTION]), 64).as_dict()
  out = {}
  for name, embedder in (("normalised", normalised), ("raw", raw)):
    q = embedder(query_inputs, query=True)
    d = embedder(block_inputs)
    out[name] = (q.numpy() @ d.numpy().T)[0]
    out[name + "_norms"] = np.linalg.norm(d.numpy(), axis=-1)
  return out


def test_normalised_scoring_ranks_the_paraphrase_over_short_fragments(minilm_scores):
  raw, normalised = minilm_scores["raw"], minilm_scores["normalised"]
  assert np.argmax(raw) != 0, raw  # the failure raw inner products give: a fragment wins
  assert np.argmax(normalised) == 0, normalised
  np.testing.assert_allclose(minilm_scores["normalised_norms"], 1.0, rtol=1e-5)
  # relevance = 20 · cosine: the raw scores divided by both norms, times the scale.
  q_norm = raw[0] / (normalised[0] / 20.0) / minilm_scores["raw_norms"][0]
  np.testing.assert_allclose(normalised, 20.0 * raw / minilm_scores["raw_norms"] / q_norm,
                             rtol=1e-4)


# ----------------------------------------------------------------------- joint logits


def test_joint_logits_choose_the_block_with_higher_p_z_given_x():
  span_scores = tf.zeros([1, 3, 4])  # every span of every block scores alike
  retrieval = tf.constant([[0.5, 2.0, 1.0]])  # block 1 is the most probable
  for mode in ("orqa", "marginal"):
    logits = losses.joint_reader_logits(span_scores, retrieval, mode)
    block, _, _ = evaluation.best_spans(logits)
    assert int(block[0]) == 1, mode
  # Span scores alone (the BM25 form) cannot tell the blocks apart: block 0 by position.
  block, _, _ = evaluation.best_spans(losses.joint_reader_logits(span_scores, None, "orqa"))
  assert int(block[0]) == 0


def test_marginal_logits_are_log_p_z_plus_log_p_s(rng):
  span_scores = rng.normal(size=(2, 3, 5)).astype(np.float32)
  retrieval = rng.normal(size=(2, 3)).astype(np.float32)
  got = losses.joint_reader_logits(tf.constant(span_scores), tf.constant(retrieval),
                                   "marginal").numpy()
  log_pz = retrieval - np.log(np.exp(retrieval).sum(-1, keepdims=True))
  log_ps = span_scores - np.log(np.exp(span_scores).sum(-1, keepdims=True))
  np.testing.assert_allclose(got, log_pz[:, :, None] + log_ps, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.exp(got).sum(axis=(1, 2)), 1.0, rtol=1e-5)


# ------------------------------------------------------------ beam-labelled retriever loss


def _np_lse(x):
  m = x.max()
  return m + np.log(np.exp(x - m).sum())


def test_beam_labelled_retriever_loss_matches_numpy(rng):
  b, r, k, s = 3, 9, 3, 5
  beam_logits = rng.normal(size=(b, r)).astype(np.float32)
  beam_correct = np.zeros((b, r), bool)
  beam_correct[0, [4, 7]] = True  # answers only beyond the K read blocks
  beam_correct[1, 1] = True
  span_scores = rng.normal(size=(b, k, s)).astype(np.float32)
  span_correct = np.zeros((b, k, s), bool)
  span_correct[1, 1, [0, 3]] = True  # question 2: nothing anywhere
  reader_logits = span_scores + beam_logits[:, :k, None]
  out = losses.openqa_loss(tf.constant(beam_logits), tf.constant(beam_correct),
                           tf.constant(reader_logits), tf.constant(span_correct), mode="orqa")
  want_retriever = [-(_np_lse(beam_logits[i][beam_correct[i]]) - _np_lse(beam_logits[i]))
                    if beam_correct[i].any() else 0.0 for i in range(b)]
  flat = reader_logits.reshape(b, -1)
  flat_correct = span_correct.reshape(b, -1)
  want_reader = [-(_np_lse(flat[i][flat_correct[i]]) - _np_lse(flat[i]))
                 if flat_correct[i].any() else 0.0 for i in range(b)]
  np.testing.assert_allclose(out["retriever_loss"].numpy(), want_retriever, rtol=1e-5)
  np.testing.assert_allclose(out["reader_loss"].numpy(), want_reader, rtol=1e-5)
  np.testing.assert_allclose(out["loss"].numpy(),
                             np.add(want_retriever, want_reader), rtol=1e-5)
  # Question 1 learns from the beam although none of its read blocks has the answer.
  assert out["retriever_loss"].numpy()[0] > 0 and out["reader_loss"].numpy()[0] == 0
  np.testing.assert_array_equal(out["answer_in_beam"].numpy(), [1, 1, 0])
  np.testing.assert_array_equal(out["has_answer"].numpy(), [0, 1, 0])


def _np_has_answer(body, length, answer, is_continuation):
  """A reference: the answer's wordpieces in a row inside the body, then a word break."""
  n = len(answer)
  for p in range(length - n + 1):
    if list(body[p:p + n]) == list(answer):
      after = body[p + n] if p + n < len(body) else 0
      if not is_continuation[after]:
        return True
  return False


def test_block_has_answer_matches_a_reference_over_whole_bodies(tokenizer):
  texts = ["the capital of france is paris and its river is the seine",
           "parisian cafes line the boulevards of the city",  # 'paris' only inside a word
           "nothing relevant here at all",
           "long " * 60 + "the seine flows to the sea"]  # answer far beyond a short reader
  answers_text = ["paris", "the seine"]
  is_continuation = spans.continuation_table(tokenizer.vocab)
  pieces = tokenizer.tokenize(tf.constant(texts))
  body_length = 96
  body = pieces.to_tensor(shape=[len(texts), body_length]).numpy().astype(np.int32)
  lengths = np.minimum(pieces.row_lengths().numpy(), body_length).astype(np.int32)
  answer_pieces = tokenizer.tokenize(tf.constant(answers_text))
  width = 6
  answer_ids = answer_pieces.to_tensor(shape=[2, width]).numpy().astype(np.int32)
  answer_lengths = answer_pieces.row_lengths().numpy().astype(np.int32)
  got = spans.block_has_answer(
      tf.constant(body[None]), tf.constant(lengths[None]), tf.constant(answer_ids[None]),
      tf.constant(answer_lengths[None]), tf.constant(is_continuation)).numpy()[0]
  want = [any(_np_has_answer(body[i], lengths[i], answer_ids[a][:answer_lengths[a]],
                             is_continuation) for a in range(2)) for i in range(len(texts))]
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(got, [True, False, False, True])


# ------------------------------------------------------------------- gold-block stage


def _read_jsonl(path, limit=0):
  rows = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      rows.append(json.loads(line))
      if limit and len(rows) >= limit:
        break
  return rows


def _write_squad_open_layout(directory):
  """An invented SQuAD-open-layout set: articles of several paragraphs (corpus.jsonl) and
  questions written from one paragraph, naming their article (dev.jsonl). The answer also
  occurs earlier, in another article, so only the title tells the gold paragraph apart."""
  corpus, questions = [], []
  for country, city in zip(_COUNTRIES, _CITIES):
    corpus.append(dict(title=f"Travel in {country}", text=f"Trains run daily to {city}."))
    corpus.append(dict(title=country, text=f"{country} is a country with a long coast."))
    corpus.append(dict(title=country, text=f"The capital of {country} is {city}, on a river."))
    questions.append(dict(question=f"What is the capital of {country}?", answer=[city],
                          title=country))
  for name, rows in (("corpus.jsonl", corpus), ("dev.jsonl", questions)):
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows)
  return str(directory)


def test_gold_block_stage_finds_the_gold_block_of_squad_open_questions(tmp_path):
  squad_open = _write_squad_open_layout(tmp_path)
  corpus = _read_jsonl(os.path.join(squad_open, "corpus.jsonl"))
  titles = [c["title"] for c in corpus]
  texts = [c["text"] for c in corpus]
  examples = inputs.read_questions(os.path.join(squad_open, "dev.jsonl"), limit=400)
  assert all(e.title for e in examples)
  gold = inputs.find_gold_rows(examples, titles, texts, regex=False)
  found = gold >= 0
  assert found.mean() > 0.95, found.mean()  # SQuAD answers are spans of their paragraph
  for example, row in zip(examples, gold):
    if row >= 0:
      assert titles[row] == example.title
      assert answers.contains_answer(texts[row], example.answers, False)
  # Without titles there is no gold block (the open stage only).
  for e in examples:
    e.title = ""
  assert (inputs.find_gold_rows(examples, titles, texts, regex=False) == -1).all()


def test_gold_first_moves_or_inserts_the_gold_block():
  rows = tf.constant([[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8]])
  gold = tf.constant([7, 2, -1])
  scores = tf.constant([[4.0, 3.0, 2.0, 1.0]] * 3)
  got, moved = gold_first(rows, gold, scores)
  np.testing.assert_array_equal(got.numpy(), [[7, 5, 6, 8], [2, 5, 6, 7], [5, 6, 7, 8]])
  # Scores follow their rows; an inserted gold block takes the best score of the beam.
  np.testing.assert_array_equal(moved.numpy(), [[2, 4, 3, 1], [4, 4, 3, 2], [4, 3, 2, 1]])


def test_gold_stage_is_decided_by_the_global_step(repo_dir):
  config = load_config(str(repo_dir / "configs" / "tiny.yaml"),
                       ["task.type=openqa", "task.openqa.gold_block_steps=10"])
  task = tasks.get_task(config)
  features = dict(gold_row=tf.constant([3, -1]), global_step=tf.constant(9, tf.int64))
  np.testing.assert_array_equal(task.gold_rows(features, True).numpy(), [3, -1])
  features["global_step"] = tf.constant(10, tf.int64)
  np.testing.assert_array_equal(task.gold_rows(features, True).numpy(), [-1, -1])
  assert task.gold_rows(features, False) is None  # evaluation reads retrieved blocks only


# ------------------------------------------------------------ the span head's learning rate


def test_head_learning_rate_multiplier_scales_the_span_heads_updates():
  def deltas(multiplier):
    trainer = TrainerConfig(train_steps=10, warmup_steps=1, learning_rate=1e-2,
                            weight_decay=0.0, head_learning_rate_multiplier=multiplier)
    optimizer = optimization.build_optimizer(trainer)
    head = tf.Variable([1.0, 1.0], name="reader/span_scorer/output_projection/kernel")
    body = tf.Variable([1.0, 1.0], name="reader/encoder/kernel")
    grads = tf.constant([0.3, -0.2])
    optimizer.apply_gradients([(grads, head), (grads, body)])
    optimizer.apply_gradients([(grads, head), (grads, body)])
    return (1.0 - head.numpy()), (1.0 - body.numpy())

  head, body = deltas(10.0)
  np.testing.assert_allclose(head, 10.0 * body, rtol=1e-4)
  head, body = deltas(1.0)
  np.testing.assert_allclose(head, body, rtol=1e-6)


def test_the_head_patterns_select_exactly_the_span_scorer(repo_dir):
  config = load_config(str(repo_dir / "configs" / "tiny.yaml"))
  reader = factory.build_reader(config)
  optimizer = optimization.AdamWeightDecayWithVariableRates(head_multiplier=10.0)
  heads = {v.name for v in reader.trainable_variables if optimizer.is_head(v)}
  scorer = {v.name for v in reader.span_scorer.trainable_variables}
  assert heads == scorer and scorer


@pytest.mark.parametrize("override, message", [
    (["model.retriever.projection=pca"], "model.retriever.projection must be one of"),
    (["model.retriever.projection=identity"], "projection_size 16 must equal"),
    (["model.retriever.scale=20.0"], "need model.retriever.normalize=true"),
    (["model.retriever.normalize=true", "model.retriever.scale=0.0"], "scale must be positive"),
    (["task.openqa.loss=ml"], "task.openqa.loss must be one of"),
    (["task.openqa.retriever_beam=2"], "retriever_beam 2 is smaller"),
    (["trainer.head_learning_rate_multiplier=0"], "head_learning_rate_multiplier must be"),
])
def test_bad_scoring_and_finetuning_options_are_refused(repo_dir, override, message):
  with pytest.raises(ConfigValueError, match=message):
    load_config(str(repo_dir / "configs" / "tiny.yaml"), override)


def test_the_step_reads_gold_blocks_first_then_retrieved_ones(tmp_path, repo_dir):
  """In the step: while global_step < gold_block_steps each question reads its gold block
  (its article's block with the answer) first; afterwards the retrieved blocks only."""
  corpus = str(tmp_path / "corpus")
  write_corpus(corpus)
  questions = tmp_path / "questions.jsonl"
  with open(questions, "w") as f:
    for country, city in zip(_COUNTRIES, _CITIES):
      f.write(json.dumps({"question": f"What is the capital of {country}?",
                          "answer": [city], "title": country}) + "\n")
  config = task_fixtures.tiny_config(repo_dir, corpus, "openqa", str(questions), **{
      "task__openqa__gold_block_steps": 5, "task__openqa__num_candidates": 2,
      "task__openqa__retriever_beam": 4})
  task, model = task_fixtures.build(config)
  features = task_fixtures.first_batch(task, config)
  gold = features["gold_row"].numpy()
  assert (gold >= 0).all()
  titles = task.index.store.title_strings
  for i, example_index in enumerate(features["example_index"].numpy()):
    assert titles[gold[i]] == task.qa_set(str(questions)).examples[example_index].title
  for step, reads_gold in ((0, True), (4, True), (5, False)):
    batch = dict(features, global_step=tf.constant(step, tf.int64))
    _, result = task.forward(model, batch, True)
    out = result["out"]
    assert out.rows.shape[1] == 4 and out.span_logits.shape[1] == 2
    first = out.rows.numpy()[:, 0]
    if reads_gold:
      np.testing.assert_array_equal(first, gold)
      # The gold block is read, so every question has a correct span and a positive.
      assert result["terms"]["has_answer"].numpy().all()
    else:
      retrieved = task.index.search(model.retriever.embed_queries(features["query"]), 4)
      np.testing.assert_array_equal(out.rows.numpy(), retrieved.rows.numpy())
