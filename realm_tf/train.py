"""`python -m realm_tf.train`: one stage of REALM, as a registered experiment.

    python -m realm_tf.train --experiment realm/ict --config configs/demo.yaml \\
        --model_dir runs/ict --override task.ict.train_data.input_path=runs/corpus/ict-*
    python -m realm_tf.train --experiment realm/pretrain --config configs/demo.yaml \\
        --model_dir runs/realm --override index.blocks=runs/corpus \\
        --override task.pretrain.train_data.input_path=runs/corpus/pretraining-* \\
        --override task.pretrain.init_checkpoint=runs/ict,task.pretrain.start_index_builder=true
    python -m realm_tf.train --experiment realm/openqa --config configs/demo.yaml \\
        --model_dir runs/nq --override index.blocks=runs/corpus \\
        --override task.openqa.init_checkpoint=runs/realm \\
        --override task.openqa.train_data.input_path=nq/train.jsonl \\
        --override task.openqa.validation_data.input_path=nq/dev.jsonl

On Cloud TPU (everything on GCS), the paper's settings, one file per stage. On a
single-host TPU VM, on that VM:
    python -m realm_tf.train --experiment realm/pretrain --tpu=local \\
        --config configs/realm_paper/bert_base.yaml --config configs/realm_paper/pretrain.yaml \\
        --model_dir gs://BUCKET/realm
On a pod slice, on worker 0 ONLY (it drives every host), with TPU_NAME the TPU's name and
TPU_LOAD_LIBRARY=0 exported: the same with --tpu=$TPU_NAME. README ("TPU VM: one host and
pod slices") has the full commands, from creating the TPU on.

The experiment (realm_tf.configs.experiments: realm/ict, realm/mlm_warmup, realm/pretrain,
realm/openqa) gives the stage's defaults and its own trainer section; each --config file
in order, then --override, change them. Without --experiment the files alone (a saved
params.yaml, say) are the run. The result is saved as <model_dir>/params.yaml.
The strategy (realm_tf.training.runtime.plan_runtime): --tpu gives TPUStrategy; else
runtime.distribution_strategy if set; else TF_CONFIG gives multi-worker, GPUs
MirroredStrategy, and otherwise the default strategy.
"""
import json
import logging
import sys

from absl import app, flags

flags.DEFINE_string("experiment", "", "A registered experiment: realm/ict, realm/mlm_warmup, "
                    "realm/pretrain or realm/openqa (the stage's defaults).")
flags.DEFINE_multi_string("config", [], "Config YAML files, applied in order over the "
                          "experiment's defaults.")
flags.DEFINE_string("model_dir", None, "Checkpoints, summaries, exports (local or gs://).",
                    required=True)
flags.DEFINE_multi_string("override", [], "Config overrides: key=value[,key=value].")
flags.DEFINE_string("tpu", "", "TPU name or address (gives TPUStrategy; sets runtime.tpu).")
flags.DEFINE_integer("stop_at_step", None,
                     "Stop at this step of the configured schedule (resume later).")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  from realm_tf.configs import ConfigError, load_config  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.pipelines.corpus_blocks import resolve_index_blocks  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.training import runtime, train_lib  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  overrides = list(FLAGS.override)
  if FLAGS.tpu:
    overrides.append(f"runtime.tpu={FLAGS.tpu}")
  try:
    if not FLAGS.experiment and not FLAGS.config:
      raise ConfigError("give --experiment (a stage), --config (a full config), or both")
    config = load_config(FLAGS.config, overrides, experiment=FLAGS.experiment)
  except (ConfigError, ValueError) as e:
    sys.exit(f"config error: {e}")
  try:
    strategy = runtime.make_strategy(config, FLAGS.tpu)
  except runtime.RuntimePlanError as e:
    sys.exit(f"runtime error: {e}")
  # {title, text} JSON lines as index.blocks: through the corpus pipeline once, first.
  config = resolve_index_blocks(config, FLAGS.model_dir)
  result = train_lib.run_experiment(config, FLAGS.model_dir, strategy, FLAGS.stop_at_step)
  print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
  logging.getLogger().setLevel(logging.INFO)
  app.run(main)
