"""Steps of the corpus-embedding pipeline: blocks → embeddings → index shards → commit."""
import json
import logging
import time
from typing import Optional, Sequence

import apache_beam as beam
from apache_beam.io import tfrecordio
import numpy as np
from apache_beam.ml.inference.base import KeyedModelHandler, RunInference

from realm_tf.pipelines.transforms.savedmodel_inference import SavedModelSignatureHandler
from realm_tf.retrieval import index_export


class ReadBlocks(beam.PTransform):
  """Block TFRecords (the corpus pipeline's `blocks-*`) → {block_id, title, text} dicts.

  The launcher names the files (read through the corpus's manifest: data.files.files, so
  a partial corpus is refused before any worker starts); they are reshuffled (so each is
  read by whichever worker is free, not all by the one that listed them) and read on the
  workers.
  """

  def __init__(self, paths: Sequence[str]):
    super().__init__()
    if not paths:
      raise ValueError("ReadBlocks: no block files to read")
    self.paths = list(paths)

  def expand(self, pbegin):
    return (pbegin
            | "BlockFiles" >> beam.Create(self.paths)
            | "SpreadFiles" >> beam.Reshuffle()
            | "ReadTFRecords" >> tfrecordio.ReadAllFromTFRecord()
            | "Parse" >> beam.Map(_parse_block))


def _parse_block(serialized: bytes) -> dict:
  # Protobuf parsing per record, not tf.io ops: no TF graph work per element on workers.
  import tensorflow as tf  # noqa: PLC0415  TensorFlow loads on the worker only
  example = tf.train.Example.FromString(serialized)
  feature = example.features.feature
  return dict(block_id=feature["block_id"].int64_list.value[0],
              title=feature["title"].bytes_list.value[0],
              text=feature["text"].bytes_list.value[0])


class EmbedBlocks(beam.PTransform):
  """{block_id, title, text} → (block_id, embedding [P] float32), batched through
  RunInference over the block-encoder SavedModel."""

  def __init__(self, encoder_dir: str, batch_size: int = 64, large_model: bool = False,
               model_copies: int = 0):
    super().__init__()
    self.encoder_dir = encoder_dir
    self.batch_size = batch_size
    self.large_model = large_model
    self.model_copies = model_copies

  def expand(self, blocks):
    handler = KeyedModelHandler(
        SavedModelSignatureHandler(self.encoder_dir, batch_size=self.batch_size,
                                   large_model=self.large_model,
                                   model_copies=self.model_copies))
    return (blocks
            | "KeyByBlockId" >> beam.Map(
                lambda b: (b["block_id"], {"title": b["title"], "text": b["text"]}))
            | "RunInference" >> RunInference(handler)
            | "Embedding" >> beam.MapTuple(
                lambda block_id, result: (block_id,
                                          np.asarray(result.inference["embeddings"],
                                                     np.float32))))


class WriteIndexShards(beam.PTransform):
  """(block_id, embedding) → one written shard per `block_id mod num_shards`; emits each
  shard's info dict."""

  def __init__(self, export_dir: str, num_shards: int, build_scann: bool = True,
               scann_overrides: Optional[dict] = None, embedding_dtype: str = "float32"):
    super().__init__()
    self.export_dir = export_dir
    self.num_shards = num_shards
    self.build_scann = build_scann
    self.scann_overrides = scann_overrides
    self.embedding_dtype = embedding_dtype

  def expand(self, embeddings):
    return (embeddings
            | "KeyByShard" >> beam.Map(lambda kv: (int(kv[0]) % self.num_shards, kv))
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShard" >> beam.MapTuple(self._write))

  def _write(self, shard: int, items) -> dict:
    items = sorted(items, key=lambda kv: kv[0])  # deterministic row order
    data = index_export.ShardData(
        embeddings=np.stack([e for _, e in items]).astype(np.float32),  # [n, P]
        block_ids=np.array([b for b, _ in items], np.int64))
    beam.metrics.Metrics.counter("embed_corpus", "blocks_indexed").inc(len(items))
    return index_export.write_shard(self.export_dir, shard, self.num_shards, data,
                                    self.build_scann, self.scann_overrides,
                                    self.embedding_dtype)


class CommitIndex(beam.PTransform):
  """All shard infos → the committed export (empty shards written where a shard got no
  blocks), then old versions garbage-collected."""

  def __init__(self, export_dir: str, index_dir: str, version: int, manifest: dict,
               num_shards: int, keep_versions: int = 3, identity: Optional[str] = None):
    super().__init__()
    self.identity = identity
    self.export_dir = export_dir
    self.index_dir = index_dir
    self.version = version
    self.manifest = manifest
    self.num_shards = num_shards
    self.keep_versions = keep_versions

  def expand(self, shard_infos):
    return (shard_infos
            | "AllShards" >> beam.combiners.ToList()
            | "Commit" >> beam.Map(self._commit))

  def _commit(self, infos: list) -> str:
    by_shard = {info["shard"]: info for info in infos}
    dimension = next((i["dimension"] for i in infos), self.manifest.get("dimension", 0))
    for shard in range(self.num_shards):
      if shard not in by_shard:
        by_shard[shard] = index_export.write_shard(
            self.export_dir, shard, self.num_shards,
            index_export.ShardData(np.zeros([0, dimension], np.float32),
                                   np.zeros([0], np.int64)), build_scann=False)
    shards = [by_shard[s] for s in range(self.num_shards)]
    manifest = dict(self.manifest, shards=shards, num_shards=self.num_shards,
                    num_blocks=int(sum(s["num_blocks"] for s in shards)),
                    dimension=int(dimension),
                    build_seconds=round(time.time() - self.manifest["started_at"], 3))
    # Written here only if a shard got no blocks (its worker wrote nothing for it).
    path = index_export.commit_export(self.export_dir, self.index_dir, self.version, manifest,
                                      identity=self.identity)
    deleted = index_export.garbage_collect(self.index_dir, keep=self.keep_versions)
    logging.info("Index %s committed (%d blocks); garbage-collected %s", path,
                 manifest["num_blocks"], deleted)
    return json.dumps({"path": path, "num_blocks": manifest["num_blocks"]})
