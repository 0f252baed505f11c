"""Index exports: one committed version directory per encoder snapshot.

  <index_dir>/000000001200/          (see realm_tf.io.versioned for the commit protocol)
    manifest.json                    shards, sizes, ScaNN parameters, encoder, build time
    shard-00000-of-00002/
      embeddings.npy                 [n, P] float32 (or float16)
      block_ids.npy                  [n] int64
      scann/                         SavedModel of ScaNN's state (when built)
      shard.json                     size, ScaNN parameters, build seconds

Shards are written independently (by parallel Beam workers) into one temporary export
directory, which is then committed as a whole.
"""
import dataclasses
import io
import logging
import os
import time
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from realm_tf.io import versioned
from realm_tf.io.versioned import (  # noqa: F401  (re-exported for index readers)
    MANIFEST, Version as IndexExport, VersionError as ExportError, garbage_collect,
    read_json, write_json_atomic)


@dataclasses.dataclass
class ShardData:
  embeddings: np.ndarray  # [n, P]
  block_ids: np.ndarray  # [n] int64


def shard_name(index: int, num_shards: int) -> str:
  return f"shard-{index:05d}-of-{num_shards:05d}"


def save_npy(path: str, array: np.ndarray):
  buffer = io.BytesIO()
  np.save(buffer, array, allow_pickle=False)
  with tf.io.gfile.GFile(path, "wb") as f:
    f.write(buffer.getvalue())


def load_npy(path: str) -> np.ndarray:
  with tf.io.gfile.GFile(path, "rb") as f:
    return np.load(io.BytesIO(f.read()), allow_pickle=False)


def new_export_dir(index_dir: str, version: int) -> str:
  """A fresh temporary directory for writing `version`'s shards."""
  return versioned.new_tmp_dir(index_dir, version)


def write_shard(export_dir: str, shard_index: int, num_shards: int, data: ShardData,
                build_scann: bool = True, scann_overrides: Optional[dict] = None,
                embedding_dtype: str = "float32") -> dict:
  """Writes one shard (embeddings, ids, ScaNN searcher) into a temporary export dir.

  Shards are independent, so many workers (Beam) can write theirs in parallel.
  """
  embeddings = np.asarray(data.embeddings, np.float32)
  block_ids = np.asarray(data.block_ids, np.int64)
  if embeddings.ndim != 2 or block_ids.shape != (embeddings.shape[0],):
    raise ExportError(f"shard {shard_index}: embeddings {embeddings.shape} and block_ids "
                      f"{block_ids.shape} do not match")
  path = os.path.join(export_dir, shard_name(shard_index, num_shards))
  tf.io.gfile.makedirs(path)
  save_npy(os.path.join(path, "embeddings.npy"), embeddings.astype(embedding_dtype))
  save_npy(os.path.join(path, "block_ids.npy"), block_ids)
  info = dict(shard=shard_index, num_shards=num_shards, num_blocks=int(embeddings.shape[0]),
              dimension=int(embeddings.shape[1]), embedding_dtype=embedding_dtype)
  if build_scann and embeddings.shape[0]:
    from realm_tf.retrieval import scann_searcher  # pylint: disable=g-import-not-at-top
    params = scann_searcher.scann_params_for(embeddings.shape[0], **(scann_overrides or {}))
    start = time.time()
    searcher = scann_searcher.build_scann(embeddings, params)
    info["scann_build_seconds"] = round(time.time() - start, 3)
    tf.saved_model.save(searcher.serialize_to_module(), os.path.join(path, "scann"))
    info["scann"] = params.to_dict()
  write_json_atomic(os.path.join(path, "shard.json"), info)
  return info


def commit_export(export_dir: str, index_dir: str, version: int, manifest: dict) -> str:
  """Commits a temporary export once every shard named in the manifest is there."""
  num_shards = len(manifest.get("shards") or [])
  missing = [shard_name(i, num_shards) for i in range(num_shards)
             if not tf.io.gfile.exists(os.path.join(export_dir, shard_name(i, num_shards),
                                                    "shard.json"))]
  if not num_shards or missing:
    raise ExportError(f"{export_dir}: cannot commit, shards missing: {missing or 'all'}")
  final = versioned.commit(export_dir, index_dir, version, manifest)
  logging.info("Committed index export %s (%d shards)", final, num_shards)
  return final


def write_export(index_dir: str, version: int, shards: Sequence[ShardData],
                 build_scann: bool = True, scann_overrides: Optional[dict] = None,
                 embedding_dtype: str = "float32", extra: Optional[dict] = None) -> str:
  """Writes a whole export in this process (the Beam pipeline writes shards in parallel)."""
  start = time.time()
  tmp = new_export_dir(index_dir, version)
  infos = [write_shard(tmp, i, len(shards), shard, build_scann, scann_overrides,
                       embedding_dtype) for i, shard in enumerate(shards)]
  manifest = dict(extra or {}, shards=infos,
                  num_blocks=int(sum(i["num_blocks"] for i in infos)),
                  dimension=infos[0]["dimension"], build_seconds=round(time.time() - start, 3))
  return commit_export(tmp, index_dir, version, manifest)


def list_exports(index_dir: str) -> list[IndexExport]:
  """Committed exports, oldest first. Partial or temporary ones are never listed."""
  return versioned.list_versions(index_dir)


def latest_export(index_dir: str) -> Optional[IndexExport]:
  return versioned.latest_version(index_dir)
