"""An invented NER corpus in CoNLL-2003's original layout (4 columns, IOB1 tags).

Sentences come from news-like frames filled with made-up people, places, organisations and
events, so the files can ship with the tests (CoNLL-2003 itself is Reuters text, research
use only). The development and test files use names that never occur in the training file,
so a tagger trained on it has to learn entities from their context and shape, not by heart:
their scores say whether the tagger learns. Like the original release, `B-` tags appear
only where an entity directly follows another of the same type.
"""
import os
import random

# Name pieces; the generated names are not words of any language we know of.
_ONSETS = ["b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r",
           "s", "st", "t", "tr", "v", "z", "th", "sk", "ch"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ai", "ou"]
_CODAS = ["", "", "", "n", "r", "l", "s", "m", "k", "nd", "rt", "v"]

# Names that the tests put in their own sentences: never drawn for the training file.
UNSEEN_PEOPLE = ("Talvek Omrin", "Desra Quellin", "Barnet Vorsk")
UNSEEN_PLACES = ("Brosmont", "Halvigrad", "Ostrelle")
UNSEEN_ORGS = ("Kestova Holdings",)
UNSEEN = {w for name in UNSEEN_PEOPLE + UNSEEN_PLACES + UNSEEN_ORGS for w in name.split()}

_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December"]
_WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_ORG_SUFFIXES = ["United", "Bank", "Motors", "Group", "Holdings", "Airlines", "Telecom"]
_PLACE_SUFFIXES = ["", "", "", "burg", "mont", "ia", "ovo", "grad"]
_NATIONALITY_SUFFIXES = ["ian", "ese", "ish", "ic"]
_EVENT_SUFFIXES = ["Cup", "Open", "Games", "Accord"]

# Frames: {PER} person, {LOC} place, {ORG} organisation, {MISC} nationality, {EVENT} a named
# event (MISC too), {NUM} number, {DAY} weekday or date. Tokens are space-separated.
FRAMES = [
    "{PER} scored twice as {ORG} beat {ORG} {NUM} - {NUM} in {LOC} on {DAY} .",
    "{LOC} police said {PER} was arrested on {DAY} .",
    "Police in {LOC} arrested {PER} on {DAY} .",
    "The {MISC} government in {LOC} rejected the plan , officials said .",
    "Shares of {ORG} rose in {LOC} on {DAY} .",
    "Shares in {ORG} fell {NUM} percent in {LOC} trading .",
    "{PER} , the {MISC} foreign minister , will visit {LOC} next week .",
    "{ORG} said it would open a new plant near {LOC} .",
    "{PER} told reporters in {LOC} that talks with {ORG} had failed .",
    "{PER} won the {EVENT} after beating {PER} in the final .",
    "{MISC} {MISC} talks resumed in {LOC} on {DAY} .",
    "{ORG} chief executive {PER} resigned on {DAY} , the company said .",
    "In {LOC} , {NUM} people attended the {EVENT} .",
    "{PER} ( {LOC} ) beat {PER} ( {LOC} ) {NUM} - {NUM} .",
    "The {MISC} striker joined {ORG} from {ORG} .",
    "{PER} said on {DAY} that {LOC} would not sign the treaty .",
    "{PER} flew to {LOC} on {DAY} .",
    "Speaking in {LOC} , {PER} praised the {MISC} team .",
    "{PER} and {PER} will lead the {ORG} delegation to {LOC} .",
    "{ORG} shares closed at {NUM} on {DAY} .",
    "Prices rose {NUM} percent in {MONTH} , the statistics office said .",
    "The central bank left interest rates unchanged on {DAY} .",
    "Talks will resume next week , a spokesman said .",
    "{PER} , who joined {ORG} in {YEAR} , denied the report .",
]
_POS = {".": ".", ",": ",", "(": "(", ")": ")", "-": ":", "the": "DT", "The": "DT",
        "a": "DT", "in": "IN", "In": "IN", "on": "IN", "to": "TO", "from": "IN", "at": "IN",
        "near": "IN", "with": "IN", "after": "IN", "that": "IN", "and": "CC", "said": "VBD"}


def _word(rng):
  parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
           for _ in range(rng.choice([2, 2, 2, 3]))]
  return "".join(parts).capitalize()


def name_pools(seed: int = 0, size: int = 900) -> tuple[list[str], list[str]]:
  """Distinct invented words, split into a training pool and a held-out pool."""
  rng = random.Random(seed)
  words, seen = [], set(UNSEEN)
  while len(words) < size:
    word = _word(rng)
    if word not in seen and 4 <= len(word) <= 10:
      seen.add(word)
      words.append(word)
  cut = size * 2 // 3
  return words[:cut], words[cut:]


def _entity(kind, rng, pool):
  """(tokens, NER type or None) for one slot."""
  if kind == "PER":
    return ([rng.choice(pool), rng.choice(pool)] if rng.random() < 0.7
            else [rng.choice(pool)]), "PER"
  if kind == "LOC":
    return [rng.choice(pool) + rng.choice(_PLACE_SUFFIXES)], "LOC"
  if kind == "ORG":
    return [rng.choice(pool), rng.choice(_ORG_SUFFIXES)], "ORG"
  if kind == "MISC":
    return [rng.choice(pool) + rng.choice(_NATIONALITY_SUFFIXES)], "MISC"
  if kind == "EVENT":
    return [rng.choice(pool), rng.choice(_EVENT_SUFFIXES)], "MISC"
  if kind == "NUM":
    return [str(rng.randint(0, 99))], None
  if kind == "YEAR":
    return [str(rng.randint(1950, 2010))], None
  if kind == "MONTH":
    return [rng.choice(_MONTHS)], None
  if kind == "DAY":
    return ([rng.choice(_WEEKDAYS)] if rng.random() < 0.6 else
            [str(rng.randint(1, 28)), rng.choice(_MONTHS), str(rng.randint(1950, 2010))]), None
  raise ValueError(kind)


def sentence(rng, pool) -> list[tuple[str, str, str, str]]:
  """One sentence as (token, POS, chunk, IOB1 NER) rows."""
  rows, previous_type = [], None
  for piece in rng.choice(FRAMES).split():
    if piece.startswith("{"):
      tokens, kind = _entity(piece[1:-1], rng, pool)
      for i, token in enumerate(tokens):
        if kind is None:
          rows.append((token, "CD" if token.isdigit() else "NNP", "I-NP", "O"))
        else:
          # IOB1: B- only on the first token of an entity right after one of its type.
          prefix = "B-" if i == 0 and previous_type == kind else "I-"
          rows.append((token, "NNP", "I-NP", prefix + kind))
      previous_type = kind
    else:
      rows.append((piece, _POS.get(piece, "NN"), "O" if piece in _POS else "I-NP", "O"))
      previous_type = None
  return rows


def write_file(path: str, documents: int, pool: list[str], seed: int) -> None:
  rng = random.Random(seed)
  with open(path, "w", encoding="utf-8") as f:
    for _ in range(documents):
      f.write("-DOCSTART- -X- -X- O\n\n")
      for _ in range(rng.randint(10, 20)):
        f.write("".join(" ".join(row) + "\n" for row in sentence(rng, pool)) + "\n")


# (file, documents, pool, seed); the sentence counts follow from the seeds.
FILES = (("eng.train", 140, "train", 1), ("eng.testa", 20, "held_out", 2),
         ("eng.testb", 20, "held_out", 3))


def write_conll(directory: str) -> str:
  """eng.train, eng.testa and eng.testb in `directory`; returns `directory`."""
  os.makedirs(directory, exist_ok=True)
  pools = dict(zip(("train", "held_out"), name_pools()))
  for name, documents, pool, seed in FILES:
    write_file(os.path.join(directory, name), documents, pools[pool], seed)
  return directory
