"""Written files → their sizes and CRC32C, for the manifest of a published output."""
from typing import Any, Dict, Tuple

import apache_beam as beam
import google_crc32c
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

FILE_PREFIX = "file/"  # stats key prefix: 'file/<path>' → {size, crc32c}
_CHUNK = 8 << 20


def _checksum(path: str) -> Tuple[str, Dict[str, Any]]:
  checksum, size = google_crc32c.Checksum(), 0
  with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
    while True:
      chunk = f.read(_CHUNK)
      if not chunk:
        break
      checksum.update(chunk)
      size += len(chunk)
  return FILE_PREFIX + path, {"path": path, "size": size,
                              "crc32c": checksum.digest().hex()}


class ChecksumFiles(beam.PTransform):
  """Paths of written files → ('file/<path>', {path, size, crc32c}), one per file, each
  file read by whichever worker is free (the Reshuffle spreads them)."""

  def expand(self, paths):
    return (paths
            | "SpreadFiles" >> beam.Reshuffle()
            | "Checksum" >> beam.Map(_checksum))
