"""`python -m realm_tf.evaluate`: Open-QA metrics and predictions of a fine-tuned model.

    python -m realm_tf.evaluate --model_dir runs/nq --questions nq/dev.jsonl \\
        [--answer_regex] [--corpus blocks_dir_or_pattern_or.jsonl] [--checkpoint PATH] \\
        [--output predictions.jsonl] [--max_questions N]

Prints a JSON object of metrics (exact_match, recall@1/5/20, reader_oracle; see
realm_tf.openqa.evaluation for their definitions) and writes one JSON line per question:
the question, the references, the predicted answer (original text of the chosen span), the
chosen block and span, and every retrieved block with its title, score, p(z|x) and whether
it contains an answer.

The corpus defaults to the one the model was fine-tuned on, searched with the run's index.
Another corpus is embedded first with the checkpoint's document tower (into --work_dir).
"""
import hashlib
import json
import logging
import os
import sys

from absl import app, flags

flags.DEFINE_string("model_dir", None, "A fine-tuning run (python -m realm_tf.train "
                    "--mode finetune).", required=True)
flags.DEFINE_string("questions", None, "JSON lines {question, answer: [...]}.", required=True)
flags.DEFINE_bool("answer_regex", False, "Answers are regular expressions (CuratedTREC).")
flags.DEFINE_string("corpus", "", "Blocks dir/pattern or {title, text} JSON lines "
                    "(default: the run's corpus).")
flags.DEFINE_string("checkpoint", "", "A checkpoint path (default: the run's latest).")
flags.DEFINE_string("output", "", "Predictions file (default: <model_dir>/eval/"
                    "<questions name>-<step>.predictions.jsonl).")
flags.DEFINE_string("work_dir", "", "Where another corpus's blocks and index go "
                    "(default: <model_dir>/eval_corpora/<hash>).")
flags.DEFINE_integer("max_questions", 0, "Evaluate the first N questions (0: all).")
flags.DEFINE_multi_string("override", [], "Config overrides: key=value[,key=value].")
FLAGS = flags.FLAGS


def evaluate_run(model_dir: str, questions: str, regex: bool = False, corpus: str = "",
                 checkpoint: str = "", output: str = "", work_dir: str = "",
                 max_questions: int = 0, overrides=()) -> dict:
  """Restores a fine-tuned model and evaluates it; returns metrics (and file paths)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from realm_tf.configs import load_config  # pylint: disable=g-import-not-at-top
  from realm_tf.data.block_store import BlockStore  # pylint: disable=g-import-not-at-top
  from realm_tf.openqa import evaluation  # pylint: disable=g-import-not-at-top
  from realm_tf.openqa.bm25 import BM25Retriever  # pylint: disable=g-import-not-at-top
  from realm_tf.openqa.corpus import prepare_blocks  # pylint: disable=g-import-not-at-top
  from realm_tf.text import Tokenizer  # pylint: disable=g-import-not-at-top
  from realm_tf.training import finetune, runs, runtime  # pylint: disable=g-import-not-at-top

  config = load_config(os.path.join(model_dir, "params.yaml"), overrides)
  finetune.check_config(config)
  # Weights come from the checkpoint: no warm start, no initial checkpoint to read.
  config = config.replace(warm_start=dict(source=""), finetune=dict(init_from="warm_start"))
  strategy = runtime.make_strategy(config)
  tokenizer = Tokenizer(config.tokenizer.vocab_file or None, config.tokenizer.lower_case)
  blocks, index_root = config.data.blocks, model_dir
  if corpus:
    other = work_dir or os.path.join(
        model_dir, "eval_corpora", hashlib.sha1(corpus.encode()).hexdigest()[:12])
    candidate = prepare_blocks(corpus, os.path.join(other, "corpus"),
                               config.retriever.block_seq_length)
    if candidate != blocks:
      blocks, index_root = candidate, other
      config = config.replace(index=dict(index_dir=""), data=dict(blocks=blocks))
  store = BlockStore.from_tfrecords(blocks)
  with strategy.scope():
    model = finetune.build_model(config, tokenizer.sep_id)
  path = checkpoint or runs.latest_checkpoint(model_dir)
  status = tf.train.Checkpoint(model=model).read(path)
  status.expect_partial()
  status.assert_existing_objects_matched()
  step = int(tf.train.load_variable(path, "global_step/.ATTRIBUTES/VARIABLE_VALUE"))
  corpus_ = finetune.build_corpus(config, model, store, tokenizer, index_root, blocks,
                                  strategy, step=step)
  bm25 = BM25Retriever(store) if config.finetune.retrieval == "bm25" else None
  qa_set = finetune.load_qa_set(questions, config, tokenizer, store, regex, bm25,
                                max_questions)
  evaluator = finetune.make_evaluator(config, strategy, model, corpus_, qa_set, tokenizer,
                                      regex)
  metrics = finetune.evaluate_once(evaluator)
  name = os.path.splitext(os.path.basename(questions))[0]
  if output:
    files = dict(predictions=evaluation.write_predictions(output, evaluator.predictions))
  else:
    files = finetune.save_evaluation(model_dir, name, step, metrics, evaluator.predictions)
  return dict(metrics, step=step, checkpoint=path, questions=questions, blocks=blocks,
              files=files)


def main(argv):
  del argv
  from realm_tf.configs import ConfigError  # pylint: disable=g-import-not-at-top
  try:
    result = evaluate_run(FLAGS.model_dir, FLAGS.questions, FLAGS.answer_regex, FLAGS.corpus,
                          FLAGS.checkpoint, FLAGS.output, FLAGS.work_dir,
                          FLAGS.max_questions, FLAGS.override)
  except (ConfigError, ValueError, FileNotFoundError) as e:
    sys.exit(f"error: {e}")
  print(json.dumps(result, indent=2, sort_keys=True))


if __name__ == "__main__":
  logging.getLogger().setLevel(logging.INFO)
  app.run(main)
