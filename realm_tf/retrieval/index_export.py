"""Versioned, atomic index exports: the file system is the message bus between the index
builder and its readers (trainer, evaluator, server).

  <index_dir>/
    000000001200/                  one version (e.g. the encoder's training step)
      manifest.json                the commit marker, written last
      shard-00000-of-00002/
        embeddings.npy             [n, P] float32 (or float16)
        block_ids.npy              [n] int64
        scann/                     SavedModel of ScaNN's state (when built)
        shard.json                 size, ScaNN parameters, build seconds
    .tmp-000000001200-<uuid>/      an export being written; never read

A version is written under a temporary name and renamed into place when every shard is
there; `manifest.json` is then written (itself via a temporary file and a rename) as the
commit marker. Readers only list versions that have a manifest, so they never see a
partial export, on local disks (atomic rename) or object stores (where a directory rename
is a copy, and the manifest, written after it, still marks the end).
"""
import dataclasses
import io
import json
import logging
import os
import re
import time
import uuid
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

MANIFEST = "manifest.json"
_VERSION_RE = re.compile(r"^\d{12}$")
_TMP_PREFIX = ".tmp-"


class ExportError(RuntimeError):
  """An index export that cannot be written or read as asked."""


@dataclasses.dataclass
class ShardData:
  embeddings: np.ndarray  # [n, P]
  block_ids: np.ndarray  # [n] int64


@dataclasses.dataclass
class IndexExport:
  version: int
  path: str
  manifest: dict


def version_name(version: int) -> str:
  if version < 0:
    raise ValueError(f"version must be >= 0, got {version}")
  return f"{version:012d}"


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


def write_json_atomic(path: str, payload: dict):
  tmp = f"{path}.tmp-{uuid.uuid4().hex}"
  with tf.io.gfile.GFile(tmp, "w") as f:
    json.dump(payload, f, indent=2, sort_keys=True)
  tf.io.gfile.rename(tmp, path, overwrite=True)


def read_json(path: str) -> dict:
  with tf.io.gfile.GFile(path) as f:
    return json.load(f)


def new_export_dir(index_dir: str, version: int) -> str:
  """A fresh temporary directory for writing `version`'s shards."""
  path = os.path.join(index_dir, f"{_TMP_PREFIX}{version_name(version)}-{uuid.uuid4().hex}")
  tf.io.gfile.makedirs(path)
  return path


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
  """Renames a complete temporary export into `<index_dir>/<version>` and commits it."""
  shards = manifest.get("shards") or []
  num_shards = len(shards)
  missing = [shard_name(i, num_shards) for i in range(num_shards)
             if not tf.io.gfile.exists(os.path.join(export_dir, shard_name(i, num_shards),
                                                    "shard.json"))]
  if not num_shards or missing:
    raise ExportError(f"{export_dir}: cannot commit, shards missing: {missing or 'all'}")
  final = os.path.join(index_dir, version_name(version))
  if tf.io.gfile.exists(final):
    raise ExportError(f"{final}: version {version} already exists")
  tf.io.gfile.rename(export_dir, final)
  manifest = dict(manifest, version=version, committed_at=time.time())
  write_json_atomic(os.path.join(final, MANIFEST), manifest)
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
  if not tf.io.gfile.isdir(index_dir):
    return []
  exports = []
  for name in tf.io.gfile.listdir(index_dir):
    name = name.rstrip("/")
    if not _VERSION_RE.match(name):
      continue
    path = os.path.join(index_dir, name)
    manifest_path = os.path.join(path, MANIFEST)
    if not tf.io.gfile.exists(manifest_path):
      continue
    try:
      manifest = read_json(manifest_path)
    except (json.JSONDecodeError, tf.errors.OpError) as e:
      logging.warning("Skipping %s: unreadable manifest (%s)", path, e)
      continue
    exports.append(IndexExport(int(name), path, manifest))
  return sorted(exports, key=lambda e: e.version)


def latest_export(index_dir: str) -> Optional[IndexExport]:
  exports = list_exports(index_dir)
  return exports[-1] if exports else None


def garbage_collect(index_dir: str, keep: int = 3,
                    stale_tmp_seconds: float = 6 * 3600) -> list[str]:
  """Deletes all but the newest `keep` committed versions, and temporary exports older than
  `stale_tmp_seconds` (left by crashed writers). Returns what was deleted."""
  deleted = []
  exports = list_exports(index_dir)
  for export in exports[:max(0, len(exports) - keep)]:
    tf.io.gfile.rmtree(export.path)
    deleted.append(export.path)
  if tf.io.gfile.isdir(index_dir):
    now = time.time()
    for name in tf.io.gfile.listdir(index_dir):
      name = name.rstrip("/")
      path = os.path.join(index_dir, name)
      if name.startswith(_TMP_PREFIX) and now - _mtime(path) > stale_tmp_seconds:
        tf.io.gfile.rmtree(path)
        deleted.append(path)
  return deleted


def _mtime(path: str) -> float:
  try:
    return tf.io.gfile.stat(path).mtime_nsec / 1e9
  except tf.errors.OpError:
    return time.time()
