"""`python -m realm_tf.train`: ICT warm start and REALM pre-training.

    python -m realm_tf.train --config configs/demo.yaml --mode ict --model_dir runs/ict \\
        --override data.corpus_dir=runs/corpus
    python -m realm_tf.train --config configs/demo.yaml --mode pretrain \\
        --model_dir runs/realm --start_index_builder \\
        --override data.corpus_dir=runs/corpus,pretrain.retriever_checkpoint=runs/ict

--tpu gives TPUStrategy; GPUs give MirroredStrategy; TF_CONFIG gives multi-worker; else the
default strategy (or `distribution_strategy` in the config).
"""
import json
import logging
import sys

from absl import app, flags

flags.DEFINE_string("config", None, "Experiment config YAML.", required=True)
flags.DEFINE_enum("mode", None, ["ict", "pretrain"], "What to train.", required=True)
flags.DEFINE_string("model_dir", None, "Checkpoints, summaries, exports.", required=True)
flags.DEFINE_multi_string("override", [], "Config overrides: key=value[,key=value].")
flags.DEFINE_string("tpu", "", "TPU name or address (gives TPUStrategy).")
flags.DEFINE_bool("start_index_builder", False,
                  "pretrain: run `python -m beam.index_builder` as a child process.")
flags.DEFINE_multi_string("builder_arg", [], "Extra arguments for the index builder.")
flags.DEFINE_integer("stop_at_step", None,
                     "Stop at this step of the configured schedule (resume later).")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  from realm_tf.configs import ConfigError, load_config  # pylint: disable=g-import-not-at-top
  from realm_tf.training import runs, runtime  # pylint: disable=g-import-not-at-top
  try:
    config = load_config(FLAGS.config, FLAGS.override)
  except ConfigError as e:
    sys.exit(f"config error: {e}")
  strategy = runtime.make_strategy(config, FLAGS.tpu)
  if FLAGS.mode == "ict":
    result = runs.run_ict(config, FLAGS.model_dir, strategy, FLAGS.stop_at_step)
  else:
    result = runs.run_pretrain(config, FLAGS.model_dir, strategy,
                               start_index_builder=FLAGS.start_index_builder,
                               builder_args=FLAGS.builder_arg,
                               stop_at_step=FLAGS.stop_at_step)
  print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
  logging.getLogger().setLevel(logging.INFO)
  app.run(main)
