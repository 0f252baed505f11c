"""`python -m realm_tf.import_released`: the REALM authors' released models as a realm_tf run.

    python -m realm_tf.import_released --output_dir runs/realm_nq \\
        --embedder gs://realm-data/cc_news_pretrained/embedder \\
        --orqa_model gs://realm-data/orqa_nq_model_from_realm \\
        --blocks gs://orqa-data/enwiki-20181220/blocks.tfr \\
        --titles gs://orqa-data/enwiki-20181220/titles.tfr

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
  blocks/blocks-*          the released blocks and titles as block records, block id =
                           record number (the row of the released block_emb)
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
import time
from collections.abc import Sequence
from typing import Optional

from absl import app, flags

FLAGS = flags.FLAGS


def define_flags():
  """The command line's flags, defined only when it runs as one (so that importing the
  module beside other entry points, as tests do, defines none)."""
  flags.DEFINE_string("output_dir", None, "The run directory to write.", required=True)
  flags.DEFINE_string("embedder", None, "The embedder TF1 Hub module directory "
                      "(cc_news_pretrained/embedder).", required=True)
  flags.DEFINE_string("orqa_model", "", "A fine-tuned Open-QA model: its directory "
                      "(orqa_nq_model_from_realm) or a checkpoint prefix. Empty: import the "
                      "pre-trained REALM (--embedder and --bert).")
  flags.DEFINE_string("bert", "", "The knowledge-augmented encoder's TF1 Hub module directory "
                      "(cc_news_pretrained/bert); needed without --orqa_model.")
  flags.DEFINE_string("blocks", None, "blocks.tfr: one UTF-8 block per record.", required=True)
  flags.DEFINE_string("titles", None, "titles.tfr: record i is block i's title.", required=True)
  flags.DEFINE_string("block_emb", "", "The checkpoint holding block_emb [N, 128] (default: "
                      "<embedder>/encoded/encoded.ckpt).")
  flags.DEFINE_integer("num_attention_heads", 0, "Attention heads (default: hidden size / 64, "
                       "as in every Google BERT).")
  flags.DEFINE_integer("index_shards", 16, "Index shards (16: 0.43 GB of block_emb each).")
  flags.DEFINE_integer("records_per_file", 1_000_000, "Block records per blocks-* file.")
  flags.DEFINE_bool("build_scann", False, "Also build a ScaNN searcher per index shard (for "
                    "index.backend=scann and the realm_qa_scann export).")


BLOCK_EMB = "block_emb"
# The authors' Open-QA settings (orqa_experiment.py flags; REALM section 4.4).
QUERY_SEQ_LENGTH = 64
BLOCK_SEQ_LENGTH = 288
READER_SEQ_LENGTH = 288 + 32
READER_BEAM = 5
MAX_SPAN_WIDTH = 10
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
  """The checkpoint of a released Open-QA model.

  Args:
    path: the model directory (orqa_nq_model_from_realm) or a checkpoint prefix.
  Returns:
    `path` if it is a checkpoint prefix, else the newest checkpoint in
    <path>/export/best_default/checkpoint, else in <path>.
  Raises:
    FileNotFoundError: there is none.
  """
  import tensorflow as tf  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  if tf.io.gfile.exists(path + ".index"):
    return path
  for directory in (os.path.join(path, "export", "best_default", "checkpoint"), path):
    found = tf.train.latest_checkpoint(directory) if tf.io.gfile.isdir(directory) else None
    if found:
      return found
  raise FileNotFoundError(f"{path}: no Open-QA checkpoint (looked for "
                          f"export/best_default/checkpoint/model.ckpt-*)")


def released_config(kind: str, dims, num_heads: int, projection_size: int,
                    layer_norm_epsilon: Optional[float], span_hidden: int, output_dir: str,
                    index_shards: int, step: int):
  """The imported run's config: the registered experiment of `kind` with the released
  models' sizes and the authors' sequence lengths and beams.

  Args:
    kind: 'openqa' (realm/openqa) or 'pretrain' (realm/pretrain).
    dims: the BERTs' sizes (released.BertDims).
    num_heads: attention heads.
    projection_size: the retriever's embedding width (128 in the release).
    layer_norm_epsilon: the projection's LayerNorm epsilon, None for none.
    span_hidden: the reader's span hidden size.
    output_dir: the run directory (the vocabulary and blocks are named under it).
    index_shards: index.num_shards.
    step: the checkpoint's step (an Open-QA run is complete at it).
  Returns:
    A validated ExperimentConfig.
  """
  from realm_tf.configs import experiments  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
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
                     query_seq_length=QUERY_SEQ_LENGTH, block_seq_length=BLOCK_SEQ_LENGTH),
      reader=dict(seq_length=max(READER_SEQ_LENGTH, QUERY_SEQ_LENGTH + BLOCK_SEQ_LENGTH),
                  max_span_width=MAX_SPAN_WIDTH, span_hidden_size=span_hidden)),
      index=dict(blocks=os.path.join(output_dir, "blocks"), backend="exact",
                 num_shards=index_shards, index_dir=""))
  if kind == "openqa":
    # The whole model is in the checkpoint; `init_from` only matters to a new run.
    config = config.replace(task=dict(openqa=dict(
        init_from="warm_start", init_checkpoint="", query_seq_length=QUERY_SEQ_LENGTH,
        reader_seq_length=READER_SEQ_LENGTH, num_candidates=READER_BEAM, loss="orqa",
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
  from realm_tf.modeling import factory  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.modeling.models.openqa import OpenQAModel  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.text.tokenization import Tokenizer  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
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
  from realm_tf.pretrained import released  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
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
  import tensorflow as tf  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads

  from realm_tf.io import layout  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  global_step = tf.Variable(step, dtype=tf.int64, trainable=False)
  checkpoint = tf.train.Checkpoint(model=model, global_step=global_step)
  # CheckpointManager names the checkpoint in its state file last (atomically).
  manager = tf.train.CheckpointManager(checkpoint, layout.checkpoint_dir(output_dir),
                                       max_to_keep=1, step_counter=global_step)
  return manager.save(checkpoint_number=step)


def copy_vocab(files: ReleasedFiles, output_dir: str) -> str:
  """Copies the embedder module's assets/vocab.txt to <output_dir>/vocab.txt (through a
  temporary name); returns the copy's path."""
  import tensorflow as tf  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
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
  import tensorflow as tf  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  import yaml  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads

  from realm_tf.io import layout  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  path = os.path.join(output_dir, START_CONFIG)
  tree = dict(model=config.model.as_dict(),
              index=dict(blocks=config.index.blocks, num_shards=config.index.num_shards,
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


def convert_corpus(blocks: str, titles: str, corpus_dir: str, expected: int,
                   records_per_file: int) -> int:
  """Converts blocks.tfr + titles.tfr into block records (block id = record number).

  Read and written a batch at a time; each <corpus_dir>/blocks-NNNNN-of-MMMMM.tfrecord is
  written under a hidden temporary name and renamed when whole.

  Args:
    blocks: blocks.tfr (one UTF-8 block per record).
    titles: titles.tfr (record i is block i's title).
    corpus_dir: where the block records go.
    expected: the number of blocks (block_emb's rows).
    records_per_file: records per output file.
  Returns:
    The number of blocks written.
  Raises:
    ValueError: the two files differ in length, a record is not UTF-8, or the count is
      not `expected`.
  """
  import tensorflow as tf  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads

  from realm_tf.corpus import schema  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  tf.io.gfile.makedirs(corpus_dir)
  num_files = max(1, math.ceil(expected / records_per_file))
  block_batches = iter(tf.data.TFRecordDataset(blocks).batch(READ_BATCH))
  title_batches = iter(tf.data.TFRecordDataset(titles).batch(READ_BATCH))
  progress = Progress("blocks", expected)
  count, writer, tmp, final = 0, None, "", ""
  try:
    while True:
      texts, names = next(block_batches, None), next(title_batches, None)
      if texts is None and names is None:
        break
      num_texts = 0 if texts is None else len(texts)
      num_names = 0 if names is None else len(names)
      if num_texts != num_names:
        raise ValueError(f"{blocks} and {titles} differ in length: {count + num_texts} "
                         f"and {count + num_names} records read so far")
      for text, title in zip(texts.numpy(), names.numpy()):
        if count % records_per_file == 0:
          if writer is not None:
            writer.close()
            tf.io.gfile.rename(tmp, final, overwrite=True)
          name = f"blocks-{count // records_per_file:05d}-of-{num_files:05d}.tfrecord"
          final = os.path.join(corpus_dir, name)
          tmp = os.path.join(corpus_dir, f".tmp-{name}")
          writer = tf.io.TFRecordWriter(tmp)
        # A bad record is refused, not set aside: every block id is a row of block_emb, and
        # the index must cover exactly the blocks the store holds.
        try:
          record = dict(block_id=count, doc_uid=title_uid(title),
                        title=title.decode("utf-8"), text=text.decode("utf-8"))
        except UnicodeDecodeError as e:
          raise ValueError(f"{blocks} / {titles}: record {count} is not UTF-8 ({e})") from e
        writer.write(schema.BLOCK.serialize(record))
        count += 1
      progress.update(count)
    if writer is not None:
      writer.close()
      writer = None
      tf.io.gfile.rename(tmp, final, overwrite=True)
  finally:
    if writer is not None:
      writer.close()
  progress.update(count, force=True)
  if count != expected:
    raise ValueError(f"{blocks}: {count} blocks, but {BLOCK_EMB} has {expected} rows")
  return count


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
    import numpy as np  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads

    from realm_tf.pretrained import released  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
    from realm_tf.retrieval.index_export import ShardData  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
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
  from realm_tf.retrieval.index_export import write_export  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  shards = BlockEmbShards(prefix, shape, min(num_shards, shape[0]))
  return write_export(index_dir, version, shards, build_scann=build_scann,
                      extra=dict(encoder=dict(step=version),
                                 source=dict(checkpoint=prefix, tensor=BLOCK_EMB)))


def import_released(files: ReleasedFiles, output_dir: str, num_attention_heads: int = 0,
                    index_shards: int = 16, records_per_file: int = 1_000_000,
                    build_scann: bool = False) -> dict:
  """Imports the released files (see the module docstring) into run `output_dir`.

  Args:
    files: where the released modules, checkpoint, blocks and titles are.
    output_dir: the run directory to write (local or gs://).
    num_attention_heads: 0 for hidden size / 64.
    index_shards: shards of the published index.
    records_per_file: block records per blocks-* file.
    build_scann: build a ScaNN searcher per index shard too.

  Returns:
    What was written: kind, step, checkpoint, blocks, index, per-checkpoint counts of
    tensors loaded and skipped.
  """
  import tensorflow as tf  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads

  from realm_tf.io import layout  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.pretrained import released  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.training.train_lib import save_params  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
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
  if kind == "openqa":
    orqa_prefix = orqa_checkpoint(files.orqa_model)
    orqa = released.ReleasedCheckpoint.load(orqa_prefix)
    span_hidden, step = released.span_hidden_size(orqa), released.read_step(orqa)
  block_emb = released.ReleasedCheckpoint.load(files.block_emb_checkpoint)
  shape = block_emb.shapes.get(BLOCK_EMB)
  if shape is None or len(shape) != 2 or shape[1] != projection_size:
    raise released.ReleasedFormatError(
        f"{files.block_emb_checkpoint}: expected tensor '{BLOCK_EMB}' [N, {projection_size}], "
        f"found {list(shape) if shape else 'none'}")
  config = released_config(kind, dims, heads, projection_size,
                           released.layer_norm_epsilon(norm), span_hidden, output_dir,
                           index_shards, step)
  model = build_model(config, kind, files.vocab_file)
  counts = load_released_weights(model, kind, files, dims, orqa_prefix)
  logging.info("Released weights loaded: %s", counts)
  # Nothing is written before every released tensor has been accounted for.
  tf.io.gfile.makedirs(output_dir)
  copy_vocab(files, output_dir)
  checkpoint = save_checkpoint(model, output_dir, step)
  num_blocks = convert_corpus(files.blocks, files.titles, config.index.blocks, shape[0],
                              records_per_file)
  index = publish_block_emb(files.block_emb_checkpoint, tuple(shape),
                            layout.index_dir(output_dir), step, index_shards, build_scann)
  write_start_config(config, output_dir)
  save_params(config, output_dir)  # last: a directory with params.yaml is a whole run
  return dict(kind=kind, step=step, checkpoint=checkpoint, num_blocks=num_blocks,
              blocks=config.index.blocks, index=index, tensors=counts,
              seconds=round(time.time() - start, 1))


def main(argv):
  del argv
  from realm_tf.io import command_line  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  with command_line.errors_reported("realm_tf.import_released",
                                    command_line.debug_requested(FLAGS.verbosity)):
    files = ReleasedFiles(embedder=FLAGS.embedder, blocks=FLAGS.blocks, titles=FLAGS.titles,
                          orqa_model=FLAGS.orqa_model, bert=FLAGS.bert,
                          block_emb=FLAGS.block_emb)
    try:
      result = import_released(files, FLAGS.output_dir, FLAGS.num_attention_heads,
                               FLAGS.index_shards, FLAGS.records_per_file, FLAGS.build_scann)
    except (ValueError, FileExistsError) as e:  # the released files or the arguments
      raise command_line.UsageError(str(e)) from e
  print(json.dumps(result, indent=2, sort_keys=True))


if __name__ == "__main__":
  define_flags()
  logging.getLogger().setLevel(logging.INFO)
  app.run(main)
