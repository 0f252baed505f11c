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
or ScaNN's TensorFlow ops (realm_tf.retrieval.scann_index's ScannHandle: the searcher is
deserialised by the first call, which the export's warm-up makes at load time, and reused
by every later call of every signature). A ScaNN export serves the per-shard ScaNN states
of its index version (or states built shard by shard where the version has none). By
default ScaNN proposes candidates and float16 embeddings re-score them
(served_index.RESCORED_PER_NEIGHBOUR: int8 scores misorder near-ties), so p(z|x)'s logits
are inner products as exact search computes them, to float16 rounding, and the shards are
served without their int8 reordering (scann_index.without_reordering); without re-scoring
(realm_tf.export.assembly.ScannSearch(rescore_dtype=None)) they are served as built, it
holds no embeddings and the logits are the searcher's reordered scores. Either way its
answers are the exact export's wherever its top-k and scores are
(tests/test_export_scann.py). realm_tf.export.assembly.served_qa_module is the one place
a QA module is assembled, for the exporter and every benchmark.

Every QA export has a `retrieve` signature: question [B] → the K blocks `answer` retrieves,
best first, without reading them: block_ids int64 [B, K], block_titles string [B, K],
retrieval_scores float32 [B, K] (the relevance logits whose softmax is retrieval_probs).
For users debugging retrieval, and for reading a served export's recall cheaply.
`retrieve_embedding` is the same search from query embeddings (query_embedding float32
[B, P], the query tower's output) instead of question text: the same outputs, so a
retrieval problem can be split into the query tower's and the index's, and an index's
recall read over gRPC on query vectors drawn without a tokenizer (benchmarks/
released_scale.py's generated questions).

A ScaNN export has one more signature, `answer_with_search_options` (question [B],
leaves_fraction [] float32, reorder_num_neighbors [] int32): the same outputs, searching
that fraction of each shard's leaves and re-scoring that many candidates (the default
export: ScaNN's candidates its embeddings re-score; without re-scoring: each shard's
reordering), chosen per request without rebuilding a shard. An option this export cannot
vary (no shard with a tree, nothing re-scored) is refused unless it has the value that
says so (scann_index.check_search_options). Its scalar inputs make it unbatchable, so
serving_default stays question-only.

`ReaderModule` exports the reader alone: a question and K (title, text) blocks in, the
best span's text, its score and each block's best span score out.
"""
from typing import Sequence

import tensorflow as tf

from realm_tf.modeling import spans
from realm_tf.export.served_index import ServedIndex
from realm_tf.modeling.models.openqa import BERT_KEYS, OpenQAModel
from realm_tf.retrieval import scann_index
from realm_tf.tasks import openqa_evaluation as evaluation
from realm_tf.text.tokenization import Tokenizer

QUESTION = "question"
# The ScaNN export's tunable signature and its two scalar inputs (serving/client.py's
# names for them; see QAModule.answer_with_search_options).
SEARCH_OPTIONS_SIGNATURE = "answer_with_search_options"
LEAVES_FRACTION = "leaves_fraction"
REORDER_NUM_NEIGHBORS = "reorder_num_neighbors"
# Every QA export's retrieval-only signature and its outputs (QAModule.retrieve).
RETRIEVE_SIGNATURE = "retrieve"
RETRIEVE_OUTPUTS = ("block_ids", "block_titles", "retrieval_scores")
# The same search from query embeddings, and its input (QAModule.retrieve_embedding).
RETRIEVE_EMBEDDING_SIGNATURE = "retrieve_embedding"
QUERY_EMBEDDING = "query_embedding"
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


def reader_length_branch(lengths: Sequence[int], needed: tf.Tensor) -> tf.Tensor:
  """Which of `lengths` (reader_lengths' list, shortest first) a pass is read at.

  Args:
    lengths: the export's reader lengths; the last is the model's full length.
    needed: [] int32, the pass's longest `[CLS] question [SEP] body [SEP]` as the full
      length packs it (so never more than the full length: longer bodies are cut there).

  Returns:
    [] int32, the index of the first length >= needed: a pass exactly at a length is read
    at that length, one longer at the next; anything past the last but one at the last.
  """
  return tf.reduce_sum(tf.cast(tf.constant(list(lengths[:-1]), tf.int32) < needed, tf.int32))


class QAModule(tf.Module):
  """Question → answer and provenance; see the module docstring."""

  def __init__(self, model: OpenQAModel, index: ServedIndex, tokenizer: Tokenizer,
               query_seq_length: int, num_retrieved: int, num_read: int,
               scann_handles: Sequence[scann_index.ScannHandle] = (), kind: str = "realm_qa",
               max_blocks_per_pass: int = 0, reader_length_step: int = 0,
               reader_xla: bool = False):
    """Built by realm_tf.export.assembly.served_qa_module, which says what each argument
    comes from.

    index: the corpus as served (served_index.served_index_from a KnowledgeIndex), with
    the ScaNN variant's searcher attached; scann_handles: that searcher's handles.

    max_blocks_per_pass: at most this many blocks (questions x num_read) go through the
    reader at once; a larger request is answered group by group, in order. 0: the whole
    request in one pass. Why: on a CPU the reader's unfused elementwise work (GELU,
    softmax, layer norms) over a large pass leaves the caches, and a block costs more in a
    large pass than in a small one (benchmarks/serving.py, "cost per block").

    reader_length_step: the reader reads each request at the shortest multiple of this
    step (up to the model's reader_seq_length) that holds its longest `[CLS] question
    [SEP] body [SEP]`, instead of always at reader_seq_length; 0: always the full length.
    Why: most blocks are shorter than the reader's length (benchmarks/results/serving.md,
    "reader input used"), and padding costs as much as text.

    reader_xla: the reader's pass (its encoder and span head over one pass's [B, K, L]
    inputs) is a `tf.function(jit_compile=True)` inside the SavedModel: XLA fuses the
    elementwise work between the matmuls. The saved graph keeps stock ops (a call with
    `_XlaMustCompile` set); tensorflow_model_server runs it only with
    `--xla_cpu_compilation_enabled=true` (serving.server mirrors that flag). XLA compiles
    one program per input shape, so the shapes are bounded: at most
    max_blocks_per_pass // num_read questions per pass times len(reader_lengths) lengths
    (each compiled once, on the first pass of that shape: the export's warm-up compiles
    the ones its requests reach). Hence reader_xla needs max_blocks_per_pass > 0: without
    it every request size would be a new program."""
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
    if scann_handles and index.searcher is None:
      raise ValueError("ScaNN handles without a searcher in the served index: attach the "
                       "searcher they belong to (served_index_from's searcher)")
    self.kind = kind
    self._held = _Untracked(model=model)
    self.tokenizer = tokenizer
    # Everything answering reads: not the document tower, whose work the index holds (the
    # blocks' embeddings). Saved, it would be restored at every load for nothing: a whole
    # BERT tower in every loaded version, against the served memory targets of
    # benchmarks/released_scale.py. A function that did read it would make
    # tf.saved_model.save refuse the untracked variable.
    documents = (set() if model.retriever.shares_towers else
                 {id(v) for v in model.retriever.document_embedder.variables})
    self.model_variables = [v for v in model.variables if id(v) not in documents]
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
    if reader_xla and not max_blocks_per_pass:
      raise ValueError("reader_xla needs max_blocks_per_pass > 0: XLA compiles a program "
                       "per pass shape, and passes of a whole request have as many shapes "
                       "as request sizes")
    self.reader_xla = bool(reader_xla)
    # Untracked (the signatures that call it are what is saved); None: the reader as is.
    self._held.reader_pass = (
        tf.function(lambda inputs: model.reader(inputs, training=False), jit_compile=True)
        if reader_xla else None)
    # Every signature binds the searchers this one function makes, so they share one
    # searcher per shard (scann_index.searcher_function). Untracked: the signatures that
    # call it are what is saved.
    self._held.make_searchers = (scann_index.searcher_function(self.scann_handles)
                                 if self.scann_handles else None)
    layouts = [scann_index.ShardLayout.of_state(h.state) for h in self.scann_handles]
    # What a request's search options can change (check_search_options refuses the rest).
    self.searches_leaves = any(layout.num_leaves for layout in layouts)
    self.rescores = (index.embeddings is not None
                     or any(layout.reorder_num_neighbors for layout in layouts))
    # [B, P] query embeddings: P is the index's, known only here.
    self.retrieve_embedding = tf.function(
        self._retrieve_embedding, input_signature=[
            tf.TensorSpec([None, index.dimension], tf.float32, name=QUERY_EMBEDDING)])
    if self.scann_handles:
      # Only where there is something to tune: an exact export has no such function.
      self.answer_with_search_options = tf.function(
          self._answer_with_search_options, input_signature=[
              tf.TensorSpec([None], tf.string, name=QUESTION),
              tf.TensorSpec([], tf.float32, name=LEAVES_FRACTION),
              tf.TensorSpec([], tf.int32, name=REORDER_NUM_NEIGHBORS)])

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

  def _encode(self, question: tf.Tensor) -> dict:
    """The model's features of [B] questions (the query tower's BERT inputs)."""
    return {"query": self.tokenizer.encode(question, self.query_seq_length).as_dict()}

  def search(self, question: tf.Tensor) -> dict[str, tf.Tensor]:
    """The `retrieve` computation: [B] questions → the num_retrieved blocks `predict`
    retrieves (the same query tower and index search), without gathering or reading them.

    Args:
      question: [B] tf.string questions.

    Returns:
      block_ids int64 [B, K], block_titles string [B, K] (read from the text store for
      these rows only) and retrieval_scores float32 [B, K] (the search's inner products:
      the relevance logits, to float rounding, whose softmax is `predict`'s
      retrieval_probs), best first.
    """
    query = self.model.retriever.embed_queries(self._encode(question)["query"],
                                               training=False)  # [B, P]
    return self.search_embedding(query)

  def search_embedding(self, query: tf.Tensor) -> dict[str, tf.Tensor]:
    """`search` from [B, P] query embeddings (the query tower's output): the same
    outputs."""
    found = self.index.search(query, self.num_retrieved)
    titles, _ = self.index.texts.lookup(found.rows)  # [B, K] each
    return dict(block_ids=tf.cast(found.block_ids, tf.int64), block_titles=titles,
                retrieval_scores=tf.cast(found.scores, tf.float32))

  def predict(self, question: tf.Tensor) -> dict[str, tf.Tensor]:
    """The `answer` computation, callable eagerly or inside another tf.function.

    Args:
      question: [B] tf.string questions.

    Returns:
      The QA outputs of the module docstring (answer [B], score [B], answer_block [B],
      block_ids / block_titles / block_texts / retrieval_probs [B, K]).
    """
    features = self._encode(question)
    model = self.model
    rows, logits, blocks = model.retrieve(features, self.index, self.num_retrieved,
                                          training=False, num_live=self.num_read)

    def read_at(length):
      def read():
        out = model.read(features, rows, logits, blocks, self.num_read, training=False,
                         reader_seq_length=length, reader_fn=self._held.reader_pass)
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
      branch = reader_length_branch(self.reader_lengths, needed)
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

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=QUESTION),
                                tf.TensorSpec([], tf.float32, name=LEAVES_FRACTION),
                                tf.TensorSpec([], tf.int32, name=REORDER_NUM_NEIGHBORS)])
  def search_and_read(self, question, leaves_fraction, reorder_num_neighbors):
    """[B] questions → the QA outputs (see predict), ScaNN searching with the given
    options, where a value of 0 or less is each shard's own (scann_index.SearchOptions).

    One function under both signatures, so they read alike; the searchers it binds are
    made by the module's one searcher function, which `retrieve` binds too, so every
    signature searches with one searcher per shard (scann_index.searcher_function;
    tests/test_export_qa.py checks it)."""
    options = scann_index.SearchOptions(leaves_fraction, reorder_num_neighbors)
    with scann_index.bound_handles(self.scann_handles, self._held.make_searchers), \
        scann_index.searching_with(options):
      if self.questions_per_pass:
        return self.predict_in_groups(question)
      return self.predict(question)

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=QUESTION)])
  def retrieve(self, question):
    """The `retrieve` signature: [B] questions → the blocks `answer` retrieves, best
    first, unread (see search); each ScaNN shard searching as it was built."""
    with scann_index.bound_handles(self.scann_handles, self._held.make_searchers):
      return self.search(question)

  def _retrieve_embedding(self, query_embedding):
    """The `retrieve_embedding` signature: [B, P] query embeddings → `retrieve`'s outputs
    for them (see search_embedding); each ScaNN shard searching as it was built."""
    with scann_index.bound_handles(self.scann_handles, self._held.make_searchers):
      return self.search_embedding(query_embedding)

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=QUESTION)])
  def answer(self, question):
    """The served signature: [B] questions → the QA outputs (see predict), each ScaNN
    shard searching as it was built."""
    return self.search_and_read(question, tf.constant(0.0), tf.constant(0))

  def _answer_with_search_options(self, question, leaves_fraction, reorder_num_neighbors):
    """The ScaNN export's tunable signature: `answer`, searching a fraction of each
    shard's leaves and re-scoring reorder_num_neighbors candidates (SearchOptions).

    Args:
      question: [B] tf.string questions.
      leaves_fraction: [] float32 in (0, 1]; shards without a tree search every block
        (with none, only 1 is taken).
      reorder_num_neighbors: [] int32, from num_retrieved to
        scann_index.MAX_REORDER_NUM_NEIGHBORS: the candidates the embeddings re-score, or
        without them each shard's reordering (with nothing re-scored, only num_retrieved
        is taken).

    Returns:
      The QA outputs of predict.

    Raises:
      tf.errors.InvalidArgumentError: an option out of range, or one this export cannot
        vary given another value than the one that says so; named.
    """
    options = scann_index.check_search_options(
        leaves_fraction, reorder_num_neighbors, self.num_retrieved,
        has_tree=self.searches_leaves, rescores=self.rescores)
    return self.search_and_read(question, *options)

  def signatures(self) -> dict:
    """serving_default and `answer`, both the `answer` function, `retrieve`,
    `retrieve_embedding`, and in a ScaNN export `answer_with_search_options` too."""
    signatures = {"serving_default": self.answer, "answer": self.answer,
                  RETRIEVE_SIGNATURE: self.retrieve,
                  RETRIEVE_EMBEDDING_SIGNATURE: self.retrieve_embedding}
    if self.scann_handles:
      signatures[SEARCH_OPTIONS_SIGNATURE] = self.answer_with_search_options
    return signatures


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

