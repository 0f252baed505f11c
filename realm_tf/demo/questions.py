"""Questions from the corpus itself: cloze questions on salient spans, for fine-tuning when
no QA data is at hand, and the held-out masked sentences the demo fills in.

A cloze question is a corpus sentence with one salient span blanked out ("___ is the
capital of France." → "Paris"). Its source block states the answer, so answering from that
block would only be copying. A candidate is therefore kept only if ANOTHER block of the
corpus contains the answer: its words as a contiguous, case-insensitive, word-bounded
sequence (the reader's uncased match, approximately), so that the question can be
answered from knowledge found elsewhere; `answer_block_ids` records where else the answer
is. The demo then leaves every question's source block out of the corpus that fine-tuning,
the export and the server search (realm_tf.demo.pipeline, the data stage), so no answer is
read from the block its question was made from.

Everything here is plain Python over plain records (realm_tf.demo.records reads and
writes the TFRecords and JSON lines).
"""
import dataclasses
import random
import re
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

from realm_tf.corpus.sentences import split_sentences

BLANK = "___"
_WORD = re.compile(r"\w+")
# A sentence that starts by pointing back ("It lies on the river ___.") names nothing a
# reader could retrieve by: such sentences give no question.
_POINTS_BACK = frozenset("it its he his she her they their this these those there".split())


def answer_key(text: str) -> Tuple[str, ...]:
  """The answer's words, lower-cased: what 'contains the answer' compares."""
  return tuple(w.lower() for w in _WORD.findall(text))


def states(words: Sequence[str], key: Tuple[str, ...]) -> bool:
  """Whether `key` occurs in `words` as a contiguous sequence."""
  return any(tuple(words[i:i + len(key)]) == key for i in range(len(words) - len(key) + 1))


@dataclasses.dataclass(frozen=True)
class Block:
  block_id: int
  title: str
  text: str


@dataclasses.dataclass(frozen=True)
class Sentence:
  """A pre-training example: x with its salient spans (character offsets into text)."""
  text: str
  block_id: int
  doc_uid: str
  spans: Tuple[Tuple[int, int, str], ...]  # (start, end, label)


@dataclasses.dataclass(frozen=True)
class Cloze:
  """One blanked span of one sentence, and the blocks other than its own that hold it."""
  question: str
  answer: str
  label: str
  sentence: Sentence
  span: Tuple[int, int, str]  # the span in sentence.text
  source_block_id: int
  answer_block_ids: Tuple[int, ...]

  def as_json(self, titles: Optional[Dict[int, str]] = None) -> dict:
    """The NQ-Open layout {"question", "answer"} plus where it came from (readers of
    question files ignore the extra keys)."""
    titles = titles or {}
    return {"question": self.question, "answer": [self.answer], "label": self.label,
            "source_block_id": self.source_block_id,
            "source_title": titles.get(self.source_block_id, ""),
            "answer_block_ids": list(self.answer_block_ids)}


class AnswerLocator:
  """Which blocks contain each of a set of answers (word n-grams of the block bodies).

  Only the n-grams that are some wanted answer are recorded, so memory is bounded by the
  answers, not by the corpus.
  """

  def __init__(self, blocks: Iterable[Block], answers: Iterable[str]):
    wanted = {key for key in map(answer_key, answers) if key}
    self._max_words = max((len(k) for k in wanted), default=0)
    self._blocks: Dict[Tuple[str, ...], Set[int]] = {key: set() for key in wanted}
    for block in blocks:
      words = answer_key(block.text)
      for n in range(1, self._max_words + 1):
        for i in range(len(words) - n + 1):
          found = self._blocks.get(tuple(words[i:i + n]))
          if found is not None:
            found.add(block.block_id)

  def blocks_with(self, answer: str) -> Set[int]:
    return set(self._blocks.get(answer_key(answer), ()))


def _sentences_with_offsets(text: str) -> Iterator[Tuple[int, str]]:
  """(character offset, sentence) of each sentence of a pre-training example."""
  position = 0
  for sentence in split_sentences(text):
    start = text.find(sentence, position)
    if start < 0:  # whitespace differs from the split: give up on exact offsets
      return
    yield start, sentence
    position = start + len(sentence)


def cloze_candidates(sentences: Iterable[Sentence], max_answer_words: int = 4,
                     min_context_words: int = 4, max_question_words: int = 24
                     ) -> Iterator[Tuple[Sentence, Tuple[int, int, str], str, str]]:
  """(sentence, span, question, answer) for every usable span, before the other-block
  check: the answer has 1..max_answer_words words; its own sentence, blanked, has at least
  min_context_words other words, at most max_question_words in all, does not start with a
  pronoun (it says nothing of what it is about) and does not state the answer again."""
  for example in sentences:
    for start, sentence in _sentences_with_offsets(example.text):
      end = start + len(sentence)
      for span in example.spans:
        span_start, span_end, _ = span
        if not (start <= span_start and span_end <= end):
          continue
        answer = example.text[span_start:span_end]
        key = answer_key(answer)
        if not key or len(key) > max_answer_words or len(answer) < 2:
          continue
        question = (sentence[:span_start - start] + BLANK + sentence[span_end - start:])
        context = answer_key(question)
        if not min_context_words <= len(context) <= max_question_words:
          continue
        if context[0] in _POINTS_BACK:
          continue
        if states(context, key):
          continue  # "___ (Paris) ..." : the answer is in the question
        yield example, span, question, answer


def cloze_questions(sentences: Sequence[Sentence], blocks: Sequence[Block],
                    **limits) -> List[Cloze]:
  """Every cloze question whose answer another block contains (see the module docstring),
  in input order, each question text once."""
  candidates = list(cloze_candidates(sentences, **limits))
  locator = AnswerLocator(blocks, [answer for _, _, _, answer in candidates])
  seen: Set[str] = set()
  questions = []
  for sentence, span, question, answer in candidates:
    elsewhere = locator.blocks_with(answer) - {sentence.block_id}
    if not elsewhere or question in seen:
      continue
    seen.add(question)
    questions.append(Cloze(question, answer, span[2], sentence, span, sentence.block_id,
                           tuple(sorted(elsewhere))))
  return questions


def pick_diverse(items: Sequence[Cloze], count: int, seed: int) -> List[Cloze]:
  """`count` items in a seeded order, different labels and source blocks first."""
  order = list(items)
  random.Random(seed).shuffle(order)
  picked: List[Cloze] = []
  labels: Set[str] = set()
  blocks: Set[int] = set()
  for strict in (True, False):
    for item in order:
      if len(picked) == count:
        return picked
      if item in picked:
        continue
      if strict and (item.label in labels or item.source_block_id in blocks):
        continue
      picked.append(item)
      labels.add(item.label)
      blocks.add(item.source_block_id)
  return picked


def answerable_without_sources(groups: Sequence[Sequence[Cloze]]) -> List[List[Cloze]]:
  """The questions of `groups` (taken in order, groups first to last) that stay answerable
  once every kept question's source block leaves the corpus: one is kept only if, with its
  own source block and all kept ones removed, its answer and every kept answer are still in
  some block. Greedy, so earlier groups (the held-out questions) are favoured."""
  sources: Set[int] = set()
  kept_all: List[Cloze] = []
  out = []
  for group in groups:
    kept = []
    for question in group:
      removed = sources | {question.source_block_id}
      if all(set(k.answer_block_ids) - removed for k in kept_all + [question]):
        sources = removed
        kept.append(question)
        kept_all.append(question)
    out.append(kept)
  return out


@dataclasses.dataclass
class Split:
  """The demo's division of the corpus's sentences and questions."""
  masked_heldout: List[Cloze]  # sentences never trained on, masked at one span
  pretraining: List[Sentence]  # what pre-training reads (held-out sentences removed)
  train_questions: List[Cloze]
  heldout_questions: List[Cloze]  # never trained on: evaluated and asked


def split_corpus(sentences: Sequence[Sentence], blocks: Sequence[Block],
                 num_masked: int, num_heldout_questions: int, max_train_questions: int,
                 seed: int = 0,
                 can_mask: Optional[Callable[[Sequence[Cloze]], List[bool]]] = None,
                 **limits) -> Split:
  """Held-out masked sentences (sentences with a span whose answer another block holds
  and the rest of the sentence does not state, and, if given, for which `can_mask` says
  the span can be masked), the rest for
  pre-training; cloze questions from the pre-training sentences, split into held-out and
  training questions (at most half of them held out). No held-out sentence gives a
  training question, and no held-out question shares its sentence with a training one.
  Every question stays answerable with all the questions' source blocks left out of the
  corpus (answerable_without_sources), which is how the demo fine-tunes and serves them."""
  candidates = cloze_questions(sentences, blocks, **limits)
  # The whole of x is read when masked: it must not state the answer elsewhere either.
  maskable = [c for c in candidates if not states(
      answer_key(c.sentence.text[:c.span[0]] + " " + c.sentence.text[c.span[1]:]),
      answer_key(c.answer))]
  if can_mask is not None:
    maskable = [c for c, ok in zip(maskable, can_mask(maskable)) if ok]
  masked = pick_diverse(maskable, num_masked, seed)
  masked_texts = {c.sentence.text for c in masked}
  pretraining = [s for s in sentences if s.text not in masked_texts]
  questions = [c for c in candidates if c.sentence.text not in masked_texts]
  heldout = pick_diverse(questions, min(num_heldout_questions, len(questions) // 2), seed + 1)
  heldout_texts = {c.sentence.text for c in heldout}
  train = [c for c in questions if c.sentence.text not in heldout_texts]
  random.Random(seed + 2).shuffle(train)
  heldout, train = answerable_without_sources([heldout, train[:max_train_questions]])
  return Split(masked, pretraining, train, heldout)


def violations(questions: Iterable[dict], blocks: Sequence[Block]) -> List[str]:
  """Questions (as written by Cloze.as_json) with no answer-bearing block other than their
  source, checked from scratch against the block texts with a regular expression; []
  when the rule holds."""
  bad = []
  for q in questions:
    answer = q["answer"][0]
    words = answer_key(answer)
    pattern = re.compile(r"(?<!\w)" + r"\W+".join(map(re.escape, words)) + r"(?!\w)",
                         re.IGNORECASE)
    if not any(b.block_id != q["source_block_id"] and pattern.search(b.text)
               for b in blocks):
      bad.append(f"{q['question']!r} → {answer!r}: only its own block "
                 f"{q['source_block_id']} holds the answer")
  return bad
