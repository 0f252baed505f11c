"""Wikitext → plain prose, and the rules that say which pages are articles.

REALM's blocks are prose: the reader is trained to find answers in sentences, so anything
a reader of the rendered page would not read as running text goes (templates, references,
tables, galleries, file and category links, code, maths, headings and the reference
sections at the end), while the visible text of links stays.

mwparserfromhell does the parsing. Its own `strip_code` is not used because it keeps the
contents of tables and the "thumb|caption" text of file links; the walk below decides
node by node instead.
"""
import re

import mwparserfromhell
from mwparserfromhell import nodes

# Tags whose contents are never prose: references, media, code, maths, layout engines.
_DROPPED_TAGS = frozenset({
    "ref", "references", "gallery", "imagemap", "math", "chem", "ce", "syntaxhighlight",
    "source", "pre", "code", "score", "timeline", "graph", "mapframe", "maplink",
    "templatedata", "templatestyles", "inputbox", "categorytree", "hiero", "table",
    "nowiki", "noinclude", "includeonly", "onlyinclude", "style", "script",
})
_LINE_BREAK_TAGS = frozenset({"br", "p", "li", "dt", "dd", "div", "blockquote", "tr"})
# Link namespaces that render as media, categories or other projects, not as link text.
_DROPPED_LINK_NAMESPACES = frozenset({
    "file", "image", "media", "category", "wikt", "wiktionary", "commons", "s",
    "wikisource", "q", "wikiquote", "n", "wikinews", "b", "wikibooks", "v", "wikiversity",
    "voy", "species", "d", "wikidata", "mw", "meta", "m", "special",
})
# Interlanguage links ("[[fr:Paris]]", "[[zh-yue:...]]") appear without a leading colon.
_INTERLANGUAGE = re.compile(r"^[a-z]{2,3}(?:-[a-z]{2,8})*$")
# Trailing sections that hold citations and navigation, not article prose.
_DROPPED_SECTIONS = frozenset({
    "references", "notes", "footnotes", "citations", "sources", "bibliography",
    "further reading", "external links", "see also", "notes and references",
    "references and notes", "works cited", "cited sources", "general references",
    "explanatory notes", "primary sources", "secondary sources", "selected bibliography",
})
_DISAMBIGUATION_TEMPLATES = frozenset({
    "disambiguation", "disambig", "disamb", "dab", "dis", "geodis", "hndis", "numberdis",
    "mathdab", "schooldis", "hospitaldis", "roaddis", "mil-unit-dis",
    "letter-number combination disambiguation", "human name disambiguation",
    "place name disambiguation", "genus disambiguation", "species latin name disambiguation",
    "disambiguation cleanup",
})
# Inline templates whose rendering is part of the sentence ("at {{convert|5|km}} from"):
# name → the 1-based positional parameters whose text is kept, joined by a space.
# Every other template is dropped (infoboxes, navboxes, citations, maintenance tags).
_INLINE_TEMPLATES = {
    "convert": (1, 2), "cvt": (1, 2), "nowrap": (1,), "nobr": (1,), "ill": (1,),
    "lang": (2,), "transl": (2,), "sic": (1,), "small": (1,), "nihongo": (1,),
}
_LANG_TEMPLATE = re.compile(r"^lang-[a-z-]+$")  # {{lang-fr|texte}}: keep the text
_NON_ARTICLE_TITLE = re.compile(r"^(?:Lists? of|Index of|Indices of|Outline of)\b")

# Markup the parser leaves as plain text when it is unbalanced; never prose either.
_STRAY_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9]*(?:\s[^<>]*)?/?>")
_STRAY_MARKUP = re.compile(r"\[\[|\]\]|\{\{|\}\}|\{\||\|\}|'{2,}|__[A-Z]+__")
_TABLE_ROW = re.compile(r"^\s*(?:\||!)")
_PAREN_TRAILING_PUNCT = re.compile(r"(?:\s*[,;:])+\s*\)")
_EMPTY_PARENS = re.compile(r"\(\s*[,;:.]*\s*\)")
_PAREN_LEADING_PUNCT = re.compile(r"\(\s*(?:[,;:]\s*)+")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:!?)])")
_SPACES = re.compile(r"[ \t\u00a0]+")


def is_non_article_title(title: str) -> bool:
  """'List of ...', 'Index of ...', 'Outline of ...': navigation pages, not prose."""
  return bool(_NON_ARTICLE_TITLE.match(title))


def is_disambiguation(title: str, wikicode) -> bool:
  """A disambiguation page: '(disambiguation)' title, a dab template or __DISAMBIG__."""
  if title.endswith("(disambiguation)") or "__DISAMBIG__" in str(wikicode):
    return True
  for template in wikicode.filter_templates(recursive=False):
    name = str(template.name).strip().lower().replace("_", " ")
    if name in _DISAMBIGUATION_TEMPLATES:
      return True
  return False


# Deepest nesting of templates and links an article may have. mwparserfromhell stops
# recursing at its tokenizer's MAX_DEPTH (100) and then reads the rest as plain text, so
# whether a page nested deeper comes out as an error, as nothing or as a stray fragment
# depends on the exact depth and on Python's stack; real articles nest a few levels, so
# anything past the parser's own limit is set aside up front, the same way every time.
MAX_MARKUP_DEPTH = 100
_NESTING_MARK = re.compile(r"\{\{|\}\}|\[\[|\]\]")


def markup_depth(wikitext: str) -> int:
  """How deeply `{{ }}` and `[[ ]]` nest (unbalanced closers are ignored)."""
  depth = deepest = 0
  for mark in _NESTING_MARK.finditer(wikitext):
    if mark.group()[0] in "{[":
      depth += 1
      deepest = max(deepest, depth)
    else:
      depth = max(0, depth - 1)
  return deepest


def parse(wikitext: str):
  """The mwparserfromhell tree; raises mwparserfromhell.parser.ParserError on failure."""
  return mwparserfromhell.parse(wikitext, skip_style_tags=True)


def to_plain_text(wikicode) -> str:
  """Prose of an article: one paragraph per line, whitespace collapsed, no markup."""
  pieces = []
  _append_nodes(wikicode.nodes, pieces, top_level=True)
  return _tidy("".join(pieces))


def _append_nodes(node_list, pieces: list, top_level: bool = False) -> None:
  skip_below_level = None  # inside a dropped section: skip until a heading this high
  for node in node_list:
    if top_level and isinstance(node, nodes.Heading):
      title = _plain(node.title).strip().lower()
      if skip_below_level is not None and node.level > skip_below_level:
        continue
      skip_below_level = node.level if title in _DROPPED_SECTIONS else None
      pieces.append("\n")  # headings end a paragraph; their own text is not prose
      continue
    if skip_below_level is not None:
      continue
    pieces.append(_node_text(node))


def _node_text(node) -> str:
  if isinstance(node, nodes.Text):
    return node.value
  if isinstance(node, nodes.Wikilink):
    return _link_text(node)
  if isinstance(node, nodes.ExternalLink):
    return _plain(node.title) if node.brackets and node.title else ""
  if isinstance(node, nodes.HTMLEntity):
    return node.normalize()
  if isinstance(node, nodes.Tag):
    return _tag_text(node)
  if isinstance(node, nodes.Heading):
    return "\n"
  if isinstance(node, nodes.Template):
    return _template_text(node)
  # Template arguments, comments: never prose.
  return ""


def _template_text(template) -> str:
  name = str(template.name).strip().lower().replace("_", " ")
  keep = (1,) if _LANG_TEMPLATE.match(name) else _INLINE_TEMPLATES.get(name, ())
  values = [_plain(template.get(position).value).strip() for position in keep
            if template.has(position)]
  return " ".join(value for value in values if value)


def _link_text(link) -> str:
  target = str(link.title).strip()
  leading_colon = target.startswith(":")
  namespace, sep, _ = target.lstrip(":").partition(":")
  namespace = namespace.strip().lower()
  if sep and (namespace in _DROPPED_LINK_NAMESPACES and not
              (leading_colon and namespace == "category")):
    return ""
  if sep and not leading_colon and _INTERLANGUAGE.match(namespace):
    return ""
  return _plain(link.text) if link.text is not None else _plain(link.title)


def _tag_text(tag) -> str:
  name = str(tag.tag).strip().lower()
  if name in _DROPPED_TAGS:
    return ""
  text = "" if tag.self_closing or tag.contents is None else _plain(tag.contents)
  return "\n" + text if name in _LINE_BREAK_TAGS else text


def _plain(wikicode) -> str:
  if wikicode is None:
    return ""
  pieces = []
  _append_nodes(wikicode.nodes, pieces)
  return "".join(pieces)


def _tidy(text: str) -> str:
  """Collapses what removals leave behind: stray markup, '( )', ' ,' and blank lines."""
  lines = []
  for line in text.split("\n"):
    if _TABLE_ROW.match(line):
      continue
    line = _STRAY_TAG.sub("", line)
    line = _STRAY_MARKUP.sub("", line)
    line = _SPACES.sub(" ", line)
    line = _PAREN_LEADING_PUNCT.sub("(", line)
    line = _PAREN_TRAILING_PUNCT.sub(")", line)
    line = _EMPTY_PARENS.sub("", line)
    line = _SPACE_BEFORE_PUNCT.sub(r"\1", line)
    line = _SPACES.sub(" ", line).strip()
    if any(ch.isalnum() for ch in line):
      lines.append(line)
  return "\n".join(lines)
