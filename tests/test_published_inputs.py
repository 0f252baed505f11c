"""Readers check what writers promise: a corpus is read only through its manifest.json.

`beam.preprocess` (and every other writer of corpus files) publishes by writing
manifest.json last (realm_tf.io.versioned.OutputWriter). A job that died half-way, or an
`--overwrite` re-run that has deleted the old manifest and shards, leaves files without
one; every reader (the trainer's input pipelines, the block store, embed_corpus, the
index builder, evaluation's text store) refuses them with one line naming the directory,
and the command lines exit 2. Files made by another tool are read only when a flag or
config field says so.
"""
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from beam import embed_corpus as embed_cli
from realm_tf import tasks
from realm_tf.corpus import published, schema
from realm_tf.data import block_texts, files
from realm_tf.data.block_store import BlockStore
from realm_tf.io import command_line, layout, storage, versioned
from realm_tf.pipelines import embed
from realm_tf.training import train_lib
from tests import task_fixtures as tf_
from tests.synthetic_corpus import write_corpus

ROWS = [dict(block_id=10 + i, doc_uid=f"d{i}", title=f"T{i}", text=f"text {i}")
        for i in range(6)]


def _publish(directory: str, num_shards: int = 2) -> str:
  published.publish_records(directory, dict(blocks=(ROWS, schema.BLOCK),
                                            extra=(ROWS[:2], schema.BLOCK)),
                            num_shards=num_shards)
  return directory


def _block_ids(paths):
  return sorted(int(schema.BLOCK.parse(r)["block_id"])
                for r in tf.data.TFRecordDataset(paths))


@pytest.mark.parametrize("root", ["local", "ram"])
def test_the_files_a_manifest_lists_are_what_a_pattern_reads(tmp_path, root):
  base = str(tmp_path) if root == "local" else f"ram://published-{os.getpid()}-{id(tmp_path)}"
  corpus = _publish(os.path.join(base, "corpus"))
  blocks = versioned.published_files(os.path.join(corpus, "blocks-*"))
  assert [os.path.basename(p) for p in blocks] == ["blocks-00000-of-00002.tfrecord",
                                                  "blocks-00001-of-00002.tfrecord"]
  assert _block_ids(blocks) == [r["block_id"] for r in ROWS]
  # The directory names every listed file; one file names itself.
  assert len(versioned.published_files(corpus)) == 4
  assert versioned.published_files(blocks[1]) == [blocks[1]]
  assert files.files(f"{corpus}/extra-*,{corpus}/blocks-00000-*") == (
      versioned.published_files(f"{corpus}/extra-*") + [blocks[0]])
  with pytest.raises(FileNotFoundError, match="lists no file of that name"):
    versioned.published_files(os.path.join(corpus, "pretraining-*"))


def _without_manifest(corpus):  # a job killed before its last step, the manifest
  storage.delete_prefix(os.path.join(corpus, versioned.MANIFEST))


def _overwrite_half_deleted(corpus):  # an --overwrite re-run killed while it deletes
  _without_manifest(corpus)
  storage.delete_prefix(os.path.join(corpus, "blocks-00001-of-00002.tfrecord"))


def _a_shard_missing(corpus):
  storage.delete_prefix(os.path.join(corpus, "blocks-00001-of-00002.tfrecord"))


def _a_shard_cut_short(corpus):
  path = os.path.join(corpus, "blocks-00000-of-00002.tfrecord")
  data = storage.read_bytes(path)
  storage.write_bytes_atomic(path, data[:len(data) // 2])


def _a_shard_not_listed(corpus):  # written after the manifest, e.g. by another run
  storage.write_bytes_atomic(os.path.join(corpus, "blocks-00002-of-00002.tfrecord"), b"x")


def _manifest_not_json(corpus):
  storage.write_bytes_atomic(os.path.join(corpus, versioned.MANIFEST), b"{not json")


DAMAGE = {
    _without_manifest: "not published \\(no manifest.json\\)",
    _overwrite_half_deleted: "not published \\(no manifest.json\\)",
    _a_shard_missing: "blocks-00001-of-00002.tfrecord: listed, missing",
    _a_shard_cut_short: "blocks-00000-of-00002.tfrecord: \\d+ bytes, manifest.json says",
    _a_shard_not_listed: "blocks-00002-of-00002.tfrecord: not listed in manifest.json",
    _manifest_not_json: "unreadable manifest",
}


@pytest.mark.parametrize("damage", list(DAMAGE), ids=lambda f: f.__name__.strip("_"))
def test_a_corpus_that_does_not_match_its_manifest_is_refused_in_one_line(tmp_path, damage):
  corpus = _publish(str(tmp_path / "corpus"))
  damage(corpus)
  with pytest.raises(versioned.UnpublishedError, match=DAMAGE[damage]) as error:
    files.files(os.path.join(corpus, "blocks-*"))
  assert corpus in str(error.value) and "\n" not in str(error.value)
  assert command_line.is_usage_error(error.value)  # exit 2 on every command line


def test_wildcards_are_allowed_in_the_file_name_only(tmp_path):
  _publish(str(tmp_path / "corpus"))
  with pytest.raises(versioned.UnpublishedError, match="wildcards are allowed in the file name"):
    files.files(str(tmp_path / "c*" / "blocks-*"))


def test_files_made_by_another_tool_are_read_only_when_asked(tmp_path):
  os.makedirs(tmp_path / "raw")
  path = str(tmp_path / "raw" / "blocks-0.tfrecord")
  with tf.io.TFRecordWriter(path) as writer:
    for row in ROWS:
      writer.write(schema.BLOCK.serialize(row))
  pattern = str(tmp_path / "raw" / "blocks-*")
  with pytest.raises(versioned.UnpublishedError, match="not published"):
    files.files(pattern)
  assert files.files(pattern, unpublished=True) == [path]
  assert list(BlockStore.from_tfrecords(pattern, unpublished=True).block_ids) == [
      r["block_id"] for r in ROWS]


@pytest.fixture(scope="module")
def partial_corpus(tmp_path_factory):
  """The invented corpus as a preprocess job killed before its manifest leaves it."""
  path = str(tmp_path_factory.mktemp("partial"))
  write_corpus(path)
  _without_manifest(path)
  return path


def test_every_reader_in_the_library_refuses_a_partial_corpus(partial_corpus, tmp_path,
                                                              repo_dir):
  """The trainer's input pipelines (ICT and pre-training), the block store of retrieval,
  evaluation's text store and the embedding job: each refuses before reading a record;
  the embedding job writes nothing. The config fields that say "made by another tool"
  open the same files."""
  for name in ("ict", "pretrain"):
    config = tf_.tiny_config(repo_dir, partial_corpus, name,
                             task__pretrain__retrieval=False)
    task = tasks.get_task(config)
    with pytest.raises(versioned.UnpublishedError, match="not published"):
      task.build_inputs(config.task_config.train_data)
  with pytest.raises(versioned.UnpublishedError, match="not published"):
    BlockStore.from_tfrecords(os.path.join(partial_corpus, "blocks-*"))
  with pytest.raises(versioned.UnpublishedError, match="not published"):
    block_texts.ensure_store(config, str(tmp_path / "run"))
  assert not tf.io.gfile.exists(str(tmp_path / "run"))
  with pytest.raises(versioned.UnpublishedError, match="not published"):
    embed.embed_corpus(embed.EmbedConfig(blocks=partial_corpus, encoder=str(tmp_path / "e"),
                                         output_dir=str(tmp_path / "index")))
  assert not tf.io.gfile.exists(str(tmp_path / "index"))
  # Said explicitly: read as files made by another tool.
  config = tf_.tiny_config(repo_dir, partial_corpus, "ict",
                           task__ict__train_data__unpublished_input=True)
  batch = tf_.first_batch(tasks.get_task(config), config)
  assert batch["block_id"].shape[0] == config.task.ict.train_data.global_batch_size
  config = config.replace(index=dict(unpublished_blocks=True))
  assert block_texts.ensure_store(config, str(tmp_path / "run")).index.text_store


def test_embed_corpus_refuses_a_partial_corpus_with_one_line_and_exit_2(partial_corpus,
                                                                       tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    embed_cli.main(["--blocks", partial_corpus, "--encoder", str(tmp_path / "encoder"),
                    "--output_dir", str(tmp_path / "index")])
  assert exit_info.value.code == command_line.USAGE_EXIT
  lines = capsys.readouterr().err.strip().splitlines()
  assert lines == [f"beam.embed_corpus: error: {partial_corpus}: not published (no "
                   "manifest.json): its writer is still running, died, or an --overwrite "
                   "re-run removed it; nothing is read from it"]


# ------------------------------------------------------------------ processes (system tier)

def _readers(repo_dir, corpus: str, work: str, config) -> dict:
  """Each reader's command line over `corpus`: name → argv. Their run directories are made
  here: an ICT run to train, a pre-training run for the index builder, an Open-QA run with
  a checkpoint to evaluate."""
  builder_run = os.path.join(work, "builder_run")
  train_lib.save_params(config.replace(index=dict(blocks=corpus)), builder_run)
  qa_run = os.path.join(work, "qa_run")
  qa_config = config.replace(task=dict(type="openqa"), index=dict(blocks=corpus))
  train_lib.save_params(qa_config, qa_run)
  _, model = tf_.build(qa_config.replace(index=dict(blocks=config.index.blocks)))
  tf.train.Checkpoint(model=model).save(os.path.join(layout.checkpoint_dir(qa_run), "ckpt"))
  questions = tf_.write_questions(os.path.join(work, "questions.jsonl"))
  return {
      "realm_tf.train": ["--experiment", "realm/ict", "--config", "configs/tiny.yaml",
                         "--model_dir", os.path.join(work, "ict_run"), "--override",
                         f"task.ict.train_data.input_path={corpus}/ict-*"],
      "beam.embed_corpus": ["--blocks", corpus, "--encoder", os.path.join(work, "encoder"),
                            "--output_dir", os.path.join(work, "index")],
      "beam.index_builder": ["--model_dir", builder_run],
      "realm_tf.evaluate": ["--model_dir", qa_run, "--questions", questions],
  }


def _refused_by_every_reader(repo_dir, readers: dict, corpus: str):
  for module, args in readers.items():
    result = subprocess.run([sys.executable, "-m", module, *args], cwd=repo_dir,
                            capture_output=True, text=True, timeout=600)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == command_line.USAGE_EXIT, (module, result.stderr[-3000:])
    assert lines[-1].startswith(f"{module}: error: {corpus}"), (module, lines[-1])
    assert any(why in lines[-1] for why in ("does not match its manifest.json",
                                            "not published", "no such")), (
        module, lines[-1])
    # (Beam's GCS client logs "Traceback for above exception" while it looks for
    # credentials; a traceback of the command's own starts a line.)
    assert not re.search(r"^Traceback \(most recent call last\)", result.stderr, re.M), module


def _preprocess(repo_dir, source, output, *extra):
  argv = [sys.executable, "-m", "beam.preprocess", "--input_format", "jsonl", "--input",
          str(source), "--output_dir", output, "--max_records", "300", *extra]
  return subprocess.Popen(argv, cwd=repo_dir, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)


def _kill_when(process, ready, what: str):
  """SIGKILLs `process` as soon as `ready()` (polled); fails if it finished first."""
  while not ready():
    assert process.poll() is None, f"{what}: the job ended first: {process.stderr.read()}"
    time.sleep(0.02)
  process.send_signal(signal.SIGKILL)
  process.wait(60)


def _killed_jobs_leave(repo_dir, vital_articles, root: str, store):
  """Kills beam.preprocess while it writes, and an --overwrite re-run while it deletes;
  returns the two directories they left (neither has a manifest)."""
  writing = os.path.join(root, "killed_writing")
  job = _preprocess(repo_dir, vital_articles, writing)
  _kill_when(job, lambda: store.is_dir_like(writing) and store.list_files(writing),
             "preprocess")
  overwritten = os.path.join(root, "killed_overwrite")
  job = _preprocess(repo_dir, vital_articles, overwritten)
  assert job.wait(900) == 0, job.stderr.read()[-3000:]
  assert store.exists(os.path.join(overwritten, versioned.MANIFEST))
  job = _preprocess(repo_dir, vital_articles, overwritten, "--overwrite")
  _kill_when(job, lambda: not store.exists(os.path.join(overwritten, versioned.MANIFEST)),
             "preprocess --overwrite")
  for left in (writing, overwritten):
    assert not store.exists(os.path.join(left, versioned.MANIFEST))
  return writing, overwritten


@pytest.mark.fault
def test_what_killed_preprocess_jobs_leave_is_refused_by_every_command(
    repo_dir, vital_articles, tmp_path, tiny_config):
  """Local disk. Also the state a job killed after its last shard and before its manifest
  leaves (every shard there): no reader globs around the missing manifest."""
  writing, overwritten = _killed_jobs_leave(repo_dir, vital_articles, str(tmp_path / "out"),
                                            storage.GFILE)
  complete = str(tmp_path / "complete")
  write_corpus(complete)
  _without_manifest(complete)
  config = tf_.tiny_config(repo_dir, str(tmp_path / "good"), "pretrain")
  write_corpus(str(tmp_path / "good"))
  for corpus in (writing, overwritten, complete):
    work = str(tmp_path / "work" / os.path.basename(corpus))
    _refused_by_every_reader(repo_dir, _readers(repo_dir, corpus, work, config), corpus)


# A writer killed after its first shard: OutputWriter (the commit protocol beam.preprocess
# publishes with) writing through TensorFlow's gs:// client. beam.preprocess itself cannot
# write to the namespace's fake-gcs-server: Beam's GCS client deletes and copies in batch
# requests, which it does not serve ("Bad response: not multi-part").
_WRITER = """
import os, sys, time
import tensorflow as tf
from realm_tf.corpus import schema
from realm_tf.io import versioned
out, overwrite = sys.argv[1], sys.argv[2] == "overwrite"
with versioned.OutputWriter(out, overwrite):
  with tf.io.TFRecordWriter(os.path.join(out, "blocks-00000-of-00002.tfrecord")) as w:
    w.write(schema.BLOCK.serialize(dict(block_id=1, doc_uid="d", title="t", text="x")))
  print("written", flush=True)
  time.sleep(3600)
"""


def _killed_writer(directory: str, *args: str) -> None:
  """Runs _WRITER and SIGKILLs it once its first shard is stored (no manifest yet)."""
  writer = subprocess.Popen([sys.executable, "-c", _WRITER, directory, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  line = writer.stdout.readline()
  assert line.strip() == "written", writer.stderr.read()[-3000:]
  writer.send_signal(signal.SIGKILL)
  writer.wait(60)


def killed_writers_on_gcs(repo_dir: str, root: str, work: str) -> None:
  """A writer killed while it writes, and an overwrite of a published corpus killed after
  it deleted the old one, on gs://; then every reader. Runs inside the GCS emulator's
  namespace (its children inherit it)."""
  from realm_tf.configs import load_config  # noqa: PLC0415  in the emulator's child only
  writing = os.path.join(root, "killed_writing")
  overwritten = os.path.join(root, "killed_overwrite")
  _killed_writer(writing, "new")
  write_corpus(overwritten)
  assert storage.exists(os.path.join(overwritten, versioned.MANIFEST))
  _killed_writer(overwritten, "overwrite")
  good = os.path.join(work, "good")
  write_corpus(good)
  config = load_config(os.path.join(repo_dir, "configs", "tiny.yaml"), [
      "task.type=pretrain", f"index.blocks={good}"])
  for corpus in (writing, overwritten):
    assert not storage.exists(os.path.join(corpus, versioned.MANIFEST))
    assert storage.list_files(corpus) == ["blocks-00000-of-00002.tfrecord"]
    _refused_by_every_reader(repo_dir, _readers(repo_dir, corpus, os.path.join(
        work, os.path.basename(corpus)), config), corpus)


@pytest.mark.fault
def test_what_killed_writers_leave_on_gcs_is_refused_by_every_command(repo_dir, tmp_path):
  """The same on the GCS emulator (benchmarks/gcs_emulator.py), TensorFlow's gs:// client
  reading and writing."""
  from benchmarks import gcs_emulator  # noqa: PLC0415  starts nothing on import; system tier only
  reason = gcs_emulator.unavailable_reason()
  if reason:
    pytest.skip(f"GCS emulator namespace unavailable: {reason}")
  with gcs_emulator.GcsEmulator(buckets=["realm-test"]) as emulator:
    emulator.run(f"""
        from tests.test_published_inputs import killed_writers_on_gcs
        killed_writers_on_gcs({str(repo_dir)!r}, "gs://realm-test/published",
                              {str(tmp_path)!r})
        """, timeout=1800)
