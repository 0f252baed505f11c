"""The REALM authors' released models as a realm_tf run (`python -m realm_tf.import_released`,
whose flags are in __main__.py).

With --orqa_model (orqa_nq_model_from_realm, orqa_wq_model_from_realm): an Open-QA run
(task realm/openqa) that `realm_tf.evaluate` and `realm_tf.export` take as it is; its query
tower and reader come from the fine-tuned checkpoint, its document tower from --embedder
(the tower that computed the released block embeddings). Without it: a REALM pre-training
run (task realm/pretrain) of --embedder (both towers) and --bert (the knowledge-augmented
encoder with its MLM head), which `realm_tf.train --experiment realm/openqa` starts from
with task.openqa.init_from=realm and task.openqa.init_checkpoint=<output_dir>.

Written under --output_dir:
  params.yaml              the run's config (sizes read from the checkpoints), written last
  checkpoints/ckpt-<step>  tf.train.Checkpoint(model=..., global_step=...)
  released.yaml            its model and index sections alone, for new runs of any stage:
                           `realm_tf.train --experiment realm/openqa --config
                           <output_dir>/released.yaml` (params.yaml names its own task)
  vocab.txt                the modules' WordPiece vocabulary
  block_texts/             the released blocks and titles as a block text store (row =
                           record number = the row of the released block_emb), what
                           evaluation, export and serving read
  blocks/blocks-*          the same as block records (block id = record number), for
                           training or re-embedding; --noblock_records skips them
  index/                   block_emb as a committed index version (realm_tf.io.versioned),
                           not re-embedded
Inputs are read through tf.io.gfile (local paths or gs://), 13M records and the 6.8 GB
block_emb a slice at a time, with a progress line every few seconds. Every released tensor
is loaded or skipped by a named rule (realm_tf.pretrained.released); anything else stops
the import with one line naming the tensor, before anything is written.
"""
import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Sequence
from typing import Optional

import numpy as np
import tensorflow as tf
import yaml

from realm_tf.configs import experiments, load_config
from realm_tf.corpus import schema
from realm_tf.data import block_texts
from realm_tf.io import layout, versioned
from realm_tf.modeling import factory
from realm_tf.modeling.models.openqa import OpenQAModel
from realm_tf.pretrained import released
from realm_tf.retrieval.index_export import ShardData, load_shard_array, write_export
from realm_tf.text.tokenization import Tokenizer
from realm_tf.training.train_lib import save_params

BLOCK_EMB = "block_emb"
# The authors' Open-QA settings (orqa_experiment.py's flag defaults; REALM section 4.4),
# used where the model directory has no params.json.
QUERY_SEQ_LENGTH = 64
BLOCK_SEQ_LENGTH = 288
READER_SEQ_LENGTH = 288 + 32
READER_BEAM = 5
MAX_SPAN_WIDTH = 10
PARAMS_FILE = "params.json"


@dataclasses.dataclass(frozen=True)
class OrqaSettings:
  """The Open-QA model's sequence lengths and beams, as its params.json gives them.

  ORQA's experiment writes every flag to <model_dir>/params.json (language/common/utils/
  experiment_utils.py), and the authors' predictor reads them back from there.
  """
  query_seq_length: int = QUERY_SEQ_LENGTH
  block_seq_length: int = BLOCK_SEQ_LENGTH
  reader_seq_length: int = READER_SEQ_LENGTH
  reader_beam: int = READER_BEAM
  max_span_width: int = MAX_SPAN_WIDTH
  span_hidden_size: int = 0  # 0: not given (the checkpoint's reader/dense gives it)
  num_block_records: int = 0  # 0: not given
  source: str = ""  # the params.json read ('' : the defaults)


def read_orqa_settings(model_dir: str) -> OrqaSettings:
  """The settings in <model_dir>/params.json, the authors' defaults where it has none.

  Args:
    model_dir: the released Open-QA model's directory ('' or a checkpoint prefix: defaults).
  Returns:
    The OrqaSettings.
  Raises:
    ValueError: params.json is not a JSON object of integer settings.
  """
  path = os.path.join(model_dir, PARAMS_FILE) if model_dir else ""
  if not path or not tf.io.gfile.exists(path):
    return OrqaSettings()
  with tf.io.gfile.GFile(path) as f:
    try:
      params = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}: not JSON ({e})") from e
  if not isinstance(params, dict):
    raise ValueError(f"{path}: not a JSON object")
  names = dict(query_seq_length="query_seq_len", block_seq_length="block_seq_len",
               reader_seq_length="reader_seq_len", reader_beam="reader_beam_size",
               max_span_width="max_span_width", span_hidden_size="span_hidden_size",
               num_block_records="num_block_records")
  values = {}
  for field, key in names.items():
    if key in params:
      if not isinstance(params[key], int) or params[key] < 1:
        raise ValueError(f"{path}: {key} must be a positive integer, got {params[key]!r}")
      values[field] = params[key]
  return OrqaSettings(**values, source=path)
# Questions per evaluation batch: the authors read one question at a time; 16 questions x
# 5 blocks x 320 wordpieces keep BERT-base's activations near 1 GB on a CPU host (the
# experiment's 512 would want tens of GB).
EVAL_BATCH = 16
PROGRESS_SECONDS = 10.0
READ_BATCH = 4096


class Progress:
  """One log line every PROGRESS_SECONDS: done / total, rate and time left."""

  def __init__(self, what: str, total: int):
    self.what, self.total = what, total
    self.start = self.last = time.time()

  def update(self, done: int, force: bool = False):
    now = time.time()
    if not force and now - self.last < PROGRESS_SECONDS:
      return
    self.last = now
    rate = done / max(now - self.start, 1e-9)
    left = (self.total - done) / rate if rate > 0 else float("inf")
    logging.info("%s: %d / %d (%.1f%%), %.0f/s, %.0f s left", self.what, done, self.total,
                 100.0 * done / max(self.total, 1), rate, left)


@dataclasses.dataclass(frozen=True)
class ReleasedFiles:
  """Where the released files are (see the module docstring)."""
  embedder: str
  blocks: str
  titles: str
  orqa_model: str = ""
  bert: str = ""
  block_emb: str = ""

  @property
  def embedder_variables(self) -> str:
    return os.path.join(self.embedder, "variables", "variables")

  @property
  def bert_variables(self) -> str:
    return os.path.join(self.bert, "variables", "variables")

  @property
  def vocab_file(self) -> str:
    return os.path.join(self.embedder, "assets", "vocab.txt")

  @property
  def block_emb_checkpoint(self) -> str:
    return self.block_emb or os.path.join(self.embedder, "encoded", "encoded.ckpt")


def orqa_checkpoint(path: str) -> str:
  """The checkpoint of a released Open-QA model, found as the authors' code finds it.

  The release's model directory holds the exporter's copy of the best checkpoint:
  language/common/utils/exporters.py (BestSavedModelAndCheckpointExporter) copies the
  files `model.ckpt-N.*` alone into export/best_default/checkpoint/, with no TF
  `checkpoint` state file, and ORQA's predictor globs `*.index` there. So a state file is
  not needed (tf.train.latest_checkpoint would find nothing); the highest step wins.

  Args:
    path: the model directory (orqa_nq_model_from_realm) or a checkpoint prefix.
  Returns:
    `path` if it is a checkpoint prefix, else the newest `model.ckpt-N` in
    <path>/export/best_default/checkpoint, else in <path> (a training directory).
  Raises:
    FileNotFoundError: there is none.
  """
  if tf.io.gfile.exists(path + ".index"):
    return path
  for directory in (os.path.join(path, "export", "best_default", "checkpoint"), path):
    if not tf.io.gfile.isdir(directory):
      continue
    steps = {}
    for name in tf.io.gfile.glob(os.path.join(directory, "*.index")):
      prefix = name[:-len(".index")]
      match = re.search(r"-(\d+)$", prefix)
      steps[int(match.group(1)) if match else -1] = prefix
    if steps:
      return steps[max(steps)]
  raise FileNotFoundError(f"{path}: no Open-QA checkpoint (looked for "
                          f"export/best_default/checkpoint/*.index and {path}/*.index)")


def released_config(kind: str, dims, num_heads: int, projection_size: int,
                    layer_norm_epsilon: Optional[float], span_hidden: int, output_dir: str,
                    index_shards: int, step: int, block_records: bool = True,
                    settings: OrqaSettings = OrqaSettings()):
  """The imported run's config: the registered experiment of `kind` with the released
  models' sizes and the authors' sequence lengths and beams.

  Args:
    kind: 'openqa' (realm/openqa) or 'pretrain' (realm/pretrain).
    dims: the BERTs' sizes (released.BertDims).
    num_heads: attention heads.
    projection_size: the retriever's embedding width (128 in the release).
    layer_norm_epsilon: the projection's LayerNorm epsilon, None for none.
    span_hidden: the reader's span hidden size.
    output_dir: the run directory (the vocabulary, block text store and blocks are named
      under it).
    index_shards: index.num_shards.
    step: the checkpoint's step (an Open-QA run is complete at it).
    block_records: the import writes block records (index.blocks); else index.blocks is
      empty and only the text store names the corpus.
    settings: the Open-QA model's lengths and beams (its params.json).
  Returns:
    A validated ExperimentConfig.
  """
  name = experiments.OPENQA if kind == "openqa" else experiments.PRETRAIN
  config = experiments.experiment_config(name)
  config = config.replace(model=dict(
      encoder=dict(vocab_size=dims.vocab_size, hidden_size=dims.hidden_size,
                   num_layers=dims.num_layers, num_attention_heads=num_heads,
                   intermediate_size=dims.intermediate_size,
                   max_position_embeddings=dims.max_position_embeddings,
                   type_vocab_size=dims.type_vocab_size,
                   # Google's BERT (and so the released modules) uses the tanh form.
                   hidden_activation="gelu_approximate"),
      warm_start=dict(source="", path=""),
      tokenizer=dict(vocab_file=os.path.join(output_dir, "vocab.txt"), lower_case=True),
      retriever=dict(projection="dense", projection_size=projection_size, normalize=False,
                     pooling="pooled", share_towers=False,
                     projection_layer_norm=layer_norm_epsilon is not None,
                     projection_layer_norm_epsilon=layer_norm_epsilon or 1e-3,
                     query_seq_length=settings.query_seq_length,
                     block_seq_length=settings.block_seq_length),
      reader=dict(seq_length=max(settings.reader_seq_length,
                                 settings.query_seq_length + settings.block_seq_length),
                  max_span_width=settings.max_span_width, span_hidden_size=span_hidden)),
      index=dict(blocks=os.path.join(output_dir, "blocks") if block_records else "",
                 text_store=os.path.join(output_dir, "block_texts"), backend="exact",
                 num_shards=index_shards, index_dir=""))
  if kind == "openqa":
    # The whole model is in the checkpoint; `init_from` only matters to a new run.
    config = config.replace(task=dict(openqa=dict(
        init_from="warm_start", init_checkpoint="",
        query_seq_length=settings.query_seq_length,
        reader_seq_length=settings.reader_seq_length, num_candidates=settings.reader_beam,
        loss="orqa",
        validation_data=dict(global_batch_size=EVAL_BATCH))),
        trainer=dict(train_steps=max(step, 1)))
  config.validate()
  return config


def build_model(config, kind: str, vocab_file: str = ""):
  """The realm_tf model the released tensors fill, built (random init).

  Args:
    config: the run's config (released_config or the run's params.yaml).
    kind: 'openqa' (OpenQAModel) or 'pretrain' (RealmPretrainer).
    vocab_file: the vocabulary giving the reader's [SEP] id (default the config's).
  Returns:
    The model, every variable created.
  """
  if kind == "pretrain":
    return factory.build_realm_pretrainer(config)
  o = config.task.openqa
  tokenizer = Tokenizer(vocab_file or config.model.tokenizer.vocab_file,
                        config.model.tokenizer.lower_case)
  return OpenQAModel(factory.build_reader(config), factory.build_retriever(config),
                     reader_seq_length=o.reader_seq_length, sep_id=tokenizer.sep_id,
                     answer_logits=o.loss, name="openqa_model")


def load_released_weights(model, kind: str, files: ReleasedFiles, dims, orqa_prefix: str):
  """Fills every variable of `model` from the released checkpoints.

  Every checkpoint's plan is checked whole (released.LoadPlan.check) before any variable
  is assigned.

  Args:
    model: build_model's model of `kind`.
    kind: 'openqa' or 'pretrain'.
    files: the released files.
    dims: the BERTs' sizes.
    orqa_prefix: the Open-QA checkpoint ('openqa' only).
  Returns:
    {checkpoint prefix: {'loaded': n, 'skipped': m}}.
  Raises:
    ReleasedFormatError: an unknown, missing or mis-shaped tensor (one line).
  """
  retriever = model.retriever
  embedder = released.ReleasedCheckpoint.load(files.embedder_variables)
  plans = {files.embedder_variables: released.LoadPlan(embedder)}
  released.plan_embedder(plans[files.embedder_variables], retriever.document_embedder, dims)
  if kind == "openqa":
    orqa = released.ReleasedCheckpoint.load(orqa_prefix)
    plan = plans[orqa_prefix] = released.LoadPlan(orqa)
    released.plan_embedder(plan, retriever.query_embedder, dims, exclude=released.READER_SCOPE)
    released.plan_reader(plan, model.reader, dims)
  else:
    # REALM's pre-training exports one embedder module; both towers start from it.
    released.plan_embedder(plans[files.embedder_variables], retriever.query_embedder, dims)
    bert = released.ReleasedCheckpoint.load(files.bert_variables)
    plan = plans[files.bert_variables] = released.LoadPlan(bert)
    kae = model.knowledge_augmented_encoder
    released.plan_bert(plan, kae.encoder, bert.one_bert(), dims, masked_lm=kae.masked_lm)
  for plan in plans.values():
    plan.check()
  return {path: plan.apply() for path, plan in plans.items()}


def save_checkpoint(model, output_dir: str, step: int) -> str:
  """Saves <output_dir>/checkpoints/ckpt-<step> as the trainer lays it out (model and
  global_step), so evaluation's restore_model and Open-QA's init_from read it.

  Args:
    model: the filled model.
    output_dir: the run directory.
    step: the global step to record.
  Returns:
    The checkpoint prefix.
  """
  global_step = tf.Variable(step, dtype=tf.int64, trainable=False)
  checkpoint = tf.train.Checkpoint(model=model, global_step=global_step)
  # CheckpointManager names the checkpoint in its state file last (atomically).
  manager = tf.train.CheckpointManager(checkpoint, layout.checkpoint_dir(output_dir),
                                       max_to_keep=1, step_counter=global_step)
  return manager.save(checkpoint_number=step)


def copy_vocab(files: ReleasedFiles, output_dir: str) -> str:
  """Copies the embedder module's assets/vocab.txt to <output_dir>/vocab.txt (through a
  temporary name); returns the copy's path."""
  path = os.path.join(output_dir, "vocab.txt")
  if not tf.io.gfile.exists(files.vocab_file):
    raise FileNotFoundError(f"{files.vocab_file}: the embedder module has no vocabulary")
  tmp = path + ".tmp"
  tf.io.gfile.copy(files.vocab_file, tmp, overwrite=True)
  tf.io.gfile.rename(tmp, path, overwrite=True)
  return path


START_CONFIG = "released.yaml"


def write_start_config(config, output_dir: str) -> str:
  """<output_dir>/released.yaml: the run's model section (the released sizes, the
  projection's LayerNorm, the vocabulary) and its index (the released blocks and
  block_emb), without a task, so any stage's experiment takes it as a --config file (a
  params.yaml names its task, which another experiment refuses). A fine-tuning that keeps
  the index fixed, as the authors' did, searches the imported block_emb directly.

  Args:
    config: the run's config.
    output_dir: the run directory.
  Returns:
    The file's path.
  """
  path = os.path.join(output_dir, START_CONFIG)
  tree = dict(model=config.model.as_dict(),
              index=dict(blocks=config.index.blocks, text_store=config.index.text_store,
                         num_shards=config.index.num_shards,
                         index_dir=layout.index_dir(output_dir)))
  with tf.io.gfile.GFile(path + ".tmp", "w") as f:
    f.write("# The released REALM model and corpus imported by realm_tf.import_released, for\n"
            "# new runs: --config " + path + "\n")
    yaml.safe_dump(tree, f, sort_keys=True)
  tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
  return path


def title_uid(title: bytes) -> str:
  """The released blocks carry no document text: blocks of one article share its title,
  which stands in for realm_tf's document uid (what "no trivial retrievals" compares)."""
  return hashlib.sha256(title).hexdigest()[:32]


def convert_corpus(blocks: str, titles: str, text_store: str, expected: int,
                   corpus_dir: str = "", records_per_file: int = 1_000_000) -> int:
  """Reads blocks.tfr + titles.tfr once into the run's block text store (block id =
  record number) and, with `corpus_dir`, block records too.

  The text store is what evaluation, the exports and the server read (realm_tf.data.
  block_texts: compressed, committed by its manifest once whole). Block records are for
  training and re-embedding (index.blocks): at 13.35M blocks they are about the size of
  blocks.tfr again, so they are written only when asked for. Each block records file is
  written under a hidden temporary name and renamed when whole.

  Args:
    blocks: blocks.tfr (one UTF-8 block per record).
    titles: titles.tfr (record i is block i's title).
    text_store: where the block text store goes.
    expected: the number of blocks (block_emb's rows).
    corpus_dir: where block records go ('' : none).
    records_per_file: block records per output file.
  Returns:
    The number of blocks written.
  Raises:
    ValueError: the two files differ in length, a record is not UTF-8, or the count is
      not `expected`.
  """
  num_files = max(1, math.ceil(expected / records_per_file))
  progress = Progress("blocks", expected)
  state = dict(count=0, writer=None, tmp="", final="")

  def close_file():
    if state["writer"] is not None:
      state["writer"].close()
      state["writer"] = None
      tf.io.gfile.rename(state["tmp"], state["final"], overwrite=True)

  def write_record(record: dict):
    count = state["count"]
    if count % records_per_file == 0:
      close_file()
      name = f"blocks-{count // records_per_file:05d}-of-{num_files:05d}.tfrecord"
      state["final"] = os.path.join(corpus_dir, name)
      state["tmp"] = os.path.join(corpus_dir, f".tmp-{name}")
      state["writer"] = tf.io.TFRecordWriter(state["tmp"])
    state["writer"].write(schema.BLOCK.serialize(record))

  def released_blocks():
    block_batches = iter(tf.data.TFRecordDataset(blocks).batch(READ_BATCH))
    title_batches = iter(tf.data.TFRecordDataset(titles).batch(READ_BATCH))
    while True:
      texts, names = next(block_batches, None), next(title_batches, None)
      if texts is None and names is None:
        return
      num_texts = 0 if texts is None else len(texts)
      num_names = 0 if names is None else len(names)
      if num_texts != num_names:
        raise ValueError(f"{blocks} and {titles} differ in length: "
                         f"{state['count'] + num_texts} and {state['count'] + num_names} "
                         f"records read so far")
      if state["count"] + num_texts > expected:
        raise ValueError(f"{blocks}: more than the {expected} rows of {BLOCK_EMB}")
      for text, title in zip(texts.numpy(), names.numpy()):
        # A bad record is refused, not set aside: every block id is a row of block_emb,
        # and the index must cover exactly the blocks the store holds.
        try:
          text_str, title_str = text.decode("utf-8"), title.decode("utf-8")
        except UnicodeDecodeError as e:
          raise ValueError(f"{blocks} / {titles}: record {state['count']} is not UTF-8 "
                           f"({e})") from e
        if corpus_dir:
          write_record(dict(block_id=state["count"], doc_uid=title_uid(title),
                            title=title_str, text=text_str))
        yield state["count"], title, text
        state["count"] += 1
      progress.update(state["count"])

  if corpus_dir:
    tf.io.gfile.makedirs(corpus_dir)
  try:
    try:
      block_texts.write_block_texts(text_store, released_blocks(), expected)
    except ValueError as e:
      if "announced" in str(e) and state["count"] < expected:  # fewer records than rows
        raise ValueError(f"{blocks}: {state['count']} blocks, but {BLOCK_EMB} has "
                         f"{expected} rows") from None
      raise
    close_file()
  finally:
    if state["writer"] is not None:
      state["writer"].close()
  progress.update(state["count"], force=True)
  return state["count"]


class BlockEmbShards(Sequence):
  """block_emb [N, P] as index shards of consecutive rows, each read when asked for (a
  lazy sequence, so write_export's one commit protocol writes them one at a time)."""

  def __init__(self, prefix: str, shape: tuple[int, int], num_shards: int):
    self.prefix, self.shape = prefix, shape
    self.bounds = [round(i * shape[0] / num_shards) for i in range(num_shards + 1)]
    self.progress = Progress("block_emb", shape[0])

  def __len__(self) -> int:
    return len(self.bounds) - 1

  def __getitem__(self, i: int):
    if not 0 <= i < len(self):
      raise IndexError(i)
    start, end = self.bounds[i], self.bounds[i + 1]
    rows = released.read_rows(self.prefix, BLOCK_EMB, self.shape, start, end - start)
    self.progress.update(end, force=True)
    return ShardData(rows, np.arange(start, end, dtype=np.int64))


def publish_block_emb(prefix: str, shape: tuple[int, int], index_dir: str, version: int,
                      num_shards: int, build_scann: bool) -> str:
  """Publishes block_emb as a committed index version, a shard at a time (write_export,
  the one commit protocol). Its document tower is the run's, at the run's step, so the
  index is not stale.

  Args:
    prefix: the checkpoint holding block_emb.
    shape: block_emb's shape [N, P].
    index_dir: the run's index directory.
    version: the version (the run's step).
    num_shards: shards of consecutive rows.
    build_scann: also build a ScaNN searcher per shard.
  Returns:
    The committed version's directory.
  """
  shards = BlockEmbShards(prefix, shape, min(num_shards, shape[0]))
  return write_export(index_dir, version, shards, build_scann=build_scann,
                      extra=dict(encoder=dict(step=version),
                                 source=dict(checkpoint=prefix, tensor=BLOCK_EMB)))


# The release's own check: block_emb was computed by the embedder module, so the imported
# document tower must reproduce its rows. Compared by relative L2 error, not cosine alone:
# a wrong LayerNorm epsilon mostly rescales a row (the retrieval scores change, its cosine
# hardly does). The same float32 computation agrees to ~1e-6 (1.4e-6 on the test
# release); a wrong epsilon or GELU form was off by 5e-4 to 9e-4 there, so a match is
# 1e-4. An import keeps the variant that reproduces block_emb best and refuses only when
# even that one is off by more than BLOCK_EMB_REFUSE: then the files do not belong
# together.
BLOCK_EMB_RELATIVE_ERROR = 1e-4
BLOCK_EMB_COSINE = 0.999
BLOCK_EMB_REFUSE = 1e-2
# (projection LayerNorm epsilon, activation) variants tried when the run's own does not
# reproduce block_emb: the two epsilons the released names allow (tf.contrib's layer_norm,
# 1e-12; Keras' LayerNormalization, 1e-3) and BERT's two GELU forms.
TOWER_VARIANTS = ((1e-12, "gelu_approximate"), (1e-3, "gelu_approximate"),
                  (1e-12, "gelu"), (1e-3, "gelu"))
CHECK_BATCH = 16


def _sample_rows(num_blocks: int, rows: int) -> np.ndarray:
  """`rows` row numbers spread evenly over the corpus (first and last included)."""
  return np.unique(np.linspace(0, num_blocks - 1, min(rows, num_blocks)).round().astype(np.int64))


def _index_rows(index_dir: str, picks: np.ndarray) -> np.ndarray:
  """[len(picks), P] float32: the committed index's embeddings of rows `picks` (block id =
  row, as the import publishes block_emb), each shard read once, checked as read."""
  export = versioned.latest_version(index_dir)
  if export is None:
    raise FileNotFoundError(f"{index_dir}: no committed index")
  shards = export.manifest["shards"]
  out = np.zeros([len(picks), int(export.manifest.get("dimension") or shards[0]["dimension"])],
                 np.float32)
  found = np.zeros([len(picks)], bool)
  for info in shards:
    if not info["num_blocks"]:
      continue
    ids = load_shard_array(export, info["shard"], len(shards), "block_ids.npy")
    where = np.searchsorted(ids, picks)
    inside = (where < len(ids)) & (ids[np.minimum(where, len(ids) - 1)] == picks)
    if inside.any():
      vectors = load_shard_array(export, info["shard"], len(shards), "embeddings.npy")
      out[inside] = vectors[where[inside]]
      found |= inside
  if not found.all():
    raise ValueError(f"{export.path}: rows {picks[~found][:5].tolist()} are not in the index")
  return out


def check_block_emb(run_dir: str, rows: int = 300, config=None,
                    all_variants: bool = False) -> dict:
  """Re-embeds `rows` of the run's blocks with its document tower and compares them with
  the index's rows (the released block_emb): the release's own check of the tower.

  The run's config is tried first; when it does not match (relative L2 error within
  BLOCK_EMB_RELATIVE_ERROR and cosine at least BLOCK_EMB_COSINE on every row; or with
  `all_variants`), every TOWER_VARIANTS variant is tried too, so the result says which
  LayerNorm epsilon and GELU form reproduce block_emb.

  Args:
    run_dir: an imported run (its checkpoint, block text store and index written).
    rows: blocks to re-embed, spread over the corpus.
    config: the run's config (default its params.yaml).
    all_variants: try every variant even when the run's own matches.
  Returns:
    {rows, max_relative_error, min_cosine (the thresholds), run: {epsilon, activation,
    min_cosine, mean_cosine, max_relative_error, matches}, variants: [the same per variant
    tried], best: the variant with the smallest error}.
  """
  config = config or load_config(layout.params_path(run_dir))
  store = block_texts.HostBlockTexts(config.index.text_store)
  picks = _sample_rows(len(store), rows)
  want = _index_rows(layout.index_dir(run_dir, config.index.index_dir), picks)
  want_norms = np.maximum(np.linalg.norm(want, axis=1), 1e-12)
  tokenizer = Tokenizer(config.model.tokenizer.vocab_file, config.model.tokenizer.lower_case)
  inputs = tokenizer.encode(tf.constant([store.titles[int(r)] for r in picks]),
                            config.model.retriever.block_seq_length,
                            pair_texts=tf.constant([store.texts[int(r)] for r in picks])).as_dict()
  checkpoint = layout.latest_checkpoint(run_dir)
  kind = "openqa" if config.task.type == "openqa" else "pretrain"

  def measure(epsilon: float, activation: str) -> dict:
    variant = config.replace(model=dict(
        encoder=dict(hidden_activation=activation),
        retriever=dict(projection_layer_norm_epsilon=epsilon)))
    model = build_model(variant, kind)
    tf.train.Checkpoint(model=model).read(checkpoint).expect_partial()
    got = np.concatenate([
        model.retriever.embed_documents({k: v[i:i + CHECK_BATCH] for k, v in inputs.items()}
                                        ).numpy()
        for i in range(0, len(picks), CHECK_BATCH)])
    error = np.linalg.norm(got - want, axis=1) / want_norms
    cosine = np.sum(got * want, axis=1) / (
        np.maximum(np.linalg.norm(got, axis=1), 1e-12) * want_norms)
    return dict(epsilon=epsilon, activation=activation,
                min_cosine=round(float(cosine.min()), 7),
                mean_cosine=round(float(cosine.mean()), 7),
                max_relative_error=float(f"{error.max():.3g}"),
                matches=bool(error.max() <= BLOCK_EMB_RELATIVE_ERROR
                             and cosine.min() >= BLOCK_EMB_COSINE))

  own = (config.model.retriever.projection_layer_norm_epsilon
         if config.model.retriever.projection_layer_norm else 0.0,
         config.model.encoder.hidden_activation)
  result = dict(rows=int(len(picks)), max_relative_error=BLOCK_EMB_RELATIVE_ERROR,
                min_cosine=BLOCK_EMB_COSINE, run=measure(*own))
  tried = [result["run"]]
  if all_variants or not result["run"]["matches"]:
    for variant in TOWER_VARIANTS:
      if variant != own and config.model.retriever.projection_layer_norm:
        tried.append(measure(*variant))
  result["variants"] = tried
  result["best"] = min(tried, key=lambda v: v["max_relative_error"])
  logging.info("block_emb check over %d blocks: %s", len(picks), result["best"])
  return result


def import_released(files: ReleasedFiles, output_dir: str, num_attention_heads: int = 0,
                    index_shards: int = 16, records_per_file: int = 1_000_000,
                    build_scann: bool = False, block_records: bool = True,
                    check_block_emb_rows: int = 0) -> dict:
  """Imports the released files (see the module docstring) into run `output_dir`.

  Args:
    files: where the released modules, checkpoint, blocks and titles are.
    output_dir: the run directory to write (local or gs://).
    num_attention_heads: 0 for hidden size / 64.
    index_shards: shards of the published index.
    records_per_file: block records per blocks-* file.
    build_scann: build a ScaNN searcher per index shard too.
    block_records: also write the blocks as block records (for training or re-embedding;
      evaluation, export and serving read the text store alone). A pre-training import
      always writes them.
    check_block_emb_rows: re-embed this many blocks and compare with block_emb
      (check_block_emb) before the run is committed; a variant of the tower that
      reproduces block_emb where the names' defaults do not is used instead; 0 skips.

  Returns:
    What was written: kind, step, checkpoint, blocks, text store, index, per-checkpoint
    counts of tensors loaded and skipped.
  """
  kind = "openqa" if files.orqa_model else "pretrain"
  if kind == "pretrain" and not files.bert:
    raise ValueError("without --orqa_model, --bert (cc_news_pretrained/bert) is needed for "
                     "the knowledge-augmented encoder")
  if tf.io.gfile.exists(layout.params_path(output_dir)):
    raise FileExistsError(f"{output_dir} already holds a run (params.yaml); choose another "
                          f"--output_dir")
  start = time.time()
  embedder = released.ReleasedCheckpoint.load(files.embedder_variables)
  dims = embedder.bert_dims(embedder.one_bert())
  heads = num_attention_heads or max(1, dims.hidden_size // released.BERT_HEAD_SIZE)
  projection, norm = released.find_embedder_head(embedder)
  projection_size = embedder.shapes[projection + "kernel"][-1]
  orqa_prefix, span_hidden, step = "", 256, 0
  settings = OrqaSettings()
  if kind == "openqa":
    orqa_prefix = orqa_checkpoint(files.orqa_model)
    orqa = released.ReleasedCheckpoint.load(orqa_prefix)
    span_hidden, step = released.span_hidden_size(orqa), released.read_step(orqa)
    settings = read_orqa_settings(files.orqa_model if not tf.io.gfile.exists(
        files.orqa_model + ".index") else "")
    if settings.span_hidden_size and settings.span_hidden_size != span_hidden:
      raise released.ReleasedFormatError(
          f"{settings.source}: span_hidden_size {settings.span_hidden_size}, but "
          f"{orqa_prefix}'s reader/dense gives {span_hidden}")
    logging.info("Open-QA settings: %s", settings)
  block_emb = released.ReleasedCheckpoint.load(files.block_emb_checkpoint)
  shape = block_emb.shapes.get(BLOCK_EMB)
  if shape is None or len(shape) != 2 or shape[1] != projection_size:
    raise released.ReleasedFormatError(
        f"{files.block_emb_checkpoint}: expected tensor '{BLOCK_EMB}' [N, {projection_size}], "
        f"found {list(shape) if shape else 'none'}")
  if settings.num_block_records and settings.num_block_records != shape[0]:
    raise released.ReleasedFormatError(
        f"{settings.source}: num_block_records {settings.num_block_records}, but "
        f"{files.block_emb_checkpoint}'s {BLOCK_EMB} has {shape[0]} rows")
  block_records = block_records or kind == "pretrain"
  config = released_config(kind, dims, heads, projection_size,
                           released.layer_norm_epsilon(norm), span_hidden, output_dir,
                           index_shards, step, block_records, settings)
  model = build_model(config, kind, files.vocab_file)
  counts = load_released_weights(model, kind, files, dims, orqa_prefix)
  logging.info("Released weights loaded: %s", counts)
  # Nothing is written before every released tensor has been accounted for.
  tf.io.gfile.makedirs(output_dir)
  copy_vocab(files, output_dir)
  checkpoint = save_checkpoint(model, output_dir, step)
  num_blocks = convert_corpus(files.blocks, files.titles, config.index.text_store, shape[0],
                              config.index.blocks, records_per_file)
  index = publish_block_emb(files.block_emb_checkpoint, tuple(shape),
                            layout.index_dir(output_dir), step, index_shards, build_scann)
  check = None
  if check_block_emb_rows:
    check = check_block_emb(output_dir, check_block_emb_rows, config)
    best = check["best"]
    if best["max_relative_error"] > BLOCK_EMB_REFUSE:
      raise released.ReleasedFormatError(
          f"the imported document tower does not reproduce {files.block_emb_checkpoint}'s "
          f"{BLOCK_EMB} (best: relative error {best['max_relative_error']}, minimum cosine "
          f"{best['min_cosine']} over {check['rows']} blocks, with LayerNorm epsilon "
          f"{best['epsilon']} and {best['activation']}; at most {BLOCK_EMB_REFUSE} "
          f"accepted): the embedder module and block_emb do not belong together")
    if not best["matches"]:
      logging.warning("block_emb is reproduced only to a relative error of %g (a match is "
                      "%g): %s", best["max_relative_error"], BLOCK_EMB_RELATIVE_ERROR, check)
    if best is not check["run"]:
      logging.warning("block_emb is reproduced with LayerNorm epsilon %g and %s, not the "
                      "names' defaults: the run uses them", best["epsilon"], best["activation"])
      config = config.replace(model=dict(
          encoder=dict(hidden_activation=best["activation"]),
          retriever=dict(projection_layer_norm_epsilon=best["epsilon"])))
  write_start_config(config, output_dir)
  save_params(config, output_dir)  # last: a directory with params.yaml is a whole run
  return dict(kind=kind, step=step, checkpoint=checkpoint, num_blocks=num_blocks,
              blocks=config.index.blocks, text_store=config.index.text_store, index=index,
              tensors=counts, block_emb_check=check,
              seconds=round(time.time() - start, 1))


