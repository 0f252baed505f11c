"""Date regexes: what counts as a salient date, and what must not."""
import pytest

from realm_tf.corpus.dates import DATE_LABEL, find_dates


def dates_in(text):
  spans = find_dates(text)
  assert all(s["label"] == DATE_LABEL for s in spans)
  return [text[s["start"]:s["end"]] for s in spans]


@pytest.mark.parametrize("text, expected", [
    ("Apollo 11 landed on 20 July 1969, and they walked.", ["20 July 1969"]),
    ("It landed on July 20, 1969 in the Sea of Tranquility.", ["July 20, 1969"]),
    ("On the 20th of July, 1969 the module landed.", ["20th of July, 1969"]),
    ("The launch log reads 1969-07-16 at the top.", ["1969-07-16"]),
    ("The mission was planned in July 1969 and flown.", ["July 1969"]),
    ("Revised in Sept. 1969 after review.", ["Sept. 1969"]),
    ("The Normans arrived in 1066, and the war lasted from 1914 to 1918.",
     ["1066", "1914", "1918"]),
    ("Music of the 1960s and the 1980's.", ["1960s", "1980's"]),
    ("Caesar was killed in 44 BC and Pompeii was buried in AD 79.", ["44 BC", "AD 79"]),
    ("Temples of the 5th century BC and of the nineteenth century.",
     ["5th century BC", "nineteenth century"]),
    ("The party is on 4 July and the vote on March 3 this year.", ["4 July", "March 3"]),
    ("In 2004, the club won; in 2005 it lost.", ["2004", "2005"]),
])
def test_finds_dates(text, expected):
  assert dates_in(text) == expected


@pytest.mark.parametrize("text", [
    "The ticket cost $1969 and the car 1,969 dollars.",
    "Over 2000 people came, and 1500 km were covered.",
    "The value rose to 3.1969 and then 1969% overnight.",
    "He lives at No. 1984 and works in room 2012.",
    "The model 2000 shipped with 12345 parts and 999 screws.",
    "You may come in May if you like.",
    "She scored 2010 points in 1500 games.",
    "Its code is 20691 and its serial A1969.",
])
def test_ignores_numbers_that_are_not_dates(text):
  assert dates_in(text) == []


def test_offsets_are_characters_not_bytes():
  text = "Zürich, Genève: founded 20 July 1291."
  [span] = find_dates(text)
  assert text[span["start"]:span["end"]] == "20 July 1291"


def test_spans_are_sorted_and_disjoint():
  text = "From 1 May 1990 to 1999-12-31, then July 2000, 2001 and the 2010s."
  spans = find_dates(text)
  assert dates_in(text) == ["1 May 1990", "1999-12-31", "July 2000", "2001", "2010s"]
  for earlier, later in zip(spans, spans[1:]):
    assert earlier["end"] <= later["start"]
