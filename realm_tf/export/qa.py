"""The Open-QA inference module: question strings in, answers with their provenance out.

In the spirit of tf-models' `official/core/export_base.ExportModule`, one tf.Module holds
everything a question needs (the tokenizer, the fine-tuned OpenQAModel's retriever and
reader, and the corpus as a ServedIndex: embeddings and block ids in variables, titles and
texts in compressed asset files read for the retrieved blocks only; see
realm_tf.export.served_index) and one `tf.function`, `answer`, runs the whole path in
graph:

  tokenize (in graph) → OpenQAModel: query embedding, top-k search, gather (the retrieved
  blocks' strings read and tokenized), reader
  → openqa_evaluation.choose_answers (best span over all read blocks jointly)
  → openqa_evaluation.answer_strings (the original text under the span)

These are the functions the Open-QA task's evaluation calls, on the same OpenQAModel and
the same embeddings and block tokens, so the served answer of a question is exactly the evaluated prediction
(tests/test_export_qa.py checks it question by question against evaluate_checkpoint).

Outputs (the QA contract of serving/client.py; B questions, K retrieved blocks):
  answer string [B], score float32 [B], answer_block int32 [B] (rank among the K),
  block_ids int64 [B, K], block_titles string [B, K], block_texts string [B, K],
  retrieval_probs float32 [B, K] (p(z|x): softmax over the K retrieved blocks' scores).

Retrieval is either exact search (stock TensorFlow ops: exact_top_k's matmuls and top_k)
or ScaNN's TensorFlow ops (`ScannHandle`: the searcher is deserialised by the first call,
which the export's warm-up makes at load time, and reused by every later call).

`ReaderModule` exports the reader alone: a question and K (title, text) blocks in, the
best span's text, its score and each block's best span score out.
"""
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from realm_tf.modeling import spans
from realm_tf.export.served_index import ServedIndex
from realm_tf.modeling.models.openqa import BERT_KEYS, OpenQAModel
# As a module: with a global `ScannSearcher` here, autograph's conversion of
# _GraphScann.search_batched resolved scann_ops.ScannSearcher to ours (TypeError, seen).
from realm_tf.retrieval import scann_searcher as scann_backend
from realm_tf.retrieval.searcher import Searcher
from realm_tf.retrieval.sharded import ShardedSearcher
from realm_tf.tasks import openqa_evaluation as evaluation
from realm_tf.text.tokenization import Tokenizer

QUESTION = "question"
# The QA signature's outputs and their dtypes (the contract of serving/client.py).
_QA_DTYPES = dict(answer=tf.string, score=tf.float32, answer_block=tf.int32,
                  block_ids=tf.int64, block_titles=tf.string, block_texts=tf.string,
                  retrieval_probs=tf.float32)
QA_OUTPUTS = tuple(_QA_DTYPES)


class _Untracked:
  """Holds Python objects out of SavedModel's object graph.

  Saving a tracked Keras model makes tf.saved_model trace every layer's call functions
  (tens of seconds for BERT). Only the signatures are needed; they capture the variables,
  which the modules track directly as lists.
  """

  def __init__(self, **objects):
    self.__dict__.update(objects)


# ---------------------------------------------------------------------------------- ScaNN


class ScannHandle(tf.Module):
  """A ScaNN searcher inside a SavedModel, deserialised once, not per request.

  scann_ops' `searcher_from_module` makes the handle eagerly, and an eager resource handle
  cannot be captured by a SavedModel function. Here the `answer` graph holds the
  `TensorsToScann` op over the searcher's state variables. Its kernel is a
  ResourceOpKernel that builds the searcher on its first run and, once initialised,
  returns the same handle on every later run without reading the data again (ScaNN's
  scann_ops.cc: TensorsToScannOp::Compute). The kernel lives as long as the loaded
  function (TF2) or the session (tensorflow_model_server), so the searcher is built by the
  first call, which the warm-up requests make at load time, and freed with the model. No
  shared_name: two loaded versions never share (or leak) a searcher.
  """

  def __init__(self, state: tf.Module, name: str = "scann_handle"):
    super().__init__(name=name)
    self.state = state  # scann_ops.ScannState (or its restored form): the searcher's data

  def handle(self) -> tf.Tensor:
    """The searcher's resource handle, made in graph by a TensorsToScann op (see above)."""
    from scann.scann_ops.py import scann_ops  # noqa: PLC0415  ScaNN's custom ops load only when a ScaNN export is served
    s = self.state
    return scann_ops.tensors_to_scann(
        s.dataset, s.scann_config, s.serialized_partitioner, s.datapoint_to_token,
        s.ah_codebook, s.hashed_dataset, s.int8_dataset, s.int8_multipliers, s.dp_norms)


class _GraphScann:
  """scann_ops.ScannSearcher's search_batched over a ScannHandle's in-graph handle."""

  def __init__(self, handle: ScannHandle):
    self._handle = handle

  def search_batched(self, queries, final_num_neighbors=None,
                     pre_reorder_num_neighbors=None, leaves_to_search=None):
    from scann.scann_ops.py import scann_ops  # noqa: PLC0415  ScaNN's custom ops load only when a ScaNN export is served
    return scann_ops.ScannSearcher(self._handle.handle()).search_batched(
        queries, final_num_neighbors, pre_reorder_num_neighbors, leaves_to_search)


def scann_searcher(embeddings: np.ndarray, block_ids: np.ndarray, rescore: bool = False,
                   states: Optional[Sequence[tuple[tf.Module, np.ndarray, np.ndarray]]] = None
                   ) -> tuple[Searcher, list[ScannHandle]]:
  """A Searcher over in-graph ScaNN handles (the project's ScannSearcher per shard).

  Args:
    embeddings: [N, P] float32 embeddings in row order (used when `states` is None).
    block_ids: [N] int64 ids of those rows (used when `states` is None).
    rescore: re-score ScaNN's candidates exactly with the embeddings.
    states: optional, per shard, (ScannState, its block ids, its embeddings) as an index
      export stores them; without, one ScaNN searcher is built over `embeddings` with
      ScaNN's recommended configuration for the corpus size (scann_params_for).

  Returns:
    (a ShardedSearcher over the shards, the ScannHandles the module must track).
  """
  if states is None:
    embeddings = np.asarray(embeddings, np.float32)
    built = scann_backend.build_scann(embeddings, scann_backend.scann_params_for(len(embeddings)))
    states = [(built.serialize_to_module(), np.asarray(block_ids, np.int64), embeddings)]
  handles, shards = [], []
  for i, (state, ids, vectors) in enumerate(states):
    handle = ScannHandle(state, name=f"scann_handle_{i}")
    handles.append(handle)
    shards.append(scann_backend.ScannSearcher(
        _GraphScann(handle), ids, int(np.shape(vectors)[1]),
        rescore_embeddings=np.asarray(vectors, np.float32) if rescore else None,
        name=f"scann_{i}"))
  return ShardedSearcher(shards), handles


def shared_dataset(handles: Sequence[ScannHandle], shard_ids: Sequence[np.ndarray],
                   embeddings: np.ndarray, block_ids: np.ndarray) -> Optional[tf.Variable]:
  """The ScaNN state's float32 dataset variable when it holds exactly `embeddings` [N, P]
  in the rows of `block_ids` (one shard, reordering in float32), else None.

  Why: the QA module needs the embeddings of the retrieved blocks (p(z|x)), and such a
  state already holds them; sharing the variable saves N x P x 4 bytes per loaded version
  (6.4 GiB at 13.35M blocks, benchmarks/scale.py)."""
  if len(handles) != 1 or len(shard_ids) != 1:
    return None
  dataset = getattr(handles[0].state, "dataset", None)
  if (dataset is None or dataset.dtype != tf.float32
      or tuple(dataset.shape) != tuple(np.shape(embeddings))
      or not np.array_equal(np.asarray(shard_ids[0], np.int64), block_ids)):
    return None
  if not np.array_equal(dataset.numpy(), np.asarray(embeddings, np.float32)):
    return None
  return dataset


# ------------------------------------------------------------------------------ QA module


def reader_lengths(full: int, query_seq_length: int, step: int) -> list[int]:
  """The reader input lengths a QA export may read a request at, shortest first.

  Args:
    full: the model's reader length.
    query_seq_length: the longest question input ([CLS] x [SEP]).
    step: the length step (0: `full` only).

  Returns:
    The multiples of `step` below `full` that hold at least the longest question plus
    one body wordpiece and [SEP], then `full`.
  """
  if not step:
    return [int(full)]
  shortest = query_seq_length + 2
  first = -(-shortest // step) * step
  return [n for n in range(first, full, step)] + [int(full)]


class QAModule(tf.Module):
  """Question → answer and provenance; see the module docstring."""

  def __init__(self, model: OpenQAModel, index: ServedIndex, tokenizer: Tokenizer,
               query_seq_length: int, num_retrieved: int, num_read: int,
               searcher: Optional[Searcher] = None,
               scann_handles: Sequence["ScannHandle"] = (), kind: str = "realm_qa",
               max_blocks_per_pass: int = 0, reader_length_step: int = 0):
    """index: the corpus as served (served_index.served_index_from a KnowledgeIndex), with
    the ScaNN variant's searcher attached; scann_handles: that searcher's handles.

    max_blocks_per_pass: at most this many blocks (questions x num_read) go through the
    reader at once; a larger request is answered group by group, in order. 0: the whole
    request in one pass. Why: on a CPU the reader's unfused elementwise work (GELU,
    softmax, layer norms) over a large pass leaves the caches, and a block costs more in a
    large pass than in a small one (benchmarks/serving.py, "cost per block").

    reader_length_step: the reader reads each request at the shortest multiple of this
    step (up to the model's reader_seq_length) that holds its longest `[CLS] question
    [SEP] body [SEP]`, instead of always at reader_seq_length; 0: always the full length.
    Why: most blocks are shorter than the reader's length (57% of the demo reader's 160
    positions held text, benchmarks/serving.py), and padding costs as much as text."""
    super().__init__(name=kind)
    if max_blocks_per_pass < 0:
      raise ValueError(f"max_blocks_per_pass must be 0 (no limit) or positive, got "
                       f"{max_blocks_per_pass}")
    if model.retriever is None:
      raise ValueError("a QA export needs a dense retriever (this model retrieves with "
                       "BM25, which has no in-graph index)")
    if not 1 <= num_read <= num_retrieved <= index.num_blocks:
      raise ValueError(f"need 1 <= num_read ({num_read}) <= num_retrieved "
                       f"({num_retrieved}) <= blocks ({index.num_blocks})")
    if searcher is not None and index.searcher is not searcher:
      raise ValueError("pass the ScaNN searcher to the ServedIndex (served_index_from's "
                       "searcher) as well")
    self.kind = kind
    self._held = _Untracked(model=model)
    self.tokenizer = tokenizer
    self.model_variables = list(model.variables)
    self.served = index  # tracked: embeddings, block ids, searcher, the text store's assets
    self.scann_handles = list(scann_handles)  # tracked: the searchers' data
    self.query_seq_length = int(query_seq_length)
    self.num_retrieved = int(num_retrieved)
    self.num_read = int(num_read)
    # Questions per reader pass (0: all of them).
    self.questions_per_pass = (max(1, max_blocks_per_pass // self.num_read)
                               if max_blocks_per_pass else 0)
    if reader_length_step < 0:
      raise ValueError(f"reader_length_step must be 0 (full length) or positive, got "
                       f"{reader_length_step}")
    self.reader_lengths = reader_lengths(model.reader_seq_length, self.query_seq_length,
                                         reader_length_step)

  @property
  def model(self) -> OpenQAModel:
    return self._held.model

  @property
  def index(self) -> ServedIndex:
    return self.served

  @property
  def asset_files(self) -> list[str]:
    """Files the saved module needs in its assets/ directory beside the tracked ones (the
    text store's chunks; exporter.save_export copies them)."""
    return self.served.texts.asset_files

  def predict(self, question: tf.Tensor) -> dict[str, tf.Tensor]:
    """The `answer` computation, callable eagerly or inside another tf.function.

    Args:
      question: [B] tf.string questions.

    Returns:
      The QA outputs of the module docstring (answer [B], score [B], answer_block [B],
      block_ids / block_titles / block_texts / retrieval_probs [B, K]).
    """
    features = {"query": self.tokenizer.encode(question, self.query_seq_length).as_dict()}
    model = self.model
    rows, logits, blocks = model.retrieve(features, self.index, self.num_retrieved,
                                          training=False, num_live=self.num_read)

    def read_at(length):
      def read():
        out = model.read(features, rows, logits, blocks, self.num_read, training=False,
                         reader_seq_length=length)
        return evaluation.choose_answers(out.span_logits, out.span_starts, out.span_ends,
                                         out.reader_inputs["body_start"])
      return read

    if len(self.reader_lengths) == 1:
      chosen = read_at(self.reader_lengths[0])()
    else:
      # The longest input of the request, as the full length would pack it.
      _, used = spans.packed_lengths(features["query"]["input_mask"],
                                     blocks.body_lengths[:, :self.num_read],
                                     model.reader_seq_length)  # [B, K]
      needed = tf.reduce_max(used)  # scalar (empty request: int min)
      # The first length that holds it (the last, full, always does).
      branch = tf.reduce_sum(tf.cast(tf.constant(self.reader_lengths[:-1]) < needed,
                                     tf.int32))
      chosen = tf.switch_case(branch, [read_at(n) for n in self.reader_lengths])
    chosen_texts = tf.gather(blocks.texts, chosen["best_block"], batch_dims=1)  # [B]
    answer = evaluation.answer_strings(self.tokenizer, chosen_texts,
                                       chosen["best_start"], chosen["best_end"])
    return dict(
        answer=answer,
        score=tf.cast(chosen["best_score"], tf.float32),
        answer_block=tf.cast(chosen["best_block"], tf.int32),
        block_ids=tf.gather(tf.convert_to_tensor(self.index.block_ids), rows),
        block_titles=blocks.titles,
        block_texts=blocks.texts,
        retrieval_probs=tf.nn.softmax(tf.cast(logits, tf.float32), axis=-1))

  def predict_in_groups(self, question: tf.Tensor) -> dict[str, tf.Tensor]:
    """`predict` over groups of `questions_per_pass` questions, one after another, the
    outputs concatenated in order. A request no larger than a group takes `predict` as is.
    The loop is a plain tf.while_loop over TensorArrays (stock ops: the exports still load
    in tensorflow_model_server) with parallel_iterations=1, so one group's intermediates
    are freed before the next group's are made."""
    group = self.questions_per_pass
    count = tf.shape(question)[0]

    def grouped():
      outputs = {name: tf.TensorArray(dtype, size=0, dynamic_size=True, infer_shape=False)
                 for name, dtype in _QA_DTYPES.items()}

      def body(start, arrays):
        part = self.predict(question[start:start + group])
        index = start // group
        return start + group, {name: arrays[name].write(index, part[name])
                               for name in arrays}

      _, arrays = tf.while_loop(lambda start, _: start < count, body,
                                (tf.constant(0), outputs), parallel_iterations=1)
      return {name: array.concat() for name, array in arrays.items()}

    return tf.cond(count <= group, lambda: self.predict(question), grouped)

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=QUESTION)])
  def answer(self, question):
    """The served signature: [B] questions → the QA outputs (see predict)."""
    if self.questions_per_pass:
      return self.predict_in_groups(question)
    return self.predict(question)

  def signatures(self) -> dict:
    """serving_default and `answer`, both the `answer` function."""
    return {"serving_default": self.answer, "answer": self.answer}


# -------------------------------------------------------------------------- reader module


class ReaderModule(tf.Module):
  """(question [B], block_titles [B, K], block_texts [B, K]) → the best span's text.

  The reader reads `[CLS] question [SEP] body [SEP]` as in fine-tuning (titles are not in
  its input); `block_titles` is taken so a caller passes blocks whole and gets the chosen
  block's title back as `answer_title`. With no retriever here, the span is chosen on the
  reader's own span scores (as with BM25 retrieval); realm_qa chooses on the model's answer
  logits, which may also weigh each block's retrieval score.
  Outputs: answer [B], score [B], answer_block int32 [B], answer_title [B],
  block_scores [B, K] (each block's best span logit).

  Args:
    model: the fine-tuned OpenQAModel (its reader is exported).
    tokenizer: the run's Tokenizer.
    query_seq_length: wordpieces of a question input.
    body_length: body wordpieces kept per block (as the index keeps them).
  """

  kind = "reader"

  def __init__(self, model: OpenQAModel, tokenizer: Tokenizer, query_seq_length: int,
               body_length: int):
    super().__init__(name=self.kind)
    self._held = _Untracked(model=model)
    self.tokenizer = tokenizer
    self.model_variables = list(model.reader.variables)
    self.query_seq_length = int(query_seq_length)
    self.body_length = int(body_length)

  @tf.function(input_signature=[
      tf.TensorSpec([None], tf.string, name=QUESTION),
      tf.TensorSpec([None, None], tf.string, name="block_titles"),
      tf.TensorSpec([None, None], tf.string, name="block_texts")])
  def read(self, question, block_titles, block_texts):
    """The served signature: (question [B], block_titles [B, K], block_texts [B, K]) →
    the outputs listed in the class docstring."""
    model = self._held.model
    query = self.tokenizer.encode(question, self.query_seq_length)
    batch, num_blocks = tf.shape(block_texts)[0], tf.shape(block_texts)[1]
    flat_texts = tf.reshape(block_texts, [-1])
    # The index's body ids: the text's wordpieces, cut to body_length (tokenize_blocks).
    pieces = self.tokenizer.tokenize(flat_texts)
    lengths = tf.minimum(tf.cast(pieces.row_lengths(), tf.int32), self.body_length)
    body_ids = pieces.to_tensor(shape=[None, self.body_length])
    inputs = spans.pack_reader_inputs(
        query.input_word_ids, query.input_mask,
        tf.reshape(tf.cast(body_ids, tf.int32), [batch, num_blocks, self.body_length]),
        tf.reshape(lengths, [batch, num_blocks]), model.reader_seq_length, model.sep_id)
    outputs = model.reader({k: inputs[k] for k in BERT_KEYS}, training=False)
    chosen = evaluation.choose_answers(outputs["span_logits"], outputs["span_starts"],
                                       outputs["span_ends"], inputs["body_start"])
    block = chosen["best_block"]
    answer = evaluation.answer_strings(
        self.tokenizer, tf.gather(block_texts, block, batch_dims=1), chosen["best_start"],
        chosen["best_end"])
    return dict(answer=answer, score=tf.cast(chosen["best_score"], tf.float32),
                answer_block=tf.cast(block, tf.int32),
                answer_title=tf.gather(block_titles, block, batch_dims=1),
                block_scores=tf.reduce_max(outputs["span_logits"], axis=-1))

  def signatures(self) -> dict:
    """serving_default and `read`, both the `read` function."""
    return {"serving_default": self.read, "read": self.read}

