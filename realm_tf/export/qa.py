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
which the export's warm-up makes at load time, and reused by every later call). A ScaNN
export serves the per-shard ScaNN states of its index version (or states built shard by
shard where the version has none) and holds no embeddings: p(z|x)'s logits are the
searcher's reordered scores, so its answers are the exact export's wherever ScaNN finds
the same top-k with exact scores (float32 reordering; tests/test_export_scann.py).

`ReaderModule` exports the reader alone: a question and K (title, text) blocks in, the
best span's text, its score and each block's best span score out.
"""
import contextlib
from typing import NamedTuple, Optional, Sequence

import numpy as np
import tensorflow as tf

from realm_tf.modeling import spans
from realm_tf.export.served_index import ServedIndex
from realm_tf.modeling.models.openqa import BERT_KEYS, OpenQAModel
# As a module: with a global `ScannSearcher` here, autograph's conversion of
# _GraphScann.search_batched resolved scann_ops.ScannSearcher to ours (TypeError, seen).
from realm_tf.retrieval import scann_searcher as scann_backend
from realm_tf.retrieval.row_blocks import RowBlocks, block_bounds
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

  One op per graph: every op node has a kernel, and so a searcher, of its own, so a graph
  whose searches sit in several branches (a cond, a loop's body) would build one per
  branch. `bound_handles` makes each handle's op once, at the top of the traced function,
  for every branch to capture. Eagerly, TensorFlow caches one kernel per op signature,
  which every shard's op would share (each shard would search the first one's data): an
  eager call makes the op in a function of the handle's own.
  """

  def __init__(self, state: tf.Module, name: str = "scann_handle"):
    super().__init__(name=name)
    self.state = state  # scann_ops.ScannState (or its restored form): the searcher's data
    self._made = _Untracked(bound=None, eager=None)

  def _make(self) -> tf.Tensor:
    from scann.scann_ops.py import scann_ops  # noqa: PLC0415  ScaNN's custom ops load only when a ScaNN export is served
    s = self.state
    return scann_ops.tensors_to_scann(
        s.dataset, s.scann_config, s.serialized_partitioner, s.datapoint_to_token,
        s.ah_codebook, s.hashed_dataset, s.int8_dataset, s.int8_multipliers, s.dp_norms)

  def handle(self) -> tf.Tensor:
    """The searcher's resource handle, made in graph by a TensorsToScann op (see above)."""
    made = self._made
    if made.bound is not None:
      return made.bound
    if tf.executing_eagerly():
      if made.eager is None:
        made.eager = tf.function(self._make)
      return made.eager()
    return self._make()


@contextlib.contextmanager
def bound_handles(handles: Sequence[ScannHandle]):
  """Within: each handle's TensorsToScann op is made once, in the graph being traced, and
  every search of that graph (its branches included) uses it (see ScannHandle)."""
  for handle in handles:
    handle._made.bound = handle._make()  # pylint: disable=protected-access
  try:
    yield
  finally:
    for handle in handles:
      handle._made.bound = None  # pylint: disable=protected-access


class _GraphScann:
  """scann_ops.ScannSearcher's search_batched over a ScannHandle's in-graph handle."""

  def __init__(self, handle: ScannHandle):
    self._handle = handle

  def search_batched(self, queries, final_num_neighbors=None,
                     pre_reorder_num_neighbors=None, leaves_to_search=None):
    from scann.scann_ops.py import scann_ops  # noqa: PLC0415  ScaNN's custom ops load only when a ScaNN export is served
    return scann_ops.ScannSearcher(self._handle.handle()).search_batched(
        queries, final_num_neighbors, pre_reorder_num_neighbors, leaves_to_search)


class ScannShard(NamedTuple):
  """One shard of a ScaNN export: ScaNN's state and the block ids of its rows."""
  state: tf.Module  # scann_ops.ScannState (or its restored form)
  block_ids: np.ndarray  # [n] int64


def gather_rows(embeddings, rows: np.ndarray) -> np.ndarray:
  """[len(rows), P] float32: rows of `embeddings` (a RowBlocks, or an [N, P] array or
  memmap), read block by block without a copy of the whole table."""
  rows = np.asarray(rows, np.int64)
  if not isinstance(embeddings, RowBlocks):
    return np.asarray(embeddings[rows], np.float32)
  parts = np.empty([len(rows), embeddings.dimension], np.float32)
  for variable, (start, end) in zip(embeddings.blocks, embeddings.bounds):
    mine = np.flatnonzero((rows >= start) & (rows < end))
    if len(mine):
      # From the read value: a gather from the variable would make it copy-on-read.
      parts[mine] = tf.gather(tf.convert_to_tensor(variable), rows[mine] - start).numpy()
  return parts


def build_scann_shards(embeddings, block_ids: np.ndarray, rows: Optional[np.ndarray] = None,
                       rows_per_shard: int = 0, **overrides) -> list[ScannShard]:
  """ScaNN states over `rows` of `embeddings`, one shard of at most `rows_per_shard` rows
  at a time: the fallback where an index version carries no ScaNN shards.

  Why shard by shard: ScaNN's builder copies its dataset more than once, so one searcher
  over REALM's 13.35M blocks needs about 30 GiB in the building process; a shard of
  ROWS_PER_BLOCK rows needs about 2 GiB, and each builder's searcher is released once its
  state is taken. The shards are searched together and merged (ShardedSearcher).

  Args:
    embeddings: [N, P] in row order (a RowBlocks, or an array or memmap).
    block_ids: [N] int64 ids of those rows.
    rows: the rows to cover (default all), in the order the shards take them.
    rows_per_shard: rows of a shard at most (0: ROWS_PER_BLOCK).
    **overrides: ScannParams fields replacing scann_params_for's choices.

  Returns:
    One ScannShard per piece of `rows`.
  """
  block_ids = np.asarray(block_ids, np.int64)
  rows = np.arange(len(block_ids)) if rows is None else np.asarray(rows, np.int64)
  shards = []
  for start, end in block_bounds(len(rows), rows_per_shard):
    piece = rows[start:end]
    built = scann_backend.build_scann(
        gather_rows(embeddings, piece),
        scann_backend.scann_params_for(len(piece), **overrides))
    shards.append(ScannShard(built.serialize_to_module(), block_ids[piece]))
    scann_backend.release(built)
  return shards


def scann_searcher(shards: Sequence[ScannShard], dimension: int
                   ) -> tuple[Searcher, list[ScannHandle]]:
  """A Searcher over in-graph ScaNN handles, one per shard, merged (ShardedSearcher).

  Its scores are ScaNN's (reordered inner products in the shards' reorder_dtype): a QA
  export takes them as p(z|x)'s logits and holds no embeddings of its own.

  Args:
    shards: the ScaNN states and their block ids (an index version's, or
      build_scann_shards').
    dimension: P.

  Returns:
    (the searcher, the ScannHandles the module must track).
  """
  if not shards:
    raise ValueError("a ScaNN export needs at least one ScaNN shard")
  handles, searchers = [], []
  for i, shard in enumerate(shards):
    handle = ScannHandle(shard.state, name=f"scann_handle_{i}")
    handles.append(handle)
    searchers.append(scann_backend.ScannSearcher(
        _GraphScann(handle), shard.block_ids, int(dimension), name=f"scann_{i}"))
  return ShardedSearcher(searchers), handles


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
    with bound_handles(self.scann_handles):
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

