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
TPU_LOAD_LIBRARY=0 exported: the same with --tpu=$TPU_NAME (docs/tpu.md says why).

The experiment (realm_tf.configs.experiments: realm/ict, realm/mlm_warmup, realm/pretrain,
realm/openqa) gives the stage's defaults and its own trainer section; each --config file
in order, then --override, change them. Without --experiment the files alone (a saved
params.yaml, say) are the run. The result is saved as <model_dir>/params.yaml.
The strategy (realm_tf.training.runtime.plan_runtime): --tpu gives TPUStrategy; else
runtime.distribution_strategy if set; else TF_CONFIG gives multi-worker, GPUs
MirroredStrategy, and otherwise the default strategy.

--mode, as tf-models' run_experiment: train_and_eval (the default) trains and evaluates
every trainer.validation_interval steps (lines in metrics.jsonl, summaries in validation/);
train trains only. continuous_eval is a side-car evaluator
(realm_tf.training.continuous_eval): run beside the trainer, with the trainer's flags and
the same --model_dir, it evaluates each new checkpoint (Open-QA: EM and recall@k;
pre-training: masked-span accuracy and retrieval utility, on validation_data), writes one
JSON line per checkpoint to <model_dir>/eval/<name>.jsonl and summaries to eval/<name>/
(--eval_name, default the mode), and exits after the final checkpoint (status 1 after
--eval_timeout seconds without a new one). eval does the same once, for the newest
checkpoint. Without --experiment and --config, the evaluators read the run's params.yaml:
    python -m realm_tf.train --mode train --experiment realm/pretrain ... --model_dir M
    python -m realm_tf.train --mode continuous_eval --experiment realm/pretrain ... \\
        --model_dir M
    python -m realm_tf.train --mode eval --model_dir M
They write none of the trainer's files (params.yaml, metrics.jsonl, checkpoints,
TRAINING_DONE, snapshots) and start no index builder; run them as one process without
TF_CONFIG.
"""
import os
import sys
import time

from absl import flags

from realm_tf.io import command_line

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
flags.DEFINE_enum("mode", "train_and_eval", ["train_and_eval", "train", "eval", "continuous_eval"],
                  "train_and_eval: train, evaluating every trainer.validation_interval steps; "
                  "train: no evaluation; eval: the newest checkpoint, once; continuous_eval: "
                  "a side-car evaluator of each new checkpoint until the final one.")
flags.DEFINE_string("eval_name", "", "eval / continuous_eval: what its files are called "
                    "(<model_dir>/eval/<name>.jsonl, eval/<name>/; default: the mode).")
flags.DEFINE_integer("eval_timeout", None, "continuous_eval: give up after this many seconds "
                     "without a new checkpoint (default trainer.continuous_eval_timeout).")
flags.DEFINE_boolean("watchdog", True, "Multi-worker (TF_CONFIG naming two or more tasks): "
                     "run training as the child of a watchdog process that ends the job "
                     "with one line naming the stopped process when it makes no progress "
                     "for runtime.progress_stall_seconds (realm_tf.training.watchdog).")
FLAGS = flags.FLAGS


def main():
  """Trains (or evaluates, --mode) the run named by the flags; returns its result."""
  # The watchdog never imports TensorFlow: it must outlive whatever TensorFlow does.
  from realm_tf.training import watchdog  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  if FLAGS.watchdog and watchdog.should_supervise(os.environ):
    sys.exit(watchdog.supervise([sys.executable, "-m", "realm_tf.train", *sys.argv[1:]]))
  watchdog.started_by_watchdog()
  from realm_tf.configs import ConfigError, load_config  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.pipelines.corpus_blocks import resolve_index_blocks  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.training import peer_failures, runtime, train_lib  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.io import layout  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.io.roles import HostRole  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  side_car = FLAGS.mode in ("eval", "continuous_eval")
  overrides = list(FLAGS.override)
  if FLAGS.tpu:
    overrides.append(f"runtime.tpu={FLAGS.tpu}")
  if FLAGS.eval_timeout is not None:
    overrides.append(f"trainer.continuous_eval_timeout={FLAGS.eval_timeout}")
  try:
    if not FLAGS.experiment and not FLAGS.config:
      if not side_car:
        raise ConfigError("give --experiment (a stage), --config (a full config), or both")
      # An evaluator of an existing run: the config the trainer saved.
      config = load_config(layout.params_path(FLAGS.model_dir), overrides)
    else:
      config = load_config(FLAGS.config, overrides, experiment=FLAGS.experiment)
  except (ConfigError, ValueError) as e:
    raise command_line.UsageError(f"config error: {e}") from e
  if side_car and os.environ.get("TF_CONFIG"):
    # TF_CONFIG would make it a worker of a multi-worker job, waiting for its peers.
    raise command_line.UsageError(f"--mode {FLAGS.mode} runs as one process of its own, "
                                  f"not in the training job's cluster: unset TF_CONFIG")
  try:
    strategy = runtime.make_strategy(config, FLAGS.tpu)
  except runtime.RuntimePlanError as e:
    raise command_line.UsageError(f"runtime error: {e}") from e
  if side_car:
    return evaluate(config, strategy)
  role = HostRole(strategy)
  if role.multi_process:
    peer_failures.introduce(strategy, role, config.runtime, FLAGS.model_dir)
  # {title, text} JSON lines as index.blocks: through the corpus pipeline once, first, by
  # the chief; the other processes then find its output and reuse it.
  if role.is_chief:
    config = resolve_index_blocks(config, FLAGS.model_dir)
  role.barrier("the corpus blocks are resolved")
  if not role.is_chief:
    config = resolve_index_blocks(config, FLAGS.model_dir)
  try:
    result = train_lib.run_experiment(config, FLAGS.model_dir, strategy, FLAGS.stop_at_step,
                                      evaluate=FLAGS.mode == "train_and_eval")
  except peer_failures.LOST_PEER_ERRORS as e:
    if not role.multi_process:
      raise
    # A collective failed: another process of the job died, stopped, hangs or cannot be
    # reached. TF's own message is a page of gRPC detail; say which peer, and what to do
    # (unless this process's watchdog has said it already: one line per process).
    sys.exit(peer_failures.lost_peer_line(e, strategy, config, FLAGS.model_dir) or 1)
  return result


def evaluate(config, strategy):
  """--mode eval / continuous_eval: a side-car evaluator of the run in --model_dir
  (realm_tf.training.continuous_eval); it writes none of the trainer's files. Returns its
  result; prints it and exits 1 when continuous_eval gave up waiting for a checkpoint
  before the run's final one."""
  import tensorflow as tf  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.io import layout  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.pipelines.corpus_blocks import JSONL_SUFFIXES, resolve_index_blocks  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.training import continuous_eval  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  name = FLAGS.eval_name or FLAGS.mode
  if config.index.blocks.endswith(JSONL_SUFFIXES):
    # The trainer runs the corpus pipeline into <model_dir>/corpus; its manifest is written
    # last. The evaluator waits for it and reuses the blocks (it never runs the pipeline).
    manifest = os.path.join(layout.corpus_dir(FLAGS.model_dir), "manifest.json")
    deadline = time.time() + config.trainer.continuous_eval_timeout
    while not tf.io.gfile.exists(manifest):
      if time.time() > deadline:
        sys.exit(f"{manifest}: the trainer has not prepared the corpus blocks")
      time.sleep(continuous_eval.POLL_SECONDS)
    config = resolve_index_blocks(config, FLAGS.model_dir)
  try:
    if FLAGS.mode == "eval":
      result = continuous_eval.evaluate_latest(config, FLAGS.model_dir, strategy, name)
    else:
      result = continuous_eval.evaluate_continuously(config, FLAGS.model_dir, strategy, name)
  except ValueError as e:
    raise command_line.UsageError(f"{FLAGS.mode} error: {e}") from e
  if result.get("timed_out"):
    command_line.print_result(result)
    sys.exit(f"continuous_eval stopped before the run's final checkpoint: {result['reason']}")
  return result


if __name__ == "__main__":
  command_line.run_absl("realm_tf.train", main)
