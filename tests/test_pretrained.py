"""Loading all-MiniLM-L6-v2 and Google BERT checkpoints into BertEncoderV2."""
import os

import numpy as np
import pytest
import tensorflow as tf
from safetensors.numpy import load_file, save_file

from realm_tf.configs import EncoderConfig
from realm_tf.modeling.layers import SpanScorer  # noqa: F401  (import check)
from realm_tf.modeling.networks import build_encoder
from realm_tf.pretrained import (
    WeightLoadingError, load_google_bert_checkpoint, load_minilm, minilm)
from realm_tf.pretrained.name_maps import bert_encoder_map, masked_lm_map
from benchmarks.bert_reference import bert_forward


@pytest.fixture(scope="module")
def minilm_encoder():
  encoder = build_encoder(EncoderConfig(**minilm.ARCHITECTURE, dropout_rate=0.0,
                                        attention_dropout_rate=0.0), name="minilm")
  report = load_minilm(encoder)
  return encoder, report


def _inputs(tokenizer, texts, length):
  return {k: v for k, v in tokenizer.encode(texts, length).as_dict().items()}


def test_minilm_loads_every_tensor(minilm_encoder):
  encoder, report = minilm_encoder
  assert report.loaded == len(encoder.variables) == 103
  assert set(report.skipped) == {"embeddings.position_ids"}


def test_minilm_matches_numpy_reference_forward(minilm_encoder, tokenizer):
  encoder, _ = minilm_encoder
  tensors = load_file(minilm.minilm_safetensors_file())
  inputs = _inputs(tokenizer, ["the eiffel tower is in paris", "rivers flow into the wide blue seas"], 9)
  assert inputs["input_mask"].numpy().all()  # the reference assumes no padding
  got = encoder(inputs)["sequence_output"].numpy()
  want = bert_forward(tensors.__getitem__, inputs["input_word_ids"].numpy(),
                      inputs["input_type_ids"].numpy(), num_layers=6, num_heads=12,
                      convention="huggingface", approximate_gelu=False)
  np.testing.assert_allclose(got, want, atol=2e-4)


# A dozen hand-written (anchor, paraphrase, unrelated) triples.
TRIPLES = [
    ("A man is playing a guitar.", "Someone is strumming a guitar.",
     "The stock market fell sharply today."),
    ("How do I bake bread at home?", "What is a recipe for homemade bread?",
     "The train to the airport was delayed."),
    ("The cat is sleeping on the sofa.", "A kitten naps on the couch.",
     "Parliament passed the new budget law."),
    ("It will rain heavily tomorrow.", "Heavy showers are forecast for tomorrow.",
     "She scored the winning goal in the final."),
    ("The company reported record profits.", "The firm announced its highest earnings ever.",
     "Penguins live in the southern hemisphere."),
    ("He forgot his keys at the office.", "He left his keys behind at work.",
     "Volcanoes can erupt without much warning."),
    ("The museum opens at nine in the morning.", "Doors of the museum open at 9 am.",
     "My laptop battery drains too quickly."),
    ("Children are playing in the park.", "Kids play outside in the park.",
     "The recipe needs two cups of flour."),
    ("The doctor prescribed antibiotics.", "The physician gave her a course of antibiotics.",
     "The band released a new album."),
    ("The flight was cancelled due to fog.", "Fog caused the plane trip to be called off.",
     "He planted tomatoes in the garden."),
    ("Water boils at one hundred degrees Celsius.", "At 100 C water starts to boil.",
     "The novel was translated into French."),
    ("The team won the championship.", "The squad took the title.",
     "Interest rates rose again this quarter."),
]


def test_minilm_mean_pooling_ranks_paraphrases_first(minilm_encoder, tokenizer):
  encoder, _ = minilm_encoder
  texts = [t for triple in TRIPLES for t in triple]
  inputs = _inputs(tokenizer, texts, 32)
  sequence = encoder(inputs)["sequence_output"]
  mask = tf.cast(inputs["input_mask"], tf.float32)[..., None]
  pooled = tf.math.l2_normalize(tf.reduce_sum(sequence * mask, 1) / tf.reduce_sum(mask, 1), -1)
  emb = pooled.numpy().reshape(len(TRIPLES), 3, -1)
  para = (emb[:, 0] * emb[:, 1]).sum(-1)
  unrelated = (emb[:, 0] * emb[:, 2]).sum(-1)
  assert (para > unrelated).all(), list(zip(para, unrelated))
  assert para.mean() - unrelated.mean() > 0.3


def _copy_minilm(tmp_path, mutate):
  tensors = dict(load_file(minilm.minilm_safetensors_file()))
  mutate(tensors)
  path = str(tmp_path / "model.safetensors")
  save_file(tensors, path)
  return path


@pytest.fixture
def small_minilm_shaped_encoder():
  return build_encoder(EncoderConfig(**minilm.ARCHITECTURE), name="target")


@pytest.mark.parametrize("mutate, message", [
    (lambda t: t.pop("encoder.layer.3.attention.self.key.weight"),
     "missing tensor 'encoder.layer.3.attention.self.key.weight'"),
    (lambda t: t.update({"encoder.layer.0.intermediate.dense.weight":
                         np.zeros((384, 1536), np.float32)}),
     "has shape (384, 1536), expected (1536, 384)"),
    (lambda t: t.update({"encoder.layer.9.output.dense.bias": np.zeros(384, np.float32)}),
     "tensors that nothing was mapped from: ['encoder.layer.9.output.dense.bias']"),
])
def test_loading_fails_loudly_and_leaves_model_untouched(tmp_path, small_minilm_shaped_encoder,
                                                          mutate, message):
  encoder = small_minilm_shaped_encoder
  path = _copy_minilm(tmp_path, mutate)
  before = [v.numpy().copy() for v in encoder.variables]
  with pytest.raises(WeightLoadingError) as err:
    load_minilm(encoder, path=path, sha256=None)
  assert message in str(err.value)
  assert path in str(err.value)
  if "nothing was mapped" not in message:  # checks run before any assignment
    for v, old in zip(encoder.variables, before):
      np.testing.assert_array_equal(v.numpy(), old)


def test_sha256_mismatch_is_refused(tmp_path, small_minilm_shaped_encoder):
  path = _copy_minilm(tmp_path, lambda t: t.update(
      {"pooler.dense.bias": np.ones(384, np.float32)}))
  with pytest.raises(WeightLoadingError, match="SHA-256"):
    load_minilm(small_minilm_shaped_encoder, path=path)


def test_wrong_architecture_is_refused():
  encoder = build_encoder(EncoderConfig(**dict(minilm.ARCHITECTURE, num_layers=4)), name="x")
  with pytest.raises(WeightLoadingError, match="nothing was mapped from"):
    load_minilm(encoder)


TINY = dict(vocab_size=60, hidden_size=16, num_layers=2, num_attention_heads=4,
            intermediate_size=32, max_position_embeddings=24, type_vocab_size=2)


def _write_google_checkpoint(prefix, rng, extra=()):
  """A tiny BERT under Google's `bert_model.ckpt` variable names, saved as TF1 does."""
  shapes = {m.source: m.source_shape for m in bert_encoder_map("google", **{
      k: v for k, v in TINY.items() if k != "num_attention_heads"})}
  shapes.update({m.source: m.source_shape for m in masked_lm_map(
      "google", vocab_size=TINY["vocab_size"], hidden_size=TINY["hidden_size"])})
  shapes["cls/seq_relationship/output_weights"] = (2, TINY["hidden_size"])
  shapes["cls/seq_relationship/output_bias"] = (2,)
  shapes.update(dict(extra))
  values = {name: (rng.normal(size=shape) * 0.2).astype(np.float32)
            for name, shape in shapes.items()}
  for name in values:
    if name.endswith("gamma"):
      values[name] += 1.0
  variables = {name: tf.Variable(v) for name, v in values.items()}
  tf.compat.v1.train.Saver(var_list=variables).save(None, prefix)
  return values


def test_google_bert_checkpoint_loads_encoder_and_mlm_head(tmp_path, tokenizer):
  from realm_tf.configs import load_config  # pylint: disable=g-import-not-at-top
  from realm_tf.modeling import factory  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1)
  prefix = str(tmp_path / "bert_model.ckpt")
  values = _write_google_checkpoint(prefix, rng)
  config = load_config(overrides=[
      f"model.encoder.{k}={v}" for k, v in TINY.items()] + [
      "model.encoder.dropout_rate=0.0", "model.encoder.attention_dropout_rate=0.0",
      "model.warm_start.source=google_bert", f"model.warm_start.path={prefix}"])
  model = factory.build_knowledge_augmented_encoder(config)
  ids = rng.integers(1, TINY["vocab_size"], size=(2, 7)).astype(np.int32)
  types = np.array([[0, 0, 0, 1, 1, 1, 1]] * 2, np.int32)
  inputs = dict(input_word_ids=ids, input_mask=np.ones_like(ids), input_type_ids=types)
  got = model.encoder(inputs)["sequence_output"].numpy()
  want = bert_forward(values.__getitem__, ids, types, num_layers=2, num_heads=4,
                      convention="google", approximate_gelu=True)
  np.testing.assert_allclose(got, want, atol=2e-4)
  np.testing.assert_array_equal(_var(model.masked_lm, "output_bias"),
                                values["cls/predictions/output_bias"])
  np.testing.assert_array_equal(_var(model.masked_lm, "transform/dense/kernel"),
                                values["cls/predictions/transform/dense/kernel"])


def _var(layer, fragment):
  return next(v.numpy() for v in layer.variables if fragment in v.name)


def test_google_checkpoint_with_unknown_tensor_is_refused(tmp_path):
  rng = np.random.default_rng(2)
  prefix = str(tmp_path / "bert_model.ckpt")
  _write_google_checkpoint(prefix, rng, extra=[("bert/encoder/layer_2/output/dense/bias", (16,))])
  encoder = build_encoder(EncoderConfig(**TINY), name="g")
  with pytest.raises(WeightLoadingError, match="layer_2"):
    load_google_bert_checkpoint(encoder, prefix)


def test_missing_checkpoint_names_the_path(tmp_path):
  encoder = build_encoder(EncoderConfig(**TINY), name="g2")
  missing = os.path.join(str(tmp_path), "nope", "bert_model.ckpt")
  with pytest.raises(WeightLoadingError, match="nope"):
    load_google_bert_checkpoint(encoder, missing)
