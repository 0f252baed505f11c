"""`python -m realm_tf.export`: serving exports of a fine-tuned Open-QA run.

    python -m realm_tf.export --model_dir runs/nq --output_dir /models \\
        [--kinds query_encoder,doc_encoder,reader,realm_qa,realm_qa_scann] \\
        [--checkpoint PATH] [--version N] [--blocks CORPUS --index_dir INDEX]
        [--max_blocks_per_pass 20] [--reader_length_step 32] [--reader_xla]
        [--embedding_dtype float32]
        [--scann_rescore_dtype float16]

Writes `<output_dir>/<kind>/<version>/` (TF Serving's layout; version defaults to the
checkpoint's training step) and prints {kind: published directory} as JSON. --blocks and
--index_dir serve another corpus (e.g. an edited one) with its committed index, built by
`python -m beam.embed_corpus` with the run's document tower: a new version whose answers
follow the new documents, no parameter changed. See
realm_tf.export.exporter for what each kind takes and returns.
"""
from absl import flags

from realm_tf.io import command_line

flags.DEFINE_string("model_dir", None, "A fine-tuned Open-QA run.", required=True)
flags.DEFINE_string("output_dir", None, "TF Serving model root: <output_dir>/<kind>/<version>.",
                    required=True)
flags.DEFINE_list("kinds", ["query_encoder", "doc_encoder", "reader", "realm_qa"],
                  "Which exports (realm_qa_scann needs a ScaNN-enabled model server).")
flags.DEFINE_string("checkpoint", "", "A checkpoint path (default: the run's latest).")
flags.DEFINE_integer("version", None, "Version number (default: the training step).")
flags.DEFINE_string("blocks", "", "Another corpus to serve (its blocks-* TFRecords); with "
                    "--index_dir.")
flags.DEFINE_string("index_dir", "", "The committed index of --blocks (its newest version).")
flags.DEFINE_integer("max_blocks_per_pass", 20,
                     "QA exports: at most this many blocks (questions x blocks read) per "
                     "reader pass; larger requests are read group by group. 0: no limit "
                     "(accelerators). 20 is what measured best on a 2-core CPU.")
flags.DEFINE_integer("reader_length_step", 32,
                     "QA exports: read each request at the shortest multiple of this many "
                     "wordpieces that holds its longest question + block (up to the model's "
                     "reader length). 0: always the full length.")
flags.DEFINE_bool("reader_xla", None,
                  "QA exports: XLA-compile the reader's pass inside the SavedModel "
                  "(tensorflow_model_server then needs --xla_cpu_compilation_enabled=true; "
                  "serving.server mirrors that flag). Default: "
                  "realm_tf.export.assembly.READER_XLA.")
flags.DEFINE_enum("embedding_dtype", "float32", ["float32", "float16"],
                  "realm_qa: the served block embeddings. float16 halves the largest "
                  "part of a loaded version (docs/scale.md); retrieval scores then carry "
                  "float16 rounding.")
flags.DEFINE_enum("scann_rescore_dtype", "float16", ["float16", "float32", "none"],
                  "realm_qa_scann: the embeddings that re-score ScaNN's candidates (its "
                  "int8 scores misorder near-ties), the shards then served without "
                  "their int8 reordering data (a float16 copy held once, in place of int8 "
                  "data held twice: docs/scale.md); none: no re-scoring, the shards as "
                  "built, ranked by ScaNN's own scores.")
FLAGS = flags.FLAGS


def main():
  """Exports the kinds named by the flags; returns {kind: published directory}."""
  from realm_tf.export.assembly import READER_XLA, ExactSearch, ScannSearch  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.export.exporter import export_run  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  rescore = FLAGS.scann_rescore_dtype
  searches = [ExactSearch(FLAGS.embedding_dtype),
              ScannSearch(rescore_dtype=None if rescore == "none" else rescore)]
  return export_run(FLAGS.model_dir, FLAGS.output_dir, FLAGS.kinds, FLAGS.checkpoint,
                    FLAGS.version, FLAGS.blocks, FLAGS.index_dir, FLAGS.max_blocks_per_pass,
                    FLAGS.reader_length_step, searches,
                    READER_XLA if FLAGS.reader_xla is None else FLAGS.reader_xla)


if __name__ == "__main__":
  # What the exporter refuses (ValueError, FileExistsError) is the run's arguments.
  command_line.run_absl("realm_tf.export", main, refused=(ValueError, FileExistsError))
