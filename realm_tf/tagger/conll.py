"""Reading CoNLL-2003 NER files (the original 4-column, IOB1-tagged release).

Each line is `token POS chunk NER`; blank lines end sentences; `-DOCSTART- -X- -X- O` lines
start documents. The original release tags in IOB1, where `B-` appears only between two
adjacent entities of the same type; training and seqeval both want IOB2 (BIO), where every
entity starts with `B-`, so tags are converted on reading.
"""
import dataclasses

import tensorflow as tf

DOCSTART = "-DOCSTART-"
ENTITY_TYPES = ("PER", "LOC", "ORG", "MISC")
# Label ids: 0 is O; type t (1-based) has B at 2t-1 and I at 2t, so type = (id + 1) // 2.
LABELS = ("O",) + tuple(f"{prefix}-{t}" for t in ENTITY_TYPES for prefix in ("B", "I"))
LABEL_IDS = {label: i for i, label in enumerate(LABELS)}


class ConllFormatError(ValueError):
  """A line that is not a CoNLL-2003 token line."""


@dataclasses.dataclass
class Sentence:
  tokens: list[str]
  tags: list[str]  # IOB2 (BIO)


@dataclasses.dataclass
class Document:
  sentences: list[Sentence]


def iob1_to_bio(tags: list[str]) -> list[str]:
  """IOB1 → IOB2: an I-X that does not continue an X entity becomes B-X."""
  bio = []
  previous = "O"
  for tag in tags:
    if tag.startswith("I-") and previous[2:] != tag[2:]:
      tag = "B-" + tag[2:]
    bio.append(tag)
    previous = tag
  return bio


def _check_tag(tag: str, where: str) -> str:
  if tag != "O" and (tag[:2] not in ("B-", "I-") or tag[2:] not in ENTITY_TYPES):
    raise ConllFormatError(f"{where}: unknown NER tag {tag!r}")
  return tag


def read_conll(path: str) -> list[Document]:
  """All documents of a CoNLL-2003 file, sentences in order, tags converted to BIO.

  Text before the first -DOCSTART- (there is none in the official files) forms a document
  of its own rather than being dropped.
  """
  documents: list[Document] = []
  tokens: list[str] = []
  tags: list[str] = []

  def end_sentence():
    if tokens:
      if not documents:
        documents.append(Document([]))
      documents[-1].sentences.append(Sentence(list(tokens), iob1_to_bio(tags)))
      tokens.clear()
      tags.clear()

  with tf.io.gfile.GFile(path, "r") as f:
    for line_number, line in enumerate(f, start=1):
      fields = line.split()
      if not fields:
        end_sentence()
        continue
      if fields[0] == DOCSTART:
        end_sentence()
        documents.append(Document([]))
        continue
      where = f"{path}:{line_number}"
      if len(fields) != 4:
        raise ConllFormatError(f"{where}: expected 4 columns (token POS chunk NER), "
                               f"got {len(fields)}: {line.rstrip()!r}")
      tokens.append(fields[0])
      tags.append(_check_tag(fields[3], where))
  end_sentence()
  return documents


def read_sentences(path: str) -> list[Sentence]:
  """Every sentence of a CoNLL-2003 file (documents flattened, order kept)."""
  return [s for document in read_conll(path) for s in document.sentences]
