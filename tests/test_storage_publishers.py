"""Every publisher on ram:// (TF's in-memory file system, object-store-like): encoder
snapshots, index exports and their loader, the tagger export, and the index builder's
embedding job (blocks read by Beam from local disk, encoder and index on ram://)."""
import dataclasses
import os
import re
import uuid

import numpy as np
import pytest
import tensorflow as tf

from realm_tf.corpus import published, schema
from realm_tf.retrieval import encoders
from realm_tf.io import storage, versioned
from realm_tf.pipelines import embed, index_builder
from realm_tf.retrieval import index_export, index_loading
from realm_tf.tagger import export as tagger_export

DIM = 4


class _HashEncoder(tf.Module):
  """A tiny block encoder with the real export's signature: (title, text) → [B, DIM]."""
  kind = encoders.BLOCK
  seq_length = 8
  dimension = DIM

  def __init__(self, scale: float = 1.0):
    super().__init__()
    self.scale = tf.Variable(scale)

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="title"),
                                tf.TensorSpec([None], tf.string, name="text")])
  def embed(self, title, text):
    buckets = tf.strings.to_hash_bucket_fast(tf.strings.join([title, text]), 1000)  # [B]
    return {"embeddings": self.scale * tf.one_hot(buckets % DIM, DIM)}  # [B, DIM]

  def signatures(self):
    return {"serving_default": self.embed}


@pytest.fixture
def ram_root():
  root = f"ram://publishers-{uuid.uuid4().hex}"
  yield root
  storage.delete_prefix(root)


def test_encoder_snapshot_export_and_load_on_ram(ram_root):
  root = os.path.join(ram_root, "export", "block_encoder")
  path = encoders.export_encoder(_HashEncoder(), root, step=30)
  latest = encoders.latest_encoder_export(root)
  assert latest.path == path and latest.manifest["step"] == 30 and latest.manifest["files"]
  signature = encoders.load_encoder(path)
  out = signature(title=tf.constant(["t"]), text=tf.constant(["x"]))["embeddings"]
  assert out.shape == (1, DIM)
  # Re-exporting the same weights as the same step is an identical re-commit ...
  assert encoders.export_encoder(_HashEncoder(), root, step=30) == path
  # ... other weights under the same step are a conflict, never a silent replacement.
  with pytest.raises(versioned.VersionConflictError):
    encoders.export_encoder(_HashEncoder(scale=2.0), root, step=30)
  # A truncated variables file is refused by name before SavedModel index_loading.
  [variables] = [f["name"] for f in latest.manifest["files"]
                 if f["name"].startswith("variables/variables.data")]
  data = storage.read_bytes(os.path.join(path, variables))
  storage.write_bytes_atomic(os.path.join(path, variables), data[:-1])
  with pytest.raises(versioned.VerificationError, match="variables.data.*truncated"):
    encoders.load_encoder(path)


def test_index_export_and_searcher_on_ram(ram_root):
  index_dir = os.path.join(ram_root, "index")
  rng = np.random.default_rng(0)
  shards = [index_export.ShardData(rng.normal(size=(6, DIM)).astype(np.float32),
                                   np.arange(6) + 10 * i) for i in range(2)]
  path = index_export.write_export(index_dir, 7, shards, build_scann=True)
  searcher = index_loading.load_searcher(index_dir, backend="scann")
  assert searcher.num_blocks == 12 and searcher.export.path == path
  assert index_loading.load_searcher(os.path.join(index_dir, "000000000007"),
                               backend="exact").num_blocks == 12
  # A shard truncated after the commit: refused with the file's name.
  npy = os.path.join(path, index_export.shard_name(1, 2), "embeddings.npy")
  storage.write_bytes_atomic(npy, storage.read_bytes(npy)[:-4])
  with pytest.raises(versioned.VerificationError, match="shard-00001-of-00002/embeddings.npy"):
    index_loading.load_searcher(index_dir, backend="exact")


class _TinyTagger(tf.Module):

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
  def serve(self, text):
    return {"length": tf.strings.length(text)}


def test_tagger_export_on_ram_publishes_committed_versions(ram_root):
  export_dir = os.path.join(ram_root, "tagger")
  first = tagger_export.export_tagger(_TinyTagger(), export_dir, {"scores": {"f1": 0.5}})
  assert not first.startswith("./") and first.startswith(export_dir + "/")
  assert tagger_export.read_manifest(export_dir)["scores"] == {"f1": 0.5}
  assert tagger_export.resolve_tagger_dir(export_dir).path == first
  # Nothing half-written is ever resolved: a crashed export leaves no manifest.
  writer = versioned.VersionWriter(export_dir, 99_999_999_999)
  storage.write_bytes_atomic(os.path.join(writer.path, "saved_model.pb"), b"partial")
  assert tagger_export.resolve_tagger_dir(export_dir).path == first


@pytest.fixture
def blocks_dir(tmp_path):
  rows = [dict(block_id=100 + i, doc_uid=f"d{i}", title=f"T{i}", text=f"text {i}")
          for i in range(20)]
  published.publish_records(str(tmp_path / "corpus"), dict(blocks=(rows, schema.BLOCK)),
                            num_shards=2)
  return str(tmp_path / "corpus"), rows


def test_index_builder_step_embeds_a_ram_snapshot_into_a_ram_index(ram_root, blocks_dir):
  blocks, rows = blocks_dir
  model_dir = os.path.join(ram_root, "run")
  encoder_root = os.path.join(model_dir, "export", "block_encoder")
  encoders.export_encoder(_HashEncoder(), encoder_root, step=50)
  index_dir = os.path.join(model_dir, "index")
  path = index_builder.build_once(model_dir, blocks, index_dir, num_shards=3,
                                  backend="exact", keep_versions=2)
  export = index_export.latest_export(index_dir)
  assert export.path == path and export.version == 50 and export.manifest["num_blocks"] == 20
  versioned.verify_version(export, checksums=True)
  # The lease the job held on the snapshot is released.
  assert versioned.leased_versions(encoder_root) == set()
  # Nothing newer: no build.
  assert index_builder.build_once(model_dir, blocks, index_dir, 3, "exact", 2) is None
  searcher = index_loading.load_searcher(index_dir, backend="exact")
  assert sorted(searcher.export.manifest["encoder"]["path"] for _ in [0]) == [
      versioned.latest_version(encoder_root).path]
  assert searcher.num_blocks == len(rows)


def test_a_failed_embedding_job_leaves_no_version_and_no_directory(ram_root, tmp_path,
                                                                   monkeypatch):
  encoder_root = os.path.join(ram_root, "block_encoder")
  encoders.export_encoder(_HashEncoder(), encoder_root, step=5)
  index_dir = os.path.join(ram_root, "index")
  # A published corpus whose one blocks file is not TFRecords: the job fails on a worker,
  # after the launcher has made the version's directory.
  corpus = str(tmp_path / "corpus")
  with versioned.OutputWriter(corpus) as writer:
    storage.write_bytes_atomic(os.path.join(corpus, "blocks-00000-of-00001.tfrecord"),
                               b"not a TFRecord file" * 10)
    writer.commit({})
  with pytest.raises(Exception, match="Not a valid TFRecord"):
    embed.embed_corpus(embed.EmbedConfig(blocks=corpus, encoder=encoder_root,
                                         output_dir=index_dir, build_scann=False))
  assert versioned.list_versions(index_dir) == []
  assert not storage.list_files(index_dir)


def test_run_config_is_read_from_an_object_store_model_dir(ram_root, repo_dir):
  from realm_tf.configs import load_config  # pylint: disable=g-import-not-at-top
  from realm_tf.configs.loading import ConfigError  # pylint: disable=g-import-not-at-top
  params = os.path.join(ram_root, "run", "params.yaml")
  storage.write_text_atomic(params, (repo_dir / "configs" / "tiny.yaml").read_text())
  assert load_config(params).as_dict() == load_config(
      str(repo_dir / "configs" / "tiny.yaml")).as_dict()
  with pytest.raises(ConfigError, match="config file not found"):
    load_config(os.path.join(ram_root, "missing", "params.yaml"))


def test_two_builds_of_one_snapshot_commit_one_index(ram_root, blocks_dir):
  """A second index builder (or a retried job) embedding the same snapshot with the same
  settings is an identical re-commit, although ScaNN's bytes differ between builds."""
  blocks, _ = blocks_dir
  encoder_root = os.path.join(ram_root, "block_encoder")
  encoders.export_encoder(_HashEncoder(), encoder_root, step=8)
  config = embed.EmbedConfig(blocks=blocks, encoder=encoder_root,
                             output_dir=os.path.join(ram_root, "index"), num_shards=2)
  first = embed.embed_corpus(config)
  assert embed.embed_corpus(config) == first
  [committed] = versioned.list_versions(config.output_dir)
  assert committed.path == first
  other = dataclasses.replace(config, num_shards=3)
  with pytest.raises(Exception, match="already committed with different files"):
    embed.embed_corpus(other)
  assert [v.path for v in versioned.list_versions(config.output_dir)] == [first]
  # The losers' data directories are gone: only the committed one is left.
  data_dirs = [n.rstrip("/") for n in tf.io.gfile.listdir(config.output_dir)
               if re.match(r"^\d{12}\.[0-9a-f]{32}/?$", n)]
  assert data_dirs == [os.path.basename(first)]


def test_a_flipped_byte_in_an_index_is_refused(ram_root):
  """Embeddings and block ids are checksummed as they are read, asked or not."""
  index_dir = os.path.join(ram_root, "index")
  path = index_export.write_export(
      index_dir, 1, [index_export.ShardData(np.eye(DIM, dtype=np.float32), np.arange(DIM))],
      build_scann=False)
  ids = os.path.join(path, index_export.shard_name(0, 1), "block_ids.npy")
  data = bytearray(storage.read_bytes(ids))
  data[-1] ^= 0x01  # same size, one bit of one id flipped
  storage.write_bytes_atomic(ids, bytes(data))
  for verify_checksums in (False, True):  # sizes agree: only the CRC32C tells
    with pytest.raises(versioned.VerificationError, match="block_ids.npy: CRC32C"):
      index_loading.load_searcher(index_dir, backend="exact", verify_checksums=verify_checksums)


def test_index_builder_loop_on_an_object_store_model_dir(ram_root, blocks_dir, repo_dir):
  """The builder reads params.yaml from model_dir, embeds the newest snapshot, and stops
  at TRAINING_DONE: all of model_dir on ram://."""
  from realm_tf.io import layout  # pylint: disable=g-import-not-at-top
  blocks, rows = blocks_dir
  model_dir = os.path.join(ram_root, "run")
  storage.write_text_atomic(layout.params_path(model_dir),
                            (repo_dir / "configs" / "tiny.yaml").read_text())
  encoders.export_encoder(_HashEncoder(), layout.block_encoder_dir(model_dir), step=70)
  builds = index_builder.run_index_builder(index_builder.IndexBuilderConfig(
      model_dir=model_dir, blocks=blocks, num_shards=2, max_builds=1, poll_seconds=0.1))
  assert builds == 1
  export = index_export.latest_export(layout.index_dir(model_dir))
  assert export.version == 70 and export.manifest["num_blocks"] == len(rows)
  layout.mark_training_done(model_dir, 70)
  assert index_builder.run_index_builder(index_builder.IndexBuilderConfig(
      model_dir=model_dir, blocks=blocks, poll_seconds=0.1)) == 0


def test_copy_for_tf_serving_writes_saved_model_pb_last(ram_root, monkeypatch):
  """TF Serving's layout is <base>/<int>/ and it loads a version once saved_model.pb is
  there: a copy interrupted before that file leaves nothing loadable; a rerun finishes."""
  root = os.path.join(ram_root, "export", "query_encoder")
  encoders.export_encoder(_HashEncoder(), root, step=30)
  version = versioned.latest_version(root)
  dest = os.path.join(ram_root, "serving", "encoder", "30")
  copied = []
  real_copy = tf.io.gfile.copy

  def copy_then_crash(source, target, overwrite=False):
    if target.endswith("saved_model.pb"):
      raise OSError("killed before the last file")
    copied.append(target)
    return real_copy(source, target, overwrite=overwrite)

  with monkeypatch.context() as patch:
    patch.setattr(tf.io.gfile, "copy", copy_then_crash)
    with pytest.raises(OSError, match="killed"):
      versioned.copy_version(version, dest)
  assert not tf.io.gfile.exists(os.path.join(dest, "saved_model.pb"))
  # Every other file was already copied when saved_model.pb's turn came.
  assert sorted(os.path.relpath(t, dest) for t in copied) == sorted(
      f["name"] for f in version.manifest["files"] if f["name"] != "saved_model.pb")
  assert versioned.copy_version(version, dest) == dest
  loaded = tf.saved_model.load(dest)
  out = loaded.signatures["serving_default"](title=tf.constant(["a"]), text=tf.constant(["b"]))
  assert out["embeddings"].shape == (1, DIM)
