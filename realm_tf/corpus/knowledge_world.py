"""A seeded synthetic world whose facts can only be known by retrieving and reading.

Why: on real Wikipedia at this machine's compute, REALM cannot be told apart from its
ablations (masked spans are mostly guessable or unanswerable). Here every entity is
invented (its name built from random syllables, so no warm start knows it) and has a few
attributes drawn from closed sets (a birthplace among towns, an occupation, a birth year;
every value one wordpiece, see TOWNS), so the MLM head only has to pick one of a few
values, and *which* one is written nowhere but in the entity's block of Z.

  Z  one block per entity stating all its facts in two sentences (blocks_per_entity 2:
     two such blocks, each in its own wording, as two sources would), plus distractors:
     namesake blocks (the same first name, another family name, other facts) and blocks
     about the towns.
  X  sentences about the entities in other wordings than Z, the attribute value the salient
     span (masked by salient-span masking); each X sentence has block_id -1 (it comes from
     no block of Z), so the entity's block may be retrieved.
  Held out: for every entity one attribute never appears in X; its sentences (in the
     wordings X uses) can only be answered by retrieving and reading the entity's block.

Written in the corpus pipeline's layout through realm_tf.corpus.schema (blocks-*,
pretraining-* for X, heldout-* for the held-out sentences, ict-* for an optional ICT warm
start), questions-{train,heldout}.jsonl for Open-QA ({"question", "answer"}: the pairs in
X for fine-tuning, the held-out pairs for evaluation) plus world.json naming each held-out sentence's gold block, so
`python -m realm_tf.train --experiment realm/pretrain` trains on it unchanged. It lives in
realm_tf (not benchmarks) because the demo, which may not import benchmarks, shows it too.
"""
import dataclasses
import functools
import hashlib
import json
import os
import random
from typing import Dict, List, Sequence

import tensorflow as tf

from realm_tf.corpus import published, schema
from realm_tf.pretrained.minilm import minilm_vocab_file

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br",
           "dr", "gr", "kl", "st", "th", "tr", "vr")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ou", "y")
_CODAS = ("", "", "", "n", "r", "l", "s", "th", "x")

OCCUPATIONS = ("baker", "weaver", "sailor", "miner", "potter", "tailor", "farmer", "painter",
               "carpenter", "butcher", "merchant", "hunter")
# Every value is one wordpiece of the uncased vocabulary (tests check it). Why: a masked
# span's [MASK] count is the answer's wordpiece count, so values of unequal lengths leak
# the answer (a reader that narrows the values to those of the right length scores well
# above chance without reading the block), and a one-piece value is copied from the block
# by one attention lookup, where a multi-piece one needs the pieces in order. The towns are
# real names: what no model can know is which of them an invented entity was born in.
TOWNS = ("york", "bristol", "dover", "leeds", "oxford", "cardiff", "bath", "durham",
         "exeter", "norwich", "chester", "lincoln", "salisbury", "windsor", "brighton",
         "derby", "hull", "cambridge", "glasgow", "dublin", "aberdeen", "perth", "ipswich",
         "plymouth", "swansea", "bedford", "carlisle", "preston", "lancaster", "dundee")
ATTRIBUTES = ("birthplace", "occupation", "year")
LABELS = {"birthplace": "LOC", "occupation": "MISC", "year": "DATE"}

# Z states an entity's facts in two short sentences, X (training and held out alike) in
# other ways. Two, so ICT has a query and a rest; each names the entity in full, so either
# finds the block (with the first name alone in the second, ICT's own-block top-1 on
# held-out sentences roughly halved). Short (about 20 wordpieces), so the reader's sequence
# is 48 and the one value it must find has few wordpieces around it.
_BLOCK_TEXTS = (("{name} was born in {birthplace} in {year}.",
                 "{name} worked as a {occupation}."),
                # A second source's wording (blocks_per_entity 2), unlike X's too.
                ("{name} was a {occupation} from {birthplace}.",
                 "{name} was born in the year {year}."))
_X_TEMPLATES = {
    "birthplace": ("The home town of {name} is {value}.",
                   "{name} grew up in {value} as a child.",
                   "People say {name} came from {value}."),
    "occupation": ("By trade, {name} was a {value}.",
                   "{name} earned a living as a {value}.",
                   "Everyone knew {name} as the local {value}."),
    "year": ("{name} came into the world in {value}.",
             "The birth of {name} took place in {value}.",
             "In {value}, {name} was born."),
}
_TOWN_BLOCK = "{town} is a small market town. Its people hold a fair every spring."
# Open-QA questions on the same facts ({"question", "answer"} JSON lines).
QUESTIONS = {
    "birthplace": "Where was {name} born?",
    "occupation": "What did {name} work as?",
    "year": "In what year was {name} born?",
}


def invented_word(rng: random.Random, syllables: int) -> str:
  """A capitalised word of random syllables (onset + vowel [+ coda])."""
  word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables))
  return (word + rng.choice(_CODAS)).capitalize()


@dataclasses.dataclass(frozen=True)
class Entity:
  first: str
  last: str
  facts: Dict[str, str]  # attribute → value
  held_out: str  # the attribute never stated in X

  @property
  def name(self) -> str:
    return f"{self.first} {self.last}"


@dataclasses.dataclass(frozen=True)
class WorldConfig:
  """Sizes of the world; every draw is made from `seed`."""
  seed: int = 0
  entities: int = 24
  towns: int = 6
  occupations: int = 6
  years: int = 6
  # Namesakes: blocks for other people sharing an entity's first name (fraction of entities).
  namesake_fraction: float = 0.5
  town_blocks: bool = True
  # Wordings per (entity, attribute) pair (of _X_TEMPLATES' three), in X and held out.
  x_templates: int = 3
  # Blocks stating all of an entity's facts, each in its own wording (_BLOCK_TEXTS). Why
  # 2: under REALM's gradient a retrieved block that does not help is pushed down until
  # another takes its place, so with one helpful block per query the k=2 candidate set's
  # second slot churns as long as the retriever trains, refreshed index or not
  # (benchmarks.knowledge_staleness measures staleness as top-k overlap); with two
  # sources both retrieved blocks help and the pair is stable.
  blocks_per_entity: int = 1

  def __post_init__(self):
    if not 1 <= self.blocks_per_entity <= len(_BLOCK_TEXTS):
      raise ValueError(f"blocks_per_entity must be 1 to {len(_BLOCK_TEXTS)}, got "
                       f"{self.blocks_per_entity}")


@functools.lru_cache(maxsize=1)
def _vocabulary() -> frozenset:
  """The uncased WordPiece vocabulary: an invented word must not be one of its words."""
  with tf.io.gfile.GFile(minilm_vocab_file()) as f:
    return frozenset(line.strip() for line in f)


def one_piece_years(first: int = 1600, last: int = 1900) -> List[int]:
  """The years in [first, last) that are one wordpiece."""
  return [y for y in range(first, last) if str(y) in _vocabulary()]


def _unique_words(rng: random.Random, count: int, syllables: Sequence[int], taken: set) -> list:
  out = []
  while len(out) < count:
    word = invented_word(rng, rng.choice(syllables))
    if word.lower() not in taken and word.lower() not in _vocabulary():
      taken.add(word.lower())
      out.append(word)
  return out


def make_world(config: WorldConfig = WorldConfig()) -> dict:
  """The world as plain data: entities, towns, blocks, x, held-out (no files)."""
  rng = random.Random(config.seed)
  taken: set = set(OCCUPATIONS) | set(TOWNS)
  towns = [t.capitalize() for t in rng.sample(TOWNS, config.towns)]
  firsts = _unique_words(rng, config.entities, (2,), taken)
  lasts = _unique_words(rng, config.entities * 2, (2,), taken)
  years = sorted(rng.sample(one_piece_years(), config.years))
  values = dict(birthplace=towns, occupation=list(OCCUPATIONS[:config.occupations]),
                year=[str(y) for y in years])
  entities = []
  for i in range(config.entities):
    facts = {a: rng.choice(values[a]) for a in ATTRIBUTES}
    entities.append(Entity(firsts[i], lasts[i], facts, held_out=ATTRIBUTES[i % len(ATTRIBUTES)]))

  blocks, gold = [], {}  # gold: entity name → its blocks' ids (each states every fact)
  for e in entities:
    gold[e.name] = _add_entity_blocks(blocks, e.name, e.facts, config.blocks_per_entity)
  # Namesakes: the same first name, another family name, independently drawn facts.
  namesakes = rng.sample(entities, int(round(config.namesake_fraction * len(entities))))
  for n, e in enumerate(namesakes):
    name = f"{e.first} {lasts[config.entities + n]}"
    facts = {a: rng.choice(values[a]) for a in ATTRIBUTES}
    _add_block(blocks, name, _block_sentences(name, facts, 0))
  if config.town_blocks:
    for town in towns:
      _add_block(blocks, town, [_TOWN_BLOCK.format(town=town)])

  x = []
  for e in entities:
    for a in ATTRIBUTES:
      if a != e.held_out:
        x.extend(_sentence(t, e, a, gold[e.name]) for t in _X_TEMPLATES[a][:config.x_templates])
  # The same wordings as X: what sets a held-out sentence apart is only that its fact was
  # never stated in X (a new wording would test paraphrase too, confounding the two).
  held_out = [_sentence(t, e, e.held_out, gold[e.name])
              for e in entities for t in _X_TEMPLATES[e.held_out][:config.x_templates]]
  rng.shuffle(x)
  return dict(config=dataclasses.asdict(config), towns=towns, values=values,
              entities=[dict(name=e.name, facts=e.facts, held_out=e.held_out,
                             block_id=gold[e.name][0], block_ids=gold[e.name])
                        for e in entities],
              blocks=blocks, x=x, held_out=held_out)


def edit_world(world: dict, seed: int = 0) -> dict:
  """The world after an edit of Z: every entity's held-out attribute gets another value of
  its closed set, written into the entity's block(s), and the held-out sentences follow
  the new values; X and every other block are unchanged. A revised block is a new document to
  the corpus schema (its doc_uid and block_id hash its text), so it gets new ids, in the
  old one's place; each held-out row keeps the value it had as `old_value`.

  Why: the knowledge lives in the corpus. A model that reads its retrieved block answers
  the held-out sentences with the new values once the index holds the edited blocks, with
  no parameter changed; one that memorised answers keeps the old ones."""
  rng = random.Random(seed)
  revised, new_facts, new_ids, entities = {}, {}, {}, []
  for e in world["entities"]:
    attribute = e["held_out"]
    choices = [v for v in world["values"][attribute] if v != e["facts"][attribute]]
    facts = dict(e["facts"], **{attribute: rng.choice(choices)})
    new_facts[e["name"]] = facts
    rewritten = []
    ids = _add_entity_blocks(rewritten, e["name"], facts, len(e["block_ids"]))
    for old, block in zip(e["block_ids"], rewritten):
      new_ids[old], revised[old] = block["block_id"], block
    entities.append(dict(e, facts=facts, block_id=ids[0], block_ids=ids,
                         old_facts=e["facts"], old_block_id=e["block_id"]))
  held_out = []
  for row in world["held_out"]:
    template = next(t for t in _X_TEMPLATES[row["attribute"]]
                    if t.format(name=row["entity"], value=row["value"]) == row["text"])
    entity = Entity(*row["entity"].split(" ", 1), new_facts[row["entity"]], row["attribute"])
    held_out.append(dict(_sentence(template, entity, row["attribute"],
                                   [new_ids[b] for b in row["gold_block_ids"]]),
                         old_value=row["value"]))
  return dict(world, entities=entities, held_out=held_out,
              blocks=[revised.get(b["block_id"], b) for b in world["blocks"]],
              edit=dict(seed=seed, revised_blocks=len(revised)))


def _block_sentences(name: str, facts: Dict[str, str], wording: int) -> List[str]:
  return [t.format(name=name, **facts) for t in _BLOCK_TEXTS[wording]]


def _add_entity_blocks(blocks: list, name: str, facts: Dict[str, str],
                       count: int) -> List[int]:
  """An entity's `count` blocks (each stating every fact, in wordings 0..count-1) appended to
  `blocks`; returns their ids."""
  return [_add_block(blocks, name, _block_sentences(name, facts, w)) for w in range(count)]


def _add_block(blocks: list, title: str, sentences: List[str]) -> int:
  text = " ".join(sentences)
  uid = hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()
  block_id = int(hashlib.sha1(f"{uid}:0".encode()).hexdigest()[:15], 16)
  blocks.append(dict(block_id=block_id, doc_uid=uid, title=title, text=text))
  return block_id


def _sentence(template: str, entity: Entity, attribute: str, gold_blocks: List[int]) -> dict:
  """One X / held-out sentence; the attribute value is its only salient span. gold_block_ids:
  the entity's blocks (each states the fact); gold_block_id: the first of them."""
  value = entity.facts[attribute]
  text = template.format(name=entity.name, value=value)
  start = text.encode().index(value.encode())
  return dict(text=text, entity=entity.name, attribute=attribute, value=value,
              gold_block_id=gold_blocks[0], gold_block_ids=list(gold_blocks), start=start,
              end=start + len(value.encode()))


def questions(world: dict, held_out: bool) -> List[dict]:
  """Open-QA questions, one per (entity, attribute) pair: the pairs stated in X (held_out
  False: fine-tuning) or the held-out pairs, whose answers are only in Z (True). Each row:
  {"question", "answer": [value], "title": the entity (its block's title)}."""
  rows = []
  for e in world["entities"]:
    for a in ATTRIBUTES:
      if (a == e["held_out"]) == held_out:
        rows.append(dict(question=QUESTIONS[a].format(name=e["name"]),
                         answer=[e["facts"][a]], title=e["name"]))
  return rows


def _pretraining_record(row: dict) -> dict:
  # block_id -1: x comes from no block of Z, so retrieval may return the entity's block.
  return dict(text=row["text"], block_id=-1, doc_uid="x:" + row["entity"],
              salient_span_starts=[row["start"]], salient_span_ends=[row["end"]],
              salient_span_labels=[LABELS[row["attribute"]]])


def write_world(directory: str, config: WorldConfig = WorldConfig()) -> dict:
  """blocks-*, pretraining-* (X), heldout-* and ict-* TFRecords and world.json in
  `directory`; returns the world (make_world) with the file patterns added."""
  return write_files(directory, make_world(config))


def write_files(directory: str, world: dict) -> dict:
  """A world (make_world's, or edit_world's) written as write_world describes."""
  world = dict(world)
  rng = random.Random(world["config"]["seed"] + 1)
  ict = []
  for block in world["blocks"]:  # ICT: one sentence of the block against the rest of it
    sentences = [s if s.endswith(".") else s + "." for s in block["text"].split(". ")]
    query = rng.choice(sentences)
    rest = " ".join(s for s in sentences if s != query) or block["text"]
    ict.append(dict(query=query, query_removed=1, block_id=block["block_id"],
                    doc_uid=block["doc_uid"], title=block["title"], text=rest))
  outputs = dict(blocks=(world["blocks"], schema.BLOCK),
                 pretraining=([_pretraining_record(r) for r in world["x"]],
                              schema.PRETRAINING),
                 heldout=([_pretraining_record(r) for r in world["held_out"]],
                          schema.PRETRAINING),
                 ict=(ict, schema.ICT))
  patterns = {name: os.path.join(directory, f"{name}-*") for name in outputs}
  texts = {}
  for name, held_out in (("train", False), ("heldout", True)):
    texts[f"questions-{name}.jsonl"] = "".join(
        json.dumps(q) + "\n" for q in questions(world, held_out))
    patterns[f"questions_{name}"] = os.path.join(directory, f"questions-{name}.jsonl")
  world["files"] = patterns
  texts["world.json"] = json.dumps(world, indent=1)
  # Published as the corpus pipeline publishes (manifest.json last): readers open a
  # corpus only through its manifest (gs:// as well as local disk).
  published.publish_records(directory, outputs, dict(kind="knowledge_world"), texts)
  return world
