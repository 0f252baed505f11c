"""Apache Beam jobs of realm_tf as library functions with typed configs.

  realm_tf.pipelines.preprocess.prepare_corpus(PreprocessConfig(...)) -> corpus dir
  realm_tf.pipelines.embed.embed_corpus(EmbedConfig(...))             -> committed index
  realm_tf.pipelines.index_builder.run_index_builder(IndexBuilderConfig(...))

Each takes `pipeline_args`, Beam/runner options passed untouched to PipelineOptions
(e.g. ['--runner', 'DataflowRunner', '--project', ...]); `beam/*.py` are thin command
lines over these. Modules import Beam and TensorFlow lazily where they can, so importing
this package is cheap.
"""
