"""Storage failures are errors, never absence: "not found" and "could not ask" (no
permission, no network, an unknown bucket, a server error after retries) are told apart by
every helper a poller relies on, and the pollers keep what they have.

The failures are injected at TensorFlow's file-system calls (the same exceptions TF's GCS
client raises: PermissionDenied, Unavailable, ...). The same code against a real object
store that stops answering is in the gs:// emulator tests."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf.io import storage, versioned
from realm_tf.io.storage import GFILE, StorageError
from realm_tf.text.tokenization import Tokenizer

OUTAGES = [tf.errors.UnavailableError(None, None, "Connection refused"),
           tf.errors.PermissionDeniedError(None, None, "403 Forbidden"),
           tf.errors.InternalError(None, None, "503 after 10 retries")]


def _break(monkeypatch, error, *names):
  def fail(*args, **kwargs):
    raise error
  for name in names:
    monkeypatch.setattr(tf.io.gfile, name, fail)


@pytest.mark.parametrize("error", OUTAGES, ids=lambda e: type(e).__name__)
def test_is_dir_like_raises_when_the_store_cannot_be_asked(tmp_path, monkeypatch, error):
  assert storage.is_dir_like(str(tmp_path))
  assert not storage.is_dir_like(str(tmp_path / "absent"))
  _break(monkeypatch, error, "stat", "glob", "isdir")
  with pytest.raises(tf.errors.OpError):
    storage.is_dir_like(str(tmp_path))
  with pytest.raises(StorageError, match=str(tmp_path)):
    GFILE.is_dir_like(str(tmp_path))


def test_an_empty_root_and_an_outage_are_different_answers(tmp_path, monkeypatch):
  root = str(tmp_path / "index")
  assert versioned.list_versions(root) == []  # nothing published: an empty list
  writer = versioned.VersionWriter(root, 3)
  tf.io.gfile.makedirs(writer.path)
  with tf.io.gfile.GFile(f"{writer.path}/a.bin", "wb") as f:
    f.write(b"abc")
  writer.commit()
  assert versioned.latest_version(root).version == 3
  _break(monkeypatch, OUTAGES[0], "stat", "glob", "isdir", "listdir")
  with pytest.raises(StorageError, match="storage failed"):
    versioned.list_versions(root)
  with pytest.raises(StorageError):
    versioned.latest_version(root)
  with pytest.raises(StorageError):
    versioned.garbage_collect(root, keep=1)


def test_a_manifest_that_cannot_be_read_is_an_error_not_a_skip(tmp_path, monkeypatch):
  root = str(tmp_path / "index")
  writer = versioned.VersionWriter(root, 1)
  tf.io.gfile.makedirs(writer.path)
  with tf.io.gfile.GFile(f"{writer.path}/a.bin", "wb") as f:
    f.write(b"abc")
  writer.commit()
  real_open = GFILE.open_read

  def flaky_open(path):
    if path.endswith(versioned.MANIFEST_SUFFIX):
      raise StorageError(f"{path}: storage failed (503)")
    return real_open(path)
  monkeypatch.setattr(GFILE, "open_read", flaky_open)
  with pytest.raises(StorageError, match="manifest.json: storage failed"):
    versioned.list_versions(root)


def test_a_vocabulary_that_cannot_be_read_is_not_reported_empty(tmp_path, monkeypatch):
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n")
  assert Tokenizer(str(vocab)).vocab_size == 6
  with pytest.raises(FileNotFoundError, match="no such vocabulary file"):
    Tokenizer(str(tmp_path / "absent.txt"))
  original = tf.io.gfile.GFile

  class Unreadable(original):
    def read(self, n=-1):
      raise tf.errors.UnavailableError(None, None, "Connection reset")
  monkeypatch.setattr(tf.io.gfile, "GFile", Unreadable)
  with pytest.raises(OSError, match="could not be read .*Connection reset"):
    Tokenizer(str(vocab))


def test_a_served_model_is_kept_through_a_storage_outage(tmp_path, monkeypatch):
  """The server's version listing raises instead of answering "no versions" (which would
  retire every loaded version)."""
  from serving import paths
  base = tmp_path / "realm_qa"
  (base / "1").mkdir(parents=True)
  (base / "1" / "saved_model.pb").write_bytes(b"x")
  assert sorted(paths.list_versions(str(base)).versions) == [1]
  _break(monkeypatch, OUTAGES[1], "stat", "glob", "isdir")
  with pytest.raises(tf.errors.PermissionDeniedError):
    paths.list_versions(str(base))


def test_the_index_poller_keeps_its_version_through_an_outage(tmp_path, monkeypatch,
                                                              tokenizer):
  from realm_tf.data.block_store import BlockStore
  from realm_tf.retrieval.index_export import ShardData, write_export
  from realm_tf.retrieval.knowledge_index import KnowledgeIndex
  ids = np.arange(1, 6, dtype=np.int64)
  store = BlockStore(ids, [f"d{i}" for i in ids], [f"T{i}" for i in ids],
                     [f"text {i}" for i in ids])
  index = KnowledgeIndex(store, tokenizer, block_seq_length=12, body_length=8, dimension=4)
  index_dir = str(tmp_path / "index")
  vectors = np.random.default_rng(0).normal(size=[5, 4]).astype(np.float32)
  write_export(index_dir, 1, [ShardData(vectors, ids)], build_scann=False)
  assert index.maybe_swap(index_dir) and index.version == 1
  _break(monkeypatch, OUTAGES[0], "stat", "glob", "isdir", "listdir")
  assert not index.maybe_swap(index_dir)
  assert index.version == 1  # still searching what it had
  assert "storage failed" in index.storage_error
