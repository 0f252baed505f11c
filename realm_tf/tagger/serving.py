"""The exported tagger: raw strings in, entity spans out, all inside the graph.

Tokenization (tensorflow_text), the classifier and BIO decoding all live in one
`tf.Module`, so the SavedModel needs nothing but TensorFlow and tensorflow_text to run, in
Beam, in TF Serving, or in a notebook, and cannot disagree with training about wordpieces.
The output layout is documented in `realm_tf.tagger.signature`.
"""
import tensorflow as tf
import tensorflow_text as tf_text
import tf_keras

from realm_tf.tagger import signature
from realm_tf.tagger.conll import ENTITY_TYPES
from realm_tf.tagger.features import continuation_table
from realm_tf.text import Tokenizer


class SpanTagger(tf.Module):
  """Wraps a trained TokenClassifier with tokenization and span decoding."""

  def __init__(self, model: tf_keras.Model, tokenizer: Tokenizer, max_seq_length: int,
               name: str = "span_tagger"):
    super().__init__(name=name)
    if max_seq_length < 3:
      raise ValueError(f"max_seq_length must be at least 3, got {max_seq_length}")
    self.model = model
    self.tokenizer = tokenizer
    self.max_seq_length = max_seq_length
    self._continuation = tf.constant(continuation_table(tokenizer))  # [vocab] bool
    self._types = tf.constant(("",) + ENTITY_TYPES)  # type id → name, 0 = outside

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=signature.INPUT_KEY)])
  def serve(self, text: tf.Tensor) -> dict[str, tf.Tensor]:
    ids, starts, ends = self.tokenizer.tokenize_with_offsets(text)  # [B, (P)] int64 each
    budget = self.max_seq_length - 2  # room for [CLS] and [SEP]
    ids, starts, ends = ids[:, :budget], starts[:, :budget], ends[:, :budget]
    return self._decode(ids, starts, ends, self._predict(ids))

  def _predict(self, ids: tf.RaggedTensor) -> tf.RaggedTensor:
    """Wordpieces [B, (P)] → predicted label ids [B, (P)], padded only to the batch's
    longest text (not to max_seq_length: most sentences are short)."""
    packed, _ = tf_text.combine_segments(
        [ids], start_of_sequence_id=self.tokenizer.cls_id,
        end_of_segment_id=self.tokenizer.sep_id)  # [B, (P + 2)]
    word_ids = tf.cast(packed.to_tensor(), tf.int32)  # [B, L]
    mask = tf.ones_like(packed, dtype=tf.int32).to_tensor()  # [B, L]
    logits = self.model(dict(input_word_ids=word_ids, input_mask=mask,
                             input_type_ids=tf.zeros_like(word_ids)), training=False)
    predicted = tf.argmax(logits, axis=-1, output_type=tf.int32)[:, 1:]  # [B, L - 1]
    return tf.RaggedTensor.from_tensor(predicted, lengths=ids.row_lengths())  # [B, (P)]

  def _decode(self, ids, starts, ends, label_ids) -> dict[str, tf.Tensor]:
    """BIO labels per BERT word → entity spans, vectorised over the flat wordpieces.

    A word is a non-`##` wordpiece plus its `##` continuations, which share its label. An
    entity starts at a word tagged B-X, or at I-X after a word of another type (seqeval's
    lenient reading), and runs over the following words tagged I-X.
    """
    rows = ids.value_rowids()  # [N] row of every wordpiece
    n = tf.size(rows)
    first_in_row = tf.not_equal(rows, tf.roll(rows, 1, axis=0)) | tf.equal(tf.range(n), 0)
    word_start = first_in_row | ~tf.gather(self._continuation, ids.flat_values)  # [N]
    word_index = tf.cumsum(tf.cast(word_start, tf.int32)) - 1  # [N]
    word_labels = tf.boolean_mask(label_ids.flat_values, word_start)  # [W]
    labels = tf.gather(word_labels, word_index)  # [N], every piece its word's label
    types = (labels + 1) // 2  # 0 = O, else 1-based index into ENTITY_TYPES
    begin_tag = tf.equal(labels % 2, 1) & word_start
    entity_start = (types > 0) & (first_in_row | tf.not_equal(types, tf.roll(types, 1, 0))
                                  | begin_tag)  # [N]
    inside = types > 0
    entity_index = tf.boolean_mask(tf.cumsum(tf.cast(entity_start, tf.int32)) - 1,
                                   inside)  # [M] sorted, one id per entity
    span_starts = tf.math.segment_min(tf.boolean_mask(starts.flat_values, inside),
                                      entity_index)  # [E]
    span_ends = tf.math.segment_max(tf.boolean_mask(ends.flat_values, inside),
                                    entity_index)  # [E]
    span_rows = tf.boolean_mask(rows, entity_start)  # [E]
    span_labels = tf.gather(self._types, tf.boolean_mask(types, entity_start))  # [E]

    def per_row(values):  # [E] → [B, (spans)]
      return tf.RaggedTensor.from_value_rowids(values, span_rows, nrows=ids.nrows())

    starts_by_row = per_row(span_starts)
    return {
        "span_starts": starts_by_row.to_tensor(default_value=-1),
        "span_ends": per_row(span_ends).to_tensor(default_value=-1),
        "span_labels": per_row(span_labels).to_tensor(default_value=""),
        "num_spans": starts_by_row.row_lengths(),
    }
