"""Reader inputs for retrieved blocks, and the answer spans inside them, as dense ops.

Blocks are retrieved inside the training step, so the reader inputs `[CLS] x [SEP] z_body
[SEP]` and the spans that match an answer are built there too. Both use gathers and
comparisons over static shapes only (no ragged or string ops), so they compile with XLA
and run on TPU; `pack_reader_inputs` produces exactly what `Tokenizer.join_bert([x, body],
waterfall)` produces (tests/test_openqa_spans.py checks it).
"""
import numpy as np
import tensorflow as tf

from realm_tf.modeling.models.reader import block_body_positions


def packed_lengths(query_mask: tf.Tensor, body_lengths: tf.Tensor,
                   seq_length: int) -> tuple[tf.Tensor, tf.Tensor]:
  """How `[CLS] x [SEP] body [SEP]` fills `seq_length` positions: the body wordpieces kept
  [B, K] (cut to the room left after the question and the final [SEP]) and the positions
  used [B, K] (question + kept body + [SEP]). query_mask [B, Lq]; body_lengths [B, K]."""
  q_len = tf.reduce_sum(tf.cast(query_mask, tf.int32), axis=1)  # [B]: [CLS] x [SEP]
  room = seq_length - 1 - q_len  # [B]: positions left before the final [SEP]
  kept = tf.minimum(tf.cast(body_lengths, tf.int32), room[:, None])  # [B, K]
  return kept, q_len[:, None] + kept + 1


def pack_reader_inputs(query_word_ids: tf.Tensor, query_mask: tf.Tensor,
                       body_ids: tf.Tensor, body_lengths: tf.Tensor,
                       seq_length: int, sep_id: int) -> dict[str, tf.Tensor]:
  """`[CLS] x [SEP] body [SEP]` for every (question, block) pair.

  Args:
    query_word_ids, query_mask: [B, Lq] the packed question `[CLS] x [SEP]` (x is kept
      whole: Lq <= seq_length - 1 leaves room for at least the final [SEP]).
    body_ids: [B, K, Lb] the blocks' body wordpieces, zero-padded; body_lengths [B, K].
    seq_length: Lr, the reader's input length (static).
    sep_id: the [SEP] id.
  Returns:
    BERT inputs [B, K, Lr] plus body_start [B], the position of the first body token.
  """
  query_length = query_word_ids.shape[1]
  if query_length is None or query_length > seq_length - 1:
    raise ValueError(f"question length {query_length} does not fit the reader's "
                     f"{seq_length} positions")
  num_blocks = tf.shape(body_ids)[1]
  body_start = tf.reduce_sum(tf.cast(query_mask, tf.int32), axis=1)  # [B]: [CLS] x [SEP]
  b_len, _ = packed_lengths(query_mask, body_lengths, seq_length)  # [B, K]
  positions = tf.range(seq_length)[None, None, :]  # [1, 1, Lr]
  start = body_start[:, None, None]  # [B, 1, 1]
  end = start + b_len[:, :, None]  # [B, K, 1]: the final [SEP]'s position
  query_part = tf.pad(tf.cast(query_word_ids, tf.int32),
                      [[0, 0], [0, seq_length - query_length]])  # [B, Lr]
  body_index = tf.clip_by_value(positions - start, 0, body_ids.shape[2] - 1)  # [B, 1, Lr]
  body_index = tf.broadcast_to(body_index, tf.concat([tf.shape(body_ids)[:2],
                                                      [seq_length]], 0))  # [B, K, Lr]
  body_part = tf.gather(tf.cast(body_ids, tf.int32), body_index, batch_dims=2)  # [B, K, Lr]
  in_query = positions < start
  in_body = (positions >= start) & (positions < end)
  is_sep = tf.equal(positions, end)
  word_ids = tf.where(in_query, tf.tile(query_part[:, None, :], [1, num_blocks, 1]),
                      tf.where(in_body, body_part,
                               tf.where(is_sep, sep_id, 0)))  # [B, K, Lr]
  second = in_body | is_sep
  return dict(input_word_ids=word_ids,
              input_mask=tf.cast(in_query | second, tf.int32),
              input_type_ids=tf.cast(second, tf.int32),
              body_start=body_start)


def continuation_table(vocab: list[str]) -> np.ndarray:
  """[V] bool: which wordpieces continue a word ('##s'); a span may not end before one."""
  return np.array([token.startswith("##") for token in vocab], bool)


def _static(values) -> np.ndarray:
  """The reader's span enumeration is static (SpanScorer returns constants)."""
  value = tf.get_static_value(values) if isinstance(values, tf.Tensor) else values
  if value is None:
    raise ValueError("span starts/ends must be static")
  return np.asarray(value, np.int32)


def locate_answer_spans(reader_inputs: dict[str, tf.Tensor], span_starts: np.ndarray,
                        span_ends: np.ndarray, answer_ids: tf.Tensor,
                        answer_lengths: tf.Tensor, is_continuation: tf.Tensor) -> tf.Tensor:
  """[B, K, S] bool: spans of the block bodies whose wordpieces equal an answer's.

  A span matches when it has an answer's length and the same wordpieces, lies inside the
  body (never in the question), and ends on a word boundary (the next wordpiece is not a
  '##' continuation: 'Paris' must not match the start of 'Parisian'). Answers are
  tokenized standalone, so they never start mid-word.

  Args:
    reader_inputs: BERT inputs [B, K, L] from pack_reader_inputs.
    span_starts, span_ends: [S] the reader's static span enumeration (inclusive ends).
    answer_ids: [B, A, W] answer wordpieces, zero-padded; W >= the widest span.
    answer_lengths: [B, A] (0 for padding answers).
    is_continuation: [V] bool, from continuation_table.
  """
  word_ids = reader_inputs["input_word_ids"]
  seq_length = word_ids.shape[-1]
  width = answer_ids.shape[-1]
  span_starts, span_ends = _static(span_starts), _static(span_ends)
  span_widths = span_ends - span_starts + 1  # [S]
  if span_widths.max() > width:
    raise ValueError(f"answers padded to {width} wordpieces cannot match spans of "
                     f"{span_widths.max()}")
  offsets = np.arange(width)
  token_positions = np.minimum(span_starts[:, None] + offsets[None, :], seq_length - 1)
  inside_span = offsets[None, :] < span_widths[:, None]  # [S, W] static
  span_tokens = tf.gather(word_ids, token_positions, axis=-1)  # [B, K, S, W]
  answers = tf.cast(answer_ids, word_ids.dtype)[:, None, None, :, :]  # [B, 1, 1, A, W]
  same_tokens = tf.equal(span_tokens[:, :, :, None, :], answers)  # [B, K, S, A, W]
  same_tokens = tf.reduce_all(same_tokens | ~inside_span[None, None, :, None, :], axis=-1)
  lengths = tf.cast(answer_lengths, tf.int32)[:, None, None, :]  # [B, 1, 1, A]
  same_length = tf.equal(lengths, span_widths[None, None, :, None]) & (lengths > 0)
  matches = tf.reduce_any(same_tokens & same_length, axis=-1)  # [B, K, S]

  flat = {k: tf.reshape(reader_inputs[k], [-1, seq_length])
          for k in ("input_word_ids", "input_mask", "input_type_ids")}  # [B*K, L]
  body = tf.reshape(block_body_positions(flat), tf.shape(word_ids))  # [B, K, L]
  in_body = (tf.gather(body, span_starts, axis=-1)
             & tf.gather(body, span_ends, axis=-1))  # [B, K, S]
  next_positions = np.minimum(span_ends + 1, seq_length - 1)
  next_ids = tf.gather(word_ids, next_positions, axis=-1)  # [B, K, S]
  ends_word = ~tf.gather(tf.cast(is_continuation, tf.bool), next_ids)
  ends_word |= tf.constant(span_ends + 1 >= seq_length)
  return matches & in_body & ends_word


def block_has_answer(body_ids: tf.Tensor, body_lengths: tf.Tensor, answer_ids: tf.Tensor,
                     answer_lengths: tf.Tensor, is_continuation: tf.Tensor) -> tf.Tensor:
  """[B, R] bool: which blocks contain an answer anywhere in their body (ORQA's has_answer
  over the retrieval beam, which labels the retriever loss).

  The rule is locate_answer_spans's, applied to the whole body table of the index rather
  than to the part the reader reads: the answer's wordpieces, in a row, ending on a word
  boundary. So a block the retriever is rewarded for is one whose answer the reader could
  be trained to pick, and regex sets use the same corpus-expanded strings as their spans.
  Done in the step because the beam is retrieved there (no host round trip, valid under
  index refresh); its cost is B·R·Lb·A·W comparisons.

  Args:
    body_ids: [B, R, Lb] body wordpieces, zero-padded (KnowledgeIndex.gather).
    body_lengths: [B, R].
    answer_ids: [B, A, W] answer wordpieces, zero-padded; answer_lengths: [B, A].
    is_continuation: [V] bool, from continuation_table.
  """
  body_length = body_ids.shape[-1]
  width = answer_ids.shape[-1]
  if body_length is None or width is None:
    raise ValueError("block_has_answer needs static body and answer widths")
  body_ids = tf.cast(body_ids, tf.int32)
  offsets = np.arange(width + 1)
  # Window of W+1 wordpieces at every start position: W to compare, one more for the word
  # boundary after an answer of length W. Positions past the table read a zero ([PAD]).
  padded = tf.pad(body_ids, [[0, 0], [0, 0], [0, width + 1]])  # [B, R, Lb+W+1]
  positions = np.arange(body_length)[:, None] + offsets[None, :]  # [Lb, W+1] static
  windows = tf.gather(padded, positions, axis=-1)  # [B, R, Lb, W+1]
  answers = tf.cast(answer_ids, tf.int32)[:, None, None, :, :]  # [B, 1, 1, A, W]
  lengths = tf.cast(answer_lengths, tf.int32)  # [B, A]
  inside = offsets[None, None, :width] < lengths[:, :, None]  # [B, A, W]
  same = tf.equal(windows[:, :, :, None, :width], answers)  # [B, R, Lb, A, W]
  same = tf.reduce_all(same | ~inside[:, None, None, :, :], axis=-1)  # [B, R, Lb, A]
  # The wordpiece right after the match must not continue a word ('Paris' ≠ 'Parisian').
  continues = tf.gather(tf.cast(is_continuation, tf.bool), windows)  # [B, R, Lb, W+1]
  after = tf.one_hot(lengths, width + 1, on_value=True, off_value=False,
                     dtype=tf.bool)[:, None, None, :, :]  # [B, 1, 1, A, W+1]
  next_continues = tf.reduce_any(continues[:, :, :, None, :] & after, axis=-1)
  ends = np.arange(body_length)[None, None, :, None] + lengths[:, None, None, :]
  fits = ends <= tf.cast(body_lengths, tf.int32)[:, :, None, None]  # [B, R, Lb, A]
  real = (lengths > 0)[:, None, None, :]
  return tf.reduce_any(same & ~next_continues & fits & real, axis=[2, 3])  # [B, R]
