"""realm_tf.io.storage on object-store semantics (ram://), and the rule that realm_tf/ and
beam/ touch user paths only through tf.io.gfile / Beam FileSystems."""
import os
import pathlib
import re
import uuid

import pytest
import tensorflow as tf

from realm_tf.io import storage

REPO = pathlib.Path(__file__).resolve().parent.parent


def _ram(name: str) -> str:
  return f"ram://storage-{uuid.uuid4().hex}/{name}"


def _put(path: str, data: bytes = b"x"):
  # No makedirs: like an object written to GCS by another tool, the parent "directory"
  # exists only as a prefix.
  with tf.io.gfile.GFile(path, "wb") as f:
    f.write(data)


def test_a_prefix_with_objects_is_a_directory():
  prefix = _ram("corpus")
  assert not storage.is_dir_like(prefix) and not storage.exists(prefix)
  _put(prefix + "/blocks-00000-of-00001.tfrecord")
  assert storage.is_dir_like(prefix) and storage.exists(prefix)
  assert not storage.is_dir_like(prefix + "/blocks-00000-of-00001.tfrecord")


def test_delete_prefix_removes_objects_under_undeclared_prefixes():
  root = _ram("out")
  tf.io.gfile.makedirs(root)
  _put(root + "/a.txt")
  tf.io.gfile.makedirs(root + "/shard")
  _put(root + "/shard/b.npy")
  storage.delete_prefix(root)
  assert not tf.io.gfile.exists(root + "/a.txt")
  assert not tf.io.gfile.exists(root + "/shard/b.npy")
  storage.delete_prefix(root)  # nothing there: no error


def test_newest_mtime_treats_unknown_times_as_unknown(tmp_path):
  ram = _ram("t")
  tf.io.gfile.makedirs(ram)
  _put(ram + "/f")
  assert storage.newest_mtime(ram) == 0.0  # ram:// keeps no times: "unknown", not "old"
  local = tmp_path / "d"
  local.mkdir()
  (local / "f").write_bytes(b"x")
  os.utime(local / "f", (1_000_000, 1_000_000))
  (local / "g").write_bytes(b"x")
  assert storage.newest_mtime(str(local)) == pytest.approx(os.stat(local / "g").st_mtime)


def test_create_if_absent_local_and_ram(tmp_path):
  for path in (str(tmp_path / "m.json"), _ram("m.json")):
    assert storage.create_if_absent(path, b"first")
    assert not storage.create_if_absent(path, b"second")
    assert storage.read_text(path) == "first"


def test_open_for_append_rotates_objects_on_object_stores(tmp_path):
  for path in (str(tmp_path / "builder.log"), _ram("builder.log")):
    with storage.open_for_append(path) as log:
      log.write("one\n")
    with storage.open_for_append(path) as log:
      log.write("two\n")
    assert storage.read_log(path) == "one\ntwo\n"


def test_read_text_names_a_missing_file():
  with pytest.raises(FileNotFoundError, match="missing.txt: no such file"):
    storage.read_text(_ram("missing.txt"))


def test_ensure_local_copy_copies_a_tree():
  root = _ram("model")
  tf.io.gfile.makedirs(root + "/variables")
  _put(root + "/saved_model.pb", b"pb")
  _put(root + "/variables/v.data", b"vv")
  local = storage.ensure_local_copy(root)
  assert pathlib.Path(local, "variables", "v.data").read_bytes() == b"vv"
  assert storage.ensure_local_copy(local) == local


# Local-only file calls that must not touch user paths in realm_tf/ and beam/.
_FORBIDDEN = re.compile(
    r"(?<![\w.])open\(|os\.path\.(exists|isdir|isfile|abspath|getsize|getmtime)\(|"
    r"\bshutil\.|\bglob\.glob\(|(?<![\w.])glob\(|os\.(rename|replace|remove|makedirs|"
    r"listdir|walk|rmdir|scandir|stat)\(|pathlib\.")
# Justified exceptions, each "file: the code it allows" (why in the comment).
_ALLOWED = {
    # create-if-absent on local disk: link(2) is the atomic primitive tf.io.gfile lacks.
    "realm_tf/io/storage.py": ["os.link(tmp, local)", "os.remove(tmp)",
                               # link_or_copy's hard link, taken only when both are local.
                               "os.remove(target)"],
    # Files inside the installed package (vocab, weights, demo data), never user paths.
    "realm_tf/pretrained/minilm.py": ["os.path.isdir(path)", "os.path.abspath(__file__)",
                                      "os.path.isfile(packaged)"],
    "realm_tf/pretrained/encoder_weights.py": ["os.path.exists(path)"],  # safetensors: local API
    "realm_tf/demo/__main__.py": ["open(os.path.join(_HERE, name)"],
    # The allow-list file inside the package (rewritten by --write), and the generator's
    # walk over the installed tensorflow_text wheel: never user paths.
    "realm_tf/export/model_server_ops.py": [
        'ALLOW_LIST = pathlib.Path(__file__).with_name("stock_model_server_ops.txt")',
        "for dirpath, _, files in os.walk(root):", "os.replace(partial, ALLOW_LIST)"],
    # is_inside: absolute paths only when neither path has a scheme (both local).
    "realm_tf/io/layout.py": ["os.path.abspath(path), os.path.abspath(model_dir)"],
}
# Code that takes local paths only: the demo is a single-machine program (child processes,
# pip, a local server) and refuses any URL among its paths (DemoOptions.validate); a
# training process and its watchdog share a heartbeat file in a temporary directory of
# their own machine, which the watchdog creates (it never sees a user path).
_LOCAL_ONLY_PACKAGES = ("realm_tf/demo/", "realm_tf/io/heartbeat.py",
                        "realm_tf/training/watchdog.py")


def _violations(repo: pathlib.Path = REPO):
  found = []
  for top in ("realm_tf", "beam"):
    for path in sorted((repo / top).rglob("*.py")):
      rel = path.relative_to(repo).as_posix()
      if rel.startswith(_LOCAL_ONLY_PACKAGES):
        continue
      allowed = _ALLOWED.get(rel, [])
      for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        code = line.split("#", 1)[0]
        if _FORBIDDEN.search(code) and not any(a in code for a in allowed):
          found.append(f"{rel}:{number}: {line.strip()}")
  return found


def test_no_local_only_file_calls_on_user_paths():
  assert _violations() == []


def test_the_file_call_check_catches_a_violation(tmp_path):
  fake = tmp_path / "realm_tf" / "bad.py"
  fake.parent.mkdir()
  fake.write_text("import os\nif os.path.exists(user_path):\n  open(user_path)\n")
  (tmp_path / "beam").mkdir()
  assert len(_violations(tmp_path)) == 2


def test_gcs_create_if_absent_sends_the_generation_precondition(monkeypatch):
  """gcp-storage-emulator ignores preconditions, so a stand-in bucket enforces
  ifGenerationMatch=0 as GCS documents it: this checks that we ask for it and read a
  refusal as "someone else committed"."""
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
  from google.cloud import storage as gcs  # pylint: disable=g-import-not-at-top
  objects = {}

  class Blob:
    def __init__(self, name):
      self.name = name

    def upload_from_string(self, data, if_generation_match=None):
      if if_generation_match == 0 and self.name in objects:
        raise exceptions.PreconditionFailed("object exists")
      objects[self.name] = data

  class Client:
    def bucket(self, name):
      assert name == "bucket"
      return type("Bucket", (), {"blob": lambda self, n: Blob(n)})()

  monkeypatch.setattr(gcs, "Client", Client)
  assert storage.create_if_absent("gs://bucket/idx/000000000001.manifest.json", b"a")
  assert not storage.create_if_absent("gs://bucket/idx/000000000001.manifest.json", b"b")
  assert objects == {"idx/000000000001.manifest.json": b"a"}


def test_the_vocab_travels_as_package_data():
  from realm_tf.pretrained import minilm  # pylint: disable=g-import-not-at-top
  path = pathlib.Path(minilm.minilm_vocab_file())
  assert path.relative_to(REPO / "realm_tf").as_posix() == "text/vocab/bert_uncased_vocab.txt"
  assert "text/vocab/*.txt" in (REPO / "setup.py").read_text()
  packaged = pathlib.Path(minilm.minilm_dir(), "vocab.txt")
  assert path.read_bytes() == packaged.read_bytes()  # the very vocab MiniLM was trained with
