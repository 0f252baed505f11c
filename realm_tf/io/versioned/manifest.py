"""Manifests and checksums: the one manifest format, its verifier, and the names of the
versioned layout (the package docstring draws it).

A manifest lists every file of an output as {name, size, crc32c}; `verify_files` checks
such a list against what is stored, and `file_path` refuses a listed name that would lead
outside the output's directory.
"""
import dataclasses
import json
import logging
import os
import re
from typing import Dict, Iterable, List, Optional

import google_crc32c

from realm_tf.io.storage import GFILE, Storage

MANIFEST_SUFFIX = ".manifest.json"
MANIFEST = "manifest.json"  # a flat output's manifest, inside its directory
WRITER_MARKER = "_WRITER.json"  # inside a data dir while it is written; not a data file
MANIFEST_NAME_RE = re.compile(r"^(\d{12})\.manifest\.json$")
DATA_DIR_RE = re.compile(r"^(\d{12})\.([0-9a-f]{32})$")
_CHUNK = 8 << 20


class VersionError(RuntimeError):
  """A version that cannot be committed or read as asked."""


class VersionConflictError(VersionError):
  """A different version with the same number is already committed."""


class VerificationError(VersionError):
  """Files of a committed version are missing, truncated or corrupted."""


class UnpublishedError(VersionError):
  """A reader was pointed at files no writer has published: no manifest, or one that does
  not match what is stored. The user's to fix (another path, or the writer re-run), so a
  command line reports it as a usage error (exit 2, realm_tf.io.command_line)."""
  is_usage_error = True


@dataclasses.dataclass
class Version:
  """A committed version, as its manifest names it.

  Attributes:
    version: the version number (e.g. the training step of a snapshot).
    path: the data directory, `<root>/<12-digit version>.<writer id>`.
    manifest: the manifest's JSON: the publisher's fields plus version, data_dir, writer,
      files ([{name, size, crc32c}]) and committed_at.
    store: the Storage it was read through (and reads its files through).
  """
  version: int
  path: str  # the data directory
  manifest: dict
  store: Storage = dataclasses.field(default=GFILE, repr=False, compare=False)


def version_name(version: int) -> str:
  """The 12-digit, zero-padded name of `version` (names sort as numbers do).

  Raises:
    ValueError: `version` is negative.
  """
  if version < 0:
    raise ValueError(f"version must be >= 0, got {version}")
  return f"{version:012d}"


def manifest_path(root: str, version: int) -> str:
  """`<root>/<12-digit version>.manifest.json`, the object whose creation commits `version`."""
  return os.path.join(root, version_name(version) + MANIFEST_SUFFIX)


def json_bytes(payload: dict) -> bytes:
  """A manifest's or claim's bytes: indented JSON, keys sorted."""
  return json.dumps(payload, indent=2, sort_keys=True).encode("utf-8")


def write_json_atomic(path: str, payload: dict, store: Storage = GFILE):
  """A small JSON object readers see whole or not at all (Storage.write_bytes_atomic).

  Args:
    path: where to write (replaced if it exists).
    payload: a JSON-serialisable dict (written with sorted keys).
    store: the Storage to write through.
  """
  store.write_bytes_atomic(path, json_bytes(payload))


def read_json(path: str, store: Storage = GFILE) -> dict:
  """Reads a JSON object.

  Args:
    path: the object to read.
    store: the Storage to read through.

  Returns:
    The decoded JSON.

  Raises:
    FileNotFoundError: `path` does not exist.
    VersionError: it is not valid JSON.
  """
  data = store.read_bytes(path)
  try:
    return json.loads(data.decode("utf-8"))
  except ValueError as e:
    raise VersionError(f"{path}: not valid JSON ({e})") from e


def version_from_manifest(root: str, path: str, store: Storage) -> Optional[Version]:
  """The version a manifest names; None (skipped, logged) if it is not JSON or was
  deleted since it was listed. A store that cannot be asked raises (StorageError): an
  outage is not "no such version"."""
  try:
    manifest = read_json(path, store)
  except (VersionError, FileNotFoundError) as e:
    logging.warning("Skipping %s: unreadable manifest (%s)", path, e)
    return None
  data_dir = manifest.get("data_dir")
  if not isinstance(data_dir, str) or not DATA_DIR_RE.match(data_dir):
    logging.warning("Skipping %s: it names no data directory", path)
    return None
  return Version(int(manifest["version"]), os.path.join(root, data_dir), manifest, store)


# ---------------------------------------------------------------------------- checksums

def crc32c_of_file(path: str, store: Storage = GFILE) -> str:
  """CRC32C (hex) of a file, streamed: the checksum GCS itself keeps for objects."""
  checksum = google_crc32c.Checksum()
  with store.open_read(path) as f:
    while True:
      chunk = f.read(_CHUNK)
      if not chunk:
        break
      checksum.update(chunk)
  return checksum.digest().hex()


def crc32c_of_bytes(data: bytes) -> str:
  """CRC32C of `data` as 8 hex digits (the form manifests record)."""
  return google_crc32c.Checksum(data).digest().hex()


def file_entries(directory: str, known: Optional[Dict[str, dict]] = None,
                 store: Storage = GFILE, exclude: Iterable[str] = ()) -> List[dict]:
  """[{name, size, crc32c}] for every file under `directory` (sorted by name).

  `known` maps names to entries a writer computed while writing (it had the bytes), so
  large files need not be read back; each is still checked against the stored size.
  Names in `exclude` (and a writer's marker) are not data files.

  Args:
    directory: the directory to list (recursively).
    known: name (relative to `directory`) → {size, crc32c} computed while writing.
    store: the Storage to list and read through.
    exclude: names to leave out.

  Returns:
    [{name, size, crc32c}] sorted by name, names relative to `directory`.

  Raises:
    VersionError: a known file's stored size differs from the size written, or a known
      file is not found.
  """
  known = known or {}
  skipped = {WRITER_MARKER, *exclude}
  entries = []
  for name, size in sorted(store.file_sizes(directory).items()):
    if name in skipped:
      continue
    path = os.path.join(directory, name)
    entry = known.get(name)
    if entry is not None and int(entry["size"]) != size:
      raise VersionError(f"{path}: {size} bytes stored, {entry['size']} written")
    crc = entry["crc32c"] if entry is not None else crc32c_of_file(path, store)
    entries.append(dict(name=name, size=int(size), crc32c=crc))
  missing = sorted(set(known) - {e["name"] for e in entries})
  if missing:
    raise VersionError(f"{directory}: files written but not found: {missing}")
  return entries


def file_path(directory: str, name: str) -> str:
  """`directory`/`name` for a file name read from a manifest.

  A manifest is data from shared storage: a name that is absolute, has a scheme, or has
  an empty, '.' or '..' component could steer a reader (or copy_version's writes) outside
  the version, so it is refused with a VerificationError.
  """
  parts = str(name).replace("\\", "/").split("/")
  if (not isinstance(name, str) or name.startswith("/") or "://" in name
      or any(part in ("", ".", "..") for part in parts)):
    raise VerificationError(f"{directory}: the manifest names a file {name!r} outside "
                            "its directory; refusing it")
  return os.path.join(directory, name)


def verify_files(directory: str, entries: Iterable[dict], checksums: bool = False,
                 store: Storage = GFILE) -> None:
  """The verifier: checks a manifest's `files` against what is stored.

  Args:
    directory: the directory the names are relative to.
    entries: the manifest's [{name, size, crc32c}].
    checksums: also compare CRC32C (reads every file); sizes are always compared.
    store: the Storage to read through.

  Raises:
    VerificationError: naming every missing, truncated or corrupted file (or a name
      outside `directory`).
  """
  problems = []
  for entry in entries:
    path = file_path(directory, entry["name"])
    try:
      size = store.size(path)
    except FileNotFoundError:
      problems.append(f"{path}: missing")
      continue
    if size != int(entry["size"]):
      problems.append(f"{path}: {size} bytes, manifest says {entry['size']} (truncated "
                      "or replaced)")
    elif checksums and crc32c_of_file(path, store) != entry["crc32c"]:
      problems.append(f"{path}: CRC32C does not match the manifest (corrupted)")
  if problems:
    raise VerificationError("; ".join(problems))


def same_files(a: Iterable[dict], b: Iterable[dict]) -> bool:
  """Whether two manifests' file lists name the same files (name, size, CRC32C), in any
  order."""
  def key(entries):
    return sorted((e["name"], int(e["size"]), e["crc32c"]) for e in entries)
  return key(a) == key(b)
