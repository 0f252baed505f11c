"""`python -m realm_tf.evaluate`: Open-QA metrics and predictions of a fine-tuned model.

    python -m realm_tf.evaluate --model_dir runs/nq --questions nq/dev.jsonl \\
        [--answer_regex] [--corpus blocks_dir_or_pattern_or.jsonl] [--checkpoint PATH] \\
        [--output predictions.jsonl] [--max_questions N] [--override key=value]

Prints a JSON object of metrics (exact_match, recall@1/5/20, reader_oracle; see
realm_tf.tasks.openqa_evaluation for their definitions) and writes one JSON line per question:
the question, the references, the predicted answer (original text of the chosen span), the
chosen block and span, and every retrieved block with its title, score, p(z|x) and whether
it contains an answer.

Retrieved blocks are read from the corpus's block text store (realm_tf.data.block_texts;
built once under <model_dir>/block_texts/ when the run names none), as a served version
reads them, so evaluation holds the embeddings but no token tables or texts of every
block (under a TPU strategy it keeps the training layout's token tables).

The run is described by its <model_dir>/params.yaml (an Open-QA task); the questions become
its task.openqa.validation_data and train_lib.evaluate_checkpoint evaluates the checkpoint.
That evaluation runs in a work directory (--work_dir, default <model_dir>/eval_corpora/
<hash of the corpus>) so that it leaves the run itself untouched (its own validation files,
TRAINING_DONE marker and params.yaml). The corpus defaults to the one the model was
fine-tuned on, searched with the run's index. Another corpus (--corpus) is embedded first:
index.blocks names it and the work directory's index starts empty, so the task exports the
checkpoint's retriever and a child index builder embeds the corpus with its document tower.
"""
import hashlib
import os
import time

from absl import flags

from realm_tf.io import command_line

flags.DEFINE_string("model_dir", None, "An Open-QA run (python -m realm_tf.train with "
                    "task.type=openqa).", required=True)
flags.DEFINE_string("questions", None, "JSON lines {question, answer: [...]}.", required=True)
flags.DEFINE_bool("answer_regex", False, "Answers are regular expressions (CuratedTREC).")
flags.DEFINE_string("corpus", "", "Blocks dir/pattern or {title, text} JSON lines "
                    "(default: the run's corpus).")
flags.DEFINE_string("checkpoint", "", "A checkpoint path (default: the run's latest).")
flags.DEFINE_string("output", "", "Predictions file (default: <model_dir>/eval/"
                    "<questions name>-<step>.predictions.jsonl).")
flags.DEFINE_string("work_dir", "", "Where the evaluation runs, and another corpus's "
                    "blocks and index go (default: <model_dir>/eval_corpora/<hash>).")
flags.DEFINE_integer("max_questions", 0, "Evaluate the first N questions (0: all).")
flags.DEFINE_multi_string("override", [], "Config overrides: key=value[,key=value].")
FLAGS = flags.FLAGS


def evaluate_run(model_dir: str, questions: str, regex: bool = False, corpus: str = "",
                 checkpoint: str = "", output: str = "", work_dir: str = "",
                 max_questions: int = 0, overrides=()) -> dict:
  """Restores a fine-tuned model and evaluates it on `questions`.

  Returns the metrics plus step, checkpoint, questions, blocks and the files written.
  """
  import tensorflow as tf  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads

  from realm_tf.configs import load_config  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.data import block_texts  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.data.block_store import blocks_pattern  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.io import layout  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.pipelines.corpus_blocks import resolve_index_blocks  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.tasks import openqa_evaluation as evaluation  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.tasks.openqa import save_evaluation  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.training import runtime, train_lib  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads

  config = load_config(layout.params_path(model_dir), overrides)
  if config.task.type != "openqa":
    raise ValueError(f"{model_dir}: task.type is {config.task.type!r}, not an Open-QA run")
  path = layout.latest_checkpoint(checkpoint or model_dir)
  blocks = config.index.blocks
  work = work_dir or os.path.join(
      model_dir, "eval_corpora", hashlib.sha1((corpus or blocks).encode()).hexdigest()[:12])
  index = dict(index_dir=layout.index_dir(model_dir, config.index.index_dir))
  if corpus:
    other = resolve_index_blocks(config.replace(index=dict(blocks=corpus)), work)
    if blocks_pattern(other.index.blocks) != blocks_pattern(blocks):
      # A fresh index of the other corpus in the work directory, built from the checkpoint.
      blocks = other.index.blocks
      index = dict(blocks=blocks, index_dir=layout.index_dir(work))
  config = config.replace(
      index=index,
      task=dict(openqa=dict(answer_regex=regex, validation_data=dict(
          input_path=questions, max_examples=max_questions))))
  strategy = runtime.make_strategy(config)
  if not isinstance(strategy, (tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy)):
    # The retrieved blocks are read from the corpus's text store, as a served version
    # reads them: no token tables or texts of every block in memory.
    if "blocks" in index:
      config = config.replace(index=dict(text_store=""))
    config = block_texts.ensure_store(config, model_dir if "blocks" not in index else work)
  # The work directory's params.yaml is what a child index builder there reads.
  train_lib.save_params(config, work)
  start = time.time()
  metrics, run = train_lib.evaluate_checkpoint(config, work, path, strategy)
  step = metrics.pop("step")
  metrics.pop("checkpoint")
  metrics["eval_seconds"] = time.time() - start
  predictions = run.task.predictions
  name = os.path.splitext(os.path.basename(questions))[0]
  if output:
    files = dict(predictions=evaluation.write_predictions(output, predictions))
  else:
    files = save_evaluation(model_dir, name, step, metrics, predictions)
  return dict(metrics, step=step, checkpoint=path, questions=questions, blocks=blocks,
              files=files)


def main():
  """Evaluates the run named by the flags; returns evaluate_run's result."""
  return evaluate_run(FLAGS.model_dir, FLAGS.questions, FLAGS.answer_regex, FLAGS.corpus,
                      FLAGS.checkpoint, FLAGS.output, FLAGS.work_dir, FLAGS.max_questions,
                      FLAGS.override)


if __name__ == "__main__":
  # What evaluate_run refuses (ValueError) is the command's arguments.
  command_line.run_absl("realm_tf.evaluate", main, refused=(ValueError,))
