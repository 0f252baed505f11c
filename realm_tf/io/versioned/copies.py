"""Handing a committed version to a reader with its own layout (TF Serving's
`<base>/<n>/`): the copy carries its manifest, which `verify_copy` checks."""
import os
from typing import Iterable, Optional

from realm_tf.io.storage import GFILE, Storage
from realm_tf.io.versioned.collection import delete_version
from realm_tf.io.versioned.manifest import (
  Version,
  file_path,
  read_json,
  verify_files,
  write_json_atomic,
)

COPIED_MANIFEST = "realm_manifest.json"  # a copy_version copy's manifest (see there)


def copy_version(version: Version, dest_dir: str,
                 last: Iterable[str] = ("saved_model.pb", "saved_model.pbtxt"),
                 manifest_dir: str = "", link: bool = False) -> str:
  """Copies a committed version's files to `dest_dir`, the `last` files at the end.

  For consumers with their own commit convention, such as TF Serving's
  `<base_path>/<integer version>/`, which loads a version once its saved_model.pb exists:
  copying that file last makes a half-copied directory invisible to it on any file
  system. Every file is checked against the manifest's size before and after the copy.
  The manifest itself goes along as `<dest_dir>/<manifest_dir>/realm_manifest.json`
  (written before the `last` files), so whoever loads the copy can check it with
  verify_copy wherever it was copied to. Re-running after a crash completes the copy.

  Args:
    version: the committed Version to copy.
    dest_dir: where its files go (same relative names).
    last: names copied after every other file.
    manifest_dir: the subdirectory of `dest_dir` for realm_manifest.json ('' : dest_dir).
    link: hard-link the files where source and copy share a local file system (for a
      source deleted right after, as the exporter's staged version is: written once).

  Returns:
    `dest_dir`.

  Raises:
    VerificationError: a source file, or a copied one, does not match the manifest.
  """
  store = version.store
  entries = version.manifest.get("files", [])
  verify_files(version.path, entries, store=store)
  write_json_atomic(os.path.join(dest_dir, manifest_dir, COPIED_MANIFEST), version.manifest,
                    store)
  last = set(last)
  ordered = ([e for e in entries if e["name"] not in last] +
             [e for e in entries if e["name"] in last])
  for entry in ordered:
    source = file_path(version.path, entry["name"])
    target = file_path(dest_dir, entry["name"])
    try:
      if store.size(target) == int(entry["size"]):
        continue  # copied by an earlier, interrupted run
    except FileNotFoundError:
      pass
    if link:
      store.link_or_copy(source, target)
    else:
      store.copy(source, target)
  verify_files(dest_dir, entries, store=store)
  return dest_dir


def verify_copy(dest_dir: str, manifest_dir: str = "", store: Storage = GFILE
                ) -> Optional[dict]:
  """Checks a copy_version copy against the manifest it carries (sizes and CRC32C).

  Args:
    dest_dir: the copy's directory.
    manifest_dir: where copy_version put realm_manifest.json, relative to `dest_dir`.
    store: the Storage to read through.

  Returns:
    The manifest, or None for a directory without one (not made by copy_version).

  Raises:
    VerificationError: naming each missing, truncated or corrupted file.
  """
  path = os.path.join(dest_dir, manifest_dir, COPIED_MANIFEST)
  if not store.exists(path):
    return None
  manifest = read_json(path, store)
  verify_files(dest_dir, manifest.get("files", []), checksums=True, store=store)
  return manifest


def publish_copy(version: Version, dest_dir: str, manifest_dir: str = "") -> str:
  """Hands a committed version over to a layout with its own commit convention (TF
  Serving's `<base>/<n>/`): copy_version, then the original is deleted, since the copy
  carries its manifest. A crash before the deletion leaves the original for a re-run to
  copy again.

  Args:
    version: the committed Version to hand over.
    dest_dir: the consumer's directory for it (e.g. `<base>/<n>`).
    manifest_dir: as for copy_version.

  Returns:
    `dest_dir`.
  """
  copy_version(version, dest_dir, manifest_dir=manifest_dir)
  delete_version(os.path.dirname(version.path.rstrip("/")), version)
  return dest_dir
