"""One MediaWiki `<page>` element → an article's title and plain text, or a reason not to.

The rules follow what REALM's Wikipedia corpus is: article prose from the main namespace.
Cheap checks (namespace, redirect, title, size) run before the wikitext is parsed.
"""
import dataclasses
import re
import xml.etree.ElementTree as ET
from typing import Tuple

from mwparserfromhell.parser import ParserError

from realm_tf.corpus import records, wikitext
from realm_tf.corpus.records import SetAsideError

_REDIRECT_TEXT = re.compile(r"^\s*#redirect\b", re.IGNORECASE)
_ENTITY_DECLARATION = re.compile(rb"<!(?:DOCTYPE|ENTITY)", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Page:
  title: str
  namespace: int
  is_redirect: bool
  wikitext: str


def parse_page(payload: bytes) -> Page:
  """The fields of one `<page>` element (cut from a dump, so without its xmlns)."""
  try:
    text = payload.decode("utf-8")
  except UnicodeDecodeError as e:
    raise SetAsideError(records.INVALID_UTF8, str(e)) from None
  if _ENTITY_DECLARATION.search(payload):  # a page never declares entities; refuse bombs
    raise SetAsideError(records.MALFORMED_XML, "entity or doctype declaration in a page")
  try:
    page = ET.fromstring(text)
  except ET.ParseError as e:
    raise SetAsideError(records.MALFORMED_XML, str(e)) from None
  title = page.findtext("title")
  namespace = page.findtext("ns")
  revision_text = page.find("revision/text")
  if page.tag != "page" or title is None or namespace is None or revision_text is None:
    raise SetAsideError(records.MALFORMED_XML, "a page needs <title>, <ns> and <revision><text>")
  try:
    namespace_id = int(namespace)
  except ValueError:
    raise SetAsideError(records.MALFORMED_XML, f"<ns> is not an integer: {namespace!r:.40}"
                        ) from None
  body = revision_text.text or ""
  return Page(title=title.strip(), namespace=namespace_id,
              is_redirect=page.find("redirect") is not None or bool(_REDIRECT_TEXT.match(body)),
              wikitext=body)


def article(payload: bytes, max_chars: int) -> Tuple[str, str]:
  """(title, plain text) of an article page; raises SetAsideError for anything else."""
  page = parse_page(payload)
  if page.namespace != 0:
    raise SetAsideError(records.NAMESPACE, f"namespace {page.namespace}")
  if page.is_redirect:
    raise SetAsideError(records.REDIRECT)
  if wikitext.is_non_article_title(page.title):
    raise SetAsideError(records.NON_ARTICLE_TITLE, page.title)
  if not page.title:
    raise SetAsideError(records.MISSING_FIELD, "empty <title>")
  if len(page.wikitext) > max_chars:
    raise SetAsideError(records.TOO_LARGE, f"{len(page.wikitext)} chars > {max_chars}")
  depth = wikitext.markup_depth(page.wikitext)
  if depth > wikitext.MAX_MARKUP_DEPTH:  # vandalism or a broken bot edit, not prose
    raise SetAsideError(records.UNPARSABLE_WIKITEXT,
                        f"templates/links nested {depth} deep > {wikitext.MAX_MARKUP_DEPTH}")
  try:
    code = wikitext.parse(page.wikitext)
    if wikitext.is_disambiguation(page.title, code):
      raise SetAsideError(records.DISAMBIGUATION)
    text = wikitext.to_plain_text(code)
  except ParserError as e:
    raise SetAsideError(records.UNPARSABLE_WIKITEXT, str(e)) from None
  except RecursionError:  # other markup (tags) nested thousands deep: not prose either
    raise SetAsideError(records.UNPARSABLE_WIKITEXT, "markup nested too deeply") from None
  if not text:
    raise SetAsideError(records.EMPTY, "no prose after removing markup")
  return page.title, text
