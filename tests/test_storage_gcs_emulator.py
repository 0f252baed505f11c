"""gs:// against a local GCS emulator (gcp-storage-emulator): Beam's GCS file system and
google-cloud-storage both honour STORAGE_EMULATOR_HOST. TF's gs:// client does not: here the
TF side is on ram:// (see test_storage_publishers.py); test_tf_gcs.py runs TF's own gs://
client against fake-gcs-server in a namespace of its own (benchmarks/gcs_emulator.py).
gcp-storage-emulator ignores generation preconditions: create-if-absent is tested there."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid

import pytest

pytest.importorskip("google.cloud.storage")
pytest.importorskip("apache_beam.io.gcp.gcsio")

import google_crc32c  # noqa: E402
from apache_beam.io.filesystems import FileSystems  # noqa: E402

from realm_tf.corpus import published, schema  # noqa: E402
from realm_tf.retrieval import encoders  # noqa: E402
from realm_tf.io import versioned  # noqa: E402
from realm_tf.pipelines import embed, preprocess  # noqa: E402
from realm_tf.pipelines.filesystems import BEAM  # noqa: E402
from tests.test_storage_publishers import _HashEncoder  # noqa: E402

BUCKET = "realm-test"


@pytest.fixture(scope="module")
def emulator():
  binary = os.path.join(os.path.dirname(sys.executable), "gcp-storage-emulator")
  if not os.path.exists(binary):
    binary = shutil.which("gcp-storage-emulator")
  if binary is None:
    pytest.skip("gcp-storage-emulator is not installed")
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  process = subprocess.Popen([binary, "start", "--port", str(port), "--in-memory",
                              "--default-bucket", BUCKET],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    deadline = time.time() + 30
    while time.time() < deadline:
      try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        break
      except OSError:
        time.sleep(0.2)
    old = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
    yield f"gs://{BUCKET}/{uuid.uuid4().hex}"
  finally:
    if old is None:
      os.environ.pop("STORAGE_EMULATOR_HOST", None)
    else:
      os.environ["STORAGE_EMULATOR_HOST"] = old
    process.terminate()
    process.wait(timeout=30)


def _put(path: str, data: bytes = b"x"):
  with FileSystems.create(path) as f:
    f.write(data)


def test_prefix_checks_and_deletes_on_gcs(emulator):
  prefix = f"{emulator}/tagger"
  assert not BEAM.is_dir_like(prefix)
  _put(prefix + "/000000000001.abc/saved_model.pb")
  _put(prefix + "/000000000001.manifest.json", b"{}")
  # Beam's exists() answers for one object only; the storage lists the prefix.
  assert not FileSystems.exists(prefix)
  assert BEAM.is_dir_like(prefix)
  assert BEAM.delete_prefix(prefix) == 2
  assert not BEAM.is_dir_like(prefix)


def _jsonl(n: int, seed: str) -> bytes:
  return b"".join(json.dumps({"title": f"Article {seed} {i}", "text": (
      f"Article {i} of set {seed} was written on 3 March 2001. It has a second sentence "
      f"about topic {i}. A third sentence closes it.")}).encode() + b"\n" for i in range(n))


def test_preprocess_pipeline_on_gcs_overwrite_deletes_stale_shards(emulator):
  source = f"{emulator}/raw/articles-0.jsonl"
  _put(source, _jsonl(12, "a"))
  output = f"{emulator}/corpus"
  stale = output + "/blocks-00007-of-00008.tfrecord"
  _put(stale, b"from an older run with more shards")
  _put(output + "/manifest.json", b"{}")
  config = preprocess.PreprocessConfig(input_format="jsonl", input=source,
                                       output_dir=output, num_shards=1)
  with pytest.raises(FileExistsError, match="already exists"):
    preprocess.prepare_corpus(config)
  config.overwrite = True
  assert preprocess.prepare_corpus(config) == output
  assert not FileSystems.exists(stale)
  manifest = versioned.verify_published(output, checksums=True, store=BEAM)
  assert manifest["counts"]["accepted"] == 12
  names = {f["name"] for f in manifest["files"]}
  assert "blocks-00000-of-00001.tfrecord" in names and "ict-00000-of-00001.tfrecord" in names
  listed = set(BEAM.list_files(output))
  assert listed == names | {"manifest.json"}  # every file listed; nothing stale left
  for entry in manifest["files"]:  # sizes and CRC32C match what is stored
    with FileSystems.open(f"{output}/{entry['name']}") as f:
      data = f.read()
    assert len(data) == entry["size"]
    assert google_crc32c.Checksum(data).digest().hex() == entry["crc32c"]


def test_preprocess_on_gcs_accepts_a_tagger_prefix_and_rejects_a_missing_one(emulator):
  source = f"{emulator}/raw2/articles.jsonl"
  _put(source, _jsonl(2, "b"))
  config = preprocess.PreprocessConfig(input_format="jsonl", input=source,
                                       output_dir=f"{emulator}/corpus2",
                                       tagger_dir=f"{emulator}/no-tagger")
  with pytest.raises(FileNotFoundError, match="--tagger_dir .*does not exist"):
    preprocess.prepare_corpus(config)
  assert not BEAM.is_dir_like(f"{emulator}/corpus2")


def test_embedding_pipeline_reads_blocks_from_gcs(emulator, tmp_path):
  """Blocks on gs:// (read by Beam on the workers), encoder and index on ram:// (TF)."""
  local = str(tmp_path / "corpus3")
  published.publish_records(local, dict(blocks=([
      dict(block_id=i, doc_uid=f"d{i}", title=f"T{i}", text=f"block {i}") for i in range(30)],
      schema.BLOCK)), num_shards=3)
  for name in sorted(os.listdir(local), key=lambda n: n == versioned.MANIFEST):  # manifest last
    with open(os.path.join(local, name), "rb") as f:
      _put(f"{emulator}/corpus3/{name}", f.read())
  ram = f"ram://gcs-embed-{uuid.uuid4().hex}"
  encoders.export_encoder(_HashEncoder(), f"{ram}/block_encoder", step=3)
  path = embed.embed_corpus(embed.EmbedConfig(
      blocks=f"{emulator}/corpus3", encoder=f"{ram}/block_encoder",
      output_dir=f"{ram}/index", num_shards=2, build_scann=False))
  committed = versioned.latest_version(f"{ram}/index")
  assert committed.path == path and committed.manifest["num_blocks"] == 30


def test_an_unknown_bucket_is_an_error_not_an_empty_listing(emulator):
  root = "gs://no-such-bucket-realm/index"
  with pytest.raises(FileNotFoundError, match="bucket gs://no-such-bucket-realm does not exist"):
    BEAM.is_dir_like(root)
  with pytest.raises(FileNotFoundError, match="does not exist"):
    versioned.list_versions(root, BEAM)
  assert not BEAM.is_dir_like(f"{emulator}/nothing-here")  # a known bucket: empty is False


def test_command_lines_say_the_bucket_is_missing_in_one_line(emulator, tmp_path, capsys):
  from beam import preprocess as preprocess_cli  # noqa: PLC0415  the entry point under test
  with pytest.raises(SystemExit) as exit_info:
    preprocess_cli.main(["--input", "gs://no-such-bucket-realm/wiki/*.xml",
                         "--output_dir", str(tmp_path / "out")])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].startswith("beam.preprocess: error: ")
  assert "gs://no-such-bucket-realm" in err[-1] and "does not exist" in err[-1]
  assert not any("Traceback" in line for line in err)
  with pytest.raises(FileNotFoundError):  # --verbosity debug: the exception itself
    preprocess_cli.main(["--input", "gs://no-such-bucket-realm/wiki/*.xml", "--output_dir",
                         str(tmp_path / "out"), "--verbosity", "debug"])
