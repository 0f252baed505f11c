"""`python -m realm_tf.train`: any realm_tf task (ICT, REALM pre-training, Open-QA).

    python -m realm_tf.train --config configs/demo.yaml --model_dir runs/ict \\
        --override task.type=ict,task.ict.train_data.input_path=runs/corpus/ict-*
    python -m realm_tf.train --config configs/demo.yaml --model_dir runs/realm \\
        --override task.type=pretrain,index.blocks=runs/corpus \\
        --override task.pretrain.train_data.input_path=runs/corpus/pretraining-* \\
        --override task.pretrain.init_checkpoint=runs/ict,task.pretrain.start_index_builder=true
    python -m realm_tf.train --config configs/demo.yaml --model_dir runs/nq \\
        --override task.type=openqa,index.blocks=runs/corpus \\
        --override task.openqa.train_data.input_path=nq/train.jsonl \\
        --override task.openqa.validation_data.input_path=nq/dev.jsonl

On Cloud TPU (everything on GCS):
    python -m realm_tf.train --config configs/realm_paper.yaml --tpu=$TPU_NAME \\
        --model_dir gs://BUCKET/realm

The config (with its overrides) is the whole run: it is saved as <model_dir>/params.yaml.
--tpu gives TPUStrategy; GPUs give MirroredStrategy; TF_CONFIG gives multi-worker; else the
default strategy (or runtime.distribution_strategy).
"""
import json
import logging
import sys

from absl import app, flags

flags.DEFINE_string("config", None, "Experiment config YAML.", required=True)
flags.DEFINE_string("model_dir", None, "Checkpoints, summaries, exports (local or gs://).",
                    required=True)
flags.DEFINE_multi_string("override", [], "Config overrides: key=value[,key=value].")
flags.DEFINE_string("tpu", "", "TPU name or address (gives TPUStrategy; sets runtime.tpu).")
flags.DEFINE_integer("stop_at_step", None,
                     "Stop at this step of the configured schedule (resume later).")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  from realm_tf.configs import ConfigError, load_config  # pylint: disable=g-import-not-at-top
  from realm_tf.training import runtime, train_lib  # pylint: disable=g-import-not-at-top
  overrides = list(FLAGS.override)
  if FLAGS.tpu:
    overrides.append(f"runtime.tpu={FLAGS.tpu}")
  try:
    config = load_config(FLAGS.config, overrides)
  except (ConfigError, ValueError) as e:
    sys.exit(f"config error: {e}")
  strategy = runtime.make_strategy(config, FLAGS.tpu)
  result = train_lib.run_experiment(config, FLAGS.model_dir, strategy, FLAGS.stop_at_step)
  print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
  logging.getLogger().setLevel(logging.INFO)
  app.run(main)
