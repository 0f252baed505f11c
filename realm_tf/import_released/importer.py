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
import logging
import time

import tensorflow as tf

from realm_tf.import_released import block_emb, corpus, release, run_config, weights
from realm_tf.import_released.release import BLOCK_EMB, ReleasedFiles
from realm_tf.import_released.tower_check import check_block_emb, tower_that_reproduces
from realm_tf.io import layout
from realm_tf.pretrained import released
from realm_tf.training.train_lib import save_params


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
  settings = release.OrqaSettings()
  if kind == "openqa":
    orqa_prefix = release.orqa_checkpoint(files.orqa_model)
    orqa = released.ReleasedCheckpoint.load(orqa_prefix)
    span_hidden, step = released.span_hidden_size(orqa), released.read_step(orqa)
    settings = release.read_orqa_settings(files.orqa_model if not tf.io.gfile.exists(
        files.orqa_model + ".index") else "")
    if settings.span_hidden_size and settings.span_hidden_size != span_hidden:
      raise released.ReleasedFormatError(
          f"{settings.source}: span_hidden_size {settings.span_hidden_size}, but "
          f"{orqa_prefix}'s reader/dense gives {span_hidden}")
    logging.info("Open-QA settings: %s", settings)
  shape = released.ReleasedCheckpoint.load(files.block_emb_checkpoint).shapes.get(BLOCK_EMB)
  if shape is None or len(shape) != 2 or shape[1] != projection_size:
    raise released.ReleasedFormatError(
        f"{files.block_emb_checkpoint}: expected tensor '{BLOCK_EMB}' [N, {projection_size}], "
        f"found {list(shape) if shape else 'none'}")
  if settings.num_block_records and settings.num_block_records != shape[0]:
    raise released.ReleasedFormatError(
        f"{settings.source}: num_block_records {settings.num_block_records}, but "
        f"{files.block_emb_checkpoint}'s {BLOCK_EMB} has {shape[0]} rows")
  block_records = block_records or kind == "pretrain"
  config = run_config.released_config(kind, dims, heads, projection_size,
                                      released.layer_norm_epsilon(norm), span_hidden,
                                      output_dir, index_shards, step, block_records, settings)
  model = weights.build_model(config, kind, files.vocab_file)
  counts = weights.load_released_weights(model, kind, files, dims, orqa_prefix)
  logging.info("Released weights loaded: %s", counts)
  # Nothing is written before every released tensor has been accounted for.
  tf.io.gfile.makedirs(output_dir)
  weights.copy_vocab(files, output_dir)
  checkpoint = weights.save_checkpoint(model, output_dir, step)
  num_blocks = corpus.convert_corpus(files.blocks, files.titles, config.index.text_store,
                                     shape[0], config.index.blocks, records_per_file)
  index = block_emb.publish_block_emb(files.block_emb_checkpoint, tuple(shape),
                                      layout.index_dir(output_dir), step, index_shards,
                                      build_scann)
  check = None
  if check_block_emb_rows:
    check = check_block_emb(output_dir, check_block_emb_rows, config)
    config = tower_that_reproduces(config, check, files.block_emb_checkpoint)
  run_config.write_start_config(config, output_dir)
  save_params(config, output_dir)  # last: a directory with params.yaml is a whole run
  return dict(kind=kind, step=step, checkpoint=checkpoint, num_blocks=num_blocks,
              blocks=config.index.blocks, text_store=config.index.text_store, index=index,
              tensors=counts, block_emb_check=check,
              seconds=round(time.time() - start, 1))
