"""Streaming readers: a file object → `RawRecord`s, never the whole file in memory.

Both readers work on lines with a byte bound, so one enormous or unterminated record
costs at most the bound in memory; it is still emitted (flagged `too_large`) so it is
counted and set aside rather than lost.

Wikipedia pages are cut out of the dump by their `<page>` / `</page>` lines and parsed
one at a time (see `wikipedia.parse_page`) instead of running one XML parser over the
whole stream: a streaming parser stops at the first malformed page, while a dump reader
must set that page aside and go on with its neighbours. In a dump every `<page>` and
`</page>` tag is on its own line, and the same strings inside wikitext are escaped
(`&lt;page&gt;`), so the cut is exact.
"""
from typing import BinaryIO, Iterator, Tuple

from realm_tf.corpus import records


def bounded_lines(stream: BinaryIO, max_line_bytes: int) -> Iterator[Tuple[bytes, bool]]:
  """(line, overlong) pairs; an overlong line is cut to `max_line_bytes`, the rest skipped."""
  while True:
    line = stream.readline(max_line_bytes)
    if not line:
      return
    overlong = len(line) == max_line_bytes and not line.endswith(b"\n")
    if overlong:
      while True:  # drain the rest of the line without keeping it
        rest = stream.readline(max_line_bytes)
        if not rest or rest.endswith(b"\n"):
          break
    yield line, overlong


def read_json_lines(stream: BinaryIO, path: str, max_record_bytes: int,
                    max_records: int = 0) -> Iterator[records.RawRecord]:
  """One record per non-blank line; `index` counts records, `line` is the file line."""
  count = 0
  for line_number, (line, overlong) in enumerate(bounded_lines(stream, max_record_bytes), 1):
    if not line.strip():
      continue
    if max_records and count >= max_records:
      return
    yield records.RawRecord(path=path, index=count, line=line_number, payload=line,
                            defect=records.TOO_LARGE if overlong else "")
    count += 1


def read_wikipedia_pages(stream: BinaryIO, path: str, max_record_bytes: int,
                         max_records: int = 0) -> Iterator[records.RawRecord]:
  """One record per `<page>...</page>` element of a MediaWiki XML export.

  A page that never closes (the next `<page>` or the end of file comes first) is emitted
  with defect `malformed_xml`; one larger than `max_record_bytes` with `too_large`.
  """
  count = 0
  chunk, size, start_line, defect = None, 0, 0, ""

  def emit(data, line, flaw):
    nonlocal count
    record = records.RawRecord(path=path, index=count, line=line, payload=data, defect=flaw)
    count += 1
    return record

  for line_number, (line, overlong) in enumerate(bounded_lines(stream, max_record_bytes), 1):
    stripped = line.strip()
    opens = stripped.startswith(b"<page>")
    if opens and chunk is not None:  # the previous page never closed
      yield emit(b"".join(chunk), start_line, defect or records.MALFORMED_XML)
      chunk = None
    if max_records and count >= max_records:
      return
    if opens:
      chunk, size, start_line, defect = [], 0, line_number, ""
    if chunk is None:
      continue  # between pages: <mediawiki>, <siteinfo>, closing tags
    if overlong or size + len(line) > max_record_bytes:
      defect = records.TOO_LARGE
    if not defect:
      chunk.append(line)
      size += len(line)
    elif size < max_record_bytes:  # keep the head of an oversized page for its excerpt
      chunk.append(line[:max_record_bytes - size])
      size = max_record_bytes
    if stripped.endswith(b"</page>"):
      yield emit(b"".join(chunk), start_line, defect)
      chunk = None
  if chunk is not None and not (max_records and count >= max_records):
    yield emit(b"".join(chunk), start_line, defect or records.MALFORMED_XML)
