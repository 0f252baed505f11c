"""The imported run's config (the registered experiment with the released sizes and the
authors' lengths and beams) and released.yaml, its model and index sections for new runs."""
import os
from typing import Optional

import tensorflow as tf
import yaml

from realm_tf.configs import experiments
from realm_tf.import_released.release import OrqaSettings
from realm_tf.io import layout

# Questions per evaluation batch: the authors read one question at a time; 16 questions x
# 5 blocks x 320 wordpieces keep BERT-base's activations near 1 GB on a CPU host (the
# experiment's 512 would want tens of GB).
EVAL_BATCH = 16


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
