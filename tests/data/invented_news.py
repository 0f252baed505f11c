"""Invented news articles in the BBC set's JSON-lines layout (`id`, `title`, `text`,
`category`), the stand-in for CC-News when `../shared/data` is not there.

Paragraphs are lines of two to four sentences about made-up people, companies and places,
with dates and figures, so the corpus pipeline finds sentences to pack, ICT queries and
date spans as it does in real news. Every article is distinct (none is a duplicate).
"""
import json
import random

from tests.data.invented_conll import name_pools

CATEGORIES = ("business", "politics", "sport", "tech", "entertainment")
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December"]
_SENTENCES = [
    "{person} said on {date} that {company} would cut {n} jobs in {place}.",
    "Profits at {company} rose {n}% to ${m}m in the three months to {month}.",
    "The firm, based in {place}, expects sales to grow again in {year}.",
    "{person}, its chief executive, told shareholders the results were encouraging.",
    "Analysts had expected a smaller rise, and shares closed {n}p higher.",
    "Ministers in {place} will debate the plan in {month} {year}.",
    "{person} won {n} of the {m} seats contested in {place} last {month}.",
    "Opposition leader {person} called the decision a mistake.",
    "The bill is due to become law on {date}.",
    "{person} scored twice as {place} beat {other} {n}-{m} on {date}.",
    "The coach said the team had played its best football since {year}.",
    "Tickets for the final in {place} sold out within {n} hours.",
    "{company} will launch its new phone in {place} in {month}.",
    "The device stores {n} hours of music and costs about ${n}.",
    "Critics said the software was slow, but early sales were strong.",
    "The film, directed by {person}, opened in {place} on {date}.",
    "It took ${n}m at the box office in its first weekend.",
    "{person} is expected to attend the awards ceremony in {month}.",
]


def _article(rng, pool, index):
  def fill(template):
    return template.format(
        person=f"{rng.choice(pool)} {rng.choice(pool)}", company=f"{rng.choice(pool)} Group",
        place=rng.choice(pool), other=rng.choice(pool), n=rng.randint(2, 99),
        m=rng.randint(2, 99), month=rng.choice(_MONTHS), year=rng.randint(1990, 2005),
        date=f"{rng.randint(1, 28)} {rng.choice(_MONTHS)} {rng.randint(1990, 2005)}")
  paragraphs = [" ".join(fill(rng.choice(_SENTENCES)) for _ in range(rng.randint(2, 4)))
                for _ in range(rng.randint(4, 7))]
  category = CATEGORIES[index % len(CATEGORIES)]
  return {"id": f"{category}/{index:03d}",
          "title": f"{rng.choice(pool)} {rng.choice(['news', 'report', 'update', 'deal'])}",
          "text": "\n".join(paragraphs), "category": category}


def write_news(path, articles: int = 200, seed: int = 0) -> str:
  """`articles` invented articles as JSON lines at `path`; returns the path."""
  rng = random.Random(seed)
  pool = name_pools()[0]
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(json.dumps(_article(rng, pool, index)) + "\n" for index in range(articles))
  return str(path)
