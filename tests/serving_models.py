"""Tiny SavedModels for the serving tests, in TF Serving's `<base>/<version>/` layout.

  fake_realm_qa  the REALM QA contract (question → answer, score, answer_block, block_ids,
                 block_titles, block_texts, retrieval_probs), deterministic in the question
  numeric        x [B, 3] → y = x W + b, plus the batch size it was called with and a call
                 counter (to see batching and warm-up from outside); a second signature
                 with a scalar input (not batchable)
  slow           x [B] → x + offset after sleeping (without burning CPU), for in-flight
                 and deadline tests; `offset` tells which build answered
  xla_compiled   x [B] → 2x + 1 through an XLA-compiled function (serving_default) and
                 without one (plain), for --xla_cpu_compilation_enabled
"""
import os
import shutil
import uuid

import numpy as np
import tensorflow as tf
from tensorflow.python.data.experimental.ops import testing as tf_data_testing
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_log_pb2

QA_BLOCKS_PER_QUESTION = 3
QA_TITLES = [f"Title {i}" for i in range(8)]
QA_TEXTS = [f"Body of block {i}, with words." for i in range(8)]


class FakeRealmQA(tf.Module):
  """Deterministic stand-in for the realm_qa export, with exactly its signature."""

  def __init__(self, tag: str):
    super().__init__()
    self.tag = tag
    self.titles = tf.constant(QA_TITLES)
    self.texts = tf.constant(QA_TEXTS)

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="question")])
  def answer(self, question):
    num_blocks = len(QA_TITLES)
    hashed = tf.strings.to_hash_bucket_fast(question, 1 << 20)  # [B]
    offsets = tf.range(QA_BLOCKS_PER_QUESTION, dtype=tf.int64) * 3  # [K]
    block_ids = (hashed[:, None] + offsets[None, :]) % num_blocks  # [B, K]
    logits = tf.cast((block_ids * 7 + hashed[:, None]) % 5, tf.float32) / 2.0  # [B, K]
    retrieval_probs = tf.nn.softmax(logits, axis=-1)
    answer_block = tf.cast(tf.argmax(retrieval_probs, axis=-1), tf.int32)  # [B]
    answer = tf.strings.join([tf.constant(f"{self.tag}:"), tf.strings.upper(question)])
    score = tf.reduce_max(logits, axis=-1) + tf.cast(tf.strings.length(question), tf.float32)
    return {
        "answer": answer,
        "score": score,
        "answer_block": answer_block,
        "block_ids": block_ids,
        "block_titles": tf.gather(self.titles, block_ids),
        "block_texts": tf.gather(self.texts, block_ids),
        "retrieval_probs": retrieval_probs,
    }


class Numeric(tf.Module):

  def __init__(self):
    super().__init__()
    self.w = tf.Variable(np.arange(6, dtype=np.float32).reshape(3, 2) / 4.0)
    self.b = tf.Variable(np.array([0.5, -1.0], dtype=np.float32))
    self.calls = tf.Variable(0, dtype=tf.int64)

  @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
  def predict(self, x):
    count = self.calls.assign_add(1)
    batch = tf.shape(x)[0]
    return {"y": tf.matmul(x, self.w) + self.b,
            "seen_batch": tf.fill([batch], batch),
            "calls": tf.fill([batch], count)}

  @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x"),
                                tf.TensorSpec([], tf.float32, name="factor")])
  def scale(self, x, factor):
    return {"y": x * factor}


class Slow(tf.Module):

  def __init__(self, delay_ms: int, offset: float):
    super().__init__()
    self.delay_us = delay_ms * 1000
    self.offset = tf.constant(offset, tf.float32)

  @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
  def predict(self, x):
    # tf.data's sleep transformation blocks this call without using a core.
    slept = tf.data.Dataset.range(1).apply(tf_data_testing.sleep(self.delay_us)).reduce(
        tf.constant(0, tf.int64), lambda total, item: total + item)
    return {"y": x + self.offset + tf.cast(slept, tf.float32)}


class XlaCompiled(tf.Module):
  """x [B] → y = 2x + 1 through a tf.function(jit_compile=True) reached only inside a
  tf.cond branch (`predict`), and the same without XLA (`plain`): what a
  realm_tf.export --reader_xla export's QA and retrieval signatures look like to a
  server."""

  def __init__(self):
    super().__init__()
    self.compiled = tf.function(lambda x: 2.0 * x + 1.0, jit_compile=True)

  @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
  def predict(self, x):
    return {"y": tf.cond(tf.size(x) > 0, lambda: self.compiled(x), lambda: x)}

  @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
  def plain(self, x):
    return {"y": 2.0 * x + 1.0}


def save_xla_compiled(path: str) -> str:
  module = XlaCompiled()
  tf.saved_model.save(module, path, signatures={"serving_default": module.predict,
                                                "plain": module.plain})
  return path


def save_fake_realm_qa(path: str, tag: str = "v1") -> str:
  module = FakeRealmQA(tag)
  tf.saved_model.save(module, path, signatures={"serving_default": module.answer})
  return path


def save_numeric(path: str) -> str:
  module = Numeric()
  tf.saved_model.save(module, path, signatures={"serving_default": module.predict,
                                                "scale": module.scale})
  return path


def save_slow(path: str, delay_ms: int, offset: float) -> str:
  module = Slow(delay_ms, offset)
  tf.saved_model.save(module, path, signatures={"serving_default": module.predict})
  return path


def publish(source: str, base_path: str, version: int) -> str:
  """Copies a built SavedModel in as `<base_path>/<version>` with an atomic rename."""
  os.makedirs(base_path, exist_ok=True)
  tmp = os.path.join(base_path, f".tmp-{version}-{uuid.uuid4().hex}")
  shutil.copytree(source, tmp)
  final = os.path.join(base_path, str(version))
  os.rename(tmp, final)
  return final


def publish_broken(base_path: str, version: int) -> str:
  """A version directory whose saved_model.pb is not a SavedModel."""
  tmp = os.path.join(base_path, f".tmp-{version}-{uuid.uuid4().hex}")
  os.makedirs(tmp)
  with open(os.path.join(tmp, "saved_model.pb"), "wb") as f:
    f.write(b"this is not a SavedModel")
  final = os.path.join(base_path, str(version))
  os.rename(tmp, final)
  return final


def write_raw_warmup(export_dir: str, inputs: dict, signature_name: str = "serving_default"):
  """A warm-up file written without realm_tf's checks (to make a bad one on purpose)."""
  request = predict_pb2.PredictRequest()
  request.model_spec.signature_name = signature_name
  for name, value in inputs.items():
    request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
  directory = os.path.join(export_dir, "assets.extra")
  os.makedirs(directory, exist_ok=True)
  with tf.io.TFRecordWriter(os.path.join(directory, "tf_serving_warmup_requests")) as writer:
    writer.write(prediction_log_pb2.PredictionLog(
        predict_log=prediction_log_pb2.PredictLog(request=request)).SerializeToString())
