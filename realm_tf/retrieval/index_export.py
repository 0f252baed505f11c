"""Index exports: one committed version directory per encoder snapshot.

  <index_dir>/000000001200.manifest.json  the commit (see realm_tf.io.versioned): shards,
                                          ScaNN parameters, encoder, build time, and every
                                          file with its size and CRC32C
  <index_dir>/000000001200.<writer id>/
    shard-00000-of-00002/
      embeddings.npy                 [n, P] float32 (or float16)
      block_ids.npy                  [n] int64
      scann/                         SavedModel of ScaNN's state (when built)
      shard.json                     size, ScaNN parameters, build seconds

Shards are written independently (by parallel Beam workers) into one uncommitted export
directory, which is then committed as a whole by writing its manifest. Each worker
checksums the files of its shard as it writes them, so the commit reads nothing back.
"""
import dataclasses
import io
import json
import logging
import os
import time
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from realm_tf.io import storage, versioned
from realm_tf.io.versioned import (  # noqa: F401  (re-exported for index readers)
  MANIFEST,
  garbage_collect,
  read_json,
  verify_version,
  write_json_atomic,
)
from realm_tf.io.versioned import Version as IndexExport
from realm_tf.io.versioned import VersionError as ExportError
from realm_tf.retrieval import scann_index


@dataclasses.dataclass
class ShardData:
  """One shard's rows.

  Attributes:
    embeddings: [n, P] float block embeddings.
    block_ids: [n] int64 ids of those blocks (the corpus's block_id).
  """
  embeddings: np.ndarray  # [n, P]
  block_ids: np.ndarray  # [n] int64


def shard_name(index: int, num_shards: int) -> str:
  """'shard-<index>-of-<num_shards>', both 5-digit: the shard's directory name."""
  return f"shard-{index:05d}-of-{num_shards:05d}"


def save_npy(path: str, array: np.ndarray) -> dict:
  """Writes `array` as .npy (no pickle).

  Args:
    path: the file to write (any TF file system).
    array: a numeric numpy array.

  Returns:
    {size, crc32c} of the bytes written (a manifest file entry without its name).
  """
  buffer = io.BytesIO()
  np.save(buffer, array, allow_pickle=False)
  data = buffer.getvalue()
  with tf.io.gfile.GFile(path, "wb") as f:
    f.write(data)
  return dict(size=len(data), crc32c=versioned.crc32c_of_bytes(data))


def load_npy(path: str) -> np.ndarray:
  """A .npy file (no pickle), unverified: see load_shard_array for a committed shard's."""
  with tf.io.gfile.GFile(path, "rb") as f:
    return np.load(io.BytesIO(f.read()), allow_pickle=False)


def load_shard_array(export: "IndexExport", shard: int, num_shards: int,
                     name: str) -> np.ndarray:
  """`<shard dir>/<name>` (embeddings.npy, block_ids.npy) of a committed export, checked
  against the manifest (size and CRC32C) on the bytes as read: a truncated or corrupted
  shard is refused by file name instead of loading wrong embeddings.

  Args:
    export: the committed IndexExport (a versioned.Version).
    shard: the shard's index.
    num_shards: the export's number of shards.
    name: the file in the shard directory ('embeddings.npy' or 'block_ids.npy').

  Returns:
    The array ([n, P] embeddings or [n] int64 ids).

  Raises:
    versioned.VerificationError: the file is not listed, missing, truncated or corrupted.
  """
  data = versioned.read_verified(export, f"{shard_name(shard, num_shards)}/{name}")
  # A read-only view of the bytes read, not np.load's copy of them: a shard's embeddings
  # are ~0.5 GB at REALM's size, and the copy held them twice while it was made.
  header = io.BytesIO(data)
  read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                 (2, 0): np.lib.format.read_array_header_2_0}.get(
                     np.lib.format.read_magic(header))
  if read_header is None:  # a format this reader does not parse: numpy's own, a copy
    return np.load(io.BytesIO(data), allow_pickle=False)
  shape, fortran_order, dtype = read_header(header)
  if dtype.hasobject:
    raise versioned.VerificationError(f"{export.path}: {name} of shard {shard} holds "
                                      "Python objects, not numbers")
  array = np.frombuffer(data, dtype, count=int(np.prod(shape)), offset=header.tell())
  return array.reshape(shape, order="F" if fortran_order else "C")


def new_export_dir(index_dir: str, version: int) -> str:
  """A fresh, uncommitted directory for `version`'s shards (a VersionWriter's).

  Args:
    index_dir: the versioned index directory.
    version: the version the shards will be committed as (the encoder snapshot's step).

  Returns:
    The directory's path, `<index_dir>/<12-digit version>.<writer id>`; commit_export
    commits it.
  """
  return versioned.VersionWriter(index_dir, version).path


def write_shard(export_dir: str, shard_index: int, num_shards: int, data: ShardData,
                build_scann: bool = True, scann_overrides: Optional[dict] = None,
                embedding_dtype: str = "float32") -> dict:
  """Writes one shard (embeddings, ids, ScaNN searcher) into an uncommitted export dir.

  Shards are independent, so many workers (Beam) can write theirs in parallel. The
  returned info lists the shard's files with sizes and CRC32C under "files" (relative to
  `export_dir`); commit_export moves them into the manifest.

  Args:
    export_dir: the uncommitted directory (new_export_dir).
    shard_index: this shard's index.
    num_shards: the export's number of shards.
    data: the shard's embeddings [n, P] and block ids [n].
    build_scann: also build and save a ScaNN searcher over the shard (when n > 0).
    scann_overrides: ScaNN parameters replacing scann_params_for's choices.
    embedding_dtype: the dtype embeddings.npy is stored in ('float32' or 'float16').

  Returns:
    The shard's info (shard, num_shards, num_blocks, dimension, embedding_dtype, ScaNN
    parameters and build seconds when built) plus "files".

  Raises:
    ExportError: embeddings are not [n, P] or block_ids not [n].
  """
  embeddings = np.asarray(data.embeddings, np.float32)
  block_ids = np.asarray(data.block_ids, np.int64)
  if embeddings.ndim != 2 or block_ids.shape != (embeddings.shape[0],):
    raise ExportError(f"shard {shard_index}: embeddings {embeddings.shape} and block_ids "
                      f"{block_ids.shape} do not match")
  name = shard_name(shard_index, num_shards)
  path = os.path.join(export_dir, name)
  tf.io.gfile.makedirs(path)
  files = [
      dict(name=f"{name}/embeddings.npy", **save_npy(os.path.join(path, "embeddings.npy"),
                                                     embeddings.astype(embedding_dtype))),
      dict(name=f"{name}/block_ids.npy", **save_npy(os.path.join(path, "block_ids.npy"),
                                                    block_ids))]
  info = dict(shard=shard_index, num_shards=num_shards, num_blocks=int(embeddings.shape[0]),
              dimension=int(embeddings.shape[1]), embedding_dtype=embedding_dtype)
  if build_scann and embeddings.shape[0]:
    params = scann_index.scann_params_for(embeddings.shape[0], **(scann_overrides or {}))
    start = time.time()
    # Built and released here: a worker writes shard after shard.
    state = scann_index.scann_state(embeddings, params)
    info["scann_build_seconds"] = round(time.time() - start, 3)
    tf.saved_model.save(state, os.path.join(path, "scann"))
    info["scann"] = params.to_dict()
    # Checksummed here, on the worker that wrote it, in parallel with the other shards.
    files += [dict(e, name=f"{name}/scann/{e['name']}")
              for e in versioned.file_entries(os.path.join(path, "scann"))]
  shard_json = json.dumps(info, indent=2, sort_keys=True).encode("utf-8")
  with tf.io.gfile.GFile(os.path.join(path, "shard.json"), "wb") as f:
    f.write(shard_json)
  files.append(dict(name=f"{name}/shard.json", size=len(shard_json),
                    crc32c=versioned.crc32c_of_bytes(shard_json)))
  return dict(info, files=files)


def commit_export(export_dir: str, index_dir: str, version: int, manifest: dict,
                  identity: Optional[str] = None) -> str:
  """Commits an export directory (from new_export_dir) once every shard named in the
  manifest is there; returns the committed data directory.

  `identity` (see VersionWriter.commit) says what makes two builds of this version the
  same: two index builders that embed the same snapshot with the same settings agree,
  although ScaNN's serialized state differs byte for byte.

  Args:
    export_dir: the directory the shards were written into (new_export_dir).
    index_dir: the versioned index directory.
    version: the version to commit.
    manifest: the export's manifest: "shards" (write_shard's infos, files included) plus
      what the publisher records (encoder, num_blocks, dimension, ...).
    identity: see above; None compares files.

  Returns:
    The committed data directory (another builder's, if it committed an identical
    version first).

  Raises:
    ExportError: a shard named in the manifest is missing (or the manifest names none).
    versioned.VersionConflictError: a different version with this number is committed.
  """
  num_shards = len(manifest.get("shards") or [])
  missing = [shard_name(i, num_shards) for i in range(num_shards)
             if not tf.io.gfile.exists(os.path.join(export_dir, shard_name(i, num_shards),
                                                    "shard.json"))]
  if not num_shards or missing:
    raise ExportError(f"{export_dir}: cannot commit, shards missing: {missing or 'all'}")
  files = [f for shard in manifest["shards"] for f in shard.get("files", ())]
  manifest = dict(manifest, shards=[{k: v for k, v in shard.items() if k != "files"}
                                    for shard in manifest["shards"]])
  writer = versioned.VersionWriter.for_existing_dir(index_dir, version, export_dir)
  final = writer.commit(manifest, files=files, identity=identity).path
  logging.info("Committed index export %s (%d shards)", final, num_shards)
  return final


def write_export(index_dir: str, version: int, shards: Sequence[ShardData],
                 build_scann: bool = True, scann_overrides: Optional[dict] = None,
                 embedding_dtype: str = "float32", extra: Optional[dict] = None) -> str:
  """Writes and commits a whole export in this process.

  The Beam pipeline (realm_tf.pipelines) writes shards in parallel instead; this is for
  tests, tools and small corpora. On failure the uncommitted directory is deleted.

  Args:
    index_dir: the versioned index directory.
    version: the version to commit.
    shards: one ShardData per shard.
    build_scann: also build each shard's ScaNN searcher.
    scann_overrides: ScaNN parameters replacing scann_params_for's choices.
    embedding_dtype: the dtype embeddings.npy is stored in.
    extra: further manifest fields (e.g. the encoder snapshot).

  Returns:
    The committed data directory.
  """
  start = time.time()
  tmp = new_export_dir(index_dir, version)
  try:
    infos = [write_shard(tmp, i, len(shards), shard, build_scann, scann_overrides,
                         embedding_dtype) for i, shard in enumerate(shards)]
    manifest = dict(extra or {}, shards=infos,
                    num_blocks=int(sum(i["num_blocks"] for i in infos)),
                    dimension=infos[0]["dimension"],
                    build_seconds=round(time.time() - start, 3))
    return commit_export(tmp, index_dir, version, manifest)
  except BaseException:
    storage.delete_prefix(tmp)  # nothing names it; do not wait for garbage collection
    raise


def list_exports(index_dir: str) -> list[IndexExport]:
  """Committed exports, oldest first. Partial or temporary ones are never listed."""
  return versioned.list_versions(index_dir)


def latest_export(index_dir: str) -> Optional[IndexExport]:
  """The newest committed export of `index_dir`, or None."""
  return versioned.latest_version(index_dir)
