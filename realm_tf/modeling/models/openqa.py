"""The Open-QA model: retrieve a beam of blocks in the step, read the best k, score spans.

ORQA / REALM fine-tuning. The retrieval beam (R blocks) feeds the retriever loss, labelled
by answer match on each block's whole body (spans.block_has_answer); the best K <= R are
read. The logits an answer is chosen from (`span_logits`) are the reader's span scores
plus the block's retrieval score ('orqa', as the authors' ORQA code), or log p(z|x) +
log p(s|z,x) ('marginal', REALM's form): see losses.joint_reader_logits. So prediction,
evaluation and the serving exports (which all take `span_logits`) weigh p(z|x).

The query tower and the reader train; the document tower trains only when the index is
refreshed during fine-tuning (then the K read blocks are re-embedded live, as in REALM
pre-training, so the gradient reaches it; the rest of the beam keeps the index's
embeddings). With BM25 retrieval there is no retriever model: the top-k and their scores
come with the features, and the span scores are used alone.
"""
from typing import Any, NamedTuple, Optional, Protocol

import tensorflow as tf
import tf_keras

from realm_tf.modeling import losses, spans
from realm_tf.modeling.models.reader import Reader
from realm_tf.modeling.models.retriever import Retriever

BERT_KEYS = ("input_word_ids", "input_mask", "input_type_ids")


class BlockIndex(Protocol):
  """The one knowledge-index API (realm_tf.retrieval.knowledge_index.KnowledgeIndex
  implements it, with its backends: sharded exact MIPS in the step, ScaNN on the host, or
  an in-graph Searcher in the exports). Declared here as a protocol rather than imported:
  models sit below retrieval, which builds on them (the retriever is a model; the index
  embeds with it). The model uses the in-step half; the refresher the host half."""

  # In the step.
  def rows(self, block_ids: tf.Tensor) -> tf.Tensor:
    """Index rows [B, k] of corpus block ids [B, k]."""

  def search(self, queries: tf.Tensor, k: int) -> Any:
    """The top-k of queries [B, P]: a SearchResult (block_ids, scores, rows [B, k])."""

  def gather(self, rows: tf.Tensor) -> Any:
    """The blocks at rows [B, k]: tokens, embeddings [B, k, P] and ids."""

  # On the host, between steps.
  version: Optional[int]  # the committed index version searched (None: none yet)

  @property
  def encoder_step(self) -> int:
    """The training step of the document tower behind `version` (staleness = step - it)."""

  def maybe_swap(self, index_dir: str) -> bool:
    """Swaps in the newest committed version under index_dir if newer; True if it did."""


class OpenQAOutputs(NamedTuple):
  rows: tf.Tensor  # [B, R] index rows of the retrieved blocks, best first
  retrieval_logits: tf.Tensor  # [B, R] relevance scores (the logits of p(z|x))
  span_logits: tf.Tensor  # [B, K, S] the answer logits (span + retrieval score), K <= R read
  span_starts: tf.Tensor  # [S] token positions in the reader inputs
  span_ends: tf.Tensor  # [S]
  reader_inputs: dict  # BERT inputs [B, K, Lr] and body_start [B]
  span_scores: Optional[tf.Tensor] = None  # [B, K, S] the reader's own span scores
  body_ids: Optional[tf.Tensor] = None  # [B, R, Lb] whole bodies of the beam
  body_lengths: Optional[tf.Tensor] = None  # [B, R]


def gold_first(rows: tf.Tensor, gold_rows: tf.Tensor,
               scores: Optional[tf.Tensor] = None) -> tuple[tf.Tensor, Optional[tf.Tensor]]:
  """Puts each question's gold row first in its beam (reading-comprehension stage).

  rows [B, R]; gold_rows [B] (-1: none, the beam is unchanged). A gold row already in the
  beam moves to the front; otherwise it is inserted and the last row drops out. `scores`
  [B, R] (optional, e.g. BM25's) follow their rows; an inserted gold row gets the best
  score of the beam. Returns the new rows [B, R] and scores (None if not given).
  """
  gold_rows = tf.cast(gold_rows, rows.dtype)
  beam = rows.shape[1] if rows.shape[1] is not None else tf.shape(rows)[1]
  candidates = tf.concat([gold_rows[:, None], rows], axis=1)  # [B, R+1]
  has_gold = gold_rows >= 0
  is_gold = tf.equal(rows, gold_rows[:, None]) & has_gold[:, None]  # [B, R]
  drop = tf.concat([~has_gold[:, None], is_gold], axis=1)
  positions = tf.range(tf.shape(candidates)[1])[None, :]  # [1, R+1]
  key = tf.where(drop, -2 * tf.shape(candidates)[1], -positions)  # kept, in order, first
  order = tf.math.top_k(key, k=beam).indices  # [B, R]
  new_rows = tf.gather(candidates, order, batch_dims=1)
  if scores is None:
    return new_rows, None
  gold_score = tf.where(tf.reduce_any(is_gold, axis=1),
                        tf.reduce_max(tf.where(is_gold, scores, scores.dtype.min), axis=1),
                        scores[:, 0])
  all_scores = tf.concat([gold_score[:, None], scores], axis=1)
  return new_rows, tf.gather(all_scores, order, batch_dims=1)


class OpenQAModel(tf_keras.Model):
  """Retriever (None for BM25) and reader; the checkpoint holds exactly these two.

  The index is passed to each call rather than owned, so checkpoints stay the size
  of the networks and one model can be evaluated against another corpus.
  """

  def __init__(self, reader: Reader, retriever: Optional[Retriever] = None,
               reader_seq_length: int = 320, sep_id: int = 102,
               train_document_encoder: bool = False, answer_logits: str = "orqa", **kwargs):
    super().__init__(**kwargs)
    if answer_logits not in losses.OPENQA_LOSSES:
      raise ValueError(f"answer_logits must be one of {losses.OPENQA_LOSSES}, "
                       f"got {answer_logits!r}")
    self.reader = reader
    self.retriever = retriever
    self.reader_seq_length = reader_seq_length
    self.sep_id = sep_id
    self.train_document_encoder = train_document_encoder
    self.answer_logits = answer_logits

  def retrieve(self, features: dict, index: BlockIndex, k: int, training=None,
               gold_rows: Optional[tf.Tensor] = None,
               num_live: int = 0) -> tuple[tf.Tensor, tf.Tensor, object]:
    """Rows [B, k] of the top-k blocks, relevance logits [B, k], and the gathered blocks.

    gold_rows [B] (optional): put first (gold_first). num_live: how many leading blocks the
    document tower re-embeds when it trains (the others keep the index's embeddings).
    """
    if self.retriever is None:
      rows = index.rows(features["bm25"]["block_ids"][:, :k])
      scores = tf.cast(features["bm25"]["scores"][:, :k], tf.float32)
      if gold_rows is not None:
        rows, scores = gold_first(rows, gold_rows, scores)
      return rows, scores, index.gather(rows, embeddings=False)  # BM25 scores them
    query = self.retriever.embed_queries(features["query"], training=training)  # [B, P]
    # MIPS picks the blocks; the logits are recomputed below so that they carry gradient.
    found = index.search(query, k)
    rows = found.rows  # [B, k]
    if gold_rows is not None:
      rows, _ = gold_first(rows, gold_rows)
    blocks = index.gather(rows)
    live = None
    if self.train_document_encoder and num_live:
      live = self.retriever.embed_documents(
          {key: value[:, :num_live] for key, value in blocks.document.items()},
          training=training)  # [B, num_live, P]
    if blocks.embeddings is None:
      # An index that keeps no embeddings (a ScaNN export: its searcher holds them) scores
      # with the search's own inner products, which carry no gradient.
      if gold_rows is not None:
        raise ValueError("gold_rows reorder the retrieved blocks, whose logits come from "
                         "an index without embeddings: train on an index with them")
      logits = tf.cast(found.scores, query.dtype)  # [B, k]
      if live is not None:
        logits = tf.concat([Retriever.relevance(query, tf.cast(live, query.dtype)),
                            logits[:, num_live:]], axis=1)
      return rows, tf.cast(logits, tf.float32), blocks
    documents = tf.cast(blocks.embeddings, query.dtype)  # [B, k, P] the index's (fixed)
    if live is not None:
      documents = tf.concat([tf.cast(live, query.dtype), documents[:, num_live:]], axis=1)
    logits = Retriever.relevance(query, documents)
    return rows, tf.cast(logits, tf.float32), blocks

  def call(self, features: dict, index: BlockIndex, num_retrieved: int, num_read: int,
           training=None, gold_rows: Optional[tf.Tensor] = None) -> OpenQAOutputs:
    """Retrieves `num_retrieved` blocks and reads the best `num_read` of them (the gold
    block first, for questions with gold_rows >= 0)."""
    rows, logits, blocks = self.retrieve(features, index, num_retrieved, training=training,
                                         gold_rows=gold_rows, num_live=num_read)
    return self.read(features, rows, logits, blocks, num_read, training=training)

  def read(self, features: dict, rows: tf.Tensor, logits: tf.Tensor, blocks,
           num_read: int, training=None,
           reader_seq_length: Optional[int] = None, reader_fn=None) -> OpenQAOutputs:
    """Reads the first `num_read` of the retrieved blocks (`retrieve`'s outputs).

    reader_seq_length (static): the reader's input length, default the model's. A shorter
    one that still holds every `[CLS] x [SEP] body [SEP]` of the batch whole (the bodies as
    the model's length would cut them) gives the same spans and scores at less cost; the
    QA export picks one per request (realm_tf.export.qa).

    reader_fn: called on the reader's BERT inputs (each [B, K, L]) in place of
    `self.reader(inputs, training=training)`, returning the same outputs: the QA export
    passes its XLA-compiled reader pass here (realm_tf.export.qa, reader_xla).
    """
    inputs = spans.pack_reader_inputs(
        features["query"]["input_word_ids"], features["query"]["input_mask"],
        blocks.body_ids[:, :num_read], blocks.body_lengths[:, :num_read],
        reader_seq_length or self.reader_seq_length, self.sep_id)
    bert_inputs = {k: inputs[k] for k in BERT_KEYS}
    outputs = (reader_fn(bert_inputs) if reader_fn is not None
               else self.reader(bert_inputs, training=training))
    scores = outputs["span_logits"]  # [B, K, S]
    answer_logits = losses.joint_reader_logits(
        scores, logits[:, :num_read] if self.retriever is not None else None,
        self.answer_logits)
    return OpenQAOutputs(rows, logits, answer_logits, outputs["span_starts"],
                         outputs["span_ends"], inputs, span_scores=scores,
                         body_ids=blocks.body_ids, body_lengths=blocks.body_lengths)
