"""beam/*.py are thin command lines: flags → typed config, runner flags untouched."""
from beam import embed_corpus, index_builder, preprocess
from realm_tf.pipelines.embed import EmbedConfig
from realm_tf.pipelines.index_builder import IndexBuilderConfig
from realm_tf.pipelines.preprocess import PreprocessConfig

DATAFLOW = ("--runner DataflowRunner --project p --region us-central1 "
            "--temp_location gs://b/tmp --staging_location gs://b/staging "
            "--setup_file ./setup.py --sdk_container_image img --experiments=use_runner_v2 "
            "--machine_type n2-highmem-8 --max_num_workers 50 --disk_size_gb 100 "
            # A runner flag that is a prefix of one of ours must not be taken for it.
            "--model some-runner-value").split()


def test_preprocess_flags_become_a_config_and_runner_flags_pass_through():
  config, rest = preprocess.parse_args(["--input", "gs://b/in*.jsonl", "--output_dir",
                                        "gs://b/corpus", "--input_format", "jsonl",
                                        "--tagger_model_copies", "1", "--overwrite"] + DATAFLOW)
  assert isinstance(config, PreprocessConfig) and rest == DATAFLOW
  assert (config.input, config.output_dir, config.tagger_model_copies, config.overwrite) == (
      "gs://b/in*.jsonl", "gs://b/corpus", 1, True)


def test_embed_flags_become_a_config_and_runner_flags_pass_through():
  config, rest = embed_corpus.parse_args(
      ["--blocks", "gs://b/corpus", "--encoder", "gs://b/run/export/block_encoder",
       "--output_dir", "gs://b/run/index", "--num_shards", "16", "--model_copies", "1",
       "--large_model", "--scann_overrides", '{"num_leaves": 100}'] + DATAFLOW)
  assert rest == DATAFLOW
  assert config == EmbedConfig(blocks="gs://b/corpus", encoder="gs://b/run/export/block_encoder",
                               output_dir="gs://b/run/index", num_shards=16,
                               scann_overrides={"num_leaves": 100}, large_model=True,
                               model_copies=1)


def test_index_builder_flags_become_a_config_and_runner_flags_pass_through():
  config, rest = index_builder.parse_args(["--model_dir", "gs://b/run", "--model_copies",
                                           "2"] + DATAFLOW)
  assert rest == DATAFLOW
  assert config == IndexBuilderConfig(model_dir="gs://b/run", model_copies=2)
