"""Turning an index export back into a Searcher, or into the ScaNN shards a served graph
searches."""
import logging
import os
from typing import Optional, Union

import numpy as np
import tensorflow as tf

from realm_tf.io import versioned
from realm_tf.retrieval import scann_index
from realm_tf.retrieval.exact import ExactSearcher
from realm_tf.retrieval.index_export import (
    ExportError, IndexExport, latest_export, load_shard_array, shard_name)
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
    block_ids = load_shard_array(export, info["shard"], len(shards_info), "block_ids.npy")
    # Read only where used: a ScaNN shard holds its own copy of the vectors.
    if backend == "exact" or rescore:
      embeddings = load_shard_array(export, info["shard"], len(shards_info), "embeddings.npy")
    if backend == "exact":
      shards.append(ExactSearcher(embeddings, block_ids, name=f"exact_{info['shard']}"))
      continue
    scann_dir = os.path.join(path, "scann")
    if not tf.io.gfile.exists(scann_dir):
      raise ExportError(f"{path}: no ScaNN searcher in this shard; use backend='exact'")
    shards.append(scann_index.host_searcher(
        scann_index.load_shard(scann_dir, block_ids), int(info["dimension"]),
        rescore_embeddings=embeddings.astype("float32") if rescore else None,
        name=f"scann_{info['shard']}"))
  searcher = ShardedSearcher(shards)
  searcher.export = export
  return searcher


def version_scann_shards(export: Optional[versioned.Version], embeddings,
                         block_ids: np.ndarray, rows_per_shard: int = 0,
                         **overrides) -> list[scann_index.ScannShard]:
  """The per-shard ScaNN states an index version carries (beam.embed_corpus, the index
  builder and the released import's --build_scann publish them with it), each as it was
  built; a shard without one, or no committed version at all, is built here from
  `embeddings`, at most `rows_per_shard` rows at a time (scann_index.build_shards).
  Nothing is built over all N blocks at once.

  Args:
    export: the committed index version (None: build every shard here).
    embeddings: [N, P] of the index in row order (a RowBlocks, an array or a memmap).
    block_ids: [N] ascending int64 ids of those rows.
    rows_per_shard: rows of a shard built here at most (0: row_blocks.ROWS_PER_BLOCK).
    **overrides: ScannParams fields for the shards built here.

  Returns:
    One ScannShard per non-empty index shard with a state, plus those built.

  Raises:
    ValueError: a shard's block ids are not among `block_ids`.
  """
  ids = np.asarray(block_ids, np.int64)
  if export is None:
    return scann_index.build_shards(embeddings, ids, None, rows_per_shard, **overrides)
  shards = export.manifest.get("shards", [])
  found, missing = [], []
  for info in shards:
    if not info["num_blocks"]:
      continue
    shard_ids = load_shard_array(export, info["shard"], len(shards), "block_ids.npy")
    path = os.path.join(export.path, shard_name(info["shard"], len(shards)), "scann")
    if tf.io.gfile.exists(path):
      found.append(scann_index.load_shard(path, shard_ids))
      continue
    rows = np.minimum(np.searchsorted(ids, shard_ids), len(ids) - 1)
    if not np.array_equal(ids[rows], shard_ids):
      raise ValueError(f"{export.path} shard {info['shard']}: its block ids are not the "
                       "index's")
    missing.append(rows)
  if missing:
    logging.info("Index %s: %d of %d shards carry no ScaNN state; building them",
                 export.path, len(missing), len(shards))
    found += scann_index.build_shards(embeddings, ids, np.concatenate(missing),
                                      rows_per_shard, **overrides)
  return found
