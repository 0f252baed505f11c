"""Retriever, knowledge-augmented encoder and reader on the tiny config."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf.modeling import factory
from realm_tf.modeling.layers.span_scorer import INVALID_SPAN_LOGIT, enumerate_spans
from realm_tf.modeling.models.reader import block_body_positions
from tests.realm_features import pretraining_features


@pytest.fixture(scope="module")
def pretrainer(tiny_config):
  return factory.build_realm_pretrainer(tiny_config)


def _perturb_padding(features, name, rng, vocab_size):
  out = dict(features)
  mask = features[name]["input_mask"].numpy()
  ids = features[name]["input_word_ids"].numpy().copy()
  ids[mask == 0] = rng.integers(1, vocab_size, size=(mask == 0).sum())
  types = features[name]["input_type_ids"].numpy().copy()
  types[mask == 0] = 1
  out[name] = dict(features[name], input_word_ids=tf.constant(ids),
                   input_type_ids=tf.constant(types))
  return out


def test_shapes_and_probabilities(pretrainer, tokenizer, tiny_config):
  f = pretraining_features(tokenizer, tiny_config)
  out = pretrainer(f)
  p = tiny_config.task.pretrain
  b, k, m = 2, p.num_candidates, p.max_predictions_per_seq
  assert out.retrieval_logits.shape == (b, k)
  assert out.token_log_probs.shape == (b, k, m)
  assert out.mlm_predictions.shape == (b, m)
  assert np.all(out.token_log_probs.numpy() <= 0)


@pytest.mark.parametrize("name", ["query", "candidates", "reader"])
def test_padding_does_not_leak_into_outputs(pretrainer, tokenizer, tiny_config, name):
  f = pretraining_features(tokenizer, tiny_config)
  g = _perturb_padding(f, name, np.random.default_rng(3),
                       tiny_config.model.encoder.vocab_size)
  a, b = pretrainer(f)._asdict(), pretrainer(g)._asdict()
  assert set(a) == {"retrieval_logits", "token_log_probs", "mlm_predictions"}
  for key in a:
    np.testing.assert_allclose(a[key].numpy(), b[key].numpy(), rtol=1e-4, atol=1e-4,
                               err_msg=key)


def test_mean_pooling_ignores_padding(tiny_config, tokenizer):
  config = tiny_config.replace(model={"retriever": {"pooling": "mean"}})
  retriever = factory.build_retriever(config)
  x = tokenizer.encode(["short", "a much longer query with many words"], 16).as_dict()
  padded = dict(x, input_word_ids=tf.where(tf.cast(x["input_mask"], tf.bool),
                                           x["input_word_ids"], 777))
  np.testing.assert_allclose(retriever.embed_queries(x).numpy(),
                             retriever.embed_queries(padded).numpy(), rtol=1e-5, atol=1e-5)


def test_retriever_relevance_is_inner_product(pretrainer, tokenizer, tiny_config):
  f = pretraining_features(tokenizer, tiny_config)
  retriever = pretrainer.retriever
  q = retriever.embed_queries(f["query"])
  d = retriever.embed_documents(f["candidates"])
  np.testing.assert_allclose(pretrainer(f).retrieval_logits.numpy(),
                             np.einsum("bp,bkp->bk", q.numpy(), d.numpy()), rtol=1e-4, atol=1e-4)
  assert not retriever.shares_towers


def test_shared_towers_option(tiny_config):
  retriever = factory.build_retriever(
      tiny_config.replace(model={"retriever": {"share_towers": True}}))
  assert retriever.shares_towers
  separate = factory.build_retriever(tiny_config)
  assert factory.count_parameters(separate) > factory.count_parameters(retriever)


def test_mlm_output_weights_are_tied_to_word_embeddings(pretrainer):
  kae = pretrainer.knowledge_augmented_encoder
  table = kae.encoder.get_embedding_table()
  assert any(v is table for v in kae.masked_lm.variables)
  ids = [id(v) for v in kae.trainable_variables]
  assert len(ids) == len(set(ids))


def test_reader_spans_stay_inside_block_body(tiny_config, tokenizer):
  reader = factory.build_reader(tiny_config)
  x = tokenizer.encode(["who wrote hamlet", "where is paris"],
                       tiny_config.model.reader.seq_length,
                       pair_texts=["hamlet was written by shakespeare", ""],
                       truncation="waterfall").as_dict()
  inputs = {k: v[:, None, :] for k, v in x.items()}  # [B, K=1, L]
  out = reader(inputs)
  logits = out["span_logits"].numpy()[:, 0]  # [B, S]
  starts, ends = out["span_starts"].numpy(), out["span_ends"].numpy()
  body = block_body_positions(x).numpy()
  valid = body[:, starts] & body[:, ends]
  assert valid[0].any() and not valid[1].any()  # the second block body is empty
  np.testing.assert_array_equal(logits <= INVALID_SPAN_LOGIT / 2, ~valid)
  width = ends - starts
  assert width.min() == 0 and width.max() == tiny_config.model.reader.max_span_width - 1
  # body positions = the tokens between the first and last [SEP] of row 0
  ids = x["input_word_ids"].numpy()[0]
  seps = np.flatnonzero(ids == tokenizer.sep_id)
  np.testing.assert_array_equal(np.flatnonzero(body[0]), np.arange(seps[0] + 1, seps[1]))


def test_enumerate_spans_covers_every_short_span():
  starts, ends = enumerate_spans(5, 3)
  spans = set(zip(starts.tolist(), ends.tolist()))
  assert spans == {(s, e) for s in range(5) for e in range(s, min(s + 3, 5))}


def test_span_scorer_first_layer_is_an_mlp_over_concatenation(tiny_config, tokenizer):
  """W_s h_s + W_e h_e (what the layer computes) == W [h_s; h_e] for W = [W_s; W_e]."""
  reader = factory.build_reader(tiny_config)
  scorer = reader.span_scorer
  h = tf.random.normal([1, 6, tiny_config.model.encoder.hidden_size], seed=1)
  logits, starts, ends = scorer(h, tf.ones([1, 6], tf.bool))
  ws, bs = scorer.start_projection.kernel, scorer.start_projection.bias
  we = scorer.end_projection.kernel
  concat = tf.concat([tf.gather(h[0], starts), tf.gather(h[0], ends)], axis=-1)
  hidden = tf.nn.relu(concat @ tf.concat([ws, we], axis=0) + bs)
  want = tf.squeeze(scorer.output_projection(scorer.layer_norm(hidden[None])), -1)[0]
  np.testing.assert_allclose(logits.numpy()[0], want.numpy(), rtol=1e-4, atol=1e-5)
  assert not np.allclose(ws.numpy(), we.numpy())  # independently initialised


def test_separate_towers_start_identical_and_are_distinct_variables(tiny_config, tokenizer):
  retriever = factory.build_retriever(tiny_config)
  x = tokenizer.encode(["a query about rivers"], 16).as_dict()
  np.testing.assert_allclose(retriever.embed_queries(x).numpy(),
                             retriever.embed_documents(x).numpy(), rtol=1e-5, atol=1e-6)
  q_vars = {id(v) for v in retriever.query_embedder.trainable_variables}
  assert not q_vars & {id(v) for v in retriever.document_embedder.trainable_variables}


def test_candidate_mask_removes_padding_candidates(pretrainer, tokenizer, tiny_config):
  f = pretraining_features(tokenizer, tiny_config)
  mask = np.ones([2, tiny_config.task.pretrain.num_candidates], np.float32)
  mask[:, -1] = 0.0
  out = pretrainer(dict(f, candidate_mask=tf.constant(mask)))
  probs = tf.nn.softmax(out.retrieval_logits, axis=-1).numpy()
  assert np.all(probs[:, -1] < 1e-12)
  np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)


def test_mlm_predictions_are_argmax_of_the_marginal(pretrainer, tokenizer, tiny_config):
  f = pretraining_features(tokenizer, tiny_config)
  out = pretrainer(f)
  kae_inputs = dict(f["reader"], masked_lm_positions=f["masked_lm"]["positions"],
                    masked_lm_ids=f["masked_lm"]["ids"])
  log_probs = pretrainer.knowledge_augmented_encoder(kae_inputs)["log_probs"].numpy()
  pz = tf.nn.softmax(out.retrieval_logits, axis=-1).numpy()  # [B, K]
  marginal = np.einsum("bk,bkmv->bmv", pz, np.exp(log_probs))
  np.testing.assert_array_equal(out.mlm_predictions.numpy(), marginal.argmax(-1))


@pytest.mark.parametrize("projection, normalize, learn_scale", [
    ("none", True, False), ("identity", True, True), ("dense", False, False)])
def test_retriever_scoring_options(tiny_config, tokenizer, projection, normalize, learn_scale):
  """projection none/identity keep the pooled vector (identity-initialised), normalize gives
  unit document vectors and scale · unit query vectors, the same through every tower."""
  hidden = tiny_config.model.encoder.hidden_size
  options = dict(projection=projection, normalize=normalize, learn_scale=learn_scale,
                 scale=20.0 if normalize else 1.0,
                 projection_size=hidden if projection == "identity" else 16)
  config = tiny_config.replace(model={"retriever": options})
  retriever = factory.build_retriever(config)
  width = factory.retriever_output_size(config)
  assert width == retriever.output_size == (16 if projection == "dense" else hidden)
  x = tokenizer.encode(["a query about rivers", "cities"], 16).as_dict()
  q, d = retriever.embed_queries(x).numpy(), retriever.embed_documents(x).numpy()
  assert q.shape == d.shape == (2, width)
  embedder = retriever.query_embedder
  if projection != "dense":  # nothing lost at step 0: the (normalised) pooled vector
    pooled = embedder.pool(x).numpy()
    if normalize:
      pooled /= np.linalg.norm(pooled, axis=-1, keepdims=True)
    np.testing.assert_allclose(d, pooled, rtol=1e-5, atol=1e-6)
  if normalize:
    np.testing.assert_allclose(np.linalg.norm(d, axis=-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(q, axis=-1), 20.0, rtol=1e-5)
  log_scales = [v for v in embedder.trainable_variables if "log_scale" in v.name]
  assert len(log_scales) == int(learn_scale)
  if learn_scale:  # the scale trains from the query side
    with tf.GradientTape() as tape:
      score = tf.reduce_sum(retriever.embed_queries(x) * retriever.embed_documents(x))
    assert tape.gradient(score, log_scales[0]) is not None
