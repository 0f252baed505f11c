"""The demo's cloze questions: never answerable only from the block they were made from."""
from realm_tf.demo.questions import (
    BLANK, Block, Cloze, Sentence, answer_key, answerable_without_sources, cloze_questions,
    pick_diverse, split_corpus, violations)


def _sentence(text, block_id, *spans, label="TITLE"):
  found = []
  for span in spans:
    start = text.index(span)
    found.append((start, start + len(span), label))
  return Sentence(text, block_id, f"doc{block_id}", tuple(found))


BLOCKS = [
    Block(1, "Veloria", "Veloria is a country. Its capital is Talmont."),
    Block(2, "Talmont", "Talmont lies on the river Amsel in VELORIA."),
    Block(3, "Amsel", "The Amsel is long. Romeo swam in it in 1204."),
    Block(4, "Quessa", "Quessa is a small island nation far away."),
]


def test_a_question_is_kept_only_when_another_block_holds_the_answer():
  sentences = [
      _sentence("The capital is Talmont on the coast.", 1, "Talmont"),  # block 2 has it
      _sentence("Quessa is a small island nation far away.", 4, "Quessa"),  # only block 4
      _sentence("The old town of Rome was built on seven hills.", 4, "Rome"),  # "Romeo"
      _sentence("Veloria is a country in the north of the world.", 1, "Veloria"),  # "VELORIA"
  ]
  questions = cloze_questions(sentences, BLOCKS)
  got = {(q.question, q.answer, q.answer_block_ids) for q in questions}
  assert got == {(f"The capital is {BLANK} on the coast.", "Talmont", (2,)),
                 (f"{BLANK} is a country in the north of the world.", "Veloria", (2,))}
  assert all(q.source_block_id not in q.answer_block_ids for q in questions)
  assert violations([q.as_json() for q in questions], BLOCKS) == []


def test_the_check_against_the_texts_catches_an_own_block_answer():
  bad = {"question": f"{BLANK} is a small island nation.", "answer": ["Quessa"],
         "source_block_id": 4}
  good = {"question": f"The capital is {BLANK}.", "answer": ["Talmont"], "source_block_id": 1}
  assert len(violations([bad, good], BLOCKS)) == 1
  assert violations([dict(bad, source_block_id=1)], BLOCKS) == []


def test_unusable_spans_give_no_question():
  sentences = [
      # The answer stated again in the question.
      _sentence("Talmont, also called Talmont, is old and very famous.", 1, "Talmont"),
      # Too little context around the blank.
      _sentence("Talmont rocks.", 1, "Talmont"),
      # Too many words in the answer.
      _sentence("Once, in the year of 1204 when the Amsel flooded the valley, all fled.", 1,
                "the year of 1204 when"),
      # A sentence pointing back to what it is about.
      _sentence("It lies on the river Amsel in the far north.", 1, "Amsel"),
  ]
  assert cloze_questions(sentences, BLOCKS) == []
  # A span crossing a sentence boundary gives none either, a span in the 2nd sentence one.
  two = _sentence("Nothing is here today. Romeo swam in it in 1204 with friends.", 9,
                  "1204", label="DATE")
  across = _sentence("Nothing is here today. Romeo swam in it in 1204 with friends.", 9,
                     "today. Romeo", label="DATE")
  got = cloze_questions([two, across], BLOCKS)
  assert [(q.question, q.answer, q.label) for q in got] == [
      (f"Romeo swam in it in {BLANK} with friends.", "1204", "DATE")]


def test_split_keeps_held_out_sentences_and_questions_apart():
  cities = ["Talmont", "Ruvik", "Sennet", "Orlamb", "Kestrel", "Dunmere", "Valcor", "Lisk"]
  blocks = [Block(100 + i, c, f"{c} is a city with a harbour and a market.")
            for i, c in enumerate(cities)]
  months = ["January", "March", "April", "June", "July", "August", "October", "December"]
  sentences = [_sentence(f"Travellers from afar often visit {c} in {m} and stay.", i, c,
                         label=("DATE", "TITLE")[i % 2])
               for i, (c, m) in enumerate(zip(cities, months))]
  split = split_corpus(sentences, blocks, num_masked=2, num_heldout_questions=3,
                       max_train_questions=100, seed=0)
  assert len(split.masked_heldout) == 2 and len(split.heldout_questions) == 3
  masked = {c.sentence.text for c in split.masked_heldout}
  assert len({c.label for c in split.masked_heldout}) == 2  # diverse labels first
  assert masked.isdisjoint(s.text for s in split.pretraining)
  assert len(split.pretraining) == len(sentences) - 2
  heldout = {c.sentence.text for c in split.heldout_questions}
  train = {c.sentence.text for c in split.train_questions}
  assert len(train) == 3 and not (heldout & train) and not (masked & (heldout | train))
  rows = [c.as_json() for c in split.train_questions + split.heldout_questions]
  assert violations(rows, blocks) == []
  # A held-out masked x never states its answer outside the span.
  restated = [_sentence(f"Pilgrims often visit {c} in {m}. Few leave {c} again.", 50 + i, c)
              for i, (c, m) in enumerate(zip(cities, months))]
  assert split_corpus(restated, blocks, 2, 1, 100, seed=0).masked_heldout == []
  # ... also when a can_mask check passes every candidate (it narrows, never widens).
  assert split_corpus(restated, blocks, 2, 1, 100, seed=0,
                      can_mask=lambda c: [True] * len(c)).masked_heldout == []
  kept = split_corpus(sentences, blocks, 8, 1, 100, seed=0,
                      can_mask=lambda c: [x.answer != "Talmont" for x in c]).masked_heldout
  assert len(kept) == 7 and "Talmont" not in {c.answer for c in kept}
  # However many are asked for, at most half of the questions are held out.
  assert len(split_corpus(sentences, blocks, 2, 100, 100, seed=0).heldout_questions) == 3
  # Seeded: the same split again.
  again = split_corpus(sentences, blocks, 2, 3, 100, seed=0)
  assert again.heldout_questions == split.heldout_questions
  assert len(pick_diverse(split.train_questions, 10, 0)) == 3
  assert answer_key("A-b c") == ("a", "b", "c")


def test_questions_stay_answerable_without_every_source_block():
  # Block 1 states "Paris" and is the source of q1; block 2 is the only other holder of
  # "Paris" and the source of q2; block 3 holds "Rome" (q3's answer, q3 from block 4).
  def cloze(question, answer, source, holders):
    sentence = Sentence(f"{question} {answer}", source, f"d{source}", ())
    return Cloze(question, answer, "LOC", sentence, (0, 1, "LOC"), source, tuple(holders))
  q1 = cloze("a", "Paris", 1, [2])
  q2 = cloze("b", "Paris", 2, [1])
  q3 = cloze("c", "Rome", 4, [3])
  q4 = cloze("d", "Rome", 3, [4])
  heldout, train = answerable_without_sources([[q1], [q2, q3, q4]])
  assert heldout == [q1]
  # q2 would remove block 2, the last holder of q1's answer; q4 would remove q3's.
  assert train == [q3]
  kept = heldout + train
  sources = {q.source_block_id for q in kept}
  assert all(set(q.answer_block_ids) - sources for q in kept)
