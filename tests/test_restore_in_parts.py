"""train_lib.read_in_parts: a checkpoint read one part at a time gives the weights one
read gives, and still refuses a model the checkpoint does not cover."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from realm_tf.training import train_lib


class Tower(tf_keras.Model):
  def __init__(self, width, **kwargs):
    super().__init__(**kwargs)
    self.inner = tf_keras.layers.Dense(width)
    self.outer = tf_keras.layers.Dense(3)

  def call(self, x):
    return self.outer(self.inner(x))


class TwoTowers(tf_keras.Model):
  def __init__(self, extra=False, **kwargs):
    super().__init__(**kwargs)
    self.query = Tower(16)
    self.document = Tower(8)
    self.scale = tf.Variable(2.0)
    self.extra = tf_keras.layers.Dense(2) if extra else None

  def call(self, x):
    out = self.query(x) + self.document(x) * self.scale
    return self.extra(out) if self.extra is not None else out


def built(model):
  model(tf.ones([1, 4]))
  return model


def test_parts_read_what_one_read_gives(tmp_path):
  saved = built(TwoTowers())
  step = tf.Variable(7, dtype=tf.int64)
  path = tf.train.Checkpoint(model=saved, global_step=step).write(str(tmp_path / "ckpt"))
  # 4 floats of 4 bytes each at most: every variable but the scalar is above it, so the
  # graph is cut to single variables (and the towers' layers' edges are followed).
  parts = train_lib.model_parts(saved, 16, ("model",))
  assert {names[:2] for names, _ in parts} >= {("model", "query"), ("model", "document")}
  assert all(names[0] == "model" for names, _ in parts)
  covered = {id(part) for _, part in parts}
  assert all(id(v) in covered for v in saved.variables)  # every variable is its own part

  fresh, fresh_step = built(TwoTowers()), tf.Variable(0, dtype=tf.int64)
  assert not np.allclose(fresh.query.inner.kernel.numpy(), saved.query.inner.kernel.numpy())
  train_lib.read_in_parts(path, 16, model=fresh, global_step=fresh_step)
  for want, got in zip(saved.variables, fresh.variables):
    np.testing.assert_array_equal(got.numpy(), want.numpy())
  assert int(fresh_step.numpy()) == 7
  # Large parts: the whole model at once, as one read would.
  assert train_lib.model_parts(saved, 1 << 30, ("model",)) == [(("model",), saved)]


def test_a_model_the_checkpoint_does_not_cover_is_refused(tmp_path):
  path = tf.train.Checkpoint(model=built(TwoTowers())).write(str(tmp_path / "ckpt"))
  with pytest.raises(AssertionError):
    train_lib.read_in_parts(path, 16, model=built(TwoTowers(extra=True)))
