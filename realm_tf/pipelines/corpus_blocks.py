"""An Open-QA corpus given as JSON lines or blocks, turned into the blocks the index reads.

Used by the trainer for Open-QA corpora (`--corpus`); retrieval itself is
realm_tf.retrieval.knowledge_index, shared with pre-training.
"""
import logging
import os

import tensorflow as tf

from realm_tf.configs.experiment import ExperimentConfig
from realm_tf.io import layout, versioned
from realm_tf.pipelines import preprocess

JSONL_SUFFIXES = (".jsonl", ".json")


def prepare_blocks(corpus: str, work_dir: str, max_block_length: int) -> str:
  """The blocks file pattern of `corpus`.

  `corpus` is a corpus pipeline output directory, a blocks file pattern, or a JSON lines
  file of {title, text} documents, which is run through the corpus pipeline
  (realm_tf.pipelines.preprocess) once into `work_dir` (reused while its manifest names the
  same input and block length).
  """
  if corpus.endswith(JSONL_SUFFIXES) and tf.io.gfile.exists(corpus) \
      and not tf.io.gfile.isdir(corpus):
    manifest_path = os.path.join(work_dir, "manifest.json")
    if tf.io.gfile.exists(manifest_path):
      made = versioned.read_json(manifest_path).get("config", {})
      if (made.get("input") != corpus
          or made.get("max_block_length") != max_block_length):
        raise ValueError(f"{work_dir} holds blocks of {made.get('input')} with "
                         f"max_block_length {made.get('max_block_length')}, not {corpus} "
                         f"with {max_block_length}: use another model_dir")
      logging.info("Reusing the blocks of %s in %s", corpus, work_dir)
    else:
      logging.info("Preprocessing %s into blocks in %s", corpus, work_dir)
      # Titles keep the pipeline's 64-wordpiece limit unless the blocks are short.
      preprocess.prepare_corpus(preprocess.PreprocessConfig(
          input_format="jsonl", input=corpus, output_dir=work_dir,
          max_block_length=max_block_length,
          max_title_length=min(64, max_block_length // 2)))
    return os.path.join(work_dir, "blocks-*")
  if tf.io.gfile.isdir(corpus):
    return os.path.join(corpus, "blocks-*")
  if not tf.io.gfile.glob(corpus):
    raise FileNotFoundError(f"--corpus {corpus}: no such directory, JSON lines file or "
                            f"blocks file pattern")
  return corpus


def resolve_index_blocks(experiment: ExperimentConfig, model_dir: str) -> ExperimentConfig:
  """index.blocks given as {title, text} JSON lines is run through the corpus pipeline once
  (into <model_dir>/corpus); the run then names the resulting blocks, so params.yaml tells
  the index builder and evaluation exactly which blocks were indexed. Called by the entry
  points (realm_tf.train, realm_tf.evaluate) before the driver: training itself never
  starts a Beam job."""
  blocks = experiment.index.blocks
  if blocks.endswith(JSONL_SUFFIXES):
    blocks = prepare_blocks(blocks, layout.corpus_dir(model_dir),
                            experiment.model.retriever.block_seq_length)
    experiment = experiment.replace(index=dict(blocks=blocks))
  return experiment
