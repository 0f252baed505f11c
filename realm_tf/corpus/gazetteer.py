"""Entity mentions from a gazetteer: the corpus's own article titles used as names.

REALM's salient spans are named entities from a tagger trained on CoNLL-2003, plus dates.
CoNLL-2003 is not redistributable (no package index ships it), so a machine without it has
no tagger. The corpus still says which strings name things: the titles of its articles. A
mention here is an exact, case-sensitive, word-bounded occurrence of the title of *another*
article of the corpus ("Paris" in the article on France; not "France" inside "France").
Its own title is left alone: a lead names its subject in its first words, and masking it
would ask the model for the one name the rest of the block is about.

Matching is by words: titles are indexed by their first word, and at each word of a text
the longest title that starts there and is followed by a word boundary wins; matches do not
overlap. A match inside a longer capitalised name is not a mention of that title ("Abraham"
in "Abraham Maslow", "Africa" in "North Africa", "Society" in "Watch Tower Tract Society"):
a capitalised word right after it, or right before it other than a sentence's first word,
rules it out. As with the dates, precision matters more than recall: a wrong span teaches
nothing, a missed one costs one candidate. Titles that do not start with a word character,
and one-character titles ("I" would match the pronoun), are not used.
"""
import collections
import re
from typing import Dict, Iterable, List, Set, Tuple

TITLE_LABEL = "TITLE"
_WORD = re.compile(r"\w+")
# A capitalised word joined to a match by one space (or hyphen): the match is part of it.
_NAME_AFTER = re.compile(r"[ -][A-Z]")


def _is_word_char(char: str) -> bool:
  return char.isalnum() or char == "_"


class TitleGazetteer:
  """Finds mentions of article titles in texts (see the module docstring).

  Built from (title, doc_uid) pairs: one title may belong to several documents, and a
  mention counts when some document other than the text's own carries that title.
  """

  def __init__(self, titles: Iterable[Tuple[str, str]], min_chars: int = 2):
    self._owners: Dict[str, Set[str]] = collections.defaultdict(set)
    for title, doc_uid in titles:
      title = " ".join(title.split())
      if len(title) >= min_chars and _is_word_char(title[0]):
        self._owners[title].add(doc_uid)
    by_first: Dict[str, List[str]] = collections.defaultdict(list)
    for title in self._owners:
      by_first[_WORD.match(title).group()].append(title)
    # Longest first, so "New York City" wins over "New York" at the same word.
    self._by_first = {word: sorted(found, key=len, reverse=True)
                      for word, found in by_first.items()}

  def __len__(self) -> int:
    return len(self._owners)

  def owners(self, mention: str) -> Set[str]:
    """The doc_uids of the documents titled `mention` (a span `find` returned)."""
    return set(self._owners.get(mention, ()))

  def find(self, text: str, doc_uid: str = "") -> List[dict]:
    """Sorted, non-overlapping {'start', 'end', 'label'} mentions in `text` (character
    offsets, end exclusive) of titles of documents other than `doc_uid`."""
    spans = []
    position = 0  # no match may start before the end of the previous one
    for word in _WORD.finditer(text):
      start = word.start()
      if start < position:
        continue
      for title in self._by_first.get(word.group(), ()):
        end = start + len(title)
        if not text.startswith(title, start):
          continue
        if end < len(text) and _is_word_char(title[-1]) and _is_word_char(text[end]):
          continue  # "Rome" in "Romeo"
        if self._owners[title] - {doc_uid} and not self._inside_name(text, start, end):
          spans.append({"start": start, "end": end, "label": TITLE_LABEL})
        # The text's own title is skipped whole: no shorter title inside it stands in.
        position = end
        break
    return spans

  @staticmethod
  def _inside_name(text: str, start: int, end: int) -> bool:
    if _NAME_AFTER.match(text, end):
      return True
    before = list(_WORD.finditer(text, max(0, start - 64), start))
    if not before or before[-1].end() != start - 1 or text[start - 1] not in " -":
      return False
    word = before[-1]
    if not word.group()[0].isupper():
      return False
    # A sentence's first word is capitalised anyway ("The Sahara", "In Paris").
    head = text[:word.start()].rstrip()
    return bool(head) and head[-1] not in ".!?:;\"'("
