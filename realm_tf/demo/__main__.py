"""`python -m realm_tf.demo`: the whole REALM pipeline on a small real corpus.

    python -m realm_tf.demo [--config configs/demo.yaml] [--run_dir runs/demo]
        [--num_articles N] [--ict_steps N] [--warmup_steps N] [--pretrain_steps N]
        [--wikipedia_qa] [--train_file questions.jsonl] [--ask "who wrote ...?"] ...

Every stage writes under --run_dir and is reused when run again with the same settings
(see realm_tf.demo.pipeline for the stages and what each runs). The defaults (the MiniLM
config, configs/demo.yaml) are sized for a 2-core CPU.
"""
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads

from absl import app, flags, logging  # noqa: E402

from realm_tf.demo.pipeline import DemoOptions  # noqa: E402

_D = DemoOptions()
flags.DEFINE_string("config", _D.config, "Experiment config (YAML) of every training stage.")
flags.DEFINE_string("run_dir", _D.run_dir, "Where every stage writes; reused on re-runs.")
flags.DEFINE_multi_string("override", [], "Config overrides for every training stage, "
                          "e.g. runtime.enable_xla=false.")
flags.DEFINE_string("articles_file", _D.articles_file,
                    "{title, text} JSON lines to use instead of the PyPI package's "
                    "Wikipedia leads.")
flags.DEFINE_integer("num_articles", _D.num_articles,
                     "Articles taken: a neighbourhood of articles that mention each other "
                     "(0: all).")
flags.DEFINE_string("conll_dir", _D.conll_dir,
                    "CoNLL-2003 (eng.train, eng.testa, eng.testb) for the salient-span "
                    "tagger; 'auto': ../shared/data/ner/conll2003 when present; '': none "
                    "(dates plus mentions of the corpus's titles).")
flags.DEFINE_integer("tagger_steps", _D.tagger_steps, "Tagger training steps (batch 32).")
flags.DEFINE_integer("ict_steps", _D.ict_steps, "ICT warm-start steps.")
flags.DEFINE_integer("warmup_steps", _D.warmup_steps,
                     "MLM-head warm-up steps (over cached encoder outputs).")
flags.DEFINE_integer("warmup_batch_size", _D.warmup_batch_size,
                     "MLM-head warm-up batch, in masked wordpieces.")
flags.DEFINE_float("warmup_learning_rate", _D.warmup_learning_rate,
                   "Learning rate of the MLM-head warm-up (a fresh head).")
flags.DEFINE_integer("warmup_max_spans", _D.warmup_max_spans,
                     "Masked spans the MLM-head warm-up encodes, a seeded sample (0: all).")
flags.DEFINE_integer("pretrain_steps", _D.pretrain_steps, "REALM pre-training steps.")
flags.DEFINE_integer("pretrain_batch_size", _D.pretrain_batch_size, "Pre-training batch.")
flags.DEFINE_integer("num_candidates", _D.num_candidates,
                     "Documents per masked sentence in pre-training (null document included).")
flags.DEFINE_integer("refresh_every_steps", _D.refresh_every_steps,
                     "Pre-training steps between retriever snapshots for the index builder.")
flags.DEFINE_bool("wikipedia_qa", _D.wikipedia_qa,
                  "Also fine-tune a reader on cloze questions over the Wikipedia corpus, "
                  "export it and ask it over gRPC (act 1's Open-QA stages; implied by "
                  "--train_file and --ask). Off by default: at this size they answer few "
                  "questions right.")
flags.DEFINE_integer("finetune_steps", _D.finetune_steps,
                     "Reader fine-tuning steps on the Wikipedia questions.")
flags.DEFINE_integer("finetune_batch_size", _D.finetune_batch_size, "Fine-tuning batch.")
flags.DEFINE_string("train_file", _D.train_file,
                    "Fine-tuning questions, NQ-Open JSON lines {\"question\", \"answer\": "
                    "[...]}; default: cloze questions generated from the corpus.")
flags.DEFINE_integer("max_train_questions", _D.max_train_questions,
                     "At most this many generated training questions.")
flags.DEFINE_integer("num_eval_questions", _D.num_eval_questions,
                     "Held-out generated questions evaluated after fine-tuning.")
flags.DEFINE_integer("num_asked", _D.num_asked,
                     "Held-out questions asked over gRPC (and printed).")
flags.DEFINE_integer("num_masked", _D.num_masked,
                     "Held-out masked sentences filled in with and without retrieval.")
flags.DEFINE_multi_string("ask", [], "Another question to ask the server (repeatable).")
flags.DEFINE_integer("seed", _D.seed, "Seed of the held-out choices (and of the world).")
flags.DEFINE_integer("world_entities", _D.world_entities,
                     "Invented people in the knowledge-world act (one block each).")
flags.DEFINE_integer("world_finetune_steps", _D.world_finetune_steps,
                     "Reader fine-tuning steps on the world's questions.")
flags.DEFINE_integer("world_batch_size", _D.world_batch_size, "Its batch.")
flags.DEFINE_integer("world_asked", _D.world_asked,
                     "Held-out world questions asked over gRPC before and after the edit.")
FLAGS = flags.FLAGS


SHOWN_FILLED_IN = 4  # sentences printed whole; the accuracy is over all of them

ACT_1_LIMITS = """
What act 1 shows at this size: REALM's pre-training stages on real Wikipedia text
(salient-span preprocessing, the ICT warm start, the embedded corpus, pre-training with the
index builder re-embedding beside the trainer) and which blocks each masked sentence read
(p(z|x) above). What it cannot show: that pre-training makes better predictions. A few CPU
minutes leave the fresh MLM head filling few blanks, mostly with the commonest masked word
(the accuracy above), and a reader fine-tuned on a few hundred Wikipedia questions answers
few right (--wikipedia_qa runs that too); the paper's gains took 200k steps of batch 512
on TPUs. Act 2 fine-tunes this pre-trained checkpoint
where an answer can only come from the corpus: facts written nowhere else, retrieved and
read, and an edit of the corpus changing the served answer with no parameter changed."""


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # the stages' own logs are in their log.txt
  # SIGTERM unwinds like Ctrl-C, so the running stage's process group (a trainer and its
  # index builder, the server) is stopped before the demo exits.
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
  from realm_tf.demo.fill_in import format_results, format_score  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.demo.pipeline import Demo, format_answers, format_summary  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.demo.world import format_world  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.demo.stages import StageError  # noqa: PLC0415  entry point: flags parse and --help answers before TensorFlow loads
  options = DemoOptions(**{name: FLAGS[name].value for name in (
      "config", "run_dir", "articles_file", "num_articles", "conll_dir", "tagger_steps",
      "ict_steps", "warmup_steps", "warmup_batch_size", "warmup_learning_rate",
      "warmup_max_spans", "pretrain_steps", "pretrain_batch_size", "num_candidates",
      "refresh_every_steps", "wikipedia_qa", "finetune_steps", "finetune_batch_size", "train_file", "max_train_questions",
      "num_eval_questions", "num_asked", "num_masked", "seed", "world_entities",
      "world_finetune_steps", "world_batch_size", "world_asked")},
                        overrides=list(FLAGS.override), ask=list(FLAGS.ask))
  try:
    demo = Demo(options, log=lambda line: print(line, flush=True))
    result = demo.run()
  except (StageError, ValueError, FileNotFoundError) as e:
    print(f"\nrealm_tf.demo: error: {e}", file=sys.stderr, flush=True)
    return 1
  print("\n=== Held-out masked sentences, filled in without and with retrieval "
        "(as the paper's Table 3) ===")
  print(format_results(result["filled_in"][:SHOWN_FILLED_IN]))
  print(format_score(result["fill_in_score"]))
  if result["answers"]:
    print("\n=== Questions asked over gRPC (held-out cloze questions), with their "
          "sources ===")
    print(format_answers(result["answers"]))
  print(ACT_1_LIMITS)
  print("\n=== Act 2, the knowledge world: held-out questions over gRPC, before and after "
        "the corpus is edited ===")
  print(format_world(result["world"]))
  print("\n=== Summary ===")
  print(format_summary(demo))
  return 0


if __name__ == "__main__":
  app.run(main)
