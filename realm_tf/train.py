"""`python -m realm_tf.train`: ICT warm start, REALM pre-training and Open-QA fine-tuning.

    python -m realm_tf.train --config configs/demo.yaml --mode ict --model_dir runs/ict \\
        --override data.corpus_dir=runs/corpus
    python -m realm_tf.train --config configs/demo.yaml --mode pretrain \\
        --model_dir runs/realm --start_index_builder \\
        --override data.corpus_dir=runs/corpus,pretrain.retriever_checkpoint=runs/ict
    python -m realm_tf.train --config configs/demo.yaml --mode finetune \\
        --model_dir runs/nq --train_file nq/train.jsonl --eval_file nq/dev.jsonl \\
        --corpus wikipedia.jsonl \\
        --override finetune.init_from=realm,finetune.init_checkpoint=runs/realm

--tpu gives TPUStrategy; GPUs give MirroredStrategy; TF_CONFIG gives multi-worker; else the
default strategy (or `distribution_strategy` in the config).
"""
import json
import logging
import sys

from absl import app, flags

flags.DEFINE_string("config", None, "Experiment config YAML.", required=True)
flags.DEFINE_enum("mode", None, ["ict", "pretrain", "finetune"], "What to train.",
                  required=True)
flags.DEFINE_string("model_dir", None, "Checkpoints, summaries, exports.", required=True)
flags.DEFINE_multi_string("override", [], "Config overrides: key=value[,key=value].")
flags.DEFINE_string("tpu", "", "TPU name or address (gives TPUStrategy).")
flags.DEFINE_bool("start_index_builder", False,
                  "pretrain: run `python -m beam.index_builder` as a child process.")
flags.DEFINE_multi_string("builder_arg", [], "Extra arguments for the index builder.")
flags.DEFINE_integer("stop_at_step", None,
                     "Stop at this step of the configured schedule (resume later).")
flags.DEFINE_string("train_file", None,
                    "finetune: questions, JSON lines {question, answer: [...]}.")
flags.DEFINE_string("eval_file", "", "finetune: questions to evaluate on (same layout).")
flags.DEFINE_bool("answer_regex", False,
                  "finetune: answers are regular expressions (CuratedTREC).")
flags.DEFINE_string("corpus", "",
                    "finetune: blocks (beam.preprocess output dir or file pattern) or a JSON "
                    "lines file of {title, text} documents; default: the config's data.")
flags.DEFINE_integer("max_train_questions", 0, "finetune: use the first N questions (0: all).")
flags.DEFINE_integer("max_eval_questions", 0, "finetune: evaluate the first N (0: all).")
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
  elif FLAGS.mode == "finetune":
    from realm_tf.training import finetune  # pylint: disable=g-import-not-at-top
    if not FLAGS.train_file:
      sys.exit("--mode finetune needs --train_file")
    try:
      finetune.check_config(config)
    except ValueError as e:
      sys.exit(f"config error: {e}")
    result = finetune.run_finetune(
        config, FLAGS.model_dir, strategy, FLAGS.train_file, eval_file=FLAGS.eval_file,
        corpus=FLAGS.corpus, regex=FLAGS.answer_regex, stop_at_step=FLAGS.stop_at_step,
        train_limit=FLAGS.max_train_questions, eval_limit=FLAGS.max_eval_questions)
  else:
    result = runs.run_pretrain(config, FLAGS.model_dir, strategy,
                               start_index_builder=FLAGS.start_index_builder,
                               builder_args=FLAGS.builder_arg,
                               stop_at_step=FLAGS.stop_at_step)
  print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
  logging.getLogger().setLevel(logging.INFO)
  app.run(main)
