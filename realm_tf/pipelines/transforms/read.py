"""Input files → raw records, plus the files' fingerprints for the manifest."""
import bz2
import gzip
import zlib
from typing import Any, BinaryIO, Dict, Iterator, Tuple

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from realm_tf.corpus import formats, manifest, records
from realm_tf.corpus.records import RawRecord
from realm_tf.pipelines.transforms import metrics


class StorageReadError(Exception):
  """Reading the stored bytes failed (network, permissions): not the data's fault, so it
  propagates and the runner retries the file."""


class _StorageStream:
  """The raw file, with its read errors told apart from the decompressor's.

  bz2 and gzip raise OSError / EOFError / zlib.error for a damaged stream, and file
  systems raise OSError too; wrapping the storage side is what lets a damaged stream be set
  aside (the data's fault) while a failed read is retried (the storage's).
  """

  def __init__(self, raw: BinaryIO):
    self._raw = raw

  def read(self, size: int = -1) -> bytes:
    try:
      return self._raw.read(size)
    except Exception as e:  # pylint: disable=broad-except
      raise StorageReadError(f"{type(e).__name__}: {e}") from e

  def readable(self) -> bool:
    return True

  def close(self) -> None:
    self._raw.close()


_DAMAGED_STREAM = (OSError, EOFError, zlib.error)  # bz2 / gzip on corrupt or cut data


def _open_decompressed(path: str) -> BinaryIO:
  """Python's own bz2/gzip readers: streaming, multi-stream dumps, and readline(limit)."""
  raw = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
  if path.endswith(".bz2"):
    return bz2.BZ2File(_StorageStream(raw))
  if path.endswith(".gz"):
    return gzip.GzipFile(fileobj=_StorageStream(raw))
  return raw


def read_file_records(path: str, input_format: str, max_record_bytes: int,
                      max_records: int = 0) -> Iterator[RawRecord]:
  """Every record of one file; a damaged compressed stream ends the file with one record
  flagged `unreadable` (the records before it are kept), a failed read raises
  StorageReadError."""
  reader = formats.get(input_format).reader
  count = 0
  with _open_decompressed(path) as stream:
    try:
      for record in reader(stream, path, max_record_bytes, max_records):
        count += 1
        yield record
    except _DAMAGED_STREAM as e:
      if not path.endswith((".bz2", ".gz")):
        raise
      yield RawRecord(path=path, index=count, line=0, payload=b"",
                      defect=records.UNREADABLE,
                      detail=f"{type(e).__name__}: {e} (after {count} records; the rest "
                             "of the file cannot be decompressed)")


class _ReadFileFn(beam.DoFn):
  """One matched file → its records, streamed (a file is read by one worker)."""

  def __init__(self, input_format: str, max_record_bytes: int, max_records: int):
    super().__init__()
    self._input_format = input_format
    self._max_record_bytes = max_record_bytes
    self._max_records = max_records
    self._records_in = metrics.counter("records_in")

  def process(self, metadata) -> Iterator[RawRecord]:
    for record in read_file_records(metadata.path, self._input_format,
                                    self._max_record_bytes, self._max_records):
      self._records_in.inc()
      yield record


class ReadRawRecords(beam.PTransform):
  """FileMetadata → RawRecords, redistributed so parsing one big file runs in parallel.

  The file list must already be spread over workers (MatchInputs reshuffles it): a
  match is one element, and without the reshuffle one worker reads every file.
  """

  def __init__(self, input_format: str, max_record_bytes: int, max_records: int = 0):
    super().__init__()
    self._fn = _ReadFileFn(input_format, max_record_bytes, max_records)

  def expand(self, files):
    return (files
            | "ReadFiles" >> beam.ParDo(self._fn)
            | "Redistribute" >> beam.Reshuffle())


def _fingerprint(metadata) -> Tuple[str, Dict[str, Any]]:
  with FileSystems.open(metadata.path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
    digest = manifest.sha256_of_stream(f)
  return (manifest.INPUT_PREFIX + metadata.path,
          {"path": metadata.path, "bytes": metadata.size_in_bytes, "sha256": digest})


class MatchInputs(beam.PTransform):
  """A file pattern → FileMetadata of every match, spread over the workers.

  MatchFiles emits all matches from the single element it starts from; the Reshuffle
  breaks fusion so that each file is read (and hashed) by whichever worker is free.
  """

  def __init__(self, file_pattern: str):
    super().__init__()
    self._pattern = file_pattern

  def expand(self, pbegin):
    return (pbegin
            | "Match" >> fileio.MatchFiles(
                self._pattern, empty_match_treatment=fileio.EmptyMatchTreatment.DISALLOW)
            | "SpreadFiles" >> beam.Reshuffle())


class FingerprintInputs(beam.PTransform):
  """FileMetadata → ('input/<path>', {path, bytes, sha256}), hashed on the workers."""

  def expand(self, files):
    return files | "HashFiles" >> beam.Map(_fingerprint)
