"""Dates as salient spans, found by regular expressions.

REALM masks named entities *and dates* (Guu et al., 2020, section 3.4): a date such as
"20 July 1969" is a fact the retriever must look up. A tagger trained on CoNLL-2003 has no
DATE type, so dates come from patterns instead. Precision matters more than recall here:
a number wrongly masked as a "date" teaches the model nothing, while a missed date only
costs one candidate span. So a bare four-digit number counts as a year only in 1000-2099,
not as part of a larger number, price or measurement, and not before a unit or count noun.

Recognised forms (longest first, matches never overlap):
  full dates   "20 July 1969", "20th of July, 1969", "July 20, 1969", ISO "1969-07-20"
  eras         "44 BC", "AD 79", "300 BCE", "5th century BC", "nineteenth century"
  month-year   "July 1969", "Sept. 1969"
  day-month    "20 July", "July 20" (full month names only: "Mar 3" is too ambiguous)
  decades      "1960s", "1960's"
  years        "1969" (see above for the guards)
Month names are matched case-sensitively: "may" is a verb, "May" a month.
"""
import re

DATE_LABEL = "DATE"

_FULL_MONTHS = ("January|February|March|April|May|June|July|August|September|October|"
                "November|December")
_MONTH_ABBREVIATIONS = r"(?:Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)\.?"
_MONTH = rf"(?:{_FULL_MONTHS}|{_MONTH_ABBREVIATIONS})"
_FULL_MONTH = rf"(?:{_FULL_MONTHS})"
_DAY = r"(?:3[01]|[12][0-9]|0?[1-9])(?:st|nd|rd|th)?"
_YEAR = r"(?:1[0-9]{3}|20[0-9]{2})"  # 1000-2099
_ERA = r"(?:BCE|BC|B\.C\.|AD|A\.D\.|CE|C\.E\.)"
_ORDINAL_WORDS = (
    "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
    "thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|"
    "twentieth|twenty-first|twenty-second")
# A number token must not continue into a larger number, a decimal or a word.
_NUMBER_START = r"(?<![\w$£€¥#])(?<!\d[.,:])"
_NUMBER_END = r"(?![\w%]|[.,:]\d)"

_PATTERN = re.compile("|".join([
    # Full dates.
    rf"{_NUMBER_START}{_DAY}\s+(?:of\s+)?{_MONTH},?\s+{_YEAR}{_NUMBER_END}",
    rf"\b{_MONTH}\s+{_DAY},?\s+{_YEAR}{_NUMBER_END}",
    rf"{_NUMBER_START}{_YEAR}-(?:0[1-9]|1[0-2])-(?:3[01]|[12][0-9]|0[1-9]){_NUMBER_END}",
    # Eras and centuries.
    rf"(?i:\b(?:[12]?[0-9](?:st|nd|rd|th)|{_ORDINAL_WORDS})[- ]century)(?:\s+{_ERA}(?!\w))?",
    rf"{_NUMBER_START}[0-9]{{1,4}}\s?{_ERA}(?!\w)",
    rf"\b(?:AD|A\.D\.)\s?[0-9]{{1,4}}{_NUMBER_END}",
    # Month and year, day and month.
    rf"\b{_MONTH},?\s+{_YEAR}{_NUMBER_END}",
    rf"{_NUMBER_START}{_DAY}\s+(?:of\s+)?{_FULL_MONTH}\b",
    rf"\b{_FULL_MONTH}\s+{_DAY}{_NUMBER_END}",
    # Decades.
    rf"{_NUMBER_START}(?:1[0-9]{{2}}|20[0-9])0'?s\b",
    # Bare years, vetted by _plausible_year.
    rf"{_NUMBER_START}(?P<year>{_YEAR}){_NUMBER_END}",
]))

# A bare number followed by one of these counts or measures something.
_COUNT_NOUNS = frozenset("""
    people persons men women children soldiers troops workers members students employees
    residents inhabitants households families species votes copies units cars vehicles
    ships aircraft times points games matches goals runs wickets pages words acres hectares
    square cubic km kilometres kilometers km2 m metres meters cm mm miles mi feet ft foot
    inches yards kg kilograms g grams lb lbs pounds tonnes tons dollars euros rupees yen
    calories kcal rpm cc hp kw mw mhz ghz hz mph years days hours minutes seconds
    """.split())
# A bare number after one of these is an amount or an identifier.
_AMOUNT_WORDS = frozenset("""
    no no. nos number numbers # page pages p. pp. route highway flight model room platform
    over than nearly approximately almost some under exactly
    """.split())
_WORD_AFTER = re.compile(r"\s+([A-Za-z][A-Za-z0-9]*)")
_WORD_BEFORE = re.compile(r"(\S+)\s+$")


def _plausible_year(text: str, start: int, end: int) -> bool:
  after = _WORD_AFTER.match(text, end)
  if after and after.group(1).lower() in _COUNT_NOUNS:
    return False
  before = _WORD_BEFORE.search(text, max(0, start - 32), start)
  if before and before.group(1).lower() in _AMOUNT_WORDS:
    return False
  return True


def find_dates(text: str) -> list[dict]:
  """Date spans in `text` as sorted, non-overlapping {'start', 'end', 'label'} dicts.

  Offsets are Python character offsets (end exclusive), so text[start:end] is the date.
  """
  spans = []
  for match in _PATTERN.finditer(text):
    start, end = match.span()
    if match.group("year") is not None and not _plausible_year(text, start, end):
      continue
    spans.append({"start": start, "end": end, "label": DATE_LABEL})
  return spans
