"""Questions in the NQ-Open JSON lines layout, and the tf.data pipelines that feed them.

  {"question": str, "answer": [str, ...]}   one per line; "title" (the question's source
                                            article, SQuAD-open) is kept, other keys ignored

Answers become the wordpiece sequences the span locator looks for (answers.answer_variants;
CuratedTREC patterns are first expanded into the strings they match in the corpus). They
are tokenized once, on the host, into [A, W] arrays; a batch carries them beside the packed
question, and retrieval, packing and span location happen in the step.

Batch features, a tf.data nest of numbers (B questions, A answer strings, W = the reader's
max span width):
  example_index [B] int64                 row of the question in the host-side list
  query    BERT inputs [B, Lq]
  answers  ids [B, A, W] int32, lengths [B, A] int32 (0: padding)
  gold_row [B] int32  the gold block's index row (reading-comprehension stage), -1: none
  bm25     block_ids [B, Kb] int64, scores [B, Kb] float32   (BM25 retrieval only)
"""
import dataclasses
import json
import logging
from typing import Optional, Protocol, Sequence

import numpy as np
import tensorflow as tf

from realm_tf.corpus import readers
from realm_tf.io import storage
from realm_tf.text import answers as answers_lib
from realm_tf.text.tokenization import Tokenizer


class LexicalSearch(Protocol):
  """What the inputs need of a sparse retriever (realm_tf.retrieval.bm25.BM25Retriever):
  its top-k is computed once on the host and fed to the reader as features."""

  def search(self, questions: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
    """(block ids [Q, k] int64, scores [Q, k] float32), best first."""


@dataclasses.dataclass
class QAExample:
  question: str
  answers: list[str]  # strings, or patterns when the set's answers are regexes
  targets: list[str] = dataclasses.field(default_factory=list)  # strings to locate
  title: str = ""  # the source article, where the question set records it


# A question line is a sentence and a few answers; anything near this is not a question.
MAX_QUESTION_RECORD_BYTES = 1 << 20


def read_questions(path: str, regex: bool = False, limit: int = 0,
                   max_record_bytes: int = MAX_QUESTION_RECORD_BYTES) -> list[QAExample]:
  """Reads a question file in the NQ-Open JSON lines layout (module docstring).

  Lines are read with a byte bound (storage.open_buffered + readers.bounded_lines), so an
  enormous or unterminated line costs at most the bound in memory before it is refused.

  Args:
    path: the file (any TF file system).
    regex: answers are regular expressions (CuratedTREC); each is compiled to check it.
    limit: read at most this many questions (0: all).
    max_record_bytes: the longest line accepted.

  Returns:
    One QAExample per non-empty line.

  Raises:
    ValueError: naming the file and line, for a bad record (too long, not UTF-8 or
      valid Unicode, not JSON, without a question or answers, or a pattern that does
      not compile); or a file without questions.
  """
  examples = []
  with storage.open_buffered(path) as f:
    for line_number, (raw, overlong) in enumerate(
        readers.bounded_lines(f, max_record_bytes), 1):
      where = f"{path}:{line_number}"
      if overlong:
        raise ValueError(f"{where}: the record is longer than {max_record_bytes} bytes")
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise ValueError(f"{where}: not UTF-8 ({e})") from None
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except ValueError as e:  # JSONDecodeError, or an integer past Python's digit limit
        raise ValueError(f"{where}: not JSON ({e})") from None
      except RecursionError:
        raise ValueError(f"{where}: not JSON (nested too deeply)") from None
      if not isinstance(record, dict):
        raise ValueError(f"{where}: expected an object with 'question' and 'answer'")
      question, answer = record.get("question"), record.get("answer")
      if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{where}: 'question' must be a non-empty string")
      if isinstance(answer, str):
        answer = [answer]
      if (not isinstance(answer, list) or not answer
          or not all(isinstance(a, str) for a in answer)):
        raise ValueError(f"{where}: 'answer' must be a non-empty list of strings")
      title = record.get("title")
      title = title if isinstance(title, str) else ""
      try:  # JSON's \\u escapes can spell lone surrogates, which no later step can encode
        for text in [question, title, *answer]:
          text.encode("utf-8")
      except UnicodeEncodeError as e:
        raise ValueError(f"{where}: a string is not valid Unicode ({e})") from None
      if regex:
        for pattern in answer:
          try:
            answers_lib.compile_pattern(pattern)
          except Exception as e:  # pylint: disable=broad-except
            raise ValueError(f"{where}: {e}") from e
      examples.append(QAExample(question.strip(), list(answer), title=title))
      if limit and len(examples) >= limit:
        break
  if not examples:
    raise ValueError(f"{path}: no questions")
  return examples


def add_targets(examples: Sequence[QAExample], regex: bool, corpus_texts: Sequence[str],
                max_answers: int):
  """Fills each example's `targets`: the strings its answer spans must equal."""
  corpus_text = "\n".join(corpus_texts) if regex else ""
  for example in examples:
    strings = (answers_lib.expand_patterns(example.answers, corpus_text, max_answers)
               if regex else example.answers)
    example.targets = answers_lib.answer_variants(strings)[:max_answers]


def tokenize_targets(examples: Sequence[QAExample], tokenizer: Tokenizer, max_answers: int,
                     width: int) -> tuple[np.ndarray, np.ndarray]:
  """[Q, A, W] wordpieces and [Q, A] lengths of each example's targets. Targets longer
  than W wordpieces are left out: no span of the reader could equal them."""
  ids = np.zeros([len(examples), max_answers, width], np.int32)
  lengths = np.zeros([len(examples), max_answers], np.int32)
  flat = [t for e in examples for t in e.targets]
  owners = [i for i, e in enumerate(examples) for _ in e.targets]
  if not flat:
    return ids, lengths
  pieces = tokenizer.tokenize(tf.constant(flat))  # [T, (n)]
  piece_lengths = pieces.row_lengths().numpy()
  dense = pieces.to_tensor(shape=[len(flat), width]).numpy()  # [T, W], cut to W
  slot = np.zeros(len(examples), np.int64)
  for row, owner in enumerate(owners):
    n = piece_lengths[row]
    if 0 < n <= width and slot[owner] < max_answers:
      ids[owner, slot[owner]] = dense[row]
      lengths[owner, slot[owner]] = n
      slot[owner] += 1
  return ids, lengths


@dataclasses.dataclass
class QASet:
  """Examples plus everything their batches need, computed once on the host."""
  examples: list[QAExample]
  answer_ids: np.ndarray  # [Q, A, W]
  answer_lengths: np.ndarray  # [Q, A]
  bm25_block_ids: Optional[np.ndarray] = None  # [Q, Kb]
  bm25_scores: Optional[np.ndarray] = None  # [Q, Kb]
  gold_rows: Optional[np.ndarray] = None  # [Q] int32, -1: no gold block

  def __len__(self) -> int:
    return len(self.examples)

  @property
  def located(self) -> float:
    """Fraction of questions with at least one target string (before retrieval)."""
    return float(np.mean(self.answer_lengths.max(axis=1) > 0))


def find_gold_rows(examples: Sequence[QAExample], titles: Sequence[str],
                   texts: Sequence[str], regex: bool) -> np.ndarray:
  """[Q] int32: for each question, the first block (index row) of its own article that
  contains an answer (answers.contains_answer: the recall@k rule), -1 when the question
  has no title or no such block.

  This is the reading-comprehension stage's input: SQuAD-open questions were written from
  one paragraph of the article named by 'title', so a block of that article with the answer
  string is (nearly always) the passage the question was asked about.
  """
  by_title: dict[str, list[int]] = {}
  for row, title in enumerate(titles):
    by_title.setdefault(title, []).append(row)
  gold = np.full([len(examples)], -1, np.int32)
  for i, example in enumerate(examples):
    for row in by_title.get(example.title, []) if example.title else []:
      if answers_lib.contains_answer(texts[row], example.answers, regex):
        gold[i] = row
        break
  return gold


def build_qa_set(examples: list[QAExample], tokenizer: Tokenizer, corpus_texts: Sequence[str],
                 regex: bool, max_answers: int, width: int,
                 bm25: Optional[LexicalSearch] = None, bm25_k: int = 0,
                 corpus_titles: Sequence[str] = ()) -> QASet:
  """Everything the batches of `examples` need, computed once on the host.

  Args:
    examples: the questions (read_questions).
    tokenizer: the run's Tokenizer.
    corpus_texts: every block's text, in index row order (needed for regex sets and for
      gold blocks).
    regex: answers are patterns (expanded into the strings they match in the corpus).
    max_answers: A, answer strings kept per question.
    width: W, the reader's max span width (longer answer strings cannot be located).
    bm25: a lexical searcher for BM25 retrieval, or None.
    bm25_k: its top-k per question.
    corpus_titles: every block's title, in index row order (gold blocks need both).

  Returns:
    The QASet: answer ids [Q, A, W] and lengths [Q, A], gold rows if questions carry
    titles, BM25 results if asked.
  """
  add_targets(examples, regex, corpus_texts, max_answers)
  ids, lengths = tokenize_targets(examples, tokenizer, max_answers, width)
  qa_set = QASet(examples, ids, lengths)
  if len(corpus_titles) and any(e.title for e in examples):
    qa_set.gold_rows = find_gold_rows(examples, corpus_titles, corpus_texts, regex)
    logging.info("%.1f%% of the questions have a gold block",
                 100 * float(np.mean(qa_set.gold_rows >= 0)))
  if bm25 is not None:
    qa_set.bm25_block_ids, qa_set.bm25_scores = bm25.search(
        [e.question for e in examples], bm25_k)
  logging.info("%d questions, %.1f%% with answer strings to locate", len(qa_set),
               100 * qa_set.located)
  return qa_set


def qa_dataset(qa_set: QASet, tokenizer: Tokenizer, query_seq_length: int, batch_size: int,
               training: bool, seed: int = 0, skip_batches: int = 0,
               input_context: Optional[tf.distribute.InputContext] = None) -> tf.data.Dataset:
  """Batches of the features listed in the module docstring.

  Training: sharded by input pipeline, repeated, shuffled in a fixed order per seed,
  fixed-size batches, resumable by skipping `skip_batches`. Evaluation: every question
  once, in order, the last batch partial. The question strings are tokenized inside the
  dataset function; only numbers leave it.
  """
  columns = dict(example_index=np.arange(len(qa_set), dtype=np.int64),
                 question=np.array([e.question for e in qa_set.examples], object),
                 answers=dict(ids=qa_set.answer_ids, lengths=qa_set.answer_lengths))
  columns["gold_row"] = (qa_set.gold_rows if qa_set.gold_rows is not None
                         else np.full([len(qa_set)], -1, np.int32))
  if qa_set.bm25_block_ids is not None:
    columns["bm25"] = dict(block_ids=qa_set.bm25_block_ids, scores=qa_set.bm25_scores)
  dataset = tf.data.Dataset.from_tensor_slices(columns)
  if input_context is not None and input_context.num_input_pipelines > 1:
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
  if training:
    dataset = dataset.repeat().shuffle(max(len(qa_set), 1), seed=seed,
                                       reshuffle_each_iteration=True)
  dataset = dataset.batch(batch_size, drop_remainder=training)
  if training and skip_batches:
    dataset = dataset.skip(skip_batches)

  def pack(batch):
    batch = dict(batch)
    query = tokenizer.encode(batch.pop("question"), query_seq_length).as_dict()
    for value in query.values():  # the batch size stays static ([B, Lq])
      value.set_shape(batch["example_index"].shape.concatenate([query_seq_length]))
    batch["query"] = query
    return batch

  return dataset.map(pack, num_parallel_calls=tf.data.AUTOTUNE,
                     deterministic=True).prefetch(2)
