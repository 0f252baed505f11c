"""Serving exports of a fine-tuned Open-QA run, published in TF Serving's layout.

    <output_dir>/<kind>/<version>/saved_model.pb, variables/, assets.extra/
        assets.extra/tf_serving_warmup_requests   replayed by TF Serving before serving
        assets.extra/realm_provenance.json        what was exported (model, index, config)
        assets.extra/realm_manifest.json          every file with size and CRC32C: the
                                                  server refuses a damaged version with it

Kinds (strings in, strings out, tokenization in graph):
  query_encoder   question [B] → embeddings [B, P]            (QueryEncoder)
  doc_encoder     (title [B], text [B]) → embeddings [B, P]   (BlockEncoder)
  reader          question [B], block_titles/texts [B, K] → answer, score, block_scores
  realm_qa        question [B] → answer + top-k blocks, exact search (stock TF ops);
                  `retrieve`: question [B] → the top-k blocks alone (no reader)
  realm_qa_scann  the same with ScaNN's TensorFlow ops (a ScaNN-enabled model server)
The QA kinds are assembled by realm_tf.export.assembly.served_qa_module, the one assembly
the benchmarks measure too.

Tokenization uses tensorflow_text's FastBertNormalize / FastWordpieceTokenize and trimmer
ops. Those are not custom ops for TF Serving: tensorflow_model_server links tf.text's
`ops_lib` (SUPPORTED_TENSORFLOW_OPS in tensorflow_serving/model_servers/BUILD), so the
stock binary runs `realm_qa`; tests/test_export_qa.py checks its graph has no op outside
core TensorFlow and tf.text. ScaNN's ops are in no stock binary: `realm_qa_scann` needs a
model server built with ScaNN's op library linked in.

Every export is first written and committed under `<output_dir>/.staging/<kind>/`
(realm_tf.io.versioned: files, sizes, CRC32C), then copied to `<kind>/<version>/` with
saved_model.pb last, so TF Serving never sees a partial version on any file system (hard
links on one local disk, so the bytes are written once); the staged original is deleted
once the copy is complete and verified.
"""
import dataclasses
import json
import logging
import os
import time
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from realm_tf import tasks
from realm_tf.configs import load_config
from realm_tf.configs.experiment import ExperimentConfig
from realm_tf.export import serving_warmup
from realm_tf.export.assembly import (MAX_BLOCKS_PER_PASS, READER_LENGTH_STEP, READER_XLA,
                                      ExactSearch, ScannSearch, Search, served_qa_module)
from realm_tf.export.qa import ReaderModule
from realm_tf.data import block_texts
from realm_tf.io import layout, versioned
from realm_tf.modeling.factory import set_precision
from realm_tf.retrieval.encoders import BlockEncoder, QueryEncoder
from realm_tf.retrieval.knowledge_index import KnowledgeIndex
from realm_tf.tasks.openqa import reader_body_length

KINDS = ("query_encoder", "doc_encoder", "reader", "realm_qa", "realm_qa_scann")
PROVENANCE_FILE = "realm_provenance.json"
STAGING = ".staging"
WARMUP_QUESTIONS = ("who wrote the iliad?", "what is the capital of france?")
# The search each QA kind serves unless told otherwise.
DEFAULT_SEARCHES = {"realm_qa": ExactSearch(), "realm_qa_scann": ScannSearch()}


@dataclasses.dataclass
class ServingRun:
  """A fine-tuned Open-QA model and its knowledge index, ready to export.

  Attributes:
    config: the run's ExperimentConfig (index.backend forced to 'exact').
    task: the OpenQATask that built the model and the index.
    model: the OpenQAModel.
    index: the KnowledgeIndex over the run's block text store, with a committed version
      swapped in (load_run).
    step: the checkpoint's training step (the default export version).
    checkpoint: the checkpoint read.
    model_dir: the run's directory.
  """
  config: ExperimentConfig
  task: object
  model: object
  index: KnowledgeIndex
  step: int
  checkpoint: str = ""
  model_dir: str = ""

  @property
  def tokenizer(self):
    """The run's Tokenizer."""
    return self.task.tokenizer

  @property
  def num_read(self) -> int:
    """K, blocks read per question (task.openqa.num_candidates)."""
    return self.config.task.openqa.num_candidates

  @property
  def num_retrieved(self) -> int:
    """As many blocks as evaluation retrieves, so p(z|x) is evaluation's too."""
    return self.task.num_retrieved(training=False)

  def provenance(self, kind: str) -> dict:
    """What an export of `kind` records about its origin (realm_provenance.json).

    Returns:
      A JSON-serialisable dict: model_dir, checkpoint, training_step, the index's version,
      path, encoder step and size, num_retrieved, num_read, the TF version and the config.
    """
    export = self.index.export
    return dict(
        kind=kind, model_dir=self.model_dir, checkpoint=self.checkpoint,
        training_step=int(self.step), index_version=self.index.version,
        index_path=export.path if export is not None else "",
        blocks=self.config.index.blocks,
        index_encoder_step=self.index.encoder_step, num_blocks=int(self.index.num_blocks),
        num_retrieved=self.num_retrieved, num_read=self.num_read,
        tensorflow=tf.__version__, config=self.config.as_dict())


def build_run(config: ExperimentConfig, model_dir: str = "", step: int = 0,
              checkpoint: str = "") -> ServingRun:
  """The task's model and an exact-search KnowledgeIndex (no embeddings yet) under the
  default strategy: one replica, as a server runs it.

  Args:
    config: an Open-QA run's ExperimentConfig.
    model_dir: the run's directory (recorded).
    step: the training step (recorded; load_run sets it from the checkpoint).
    checkpoint: the checkpoint path (recorded).

  Returns:
    A ServingRun whose weights and index are not loaded yet.

  Raises:
    ValueError: the config is not an Open-QA run with dense retrieval.
  """
  if config.task.type != "openqa":
    raise ValueError(f"task.type is {config.task.type!r}: serving exports need an Open-QA "
                     "run (task.type=openqa)")
  if config.task.openqa.retrieval != "dense":
    raise ValueError("serving exports need dense retrieval (task.openqa.retrieval=dense)")
  # The exports search in graph; a 'scann' run's index is searched by realm_qa_scann.
  config = config.replace(index=dict(backend="exact"))
  set_precision(config)
  strategy = tf.distribute.get_strategy()
  task = tasks.get_task(config, model_dir)
  model = task.build_model()
  index = task.build_index(strategy)
  return ServingRun(config, task, model, index, step, checkpoint, model_dir)


def load_run(model_dir: str, checkpoint: str = "", blocks: str = "",
             index_dir: str = "") -> ServingRun:
  """A run's fine-tuned checkpoint (its newest, or `checkpoint`) and newest committed index.

  `blocks` and `index_dir` (both or neither) serve another corpus with its own committed
  index in place of the run's: an edited corpus, re-embedded by the same document tower,
  is published as a new version without a parameter changed (REALM's knowledge lives in
  the corpus). The index must cover exactly `blocks` (KnowledgeIndex.swap checks the ids).

  Args:
    model_dir: the Open-QA run's directory (its params.yaml is the config).
    checkpoint: a checkpoint to export instead of the run's newest.
    blocks: another corpus's blocks (with `index_dir`).
    index_dir: the versioned index directory of `blocks`.

  Returns:
    The ServingRun, weights restored and the newest committed index swapped in.

  Raises:
    ValueError: only one of `blocks` and `index_dir` is given, or the run is not a dense
      Open-QA run.
    FileNotFoundError: no checkpoint, or no committed index.
    AssertionError: a model variable is not in the checkpoint.
  """
  if bool(blocks) != bool(index_dir):
    raise ValueError("--blocks and --index_dir go together: a corpus and the committed "
                     "index of its blocks")
  config = load_config(layout.params_path(model_dir))
  if blocks:
    config = config.replace(index=dict(blocks=blocks, index_dir=index_dir, text_store=""))
  # The export links the store's chunks among its assets: no texts in memory, none
  # written again (realm_tf.data.block_texts).
  config = block_texts.ensure_store(config, model_dir)
  path = layout.latest_checkpoint(checkpoint or model_dir)
  step_var = tf.Variable(0, dtype=tf.int64, trainable=False)
  run = build_run(config, model_dir, checkpoint=path)
  index_dir = layout.index_dir(model_dir, config.index.index_dir)
  latest = versioned.latest_version(index_dir)
  if latest is None:
    raise FileNotFoundError(f"{index_dir}: no committed index; the run has not built one")
  run.index.swap(latest)
  status = tf.train.Checkpoint(model=run.model, global_step=step_var).read(path)
  status.expect_partial()
  # The networks' variables exist once they have run: one question builds them all.
  served_qa_module(run.model, run.index, run.tokenizer, run.config).predict(
      tf.constant(["?"]))
  status.assert_existing_objects_matched()
  run.step = int(step_var.numpy())
  logging.info("Loaded %s (step %d), index version %s", path, run.step, run.index.version)
  return run


def index_embeddings(index: KnowledgeIndex) -> np.ndarray:
  """[N, P] float32 embeddings of the index in row order (one replica's row blocks)."""
  return index.embedding_blocks.numpy().astype(np.float32)


class ServingQueryEncoder(QueryEncoder):
  """QueryEncoder with a named signature beside serving_default (TF Serving clients name
  the signature they call; the index builder keeps using the plain export)."""

  def signatures(self) -> dict:
    """serving_default and `embed`, both the query embedding function."""
    return dict(super().signatures(), embed=self.embed)


class ServingBlockEncoder(BlockEncoder):
  """BlockEncoder with a named signature beside serving_default."""

  def signatures(self) -> dict:
    """serving_default and `embed`, both the block embedding function."""
    return dict(super().signatures(), embed=self.embed)


def build_module(run: ServingRun, kind: str,
                 max_blocks_per_pass: int = MAX_BLOCKS_PER_PASS,
                 reader_length_step: int = READER_LENGTH_STEP,
                 search: Optional[Search] = None,
                 reader_xla: bool = READER_XLA, release_index: bool = False) -> tf.Module:
  """The tf.Module saved as one export kind.

  Args:
    run: the loaded ServingRun.
    kind: one of KINDS: 'query_encoder', 'doc_encoder', 'reader', 'realm_qa' (question →
      answer, exact search in graph) or 'realm_qa_scann' (the same with ScaNN's TF ops).
    max_blocks_per_pass: QA kinds: blocks read per reader pass at most (0: no limit).
    reader_length_step: QA kinds: reader lengths are multiples of this (0: full length).
    search: QA kinds: how the module searches (assembly.ExactSearch for realm_qa,
      assembly.ScannSearch for realm_qa_scann); default DEFAULT_SEARCHES[kind].
    reader_xla: QA kinds: the reader's pass XLA-compiled (QAModule; the export then needs
      tensorflow_model_server's --xla_cpu_compilation_enabled=true).
    release_index: QA kinds: the run's index gives up its embeddings once the module has
      its own (served_qa_module): the run's last use of them.

  Returns:
    The module; its `signatures()` are what the SavedModel serves.

  Raises:
    ValueError: an unknown kind, or a search of another kind than `kind`.
  """
  c = run.config
  if kind == "query_encoder":
    return ServingQueryEncoder(run.model.retriever.query_embedder, run.tokenizer,
                               c.task.openqa.query_seq_length)
  if kind == "doc_encoder":
    return ServingBlockEncoder(run.model.retriever.document_embedder, run.tokenizer,
                               c.model.retriever.block_seq_length)
  if kind == "reader":
    return ReaderModule(run.model, run.tokenizer, c.task.openqa.query_seq_length,
                        reader_body_length(c))
  if kind in DEFAULT_SEARCHES:
    search = DEFAULT_SEARCHES[kind] if search is None else search
    if search.kind != kind:
      raise ValueError(f"a {kind} export cannot serve {search!r}, which is {search.kind}'s")
    return served_qa_module(run.model, run.index, run.tokenizer, c, search,
                            max_blocks_per_pass, reader_length_step, reader_xla,
                            release_index)
  raise ValueError(f"unknown export kind {kind!r}; kinds are {', '.join(KINDS)}")


def warmup_requests(kind: str, run: ServingRun,
                    questions: Sequence[str] = WARMUP_QUESTIONS) -> list[dict]:
  """Requests TF Serving replays before serving: one per batch size a client is likely
  to send first (1 and all of `questions`), so both traces exist.

  Args:
    kind: the export kind (its signature's inputs).
    run: the ServingRun (corpus blocks for the encoder and reader kinds).
    questions: the questions to send.

  Returns:
    Two requests, each a dict of input name → list (one for the batch of 1, one larger).
  """
  store = run.index.store
  k = min(run.num_read, len(store))
  one, many = list(questions[:1]), list(questions)
  if kind == "doc_encoder":
    return [dict(title=store.title_strings[:1], text=store.text_strings[:1]),
            dict(title=store.title_strings[:2], text=store.text_strings[:2])]
  if kind == "query_encoder":
    return [dict(text=one), dict(text=many)]
  if kind == "reader":
    titles = [store.title_strings[:k]]
    texts = [store.text_strings[:k]]
    return [dict(question=one, block_titles=titles, block_texts=texts),
            dict(question=many, block_titles=titles * len(many),
                 block_texts=texts * len(many))]
  return [dict(question=one), dict(question=many)]


def save_export(module: tf.Module, output_dir: str, kind: str, version: int,
                provenance: dict, warmup: Sequence[dict]) -> str:
  """Writes, commits, then publishes `module` as `<output_dir>/<kind>/<version>/`.

  Refuses to overwrite a published version (TF Serving would not reload it anyway).

  Args:
    module: the module to save (build_module's), with `signatures()`.
    output_dir: the export base directory (TF Serving's model base path's parent).
    kind: the export kind (the subdirectory, and the warm-up's model name).
    version: the positive integer version (TF Serving's directory name).
    provenance: written as assets.extra/realm_provenance.json (with kind, version, time
      and signatures added).
    warmup: requests written as TF Serving's warm-up file (warmup_requests').

  Returns:
    The published directory, `<output_dir>/<kind>/<version>`.

  Raises:
    ValueError: `version` < 1.
    FileExistsError: that version is already published.
  """
  if version < 1:
    raise ValueError(f"version must be a positive integer, got {version} (pass --version)")
  published = os.path.join(output_dir, kind, str(int(version)))
  if tf.io.gfile.exists(os.path.join(published, "saved_model.pb")):
    raise FileExistsError(f"{published} is already published; choose another --version")
  start = time.time()
  with versioned.VersionWriter(os.path.join(output_dir, STAGING, kind), version) as writer:
    tf.saved_model.save(module, writer.path, signatures=module.signatures())
    copy_asset_files(module, writer.path)
    extra = os.path.join(writer.path, serving_warmup.WARMUP_DIR)
    tf.io.gfile.makedirs(extra)
    record = dict(provenance, kind=kind, version=int(version), exported_at=time.time(),
                  signatures=sorted(module.signatures()))
    with tf.io.gfile.GFile(os.path.join(extra, PROVENANCE_FILE), "w") as f:
      json.dump(record, f, indent=2, sort_keys=True, default=str)
    serving_warmup.write_warmup_requests(writer.path, warmup, model_name=kind)
    committed = writer.commit(dict(kind=kind, export_seconds=round(time.time() - start, 3)))
  # Linked where staging and publication share a disk: the export is written once.
  versioned.copy_version(committed, published, manifest_dir=serving_warmup.WARMUP_DIR,
                         link=True)
  # The published copy carries the manifest (verify_copy checks it): the staged original
  # is no longer needed. A crash before this line leaves it for a re-run to copy again.
  versioned.delete_version(os.path.join(output_dir, STAGING, kind), committed)
  logging.info("Published %s (%.1f s)", published, time.time() - start)
  return published


def copy_asset_files(module: tf.Module, saved_model_dir: str) -> int:
  """Copies the files a module keeps outside its tracked objects (a QA export's text store
  chunks: `asset_files`) into `<saved_model_dir>/assets/`; returns how many. A hard link
  where the file system allows it: at Wikipedia scale the chunks are gigabytes."""
  names = list(getattr(module, "asset_files", ()))
  assets = os.path.join(saved_model_dir, "assets")
  tf.io.gfile.makedirs(assets)
  for source in names:
    target = os.path.join(assets, os.path.basename(source))
    try:
      os.link(source, target)
    except OSError:  # another device, or an object store: a copy
      tf.io.gfile.copy(source, target, overwrite=True)
  return len(names)


def read_provenance(export_dir: str) -> dict:
  """An export's assets.extra/realm_provenance.json (see ServingRun.provenance)."""
  with tf.io.gfile.GFile(os.path.join(export_dir, serving_warmup.WARMUP_DIR,
                                      PROVENANCE_FILE)) as f:
    return json.load(f)


def export_run(model_dir: str, output_dir: str, kinds: Sequence[str] = KINDS,
               checkpoint: str = "", version: Optional[int] = None, blocks: str = "",
               index_dir: str = "",
               max_blocks_per_pass: int = MAX_BLOCKS_PER_PASS,
               reader_length_step: int = READER_LENGTH_STEP,
               searches: Sequence[Search] = (),
               reader_xla: bool = READER_XLA) -> dict[str, str]:
  """`python -m realm_tf.export`: loads a run once and publishes each export kind.

  Args:
    model_dir: the Open-QA run's directory.
    output_dir: the export base directory.
    kinds: the kinds to export (KINDS).
    checkpoint: a checkpoint instead of the run's newest.
    version: the export version (default: the checkpoint's training step).
    blocks: another corpus to serve (with `index_dir`; see load_run).
    index_dir: the committed index of `blocks`.
    max_blocks_per_pass: QA kinds: blocks per reader pass at most (QAModule).
    reader_length_step: QA kinds: the reader-length step (QAModule).
    searches: how the QA kinds search, at most one per kind (an assembly.ExactSearch for
      realm_qa, a ScannSearch for realm_qa_scann); a kind without one searches as
      DEFAULT_SEARCHES says.
    reader_xla: QA kinds: the reader's pass XLA-compiled (QAModule).

  Returns:
    Kind → published directory.

  Raises:
    ValueError: an unknown kind or two searches for one kind (before anything is
      loaded), or as load_run and save_export raise.
  """
  unknown = [k for k in kinds if k not in KINDS]
  if unknown:
    raise ValueError(f"unknown export kinds {unknown}; kinds are {', '.join(KINDS)}")
  chosen = {}
  for search in searches:
    if search.kind in chosen:
      raise ValueError(f"two searches for {search.kind}: {chosen[search.kind]!r} and "
                       f"{search!r}")
    chosen[search.kind] = search
  run = load_run(model_dir, checkpoint, blocks, index_dir)
  version = run.step if version is None else version
  searches_of = {kind: chosen.get(kind, DEFAULT_SEARCHES.get(kind)) for kind in kinds}
  published = {}
  for i, kind in enumerate(kinds):
    provenance = run.provenance(kind)
    search = searches_of[kind]
    if search is not None:
      provenance.update(max_blocks_per_pass=max_blocks_per_pass,
                        reader_length_step=reader_length_step, reader_xla=reader_xla,
                        **search.describe())
    module = build_module(run, kind, max_blocks_per_pass, reader_length_step, search,
                          reader_xla, release_index=releases_index(search, [
                              searches_of[k] for k in kinds[i + 1:]]))
    published[kind] = save_export(module, output_dir, kind, version, provenance,
                                  warmup_requests(kind, run))
    del module  # not held beside the next kind's (an exact module holds the index's table)
  return published


def releases_index(search: Optional[Search], later: Sequence[Optional[Search]]) -> bool:
  """Whether the QA module of `search` gives up the run's index embeddings once it has
  its own (served_qa_module's release_index): when no later kind of the same export run
  is a QA kind and it does not serve the index's own float32 table. Why: at 13.35M blocks
  that table is 6.4 GiB, held to the end of a ScaNN export beside the module's float16
  copy and ScaNN states (benchmarks/results/released_scale.md: the export's memory)."""
  if search is None or any(s is not None for s in later):
    return False
  if isinstance(search, ScannSearch):
    return True
  return search.embedding_dtype != "float32"


__all__ = ["DEFAULT_SEARCHES", "KINDS", "MAX_BLOCKS_PER_PASS", "READER_LENGTH_STEP", "READER_XLA",
           "ServingRun", "build_module", "build_run", "export_run", "load_run",
           "read_provenance", "releases_index", "save_export", "warmup_requests"]
