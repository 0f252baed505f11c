"""The demo's MLM-head warm-up (realm_tf.demo.reading_warmup): which documents each masked
span is read with, that its cached encoder outputs give exactly the model's own
log-probabilities (the reason it may train the head apart from the trainer), and that the
head it writes is what pre-training's mlm_init_checkpoint restores."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from realm_tf import tasks
from realm_tf.demo import reading_warmup
from realm_tf.demo.questions import Block, Sentence, answer_key, states
from realm_tf.modeling import factory
from realm_tf.modeling.spans import pack_reader_inputs

BLOCKS = [
    Block(1, "Veloria", "Veloria is a country. Its capital is Talmont."),
    Block(2, "Talmont", "Talmont lies on the river Amsel in Veloria."),
    Block(3, "Amsel", "The Amsel is long. Romeo swam in it in 1204."),
    Block(4, "Quessa", "Quessa is a small island nation far away."),
    Block(5, "Orvan", "Orvan is a mountain of grey stone."),
]


def _sentence(text, block_id, *spans):
  found = tuple((text.index(s), text.index(s) + len(s), "TITLE") for s in spans)
  return Sentence(text, block_id, f"doc{block_id}", found)


SENTENCES = [
    _sentence("The capital of Veloria is Talmont.", 1, "Veloria", "Talmont"),
    _sentence("Quessa lies far away in the sea.", 4, "Quessa"),  # only its own block
    _sentence("Romeo swam in the Amsel in 1204.", 3, "Amsel", "1204"),
]


def test_each_span_is_read_with_another_block_that_states_it_never_its_own():
  chosen = reading_warmup.examples(SENTENCES, BLOCKS, lambda s: [True] * len(s), seed=0)
  assert [e.sentence.text[e.sentence.spans[0][0]:e.sentence.spans[0][1]] for e in chosen] == [
      "Veloria", "Talmont", "Quessa", "Amsel", "1204"]
  text = {b.block_id: b.text for b in BLOCKS}
  for e in chosen:
    key = answer_key(e.sentence.text[e.sentence.spans[0][0]:e.sentence.spans[0][1]])
    # Never the sentence's own block (it holds x itself: REALM's trivial retrieval).
    assert e.reading_block_id != e.sentence.block_id
    if e.reading_block_id is not None:
      assert states(answer_key(text[e.reading_block_id]), key)
  # Quessa and 1204 are stated by their own blocks only (4 and 3, the sentences'), the
  # rest by block 2 besides their own.
  assert [e.reading_block_id for e in chosen] == [2, 2, None, 2, None]
  # What cannot be masked is left out.
  assert len(reading_warmup.examples(SENTENCES, BLOCKS, lambda s: [False] * len(s), 0)) == 0


def test_at_most_max_spans_a_seeded_sample_in_order():
  everything = reading_warmup.examples(SENTENCES, BLOCKS, lambda s: [True] * len(s), 0)
  spans = [e.sentence.spans for e in everything]
  for seed in range(4):
    some = reading_warmup.examples(SENTENCES, BLOCKS, lambda s: [True] * len(s), seed,
                                   max_spans=3)
    got = [e.sentence.spans for e in some]
    assert len(got) == 3 and got == [x for x in spans if x in got]
    assert got == [e.sentence.spans for e in reading_warmup.examples(
        SENTENCES, BLOCKS, lambda s: [True] * len(s), seed, max_spans=3)]
  assert len(reading_warmup.examples(SENTENCES, BLOCKS, lambda s: [True] * len(s), 0,
                                     max_spans=50)) == len(everything)


def test_cached_outputs_give_the_models_own_log_probabilities(tiny_config, tokenizer, tmp_path):
  """The head trained on MaskFeatures' outputs sees what it would see inside the model:
  the same log p(y_m | z, x), with a block and with the null document (which the cache
  encodes at the query's length plus one, the model at the reader's full length)."""
  tf_keras.utils.set_random_seed(0)
  config = tiny_config
  model = factory.build_knowledge_augmented_encoder(config)
  single = [Sentence(s.text, s.block_id, s.doc_uid, (span,)) for s in SENTENCES
            for span in s.spans]
  queries = reading_warmup.masked_queries(
      single, str(tmp_path / "spans.tfrecord"), tokenizer,
      config.model.retriever.query_seq_length, config.task.pretrain.max_predictions_per_seq)
  bodies = [BLOCKS[i % len(BLOCKS)].text for i in range(len(single))]
  encode = reading_warmup.MaskFeatures(model.encoder, tokenizer, config.model.reader.seq_length,
                                       batch_size=4)
  weights = queries["masked_lm"]["weights"]
  for body in (bodies, None):
    cached = encode(queries, body)  # [N, M, H]
    real = weights > 0
    got = reading_warmup._head_log_probs(model, tf.constant(cached[real])).numpy()  # [T, V]
    if body is None:
      body_ids, lengths = tf.zeros([len(single), 1, 1], tf.int32), tf.zeros([len(single), 1],
                                                                            tf.int32)
    else:
      ragged = tokenizer.tokenize(tf.constant(body))
      body_ids = tf.cast(ragged.to_tensor(), tf.int32)[:, None]
      lengths = tf.cast(ragged.row_lengths(), tf.int32)[:, None]
    packed = pack_reader_inputs(tf.constant(queries["query"]["input_word_ids"]),
                                tf.constant(queries["query"]["input_mask"]), body_ids, lengths,
                                config.model.reader.seq_length, tokenizer.sep_id)
    inputs = {k: packed[k] for k in ("input_word_ids", "input_mask", "input_type_ids")}
    out = model(dict(inputs, masked_lm_positions=queries["masked_lm"]["positions"],
                     masked_lm_ids=queries["masked_lm"]["ids"]), training=False)
    want = out["log_probs"].numpy()[:, 0][real]  # [T, V]
    np.testing.assert_allclose(got, want, atol=2e-4)


def test_the_warmup_trains_the_head_only_and_pretraining_restores_it(tiny_config, tmp_path):
  config = tiny_config
  sentences = SENTENCES * 4
  info = reading_warmup.run(config, sentences, BLOCKS, str(tmp_path), steps=30, batch_size=8,
                            learning_rate=1e-2, seed=0, log=lambda line: None)
  assert info["examples"] == 20 and info["stated_elsewhere"] == 12
  assert info["last_loss"] < info["first_loss"]
  reader = tf.train.load_checkpoint(info["checkpoint"])
  tf_keras.utils.set_random_seed(0)  # as the warm-up built its model: the same fresh head
  warm = factory.build_knowledge_augmented_encoder(config)
  task = tasks.get_task(config.replace(task=dict(pretrain=dict(
      mlm_init_checkpoint=str(tmp_path), init_checkpoint=""))))
  pretrainer = task.build_model()
  task.initialize(pretrainer)
  restored = pretrainer.knowledge_augmented_encoder
  # The head moved from a fresh one's values and pre-training starts from them; the
  # encoder, frozen in the warm-up, is what build_model's warm start gives.
  for variable, fresh in zip(reading_warmup.head_variables(restored),
                             reading_warmup.head_variables(warm)):
    assert not np.allclose(variable.numpy(), fresh.numpy())
  for variable, fresh in zip(restored.encoder.weights, warm.encoder.weights):
    np.testing.assert_array_equal(variable.numpy(), fresh.numpy())
  assert any(name.endswith(".ATTRIBUTES/VARIABLE_VALUE") and "masked_lm" in name
             for name in reader.get_variable_to_shape_map())


def test_no_maskable_span_is_a_clear_error(tiny_config, tmp_path):
  unsalient = [Sentence("Nothing salient is here.", 1, "doc1", ())]
  with pytest.raises(ValueError, match="nothing to learn from"):
    reading_warmup.run(tiny_config, unsalient, BLOCKS, str(tmp_path), 1, 2, 1e-3, 0,
                       log=lambda line: None)
