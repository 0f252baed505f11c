"""Embed the corpus blocks with a block-encoder snapshot into a sharded, versioned index.

    from realm_tf.pipelines.embed import EmbedConfig, embed_corpus
    index_path = embed_corpus(EmbedConfig(blocks="gs://b/corpus",
                                          encoder="gs://b/run/export/block_encoder",
                                          output_dir="gs://b/run/index", num_shards=8),
                              pipeline_args=["--runner", "DataflowRunner", ...])

  ReadBlocks ─ EmbedBlocks (RunInference) ─ WriteIndexShards ─ CommitIndex
  (match, reshuffle,                          (ScaNN per shard,   (manifest written last,
   read on workers)                            checksummed)        then GC of old versions)

Shards are written into an uncommitted export directory; the version (by default the
encoder's training step) becomes visible only when CommitIndex writes its manifest. The
launcher holds a lease on the encoder snapshot while the job runs, so the trainer's
garbage collection cannot delete it under the workers.
"""
import dataclasses
import json
import logging
import time
from typing import Optional, Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from realm_tf.data import files as data_files
from realm_tf.io import storage, versioned
from realm_tf.pipelines.filesystems import BEAM
from realm_tf.pipelines.transforms.embedding import (
    CommitIndex, EmbedBlocks, ReadBlocks, WriteIndexShards)


@dataclasses.dataclass
class EmbedConfig:
  """What to embed, where to publish it, and how RunInference runs the encoder."""
  blocks: str  # corpus dir (its blocks-* TFRecords) or a file pattern
  encoder: str  # a committed block-encoder export, or a directory of them (newest used)
  output_dir: str  # the index directory; versions are committed under it
  num_shards: int = 1
  version: Optional[int] = None  # None: the encoder's training step
  batch_size: int = 64  # blocks per encoder call
  build_scann: bool = True  # False: embeddings only (exact search)
  scann_overrides: dict = dataclasses.field(default_factory=dict)
  embedding_dtype: str = "float32"  # or float16
  keep_versions: int = 3
  # RunInference: True loads one encoder per worker VM shared by its SDK processes
  # (instead of one per process); model_copies > 0 caps the copies (implies large_model).
  large_model: bool = False
  model_copies: int = 0
  lease_ttl_seconds: float = 1800.0  # lease on the encoder snapshot, refreshed while held
  builder: str = ""  # who builds (recorded in the manifest; the index builder's host:pid)
  # `blocks` were made by another tool and have no manifest: read unchecked (never the
  # default: a corpus whose writer died half-way must not be indexed as if complete).
  unpublished_blocks: bool = False

  def validate(self) -> None:
    problems = []
    for name in ("blocks", "encoder", "output_dir"):
      if not getattr(self, name):
        problems.append(f"{name} is required")
    if self.num_shards < 1:
      problems.append("num_shards must be at least 1")
    if self.batch_size < 1:
      problems.append("batch_size must be positive")
    if self.embedding_dtype not in ("float32", "float16"):
      problems.append("embedding_dtype must be float32 or float16")
    if self.model_copies < 0:
      problems.append("model_copies must be >= 0")
    if self.version is not None and self.version < 0:
      problems.append("version must be >= 0")
    if not isinstance(self.scann_overrides, dict):
      problems.append("scann_overrides must be a dict of ScannParams fields")
    if problems:
      raise ValueError("invalid embedding config: " + "; ".join(problems))


def resolve_encoder(path: str) -> versioned.Version:
  """One committed encoder export, or the newest under a directory of them."""
  try:
    return versioned.read_version(path)
  except versioned.VersionError:
    latest = versioned.latest_version(path)
    if latest is None:
      raise FileNotFoundError(f"{path}: no committed encoder export") from None
    return latest


def build_identity(encoder: versioned.Version, config: EmbedConfig) -> str:
  """What makes two builds of one index version the same build: the encoder (its
  identity, else its fingerprint), the blocks and every setting that changes the files."""
  return json.dumps(dict(
      encoder=encoder.manifest.get("identity") or encoder.manifest.get("fingerprint"),
      blocks=config.blocks, num_shards=config.num_shards, build_scann=config.build_scann,
      scann_overrides=config.scann_overrides, embedding_dtype=config.embedding_dtype),
      sort_keys=True)


def _encoder_root(encoder: versioned.Version) -> str:
  return encoder.path.rstrip("/").rsplit("/", 1)[0]


def embed_corpus(config: EmbedConfig, pipeline_args: Sequence[str] = ()) -> str:
  """Runs the pipeline to completion; returns the committed index export path.

  Args:
    config: what to embed and where (EmbedConfig).
    pipeline_args: Beam runner options, passed untouched.

  Returns:
    The committed index version's data directory.

  Raises:
    versioned.UnpublishedError: the blocks are not a published corpus (unless
      config.unpublished_blocks): checked before anything is written.
    FileNotFoundError: no blocks, or no committed encoder export.
  """
  config.validate()
  # Through Beam's FileSystems, as the workers read them (the launcher reads the manifest
  # and lists the files; no record).
  block_files = data_files.files(data_files.corpus_files(config.blocks, data_files.BLOCKS, BEAM),
                                 config.unpublished_blocks, BEAM)
  encoder = resolve_encoder(config.encoder)
  version = encoder.manifest.get("step", 0) if config.version is None else config.version
  with versioned.Lease(_encoder_root(encoder), encoder.version, holder="embed_corpus",
                       ttl_seconds=config.lease_ttl_seconds):
    # Sizes and CRC32C (a snapshot is small next to the corpus it embeds): a truncated or
    # corrupted snapshot fails here, by file name, never as wrong embeddings.
    versioned.verify_version(encoder, checksums=True)
    export_dir = versioned.VersionWriter(config.output_dir, version).path
    manifest = dict(
        encoder=dict(path=encoder.path, step=encoder.manifest.get("step"),
                     fingerprint=encoder.manifest.get("fingerprint"),
                     kind=encoder.manifest.get("kind"),
                     committed_at=encoder.manifest.get("committed_at")),
        blocks=config.blocks, dimension=encoder.manifest.get("dimension", 0),
        embedding_dtype=config.embedding_dtype, started_at=time.time())
    if config.builder:
      manifest["builder"] = config.builder
    logging.info("Embedding %s with %s into %s (version %d, %d shards)", config.blocks,
                 encoder.path, config.output_dir, version, config.num_shards)
    try:
      with beam.Pipeline(options=PipelineOptions(list(pipeline_args),
                                                 save_main_session=False)) as p:
        _ = (p
             | "ReadBlocks" >> ReadBlocks(block_files)
             | "EmbedBlocks" >> EmbedBlocks(encoder.path, config.batch_size,
                                            config.large_model, config.model_copies)
             | "WriteIndexShards" >> WriteIndexShards(
                 export_dir, config.num_shards, build_scann=config.build_scann,
                 scann_overrides=config.scann_overrides,
                 embedding_dtype=config.embedding_dtype)
             | "CommitIndex" >> CommitIndex(export_dir, config.output_dir, version, manifest,
                                            config.num_shards, config.keep_versions,
                                            identity=build_identity(encoder, config)))
    except BaseException:
      # Not committed, so no reader can see it; delete it now rather than at GC time.
      if not _committed(export_dir):
        storage.delete_prefix(export_dir)
      raise
  return versioned.read_version(versioned.manifest_path(config.output_dir, version)).path


def _committed(export_dir: str) -> bool:
  try:
    return versioned.read_version(export_dir).path.rstrip("/") == export_dir.rstrip("/")
  except versioned.VersionError:
    return False
