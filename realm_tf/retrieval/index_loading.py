"""Turning an index export back into a Searcher."""
import os
from typing import Union

import tensorflow as tf
from scann.scann_ops.py import scann_ops

from realm_tf.io import versioned
from realm_tf.retrieval.exact import ExactSearcher
from realm_tf.retrieval.index_export import (
    ExportError, IndexExport, latest_export, load_shard_array, shard_name)
from realm_tf.retrieval.scann_searcher import ScannSearcher
from realm_tf.retrieval.sharded import ShardedSearcher

BACKENDS = ("scann", "exact")


def resolve_export(path: str) -> IndexExport:
  """The committed export `path` names.

  Args:
    path: one committed export (its data dir, its manifest, or `<index_dir>/<version>`)
      or an index dir (its newest committed export).

  Returns:
    The IndexExport.

  Raises:
    ExportError: `path` is an index dir with no committed export.
  """
  try:
    return versioned.read_version(path)
  except versioned.VersionError:
    pass
  export = latest_export(path)
  if export is None:
    raise ExportError(f"{path}: no committed index export")
  return export


def load_searcher(path_or_export: Union[str, IndexExport], backend: str = "scann",
                  rescore: bool = False, verify_checksums: bool = False) -> ShardedSearcher:
  """A ShardedSearcher over every shard of an export.

  Args:
    path_or_export: an index dir (its newest committed export is used), one export dir, or
      an IndexExport.
    backend: 'scann' (the shards' serialised ScaNN searchers) or 'exact'.
    rescore: with ScaNN, re-score candidates exactly with the stored embeddings.
    verify_checksums: also check the CRC32C of the ScaNN searchers' files against the
      manifest (sizes are always checked; the embeddings and block ids always have their
      CRC32C checked as they are read).

  Returns:
    A ShardedSearcher over the non-empty shards, with the IndexExport as its `export`.

  Raises:
    ValueError: `backend` is not 'scann' or 'exact'.
    ExportError: no committed export at the path, or backend 'scann' and a shard has no
      ScaNN searcher.
    VerificationError: a file is missing, truncated or corrupted (a ScaNN file: with
      verify_checksums).
  """
  if backend not in BACKENDS:
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
  export = path_or_export if isinstance(path_or_export, IndexExport) else resolve_export(
      path_or_export)
  # Sizes of every file against the manifest: a truncated shard is refused by name here
  # instead of failing (or worse, loading) deep inside numpy or ScaNN. The .npy files are
  # checksummed as they are read below, so only the others get a CRC32C pass here.
  files = export.manifest.get("files", [])
  versioned.verify_files(export.path, files)
  if verify_checksums:
    versioned.verify_files(export.path, [e for e in files if not e["name"].endswith(".npy")],
                           checksums=True)
  shards_info = export.manifest["shards"]
  shards = []
  for info in shards_info:
    if not info["num_blocks"]:
      continue  # a shard that received no blocks has nothing to search
    path = os.path.join(export.path, shard_name(info["shard"], len(shards_info)))
    embeddings = load_shard_array(export, info["shard"], len(shards_info), "embeddings.npy")
    block_ids = load_shard_array(export, info["shard"], len(shards_info), "block_ids.npy")
    if backend == "exact":
      shards.append(ExactSearcher(embeddings, block_ids, name=f"exact_{info['shard']}"))
      continue
    scann_dir = os.path.join(path, "scann")
    if not tf.io.gfile.exists(scann_dir):
      raise ExportError(f"{path}: no ScaNN searcher in this shard; use backend='exact'")
    state = tf.saved_model.load(scann_dir)
    searcher = ScannSearcher(
        scann_ops.searcher_from_module(state), block_ids, int(info["dimension"]),
        rescore_embeddings=embeddings.astype("float32") if rescore else None,
        name=f"scann_{info['shard']}")
    searcher.scann_state = state  # keep the loaded assets alive with the searcher
    shards.append(searcher)
  searcher = ShardedSearcher(shards)
  searcher.export = export
  return searcher
