"""`python -m realm_tf.demo`: REALM learning, then serving what it learnt, on a 2-core CPU.

    python -m realm_tf.demo [--run_dir runs/demo] [--pretrain_steps N] [--world_entities N]
        [--ask "a question for the Wikipedia leads"] ...

Every stage writes under --run_dir and is reused when run again with the same settings
(see realm_tf.demo.pipeline for the stages and what each runs). The defaults are sized for
a 2-core CPU: `make demo` in about ten minutes after set-up.
"""
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads

from absl import app, flags, logging  # noqa: E402

from realm_tf.demo.pipeline import DemoOptions  # noqa: E402

_D = DemoOptions()
flags.DEFINE_multi_string("config", list(_D.configs),
                          "Experiment config files (YAML, in order) of every training stage "
                          "of acts 1 and 2.")
flags.DEFINE_string("leads_config", _D.leads_config,
                    "The config whose retriever (at step 0: its warm start) embeds the "
                    "Wikipedia leads.")
flags.DEFINE_string("run_dir", _D.run_dir, "Where every stage writes; reused on re-runs.")
flags.DEFINE_multi_string("override", [], "Config overrides for every training stage of the "
                          "acts, e.g. runtime.enable_xla=true.")
flags.DEFINE_string("articles_file", _D.articles_file,
                    "{title, text} JSON lines to use instead of the PyPI package's "
                    "Wikipedia leads.")
flags.DEFINE_integer("num_articles", _D.num_articles,
                     "Articles taken: a neighbourhood of articles that mention each other "
                     "(0: all).")
flags.DEFINE_multi_string("ask", list(_D.leads_questions),
                          "A question answered with the Wikipedia leads it retrieves "
                          "(repeatable; replaces the default ones).")
flags.DEFINE_integer("world_entities", _D.world_entities,
                     "Invented people in the world of acts 1 and 2 (two blocks each).")
flags.DEFINE_integer("reader_steps", _D.reader_steps,
                     "Steps of the reader's training on own blocks (batch 64).")
flags.DEFINE_integer("ict_steps", _D.ict_steps, "ICT warm-start steps (kept weak on purpose).")
flags.DEFINE_integer("pretrain_steps", _D.pretrain_steps, "REALM pre-training steps.")
flags.DEFINE_integer("pretrain_batch_size", _D.pretrain_batch_size,
                     "Pre-training batch (ICT's is twice this).")
flags.DEFINE_integer("num_candidates", _D.num_candidates,
                     "Blocks retrieved per masked sentence in pre-training (k).")
flags.DEFINE_integer("refresh_every_steps", _D.refresh_every_steps,
                     "Pre-training steps between retriever snapshots for the index builder "
                     "(the index searched is never older).")
flags.DEFINE_float("learning_rate", _D.learning_rate,
                   "Learning rate of ICT and pre-training (retriever and reader alike).")
flags.DEFINE_integer("num_shown", _D.num_shown,
                     "Held-out sentences printed filled in (the figures are over all).")
flags.DEFINE_integer("world_finetune_steps", _D.world_finetune_steps,
                     "Act 2: Open-QA fine-tuning steps on the world's questions.")
flags.DEFINE_integer("world_batch_size", _D.world_batch_size, "Act 2: its batch.")
flags.DEFINE_float("world_learning_rate", _D.world_learning_rate,
                   "Act 2: its learning rate (the span head's is the trainer's multiple).")
flags.DEFINE_integer("world_asked", _D.world_asked,
                     "Act 2: held-out questions printed before and after the edit (all are "
                     "asked).")
flags.DEFINE_integer("seed", _D.seed, "Seed of the world and of every training stage.")
FLAGS = flags.FLAGS

OPTIONS = ("run_dir", "leads_config", "articles_file", "num_articles", "world_entities",
           "reader_steps", "ict_steps", "pretrain_steps", "pretrain_batch_size",
           "num_candidates", "refresh_every_steps", "learning_rate", "num_shown",
           "world_finetune_steps", "world_batch_size", "world_learning_rate", "world_asked",
           "seed")

WHY_A_WORLD = """\
Why invented facts: no BERT pre-trained to fill masks can be reached from this machine, so a
small reader learns to read first, and every fact is written only in its person's blocks."""


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # the stages' own logs are in their log.txt
  # SIGTERM unwinds like Ctrl-C, so the running stage's process group (a trainer and its
  # index builder, the server) is stopped before the demo exits.
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
  from realm_tf.demo.leads import format_leads  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.demo.pipeline import Demo, format_act1, format_summary  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.demo.world import format_world  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.demo.stages import StageError  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  options = DemoOptions(**{name: FLAGS[name].value for name in OPTIONS},
                        configs=list(FLAGS.config), overrides=list(FLAGS.override),
                        leads_questions=list(FLAGS.ask))
  try:
    demo = Demo(options, log=lambda line: print(line, flush=True))
    result = demo.run()
  except (StageError, ValueError, FileNotFoundError) as e:
    print(f"\nrealm_tf.demo: error: {e}", file=sys.stderr, flush=True)
    return 1
  print("\n=== The real data path: questions answered with the Wikipedia leads they "
        "retrieve ===")
  print(format_leads(result["leads"]["questions"]))
  print("\n=== Act 1: REALM pre-training; held-out masked sentences filled in with and "
        "without retrieval (as the paper's Table 3) ===")
  print(WHY_A_WORLD)
  print(format_act1(result["act1"], options.num_shown))
  print("\n=== Act 2: act 1's model fine-tuned for Open-QA; held-out questions over gRPC, "
        "before and after the corpus is edited ===")
  print(format_world(result["act2"]))
  print("\n=== Summary ===")
  print(format_summary(demo))
  return 0


if __name__ == "__main__":
  app.run(main)
