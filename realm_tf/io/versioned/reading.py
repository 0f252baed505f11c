"""Readers and verification: the committed versions of a root (manifests only, never a
partial version), one version by path, and its files checked against its manifest."""
import fnmatch
import os
import re
from typing import List, Optional

from realm_tf.io.storage import GFILE, Storage
from realm_tf.io.versioned.manifest import (
  DATA_DIR_RE,
  MANIFEST,
  MANIFEST_NAME_RE,
  MANIFEST_SUFFIX,
  VerificationError,
  Version,
  VersionError,
  UnpublishedError,
  crc32c_of_bytes,
  file_path,
  manifest_path,
  read_json,
  verify_files,
  version_from_manifest,
)


def list_versions(root: str, store: Storage = GFILE) -> List[Version]:
  """Committed versions under `root`, oldest first (manifests only: never a partial one).

  Args:
    root: the versioned output's root (may not exist yet).
    store: the Storage to list through.

  Returns:
    The Versions; unreadable manifests are skipped (and logged).

  Raises:
    storage.StorageError: the store could not be asked (not "no versions").
  """
  if not store.is_dir_like(root):
    return []
  versions = []
  for name in store.listdir(root):
    if MANIFEST_NAME_RE.match(name):
      version = version_from_manifest(root, os.path.join(root, name), store)
      if version is not None:
        versions.append(version)
  return sorted(versions, key=lambda v: v.version)


def latest_version(root: str, store: Storage = GFILE) -> Optional[Version]:
  """The newest committed version under `root`, or None (see list_versions)."""
  versions = list_versions(root, store)
  return versions[-1] if versions else None


def read_version(path: str, store: Storage = GFILE) -> Version:
  """One committed version, from its data directory, its manifest, or `<root>/<version>`.

  Args:
    path: `<root>/<12-digit version>`, its data directory or its manifest.
    store: the Storage to read through.

  Returns:
    The committed Version (its files not verified: see verify_version).

  Raises:
    VersionError: `path` names no version, or it is not committed (a directory no
      manifest names), or its manifest is unreadable.
  """
  path = path.rstrip("/")
  root, name = os.path.split(path)
  if MANIFEST_NAME_RE.match(name):
    target = path
  elif DATA_DIR_RE.match(name) or re.match(r"^\d{12}$", name):
    target = manifest_path(root, int(name[:12]))
  else:
    raise VersionError(f"{path}: not a version (expected <root>/<12-digit version>[.<id>] "
                       f"or its {MANIFEST_SUFFIX})")
  if not store.exists(target):
    raise VersionError(f"{path}: not a committed version (no {target})")
  version = version_from_manifest(root, target, store)
  if version is None:
    raise VersionError(f"{target}: unreadable manifest")
  if DATA_DIR_RE.match(name) and version.path.rstrip("/") != path:
    raise VersionError(f"{path}: not committed (version {version.version} of {root} is "
                       f"{version.path})")
  return version


def verify_published(output_dir: str, checksums: bool = False,
                     store: Storage = GFILE) -> dict:
  """A flat output (OutputWriter) checked against its manifest's files.

  Args:
    output_dir: the flat output's directory.
    checksums: also compare CRC32C (reads every file); sizes are always compared.
    store: the Storage to read through.

  Returns:
    The manifest.

  Raises:
    UnpublishedError: the output is not published (no manifest.json).
    VerificationError: a listed file is missing, truncated or corrupted.
  """
  path = os.path.join(output_dir, MANIFEST)
  if not store.exists(path):
    raise UnpublishedError(f"{output_dir}: not published (no {MANIFEST}; a run may still be "
                       "writing it, or failed)")
  manifest = read_json(path, store)
  verify_files(output_dir, manifest.get("files", []), checksums, store)
  return manifest


GLOB_CHARS = "*?["  # tf.io.gfile.glob's wildcards (`*` and `?` never cross a '/')


def published_files(path: str, store: Storage = GFILE) -> List[str]:
  """The files a published flat output (OutputWriter) holds, read through its manifest.

  The one way a reader opens a pipeline's output (a `beam.preprocess` corpus and its
  examples, an imported corpus, the demo's files): manifest.json is written last, so a
  directory without it is one whose writer is still running, died half-way, or is an
  `--overwrite` re-run that has deleted the old output. Globbing around it would train on
  or index a partial corpus as if it were complete.

  Args:
    path: the output's directory (every file its manifest lists), one file in it, or a
      file pattern inside it (`<dir>/blocks-*`: the listed files the pattern matches).
      Wildcards only in the last component: the manifest sits in the pattern's
      directory.
    store: the Storage to read through.

  Returns:
    The listed files the path names, as sorted full paths.

  Raises:
    FileNotFoundError: the directory does not exist, or nothing it lists matches.
    UnpublishedError: (one line naming the path) no manifest.json; an unreadable one; or
      a manifest that does not match the files found: a listed file missing or of another
      size, or a file the pattern matches that the manifest does not list.
  """
  path = path.rstrip("/")
  directory, pattern = os.path.split(path)
  if not any(c in pattern for c in GLOB_CHARS):
    if store.is_dir_like(path):
      directory, pattern = path, ""
    elif not store.exists(path):
      raise FileNotFoundError(f"{path}: no such file or directory")
  if any(c in directory for c in GLOB_CHARS):
    raise UnpublishedError(
        f"{path}: a published output is read from its one directory (its manifest.json "
        "lists its files); wildcards are allowed in the file name only")
  if not store.is_dir_like(directory):
    raise FileNotFoundError(f"{directory}: no such directory")
  manifest_file = os.path.join(directory, MANIFEST)
  try:
    manifest = read_json(manifest_file, store)
  except FileNotFoundError:
    raise UnpublishedError(
        f"{directory}: not published (no {MANIFEST}): its writer is still running, died, "
        "or an --overwrite re-run removed it; nothing is read from it") from None
  except VersionError as e:
    raise UnpublishedError(f"{manifest_file}: unreadable manifest ({e})") from None
  entries = manifest.get("files") if isinstance(manifest, dict) else None
  if not isinstance(entries, list) or not all(
      isinstance(e, dict) and isinstance(e.get("name"), str) for e in entries):
    raise UnpublishedError(f"{manifest_file}: lists no files (not an output's manifest)")

  def named(name: str) -> bool:
    return not pattern or ("/" not in name and fnmatch.fnmatchcase(name, pattern))

  try:
    listed = {e["name"]: int(e["size"]) for e in entries if named(e["name"])}
  except (KeyError, TypeError, ValueError):
    raise UnpublishedError(f"{manifest_file}: a file entry without a size") from None
  found = {name: size for name, size in store.file_sizes(directory).items()
           if name != MANIFEST and named(name)}
  problems = [f"{name}: listed, missing" for name in sorted(set(listed) - set(found))]
  problems += [f"{name}: not listed in {MANIFEST} (written after it, or by another run)"
               for name in sorted(set(found) - set(listed))]
  problems += [f"{name}: {found[name]} bytes, {MANIFEST} says {listed[name]}"
               for name in sorted(set(listed) & set(found)) if found[name] != listed[name]]
  if problems:
    raise UnpublishedError(f"{directory}: does not match its {MANIFEST}: "
                           + "; ".join(problems[:5])
                           + (f"; and {len(problems) - 5} more" if len(problems) > 5 else ""))
  if not listed:
    raise FileNotFoundError(f"{path}: {MANIFEST} lists no file of that name")
  return [file_path(directory, name) for name in sorted(listed)]


def read_verified(version: Version, name: str) -> bytes:
  """One file of a committed version, checked against its manifest entry as it is read.

  Size and CRC32C are compared on the bytes the caller gets, so a reader that loads the
  file anyway (an index shard's embeddings) pays no second read for the checksum.

  Args:
    version: the committed Version.
    name: the file's name in the manifest (relative to the data directory).

  Returns:
    The file's bytes.

  Raises:
    VerificationError: naming the file: not in the manifest, missing, truncated or
      corrupted.
  """
  path = file_path(version.path, name)
  entry = next((e for e in version.manifest.get("files", []) if e["name"] == name), None)
  if entry is None:
    raise VerificationError(f"{path}: not listed in the manifest of version "
                            f"{version.version}")
  try:
    data = version.store.read_bytes(path)
  except FileNotFoundError:
    raise VerificationError(f"{path}: missing") from None
  if len(data) != int(entry["size"]):
    raise VerificationError(f"{path}: {len(data)} bytes, manifest says {entry['size']} "
                            "(truncated or replaced)")
  if crc32c_of_bytes(data) != entry["crc32c"]:
    raise VerificationError(f"{path}: CRC32C does not match the manifest (corrupted)")
  return data


def verify_version(version: Version, checksums: bool = False) -> Version:
  """Checks every file the manifest lists: size always, CRC32C if `checksums`.

  Args:
    version: the committed Version.
    checksums: also compare CRC32C (reads every file).

  Returns:
    `version`, verified.

  Raises:
    VerificationError: naming each missing, truncated or corrupted file.
  """
  verify_files(version.path, version.manifest.get("files", []), checksums, version.store)
  return version
