"""Input files → raw records, plus the files' fingerprints for the manifest."""
import bz2
import gzip
from typing import Any, BinaryIO, Dict, Iterator, Tuple

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from realm_tf.corpus import formats, manifest
from realm_tf.corpus.records import RawRecord
from realm_tf.pipelines.transforms import metrics

def _open_decompressed(path: str) -> BinaryIO:
  """Python's own bz2/gzip readers: streaming, multi-stream dumps, and readline(limit)."""
  raw = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
  if path.endswith(".bz2"):
    return bz2.BZ2File(raw)
  if path.endswith(".gz"):
    return gzip.GzipFile(fileobj=raw)
  return raw


class _ReadFileFn(beam.DoFn):
  """One matched file → its records, streamed (a file is read by one worker)."""

  def __init__(self, input_format: str, max_record_bytes: int, max_records: int):
    super().__init__()
    self._input_format = input_format
    self._max_record_bytes = max_record_bytes
    self._max_records = max_records
    self._records_in = metrics.counter("records_in")

  def process(self, metadata) -> Iterator[RawRecord]:
    reader = formats.get(self._input_format).reader
    with _open_decompressed(metadata.path) as stream:
      for record in reader(stream, metadata.path, self._max_record_bytes, self._max_records):
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
    from apache_beam.io import fileio  # pylint: disable=g-import-not-at-top
    return (pbegin
            | "Match" >> fileio.MatchFiles(
                self._pattern, empty_match_treatment=fileio.EmptyMatchTreatment.DISALLOW)
            | "SpreadFiles" >> beam.Reshuffle())


class FingerprintInputs(beam.PTransform):
  """FileMetadata → ('input/<path>', {path, bytes, sha256}), hashed on the workers."""

  def expand(self, files):
    return files | "HashFiles" >> beam.Map(_fingerprint)
