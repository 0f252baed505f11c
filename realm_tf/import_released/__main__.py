"""`python -m realm_tf.import_released`: the REALM authors' released models as a realm_tf run.

    python -m realm_tf.import_released --output_dir runs/realm_nq \\
        --embedder gs://realm-data/cc_news_pretrained/embedder \\
        --orqa_model gs://realm-data/orqa_nq_model_from_realm \\
        --blocks gs://orqa-data/enwiki-20181220/blocks.tfr \\
        --titles gs://orqa-data/enwiki-20181220/titles.tfr

What it writes and how: realm_tf.import_released.importer. Prints a JSON summary.
"""
from absl import flags

from realm_tf.io import command_line

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
flags.DEFINE_bool("block_records", True, "Also write the blocks as block records "
                  "(<output_dir>/blocks: about the size of blocks.tfr again) for training or "
                  "re-embedding; evaluation, export and serving read the block text store "
                  "alone. Always written for a pre-training import.")
flags.DEFINE_bool("build_scann", False, "Also build a ScaNN searcher per index shard (for "
                  "index.backend=scann and the realm_qa_scann export).")
flags.DEFINE_integer("check_block_emb_rows", 64, "Re-embed this many released blocks with "
                     "the imported document tower and compare with their block_emb rows "
                     "(the release's own check of the tower's LayerNorm epsilon and GELU); "
                     "0 skips it.")

FLAGS = flags.FLAGS


def main():
  """Imports the released files named by the flags; returns the importer's summary."""
  from realm_tf.import_released import importer  # noqa: PLC0415  flags parse and --help answers before TensorFlow loads
  files = importer.ReleasedFiles(
      embedder=FLAGS.embedder, blocks=FLAGS.blocks, titles=FLAGS.titles,
      orqa_model=FLAGS.orqa_model, bert=FLAGS.bert, block_emb=FLAGS.block_emb)
  return importer.import_released(
      files, FLAGS.output_dir, FLAGS.num_attention_heads, FLAGS.index_shards,
      FLAGS.records_per_file, FLAGS.build_scann, FLAGS.block_records,
      FLAGS.check_block_emb_rows)


if __name__ == "__main__":
  # What the importer refuses (ValueError, FileExistsError): the released files or the
  # arguments.
  command_line.run_absl("realm_tf.import_released", main,
                        refused=(ValueError, FileExistsError))
