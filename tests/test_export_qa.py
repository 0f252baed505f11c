"""Serving exports of a fine-tuned tiny Open-QA run: served answers are the evaluated ones,
TF Serving's layout, warm-up and provenance, the stock binary's ops only for realm_qa, a
ScaNN handle made once per load for realm_qa_scann, and `saved_model_cli show --all`."""
import fcntl
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from realm_tf.configs import load_config
from realm_tf.data.block_store import BlockStore, blocks_pattern
from realm_tf.export import exporter, model_server_ops, qa
from realm_tf.export.assembly import ScannSearch
from realm_tf.io import layout, versioned
from realm_tf.retrieval import scann_index
from realm_tf.tasks import openqa_evaluation as evaluation
from realm_tf.training import train_lib
from serving.servable import serve_meta_graph, xla_compiled_signatures
from tests import task_fixtures as tf_
from tests.synthetic_corpus import write_corpus

TRAIN_STEPS = 6
VENV_BIN = os.path.dirname(sys.executable)


def finetune_and_export(root: str, repo_dir, kinds=exporter.KINDS) -> dict:
  """Fine-tunes the tiny model briefly over the invented corpus (with a committed index,
  so no index builder starts), evaluates it, and exports `kinds` under <root>/models.
  Returns JSON values only (shared_export passes them between processes)."""
  corpus = os.path.join(root, "corpus")
  write_corpus(corpus)
  questions = tf_.write_questions(os.path.join(root, "questions.jsonl"))
  model_dir = os.path.join(root, "run")
  config = tf_.tiny_config(repo_dir, corpus, "openqa", questions, **{
      "trainer.train_steps": TRAIN_STEPS, "trainer.steps_per_loop": TRAIN_STEPS,
      "trainer.checkpoint_interval": TRAIN_STEPS, "trainer.learning_rate": 1e-2,
      "task.openqa.num_candidates": 3})
  store = BlockStore.from_tfrecords(blocks_pattern(corpus))
  rng = np.random.default_rng(0)
  tf_.publish_index(layout.index_dir(model_dir, config.index.index_dir), 1, store.block_ids,
                    rng.normal(size=[len(store), 16]).astype(np.float32))
  strategy = tf.distribute.get_strategy()
  train_lib.run_experiment(config, model_dir, strategy)
  evaluated = config.replace(task=dict(openqa=dict(validation_data=dict(
      input_path=questions, max_examples=0))), trainer=dict(validation_steps=-1))
  _, run = train_lib.evaluate_checkpoint(evaluated, model_dir, strategy=strategy)
  out = os.path.join(root, "models")
  published = exporter.export_run(model_dir, out, kinds)
  return dict(model_dir=model_dir, out=out, published=published,
              predictions=list(run.task.predictions),
              questions=[p["question"] for p in run.task.predictions])


def _session_dir(tmp_path_factory) -> pathlib.Path:
  """The session's temporary directory, which all its xdist workers see: a worker's base
  temp is <session>/popen-gwN. Without xdist the base temp itself (its parent holds every
  session's)."""
  base = tmp_path_factory.getbasetemp()
  return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_export(tmp_path_factory, repo_dir) -> dict:
  """One fine-tuned run and its exports per test session, for this module and
  tests/test_serving_realm.py in whichever xdist workers run them: the first to take the
  lock builds them, the others wait and read them. The record is renamed into place last,
  so a build that failed is built again, never read half made. Tests read what it names
  and write only to copies."""
  root = _session_dir(tmp_path_factory) / "export_qa"
  record = root / "exported.json"
  with open(f"{root}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
    if not record.is_file():
      shutil.rmtree(root, ignore_errors=True)  # a failed build's files
      root.mkdir()
      built = finetune_and_export(str(root), repo_dir)
      partial = root / "exported.json.tmp"
      partial.write_text(json.dumps(built))
      os.replace(partial, record)
    exported = json.loads(record.read_text())
  exported["config"] = load_config(layout.params_path(exported["model_dir"]))
  return exported


@pytest.fixture(scope="module")
def exported(tmp_path_factory, repo_dir):
  return shared_export(tmp_path_factory, repo_dir)


@pytest.fixture(scope="module")
def realm_qa(exported):
  return tf.saved_model.load(exported["published"]["realm_qa"])


def _outputs(loaded, questions):
  result = loaded.signatures["serving_default"](question=tf.constant(questions))
  return {k: v.numpy() for k, v in result.items()}


# ------------------------------------------------------------------- one answer path


# The corpus is small, so realm_qa_scann's shards are brute force in float32: exact top-k
# and exact scores, so its answers are the evaluated ones too (tests/test_export_scann.py).
@pytest.mark.parametrize("kind", ["realm_qa", "realm_qa_scann"])
def test_served_answers_are_the_evaluated_predictions(exported, kind):
  loaded = tf.saved_model.load(exported["published"][kind])
  predictions = exported["predictions"]
  out = _outputs(loaded, exported["questions"])
  assert sorted(out) == sorted(qa.QA_OUTPUTS)
  for i, record in enumerate(predictions):
    assert out["answer"][i].decode() == record["prediction"], record["question"]
    assert out["answer_block"][i] == record["chosen"]["rank"]
    np.testing.assert_allclose(out["score"][i], record["chosen"]["span_logit"], rtol=1e-4,
                               atol=1e-4)
    retrieved = record["retrieved"]
    assert [int(b) for b in out["block_ids"][i]] == [r["block_id"] for r in retrieved]
    assert [t.decode() for t in out["block_titles"][i]] == [r["title"] for r in retrieved]
    np.testing.assert_allclose(out["retrieval_probs"][i],
                               [r["p_z_given_x"] for r in retrieved], rtol=1e-4, atol=1e-5)
  # The evaluated answers are real spans of the chosen blocks' texts, not empty strings.
  assert all(out["answer"][i].decode() in out["block_texts"][i][out["answer_block"][i]]
             .decode() for i in range(len(predictions)))
  assert all(out["answer"])


def _assert_same_outputs(out: dict, expected: dict, tolerance: float):
  """The same QA outputs: strings and integers equal, floats within `tolerance`."""
  assert sorted(out) == sorted(expected)
  for name, value in expected.items():
    assert out[name].shape == value.shape, name
    if value.dtype.kind in "fc":
      np.testing.assert_allclose(out[name], value, rtol=tolerance, atol=tolerance,
                                 err_msg=name)
    else:
      np.testing.assert_array_equal(out[name], value, err_msg=name)


def test_reading_in_groups_answers_as_one_pass(exported):
  """max_blocks_per_pass splits a request into groups read one after another: the same
  outputs as one pass over the whole request, for groups of one question, of two (the
  last group short), and for a request no larger than a group."""
  run = exporter.load_run(exported["model_dir"])
  questions = tf.constant(exported["questions"][:5])
  whole = exporter.build_module(run, "realm_qa", max_blocks_per_pass=0)
  assert whole.questions_per_pass == 0
  expected = {k: v.numpy() for k, v in whole.answer(questions).items()}
  for per_pass, group in ((run.num_read, 1), (2 * run.num_read + 1, 2),
                          (5 * run.num_read, 5)):
    module = exporter.build_module(run, "realm_qa", max_blocks_per_pass=per_pass)
    assert module.questions_per_pass == group
    _assert_same_outputs({k: v.numpy() for k, v in module.answer(questions).items()},
                         expected, tolerance=1e-5)
  with pytest.raises(ValueError, match="max_blocks_per_pass"):
    exporter.build_module(run, "realm_qa", max_blocks_per_pass=-1)


def test_reading_at_the_shortest_length_that_holds_the_request(exported, monkeypatch):
  """reader_length_step: a request is read at the shortest multiple of the step that holds
  its longest [CLS] question [SEP] body [SEP]; the answers, scores and blocks are those of
  reading at the model's full length, and a shorter length is really the one read."""
  assert qa.reader_lengths(160, 32, 32) == [64, 96, 128, 160]
  assert qa.reader_lengths(160, 32, 0) == [160]
  assert qa.reader_lengths(64, 16, 8) == [24, 32, 40, 48, 56, 64]
  run = exporter.load_run(exported["model_dir"])
  full = run.model.reader_seq_length
  questions = tf.constant(exported["questions"][:4])
  whole = exporter.build_module(run, "realm_qa", 0, reader_length_step=0)
  expected = {k: v.numpy() for k, v in whole.answer(questions).items()}
  stepped = exporter.build_module(run, "realm_qa", 0, reader_length_step=8)
  assert stepped.reader_lengths[-1] == full and len(stepped.reader_lengths) > 1
  read_at = []
  original = type(run.model).read

  def recording_read(self, *args, reader_seq_length=None, **kwargs):
    read_at.append(reader_seq_length)
    return original(self, *args, reader_seq_length=reader_seq_length, **kwargs)

  monkeypatch.setattr(type(run.model), "read", recording_read)
  eager = {k: v.numpy() for k, v in stepped.predict(questions).items()}  # one branch runs
  assert len(read_at) == 1 and read_at[0] < full, read_at
  for out in (eager, {k: v.numpy() for k, v in stepped.answer(questions).items()}):
    _assert_same_outputs(out, expected, tolerance=1e-4)
  with pytest.raises(ValueError, match="reader_length_step"):
    exporter.build_module(run, "realm_qa", reader_length_step=-1)


def test_a_pass_is_read_at_the_first_length_that_holds_it():
  """reader_length_branch: a pass whose longest input is exactly a length is read at that
  length, one a wordpiece longer at the next, and one past the full length (which
  packed_lengths never gives: bodies are cut at it) at the full length, never beyond."""
  lengths = qa.reader_lengths(160, 32, 32)  # [64, 96, 128, 160]
  branch = tf.function(lambda needed: qa.reader_length_branch(lengths, needed))
  for needed, expected in ((1, 64), (64, 64), (65, 96), (96, 96), (159, 160), (160, 160),
                           (161, 160), (10_000, 160)):
    assert lengths[int(branch(tf.constant(needed)))] == expected, needed
  assert int(qa.reader_length_branch([160], tf.constant(500))) == 0


def test_xla_reader_pass_answers_as_the_baseline(exported, tmp_path):
  """reader_xla: the reader's pass XLA-compiled, in passes and at per-pass lengths, gives
  the outputs of the plain export read in one pass at the full length (float tolerance:
  XLA fuses and reorders the arithmetic), in process and saved; the saved graph keeps the
  stock binary's ops, and its QA signatures (not the retrieval ones) are the ones that
  reach an XLA-compiled function, which serving.server runs only with
  --xla_cpu_compilation_enabled."""
  run = exporter.load_run(exported["model_dir"])
  questions = tf.constant(exported["questions"][:5])
  baseline = exporter.build_module(run, "realm_qa", 0, 0)
  expected = {k: v.numpy() for k, v in baseline.answer(questions).items()}
  compiled = exporter.build_module(run, "realm_qa", 2 * run.num_read, 8, reader_xla=True)
  assert compiled.reader_xla and not baseline.reader_xla
  assert compiled.questions_per_pass == 2 and len(compiled.reader_lengths) > 1
  _assert_same_outputs({k: v.numpy() for k, v in compiled.answer(questions).items()},
                       expected, tolerance=1e-4)
  path = exporter.save_export(compiled, str(tmp_path), "realm_qa", 1,
                              run.provenance("realm_qa"),
                              exporter.warmup_requests("realm_qa", run))
  _assert_same_outputs(_outputs(tf.saved_model.load(path), questions), expected,
                       tolerance=1e-4)
  outside = model_server_ops.ops_outside(path)
  assert not outside, f"the XLA export uses ops the stock binary lacks: {sorted(outside)}"
  assert xla_compiled_signatures(serve_meta_graph(path)) == {"serving_default", "answer"}
  assert xla_compiled_signatures(
      serve_meta_graph(exported["published"]["realm_qa"])) == set()
  with pytest.raises(ValueError, match="reader_xla needs max_blocks_per_pass"):
    exporter.build_module(run, "realm_qa", 0, 8, reader_xla=True)


def test_qa_outputs_follow_the_client_contract(realm_qa):
  from serving import client  # pylint: disable=g-import-not-at-top
  signature = realm_qa.signatures["serving_default"]
  assert set(signature.structured_outputs) == set(client.PER_QUESTION + client.PER_BLOCK)
  _, inputs = signature.structured_input_signature
  assert {k: (v.dtype, v.shape.as_list()) for k, v in inputs.items()} == {
      client.QUESTION: (tf.string, [None])}
  dtypes = {k: v.dtype for k, v in signature.structured_outputs.items()}
  assert dtypes == dict(answer=tf.string, score=tf.float32, answer_block=tf.int32,
                        block_ids=tf.int64, block_titles=tf.string, block_texts=tf.string,
                        retrieval_probs=tf.float32)


def test_search_options_signature_follows_the_client_contract(exported):
  """The ScaNN export's tunable signature: the client's names, the QA outputs, scalar
  options beside the batched question."""
  from serving import client  # pylint: disable=g-import-not-at-top
  assert (qa.SEARCH_OPTIONS_SIGNATURE, qa.LEAVES_FRACTION, qa.REORDER_NUM_NEIGHBORS) == (
      client.SEARCH_OPTIONS_SIGNATURE, client.LEAVES_FRACTION, client.REORDER_NUM_NEIGHBORS)
  loaded = tf.saved_model.load(exported["published"]["realm_qa_scann"])
  signature = loaded.signatures[client.SEARCH_OPTIONS_SIGNATURE]
  _, inputs = signature.structured_input_signature
  assert {k: (v.dtype, v.shape.as_list()) for k, v in inputs.items()} == {
      client.QUESTION: (tf.string, [None]), client.LEAVES_FRACTION: (tf.float32, []),
      client.REORDER_NUM_NEIGHBORS: (tf.int32, [])}
  assert set(signature.structured_outputs) == set(client.PER_QUESTION + client.PER_BLOCK)


@pytest.mark.parametrize("kind", ["realm_qa", "realm_qa_scann"])
def test_retrieve_signature_returns_the_blocks_answer_reads(exported, kind):
  """`retrieve` (no reader): the blocks `answer` retrieves, best first, their titles and
  the scores whose softmax is answer's retrieval_probs; for realm_qa the knowledge index's
  exact top-k (evaluation's search), for realm_qa_scann its searcher's (candidates
  re-scored from float16 embeddings), each computed here in process."""
  loaded = tf.saved_model.load(exported["published"][kind])
  signature = loaded.signatures[qa.RETRIEVE_SIGNATURE]
  _, inputs = signature.structured_input_signature
  assert {k: (v.dtype, v.shape.as_list()) for k, v in inputs.items()} == {
      qa.QUESTION: (tf.string, [None])}
  assert {k: v.dtype for k, v in signature.structured_outputs.items()} == dict(
      block_ids=tf.int64, block_titles=tf.string, retrieval_scores=tf.float32)
  questions = exported["questions"]
  got = {k: v.numpy() for k, v in signature(question=tf.constant(questions)).items()}
  answered = _outputs(loaded, questions)
  np.testing.assert_array_equal(got["block_ids"], answered["block_ids"])
  np.testing.assert_array_equal(got["block_titles"], answered["block_titles"])
  np.testing.assert_allclose(tf.nn.softmax(got["retrieval_scores"]).numpy(),
                             answered["retrieval_probs"], rtol=1e-4, atol=1e-5)
  run = exporter.load_run(exported["model_dir"])
  query = run.model.retriever.embed_queries(run.tokenizer.encode(
      tf.constant(questions), exported["config"].task.openqa.query_seq_length).as_dict(),
      training=False)
  index = run.index if kind == "realm_qa" else exporter.build_module(run, kind).index
  found = index.search(query, run.num_retrieved)
  np.testing.assert_array_equal(got["block_ids"], found.block_ids.numpy())
  np.testing.assert_allclose(got["retrieval_scores"], found.scores.numpy(), rtol=1e-5,
                             atol=1e-5)
  # retrieve_embedding: the same search from the query tower's output, fed over the
  # signature as a float32 [B, P] input (recall is read on generated vectors).
  by_embedding = loaded.signatures[qa.RETRIEVE_EMBEDDING_SIGNATURE]
  _, inputs = by_embedding.structured_input_signature
  assert {k: (v.dtype, v.shape.as_list()) for k, v in inputs.items()} == {
      qa.QUERY_EMBEDDING: (tf.float32, [None, int(query.shape[1])])}
  embedded = {k: v.numpy() for k, v in by_embedding(query_embedding=query).items()}
  for name in ("block_ids", "block_titles"):
    np.testing.assert_array_equal(embedded[name], got[name])
  np.testing.assert_allclose(embedded["retrieval_scores"], got["retrieval_scores"],
                             rtol=1e-5, atol=1e-5)
  # A row of its own: a different embedding finds other blocks, so the input is read.
  flipped = by_embedding(query_embedding=-query[:1])["block_ids"].numpy()
  assert flipped.tolist() != got["block_ids"][:1].tolist()
  titles = np.array(run.index.store.title_strings, object)[found.rows.numpy()]
  assert [[t.decode() for t in row] for row in got["block_titles"]] == titles.tolist()


def test_reader_export_reads_blocks_like_the_model(exported):
  """Given the blocks the model retrieved, the reader export chooses the span the model's
  reader scores best (its own span scores: the reader export has no retrieval score)."""
  reader = tf.saved_model.load(exported["published"]["reader"])
  run = exporter.load_run(exported["model_dir"])
  questions = exported["questions"][:6]
  query = run.tokenizer.encode(tf.constant(questions),
                               exported["config"].task.openqa.query_seq_length).as_dict()
  out = run.model({"query": query}, index=run.index, num_retrieved=run.num_retrieved,
                  num_read=run.num_read, training=False)
  own_scores = getattr(out, "span_scores", None)
  own_scores = out.span_logits if own_scores is None else own_scores
  chosen = evaluation.choose_answers(own_scores, out.span_starts, out.span_ends,
                                     out.reader_inputs["body_start"])
  rows = out.rows[:, :run.num_read].numpy()
  texts = np.array(run.index.store.text_strings, object)[rows]
  titles = np.array(run.index.store.title_strings, object)[rows]
  expected = evaluation.answer_strings(
      run.tokenizer, tf.constant(texts[np.arange(len(questions)),
                                       chosen["best_block"].numpy()]),
      chosen["best_start"], chosen["best_end"]).numpy()
  read = {key: v.numpy() for key, v in reader.signatures["serving_default"](
      question=tf.constant(questions), block_titles=tf.constant(titles),
      block_texts=tf.constant(texts)).items()}
  np.testing.assert_array_equal(read["answer"], expected)
  np.testing.assert_array_equal(read["answer_block"], chosen["best_block"].numpy())
  np.testing.assert_allclose(read["score"], chosen["best_score"].numpy(), rtol=1e-4,
                             atol=1e-4)
  np.testing.assert_allclose(read["block_scores"], tf.reduce_max(own_scores, -1).numpy(),
                             rtol=1e-4, atol=1e-4)
  np.testing.assert_array_equal(
      read["answer_title"], titles[np.arange(len(questions)), read["answer_block"]].astype(
          bytes))


def test_encoder_exports_reproduce_realm_qa_retrieval(exported, realm_qa):
  """query_encoder embeddings against the index's embeddings rank blocks as realm_qa does;
  doc_encoder embeds (title, text) pairs with the document tower."""
  queries = tf.saved_model.load(exported["published"]["query_encoder"])
  documents = tf.saved_model.load(exported["published"]["doc_encoder"])
  questions = exported["questions"][:4]
  embedded = queries.signatures["serving_default"](text=tf.constant(questions))["embeddings"]
  qa = _outputs(realm_qa, questions)
  run = exporter.load_run(exported["model_dir"])
  scores = embedded.numpy() @ exporter.index_embeddings(run.index).T
  order = np.argsort(-scores, axis=1, kind="stable")[:, :qa["block_ids"].shape[1]]
  np.testing.assert_array_equal(run.index.store.block_ids[order], qa["block_ids"])
  doc = documents.signatures["serving_default"](
      title=tf.constant(run.index.store.title_strings[:3]),
      text=tf.constant(run.index.store.text_strings[:3]))["embeddings"].numpy()
  inputs = run.tokenizer.encode(tf.constant(run.index.store.title_strings[:3]),
                                exported["config"].model.retriever.block_seq_length,
                                pair_texts=tf.constant(run.index.store.text_strings[:3]))
  expected = run.model.retriever.embed_documents(inputs.as_dict(), training=False).numpy()
  np.testing.assert_allclose(doc, expected, rtol=1e-5, atol=1e-5)


# -------------------------------------------------------------- layout and provenance


def test_exports_are_published_in_tf_serving_layout_with_warmup_and_provenance(exported):
  step = TRAIN_STEPS
  for kind, path in exported["published"].items():
    assert path == os.path.join(exported["out"], kind, str(step))
    assert sorted(n for n in os.listdir(os.path.join(exported["out"], kind))) == [str(step)]
    assert os.path.isfile(os.path.join(path, "saved_model.pb"))
    assert versioned.verify_copy(path, "assets.extra")["kind"] == kind
    staging = os.path.join(exported["out"], exporter.STAGING, kind)
    assert versioned.list_versions(staging) == [] and not [  # no second copy left behind
        n for n in os.listdir(staging) if not n.startswith("_")], os.listdir(staging)
    provenance = exporter.read_provenance(path)
    assert provenance["kind"] == kind and provenance["training_step"] == step
    assert provenance["index_version"] == 1 and provenance["version"] == step
    assert provenance["checkpoint"].endswith(f"-{step}")
    assert provenance["config"]["task"]["type"] == "openqa"
    loaded = tf.saved_model.load(path)
    assert "serving_default" in loaded.signatures and len(loaded.signatures) >= 2
    warmup = os.path.join(path, "assets.extra", "tf_serving_warmup_requests")
    records = list(tf.data.TFRecordDataset(warmup).as_numpy_iterator())
    assert records
    for raw in records:  # every warm-up request runs through the export's signature
      log = prediction_log_pb2.PredictionLog.FromString(raw)
      request = log.predict_log.request
      assert request.model_spec.name == kind
      inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
      loaded.signatures[request.model_spec.signature_name](**inputs)


def test_a_published_version_is_never_overwritten(exported, tmp_path):
  # Tried on a copy: were the refusal broken, the shared export would be overwritten
  # under the other tests.
  shutil.copytree(os.path.join(exported["out"], "query_encoder"), tmp_path / "query_encoder")
  run = exporter.load_run(exported["model_dir"])
  with pytest.raises(FileExistsError, match="already published"):
    exporter.save_export(exporter.build_module(run, "query_encoder"), str(tmp_path),
                         "query_encoder", TRAIN_STEPS, run.provenance("query_encoder"),
                         exporter.warmup_requests("query_encoder", run))
  assert sorted(os.listdir(tmp_path)) == ["query_encoder"]  # nothing staged either
  with pytest.raises(ValueError, match="unknown export kind"):
    exporter.build_module(run, "realm")


def test_saved_model_cli_lists_every_export(exported):
  cli = os.path.join(VENV_BIN, "saved_model_cli")
  running = {kind: subprocess.Popen([cli, "show", "--all", "--dir", path],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
             for kind, path in exported["published"].items()}
  for kind, process in running.items():
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, (kind, stderr[-2000:])
    assert "signature_def['serving_default']" in stdout, kind
    assert "Traceback" not in stdout + stderr, kind
    named = [s for s in ("answer", "read", "embed") if f"signature_def['{s}']" in stdout]
    assert named, f"{kind}: no named signature beside serving_default"


# ---------------------------------------------------------------------------- ops


def test_exports_use_only_ops_of_the_stock_model_server(exported):
  """realm_qa: every op of its graph (all functions, called or not) is one the stock
  tensorflow_model_server 2.20.0 registers (the committed allow-list); realm_qa_scann: those
  and ScaNN's served ops, nothing else. A new op fails here, named."""
  stock = model_server_ops.read_allow_list()
  ops = model_server_ops.saved_model_ops(exported["published"]["realm_qa"])
  assert {"MatMul", "TopKV2", "FastWordpieceTokenizeWithOffsets"} <= ops  # it read a graph
  assert not ops - stock, f"realm_qa uses ops the stock binary lacks: {sorted(ops - stock)}"
  # Every signature of the ScaNN export, answer_with_search_options included, needs only
  # ScaNN's served ops beyond the stock ones: a model server with ScaNN's ops runs it.
  scann_ops = model_server_ops.saved_model_ops(exported["published"]["realm_qa_scann"])
  beyond = scann_ops - stock
  assert beyond == scann_index.SERVED_SCANN_OPS, (
      f"realm_qa_scann uses ops beyond the stock binary's and ScaNN's served ones: "
      f"{sorted(beyond - scann_index.SERVED_SCANN_OPS)}")
  signatures = {kind: set(tf.saved_model.load(exported["published"][kind]).signatures)
                for kind in ("realm_qa", "realm_qa_scann")}
  retrieval = {qa.RETRIEVE_SIGNATURE, qa.RETRIEVE_EMBEDDING_SIGNATURE}
  assert signatures == {"realm_qa": {"serving_default", "answer", *retrieval},
                        "realm_qa_scann": {"serving_default", "answer", *retrieval,
                                           qa.SEARCH_OPTIONS_SIGNATURE}}


def _negate_scann_data(loaded):
  for handle in loaded.scann_handles:
    for name in ("dataset", "int8_dataset"):
      variable = getattr(handle.state, name)
      if int(tf.size(variable)):
        variable.assign(-variable.read_value())


def test_scann_searcher_is_built_once_not_per_call(exported, tmp_path):
  """After the first call, the searcher's data is no longer read: changing it leaves the
  results alone (a searcher rebuilt per request would now rank the blocks in reverse),
  while the same change before the first call does reverse them. (An export that ranks by
  the searcher's scores: re-scoring from embeddings would put the reversal right.)"""
  path = exporter.export_run(exported["model_dir"], str(tmp_path), ["realm_qa_scann"],
                             searches=[ScannSearch(rescore_dtype=None)])["realm_qa_scann"]
  question = exported["questions"][:1]
  loaded = tf.saved_model.load(path)
  first = _outputs(loaded, question)
  _negate_scann_data(loaded)
  np.testing.assert_array_equal(_outputs(loaded, question)["block_ids"], first["block_ids"])
  # answer_with_search_options and retrieve share the searchers serving_default built (one
  # function makes them for every signature): their first calls do not read the changed
  # data either. Brute-force shards without re-scoring: options that say so.
  tuned = loaded.signatures[qa.SEARCH_OPTIONS_SIGNATURE](
      question=tf.constant(question), leaves_fraction=tf.constant(1.0),
      reorder_num_neighbors=tf.constant(exporter.read_provenance(path)["num_retrieved"]))
  np.testing.assert_array_equal(tuned["block_ids"].numpy(), first["block_ids"])
  retrieved = loaded.signatures[qa.RETRIEVE_SIGNATURE](question=tf.constant(question))
  np.testing.assert_array_equal(retrieved["block_ids"].numpy(), first["block_ids"])
  # The control: the same change before the first call reaches the searcher.
  fresh = tf.saved_model.load(path)
  _negate_scann_data(fresh)
  reversed_ids = _outputs(fresh, question)["block_ids"]
  assert not np.array_equal(reversed_ids, first["block_ids"])
  # The signature's graph builds the searcher in one op, then searches with it.
  assert scann_index.SERVED_SCANN_OPS <= model_server_ops.saved_model_ops(path)


@pytest.fixture(scope="module")
def separate_towers(exported):
  run = exporter.load_run(exported["model_dir"])
  assert not run.model.retriever.shares_towers  # else the check below checks nothing
  return run.model, run.model.retriever.document_embedder.variables


def test_qa_exports_hold_embeddings_once_and_no_text_variable(exported, separate_towers):
  """One [N, P] float32 variable in either checkpoint: the exact export's embeddings, and
  the ScaNN export's brute-force state, beside which it keeps one float16 copy (which
  re-scores the searcher's candidates); neither keeps a string variable (titles and texts
  are compressed asset files, realm_tf.export.served_index), nor the document tower."""
  model, documents = separate_towers
  for kind, expected in (("realm_qa", 1), ("realm_qa_scann", 1)):
    path = exported["published"][kind]
    num_blocks = exporter.read_provenance(path)["num_blocks"]
    reader = tf.train.load_checkpoint(os.path.join(path, "variables", "variables"))
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    tables = [k for k, shape in shapes.items()
              if dtypes[k] == tf.float32 and len(shape) == 2 and shape[0] == num_blocks]
    assert len(tables) == expected, (kind, tables)
    halves = [k for k, shape in shapes.items()
              if dtypes[k] == tf.float16 and len(shape) == 2 and shape[0] == num_blocks]
    assert len(halves) == (kind == "realm_qa_scann"), (kind, halves)
    # ScaNN's state keeps its configuration and codebook as strings of its own.
    strings = [k for k, dtype in dtypes.items() if dtype == tf.string
               and not k.startswith(("scann_handles/", "_CHECKPOINTABLE_OBJECT_GRAPH"))]
    assert not strings, (kind, strings)
    assert any(name.startswith("block_texts-") for name in os.listdir(os.path.join(path,
                                                                                 "assets")))
    # The model's variables but the document tower's: answering never embeds a block.
    saved = {k.split("/")[1] for k in shapes if k.startswith("model_variables/")}
    assert len(saved) == len(model.variables) - len(documents), kind



def test_export_command_line(exported, tmp_path):
  # Four processes, started together: one export, and three that stop before writing
  # anything (each still loads TensorFlow first, so in a row they would wait for four).
  export = [sys.executable, "-m", "realm_tf.export", "--model_dir", exported["model_dir"],
            "--output_dir", str(tmp_path)]
  commands = dict(
      published=[*export, "--kinds", "query_encoder", "--version", "7"],
      bad=[*export, "--kinds", "nope"],
      # The command line's reading defaults are the exporter's (its flags parse before
      # TensorFlow loads, so they cannot import them).
      usage=[sys.executable, "-m", "realm_tf.export", "--help"],
      # Another corpus needs its index (the edited-corpus export runs end to end in
      # test_demo).
      alone=[*export, "--kinds", "realm_qa", "--blocks", str(tmp_path)])
  quiet = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  running = {name: subprocess.Popen(  # pylint: disable=consider-using-with
      command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env=quiet if name == "published" else None) for name, command in commands.items()}
  results = {}
  try:
    for name, process in running.items():
      stdout, stderr = process.communicate(timeout=300)
      results[name] = (process.returncode, stdout, stderr)
  finally:
    for process in running.values():
      if process.poll() is None:
        process.kill()
        process.wait()
  code, stdout, stderr = results["published"]
  assert code == 0, stderr[-3000:]
  published = json.loads(stdout[stdout.index("{"):])
  assert published == {"query_encoder": str(tmp_path / "query_encoder" / "7")}
  assert exporter.read_provenance(published["query_encoder"])["training_step"] == TRAIN_STEPS
  code, _, stderr = results["bad"]
  assert code != 0 and "unknown export kinds" in stderr
  _, stdout, stderr = results["usage"]
  text = re.sub(r"\s+", " ", stdout + stderr)
  for flag, default in (("max_blocks_per_pass", exporter.MAX_BLOCKS_PER_PASS),
                        ("reader_length_step", exporter.READER_LENGTH_STEP)):
    assert re.search(rf"--{flag}: .*?\(default: '{default}'\)", text), flag
  code, _, stderr = results["alone"]
  assert code != 0 and "--blocks and --index_dir go together" in stderr


def test_answer_strings_return_the_original_text_in_graph(tokenizer):
  """The served and evaluated answer string: case, accents and punctuation as written; an
  empty block gives "" and an index past the end is clipped, inside a tf.function too."""
  texts = ["Café Müller, in PARIS!", "", "Tokyo"]
  starts, ends = [0, 0, 4], [1, 3, 9]
  graph = tf.function(lambda t, s, e: evaluation.answer_strings(tokenizer, t, s, e))
  found = graph(tf.constant(texts), tf.constant(starts), tf.constant(ends)).numpy()
  assert [s.decode() for s in found] == ["Café Müller", "", "Tokyo"]
  assert evaluation.span_strings(tokenizer, texts, np.array(starts), np.array(ends)) == [
      "Café Müller", "", "Tokyo"]
