"""WordPiece tokenization and BERT input packing, in the TensorFlow graph.

Tokenizing inside the graph (tensorflow_text) means the same code runs in tf.data input
pipelines, in training steps, and inside exported SavedModels that TF Serving runs, so the
served model and the trained one can never disagree about tokenization.
"""
import dataclasses
from typing import Optional, Sequence, Union

import tensorflow as tf
import tensorflow_text as tf_text

from realm_tf.pretrained.minilm import minilm_vocab_file

_TRIMMERS = {
    # Round robin: every segment gives up tokens in turn (BERT's pair truncation).
    "round_robin": tf_text.RoundRobinTrimmer,
    # Waterfall: earlier segments are kept whole first; later ones get what is left. Used
    # when x must keep the same positions for every retrieved z (masked positions, answers).
    "waterfall": tf_text.WaterfallTrimmer,
}


@dataclasses.dataclass
class BertInputs:
  """Packed BERT inputs, each [batch, seq_length] int32."""
  input_word_ids: tf.Tensor
  input_mask: tf.Tensor
  input_type_ids: tf.Tensor

  def as_dict(self) -> dict[str, tf.Tensor]:
    """{'input_word_ids', 'input_mask', 'input_type_ids'}: what tf-models' encoders take."""
    # Not dataclasses.asdict: it deep-copies, which symbolic tensors in a graph refuse.
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


class Tokenizer(tf.Module):
  """Uncased WordPiece tokenizer plus `join_bert` packing.

  join_bert(x)      = [CLS] x [SEP]           (segment ids 0)
  join_bert(x1, x2) = [CLS] x1 [SEP] x2 [SEP] (segment ids 0 for x1 and its [SEP], 1 after)

  Args:
    vocab_file: a vocab.txt on any TF file system; None: the MiniLM package's (BERT's
      uncased vocabulary).
    lower_case: lower-case and strip accents first (uncased models).
    name: the tf.Module's name.

  Raises:
    FileNotFoundError: the vocabulary file does not exist.
    OSError: it could not be read.
    ValueError: it is empty or lacks [PAD], [UNK], [CLS], [SEP] or [MASK].
  """

  def __init__(self, vocab_file: Optional[str] = None, lower_case: bool = True,
               name: str = "tokenizer"):
    super().__init__(name=name)
    self.vocab_file = vocab_file or minilm_vocab_file()
    # Read whole, not line by line: TF's line iterator ends quietly on a read error, and a
    # vocabulary that could not be read would then look empty.
    try:
      with tf.io.gfile.GFile(self.vocab_file, "rb") as f:
        text = f.read().decode("utf-8")
    except tf.errors.NotFoundError:
      raise FileNotFoundError(f"{self.vocab_file}: no such vocabulary file") from None
    except tf.errors.OpError as e:
      raise OSError(f"{self.vocab_file}: the vocabulary could not be read "
                    f"({type(e).__name__}: {e.message})") from e
    # "\n" only: str.splitlines would also split on \x85 or \u2028 inside a token.
    self.vocab = text.split("\n")
    if self.vocab and self.vocab[-1] == "":
      self.vocab.pop()
    if not self.vocab:
      raise ValueError(f"{self.vocab_file}: empty vocabulary")
    index = {token: i for i, token in enumerate(self.vocab)}
    for special in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"):
      if special not in index:
        raise ValueError(f"{self.vocab_file}: vocabulary lacks {special}")
    self.pad_id = index["[PAD]"]
    self.unk_id = index["[UNK]"]
    self.cls_id = index["[CLS]"]
    self.sep_id = index["[SEP]"]
    self.mask_id = index["[MASK]"]
    self.vocab_size = len(self.vocab)
    self._wordpiece = tf_text.FastBertTokenizer(
        vocab=self.vocab, token_out_type=tf.int64, unknown_token="[UNK]",
        lower_case_nfd_strip_accents=lower_case, support_detokenization=True)

  def tokenize(self, texts: tf.Tensor) -> tf.RaggedTensor:
    """[batch] strings → [batch, (tokens)] int64 wordpiece ids."""
    return self._wordpiece.tokenize(texts)

  def tokenize_with_offsets(self, texts: tf.Tensor):
    """Ids plus each wordpiece's [start, end) byte offsets into the *original* text."""
    return self._wordpiece.tokenize_with_offsets(texts)

  def detokenize(self, token_ids) -> tf.Tensor:
    """Wordpiece ids → normalised (lower-cased) text; prefer `span_text` for answers."""
    return self._wordpiece.detokenize(token_ids)

  def join_bert(self, segments: Sequence[Union[tf.RaggedTensor, tf.Tensor]], seq_length: int,
                truncation: str = "round_robin") -> BertInputs:
    """Packs one or two tokenized segments into fixed-length BERT inputs.

    Args:
      segments: one or two [batch, (tokens)] ragged id tensors (or lists of strings, which
        are tokenized first).
      seq_length: the padded length, special tokens included.
      truncation: 'round_robin' or 'waterfall' (see _TRIMMERS).

    Returns:
      BertInputs, each [batch, seq_length] int32.

    Raises:
      ValueError: not one or two segments, an unknown truncation, or a seq_length too
        short for the special tokens.
      TypeError: a segment is neither strings nor ragged ids.
    """
    if not 1 <= len(segments) <= 2:
      raise ValueError(f"join_bert takes one or two segments, got {len(segments)}")
    if truncation not in _TRIMMERS:
      raise ValueError(f"truncation must be one of {sorted(_TRIMMERS)}, got {truncation!r}")
    budget = seq_length - (len(segments) + 1)  # [CLS] + one [SEP] per segment
    if budget < len(segments):
      raise ValueError(f"seq_length {seq_length} leaves no room for {len(segments)} segments")
    segments = [self._as_ids(s) for s in segments]
    trimmed = _TRIMMERS[truncation](max_seq_length=budget).trim(segments)
    ids, type_ids = tf_text.combine_segments(
        trimmed, start_of_sequence_id=self.cls_id, end_of_segment_id=self.sep_id)
    word_ids, mask = tf_text.pad_model_inputs(ids, max_seq_length=seq_length)
    type_ids, _ = tf_text.pad_model_inputs(type_ids, max_seq_length=seq_length)
    return BertInputs(input_word_ids=tf.cast(word_ids, tf.int32),
                      input_mask=tf.cast(mask, tf.int32),
                      input_type_ids=tf.cast(type_ids, tf.int32))

  def encode(self, texts, seq_length: int, pair_texts=None,
             truncation: str = "round_robin") -> BertInputs:
    """Strings (and optional second strings) → packed BERT inputs.

    Args:
      texts: [batch] strings.
      seq_length: the padded length, special tokens included.
      pair_texts: optional [batch] second strings (`[CLS] texts [SEP] pair_texts [SEP]`).
      truncation: as join_bert.

    Returns:
      BertInputs, each [batch, seq_length] int32.
    """
    segments = [texts] if pair_texts is None else [texts, pair_texts]
    return self.join_bert(segments, seq_length, truncation)

  def null_block(self, batch_size: int, seq_length: int) -> BertInputs:
    """The null document: an empty block `[CLS] [SEP] [SEP]`, embedded like any other."""
    empty = tf.RaggedTensor.from_row_lengths(
        tf.zeros([0], tf.int64), tf.zeros([batch_size], tf.int64))
    return self.join_bert([empty, empty], seq_length)

  def _as_ids(self, segment) -> tf.RaggedTensor:
    if isinstance(segment, tf.RaggedTensor) and segment.dtype.is_integer:
      return tf.cast(segment, tf.int64)
    segment = tf.convert_to_tensor(segment)
    if segment.dtype == tf.string:
      return self.tokenize(segment)
    raise TypeError(f"segment must be strings or ragged ids, got {segment.dtype}")


def span_text(texts: tf.Tensor, token_starts: tf.RaggedTensor, token_ends: tf.RaggedTensor,
              span_start: tf.Tensor, span_end: tf.Tensor) -> tf.Tensor:
  """The original text under wordpieces [span_start, span_end] (inclusive), per row.

  Uses the byte offsets from `tokenize_with_offsets`, so case, accents and punctuation
  come back exactly as written, which is what an answer string must be.

  Args:
    texts: [batch] the texts that were tokenized.
    token_starts, token_ends: [batch, (tokens)] byte offsets.
    span_start, span_end: [batch] wordpiece indices into each row.

  Returns:
    [batch] strings.
  """
  batch = tf.range(tf.shape(texts, out_type=tf.int64)[0])
  span_start = tf.cast(span_start, tf.int64)
  span_end = tf.cast(span_end, tf.int64)
  begin = tf.gather_nd(token_starts, tf.stack([batch, span_start], axis=1))
  end = tf.gather_nd(token_ends, tf.stack([batch, span_end], axis=1))
  return tf.strings.substr(texts, begin, end - begin, unit="BYTE")
