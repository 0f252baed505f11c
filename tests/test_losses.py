"""REALM / ORQA objectives against NumPy references and the paper's analytic properties."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf.modeling import losses


def _np_log_softmax(x, axis=-1):
  x = x - x.max(axis=axis, keepdims=True)
  return x - np.log(np.exp(x).sum(axis=axis, keepdims=True))


def _np_logsumexp(x, axis):
  m = x.max(axis=axis, keepdims=True)
  return (m + np.log(np.exp(x - m).sum(axis=axis, keepdims=True))).squeeze(axis)


@pytest.fixture
def rng():
  return np.random.default_rng(0)


def test_marginal_log_likelihood_matches_numpy(rng):
  b, k, m = 3, 5, 4
  retrieval = rng.normal(size=(b, k)).astype(np.float32) * 3
  token_lp = _np_log_softmax(rng.normal(size=(b, k, m, 7)))[..., 0].astype(np.float32)
  weights = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], np.float32)

  # p(y_m|x) = sum_z p(z|x) p(y_m|z,x), computed in probability space.
  pz = np.exp(_np_log_softmax(retrieval.astype(np.float64)))
  expected_marginal = np.log((pz[:, :, None] * np.exp(token_lp.astype(np.float64))).sum(1))
  got = losses.marginal_log_likelihood(tf.constant(retrieval), tf.constant(token_lp))
  np.testing.assert_allclose(got.numpy(), expected_marginal, rtol=1e-5, atol=1e-5)

  loss_sum, weight_sum = losses.masked_lm_marginal_loss(
      tf.constant(retrieval), tf.constant(token_lp), tf.constant(weights))
  expected_loss = -(expected_marginal * weights).sum() / weights.sum()
  np.testing.assert_allclose((loss_sum / weight_sum).numpy(), expected_loss, rtol=1e-5)
  assert weight_sum.numpy() == weights.sum()


def test_padding_tokens_do_not_change_the_loss(rng):
  retrieval = tf.constant(rng.normal(size=(2, 3)), tf.float32)
  token_lp = rng.normal(size=(2, 3, 4)).astype(np.float32) - 3
  weights = tf.constant([[1, 1, 0, 0], [1, 0, 0, 0]], tf.float32)
  changed = token_lp.copy()
  changed[0, :, 2:] = -50.0  # padding positions get arbitrary values
  changed[1, :, 1:] = 7.0
  a = losses.masked_lm_marginal_loss(retrieval, tf.constant(token_lp), weights)
  b = losses.masked_lm_marginal_loss(retrieval, tf.constant(changed), weights)
  np.testing.assert_allclose(a[0].numpy(), b[0].numpy(), rtol=1e-6)


def test_gradient_wrt_relevance_is_positive_iff_document_beats_marginal(rng):
  """d log p(y|x) / d s(z) = p(z|x) (p(y|z,x) / p(y|x) - 1): the paper's r(z)."""
  for _ in range(5):
    k = 6
    scores = tf.Variable(rng.normal(size=(1, k)).astype(np.float32))
    log_py_given_z = _np_log_softmax(rng.normal(size=(k, 9)) * 2)[:, 0].astype(np.float32)
    token_lp = tf.constant(log_py_given_z[None, :, None])  # [1, K, M=1]
    with tf.GradientTape() as tape:
      log_py = losses.marginal_log_likelihood(scores, token_lp)[0, 0]
    grad = tape.gradient(log_py, scores).numpy()[0]
    p_y = np.exp(log_py.numpy())
    p_y_given_z = np.exp(log_py_given_z)
    np.testing.assert_array_equal(grad > 0, p_y_given_z > p_y)
    pz = np.exp(_np_log_softmax(scores.numpy()[0].astype(np.float64)))
    np.testing.assert_allclose(grad, pz * (p_y_given_z / p_y - 1), rtol=1e-4, atol=1e-6)


def test_null_document_changes_the_marginal_as_expected():
  """Adding the null document mixes in p(y|null,x) with weight p(null|x)."""
  retrieval = np.array([[2.0, 1.0]], np.float32)
  token_lp = np.log(np.array([[[0.5], [0.1]]], np.float32))  # p(y|z1)=.5, p(y|z2)=.1
  without = losses.marginal_log_likelihood(tf.constant(retrieval), tf.constant(token_lp))
  null_score, p_null_y = 0.5, 0.3
  with_null = losses.marginal_log_likelihood(
      tf.constant([[null_score, 2.0, 1.0]]),
      tf.constant(np.log(np.array([[[p_null_y], [0.5], [0.1]]], np.float32))))
  pz = np.exp(_np_log_softmax(np.array([null_score, 2.0, 1.0])))
  expected = np.log(pz @ np.array([p_null_y, 0.5, 0.1]))
  np.testing.assert_allclose(with_null.numpy()[0, 0], expected, rtol=1e-5)
  # p(y|x) without the null doc is a mix of .5 and .1 (≈ .39); a null doc that explains y
  # worse than that lowers it, and one that explains it better raises it.
  assert with_null.numpy()[0, 0] < without.numpy()[0, 0]
  better = losses.marginal_log_likelihood(
      tf.constant([[null_score, 2.0, 1.0]]),
      tf.constant(np.log(np.array([[[0.9], [0.5], [0.1]]], np.float32))))
  assert better.numpy()[0, 0] > without.numpy()[0, 0]


def test_retrieval_utility_uses_top_non_null_document():
  token_lp = tf.constant(np.log([[[0.2, 0.5], [0.4, 0.5], [0.8, 0.9]]]), tf.float32)
  weights = tf.constant([[1.0, 0.0]])
  # The null document (index 0) has the highest score but must be skipped; top = index 2.
  retrieval = tf.constant([[10.0, 1.0, 3.0]])
  ru = losses.retrieval_utility(token_lp, weights, retrieval, null_index=0)
  np.testing.assert_allclose(ru.numpy(), [np.log(0.8) - np.log(0.2)], rtol=1e-5)
  retrieval = tf.constant([[10.0, 3.0, 1.0]])
  ru = losses.retrieval_utility(token_lp, weights, retrieval, null_index=0)
  np.testing.assert_allclose(ru.numpy(), [np.log(0.4) - np.log(0.2)], rtol=1e-5)


def test_reader_log_likelihood_and_openqa_loss_match_numpy(rng):
  b, k, s = 2, 3, 6
  retrieval = rng.normal(size=(b, k)).astype(np.float32)
  spans = rng.normal(size=(b, k, s)).astype(np.float32)
  correct = np.zeros((b, k, s), bool)
  correct[0, 1, [2, 4]] = True
  correct[0, 2, 0] = True  # example 0: answers in blocks 1 and 2; example 1: none

  got = losses.reader_log_likelihood(tf.constant(spans), tf.constant(correct)).numpy()
  want = _np_logsumexp(np.where(correct[0, 1], spans[0, 1], -np.inf), 0) - _np_logsumexp(
      spans[0, 1], 0)
  np.testing.assert_allclose(got[0, 1], want, rtol=1e-5)
  assert got[0, 0] < -1e8  # no matching span: log 0

  # ORQA with the beam = the K read blocks: the retriever term over them, the reader's
  # softmax over every span of every block (tests/test_answer_quality.py: a wider beam).
  block_correct = correct.any(-1)
  out = losses.openqa_loss(tf.constant(retrieval), tf.constant(block_correct),
                           tf.constant(spans), tf.constant(correct))
  pz = _np_log_softmax(retrieval[0])
  want_retriever = -_np_logsumexp(pz[[1, 2]], 0)
  flat = spans[0].reshape(-1)
  want_reader = -(_np_logsumexp(flat[correct[0].reshape(-1)], 0) - _np_logsumexp(flat, 0))
  np.testing.assert_allclose(out["retriever_loss"].numpy()[0], want_retriever, rtol=1e-5)
  np.testing.assert_allclose(out["reader_loss"].numpy()[0], want_reader, rtol=1e-5)
  np.testing.assert_array_equal(out["has_answer"].numpy(), [1.0, 0.0])
  assert out["loss"].numpy()[1] == 0.0

  # REALM's marginal: −log Σ_z p(z|x) Σ_{s correct} p(s|z,x), no separate retriever term.
  joint = losses.joint_reader_logits(tf.constant(spans), tf.constant(retrieval), "marginal")
  out = losses.openqa_loss(tf.constant(retrieval), tf.constant(block_correct), joint,
                           tf.constant(correct), mode="marginal")
  want = -_np_logsumexp(np.array([pz[z] + got[0, z] for z in (1, 2)]), 0)
  np.testing.assert_allclose(out["loss"].numpy()[0], want, rtol=1e-5)
  assert out["retriever_loss"].numpy()[0] == 0.0 and out["loss"].numpy()[1] == 0.0


@pytest.mark.parametrize("mode", ["orqa", "marginal"])
def test_openqa_loss_gradients_are_finite_without_answers(rng, mode):
  retrieval = tf.Variable(rng.normal(size=(2, 3)).astype(np.float32))
  spans = tf.Variable(rng.normal(size=(2, 3, 4)).astype(np.float32))
  correct = tf.zeros([2, 3, 4], tf.bool)
  with tf.GradientTape() as tape:
    joint = losses.joint_reader_logits(spans, retrieval, mode)
    loss = tf.reduce_sum(losses.openqa_loss(retrieval, tf.zeros([2, 3], tf.bool), joint,
                                            correct, mode=mode)["loss"])
  for g in tape.gradient(loss, [retrieval, spans]):
    assert np.all(np.isfinite(g.numpy()))


def test_ict_loss_matches_numpy_and_masks_duplicate_blocks(rng):
  q = rng.normal(size=(4, 6)).astype(np.float32)
  d = rng.normal(size=(4, 6)).astype(np.float32)
  ids = np.array([10, 11, 10, 12], np.int64)  # rows 0 and 2 share a block
  out = losses.ict_loss(tf.constant(q), tf.constant(d), tf.constant(ids))
  logits = q @ d.T
  logits[0, 2] = logits[2, 0] = -1e9  # the same block is not a negative of itself
  want = -np.diag(_np_log_softmax(logits.astype(np.float64))).sum()
  np.testing.assert_allclose(out["loss_sum"].numpy(), want, rtol=1e-5)
  assert out["count"].numpy() == 4
  assert out["correct"].numpy() == (logits.argmax(1) == np.arange(4)).sum()


def test_ict_loss_under_two_replicas_uses_the_global_batch(rng, mirrored_strategy):
  strategy = mirrored_strategy
  q = rng.normal(size=(4, 6)).astype(np.float32)
  d = rng.normal(size=(4, 6)).astype(np.float32)
  ids = np.arange(4, dtype=np.int64)
  single = losses.ict_loss(tf.constant(q), tf.constant(d), tf.constant(ids))

  def per_replica(context):
    i = context.replica_id_in_sync_group
    return tf.constant(q[2 * i:2 * i + 2]), tf.constant(d[2 * i:2 * i + 2]), tf.constant(
        ids[2 * i:2 * i + 2])

  values = strategy.experimental_distribute_values_from_function(per_replica)
  out = strategy.run(lambda v: losses.ict_loss(*v), args=(values,))
  total = strategy.reduce(tf.distribute.ReduceOp.SUM, out["loss_sum"], axis=None)
  np.testing.assert_allclose(total.numpy(), single["loss_sum"].numpy(), rtol=1e-5)
