"""The released REALM NQ model evaluated by realm_tf on NQ-Open test: against the paper's 40.4.

    python -m benchmarks.released_nq --released_dir $REALM [--run runs/realm_nq] \\
        [--questions PATH] [--max_questions N] [--override key=value]

`--released_dir` holds the download of docs/released_models.md (cc_news_pretrained/,
orqa_nq_model_from_realm/, enwiki-20181220/{blocks,titles}.tfr, resplit/). The run is
imported first when `--run` holds none (python -m realm_tf.import_released), then
realm_tf.evaluate scores it on NQ-Open test (the 3,610 questions of the authors' resplit,
resplit/NaturalQuestions.resplit.test.jsonl). Writes results/<name>.json and .md: exact
match, recall@k, reader oracle, questions, evaluation time, and the difference from
REALM's published NQ-Open figure for this model (Guu et al., 2020, Table 1: 40.4, REALM
pre-trained on CC-News). Before evaluating, the release's own check: CHECK_ROWS released
blocks re-embedded by the imported document tower against their block_emb rows.

Not run on this project's machines: the download (about 30 GB) cannot be reached from
them, so no result is committed. The same commands at the release's size with random
weights run here: benchmarks/released_scale.py.
"""
import json
import logging
import os
import time

from absl import app, flags

from benchmarks import harness

FLAGS = flags.FLAGS


def define_flags():
  """The command line's flags, defined only when it runs as one (so that importing the
  module beside other entry points, as tests do, defines none)."""
  flags.DEFINE_string("released_dir", None, "The download of the released files.",
                      required=True)
  flags.DEFINE_string("run", "", "The imported run (default <released_dir>/realm_nq_run); "
                      "imported first when it holds no params.yaml.")
  flags.DEFINE_string("questions", "", "NQ-Open test (default <released_dir>/resplit/"
                      "NaturalQuestions.resplit.test.jsonl).")
  flags.DEFINE_integer("max_questions", 0, "Evaluate the first N questions (0: all).")
  flags.DEFINE_multi_string("override", [], "Config overrides for the evaluation, "
                            "key=value (e.g. runtime.enable_xla=false on CPUs).")
  flags.DEFINE_string("name", "released_nq", "Results file name under benchmarks/results.")


# REALM pre-trained on CC-News (the release's cc_news_pretrained, which
# orqa_nq_model_from_realm was fine-tuned from) on NQ-Open test, Guu et al. 2020, Table 1;
# REALM pre-trained on Wikipedia reads 39.2 there.
PAPER_EXACT_MATCH = 0.404
PAPER_LABEL = "REALM (X = CC-News), Table 1"
# Blocks re-embedded to check the imported document tower against block_emb.
CHECK_ROWS = 300
NQ_OPEN_TEST_QUESTIONS = 3610  # the authors' resplit (language/orqa/README.md)


def released_paths(released_dir: str) -> dict:
  """Where docs/released_models.md's download puts each released file."""
  return dict(embedder=os.path.join(released_dir, "cc_news_pretrained", "embedder"),
              orqa_model=os.path.join(released_dir, "orqa_nq_model_from_realm"),
              blocks=os.path.join(released_dir, "enwiki-20181220", "blocks.tfr"),
              titles=os.path.join(released_dir, "enwiki-20181220", "titles.tfr"),
              questions=os.path.join(released_dir, "resplit",
                                     "NaturalQuestions.resplit.test.jsonl"))


def ensure_import(released_dir: str, run: str) -> dict:
  """Imports the released NQ model into `run` unless it already holds a run; returns the
  import's summary ({} when reused)."""
  from realm_tf.import_released import importer  # noqa: PLC0415  benchmark entry point: flags parse and --help answers before TensorFlow loads
  from realm_tf.io import layout  # noqa: PLC0415  benchmark entry point: flags parse and --help answers before TensorFlow loads
  if os.path.exists(layout.params_path(run)):
    return {}
  paths = released_paths(released_dir)
  return importer.import_released(importer.ReleasedFiles(
      embedder=paths["embedder"], orqa_model=paths["orqa_model"], blocks=paths["blocks"],
      titles=paths["titles"]), run, block_records=False)


def check_tower(run: str, rows: int = CHECK_ROWS) -> dict:
  """The release's own check before evaluating: `rows` released blocks re-embedded by the
  imported document tower against their block_emb rows, with every LayerNorm epsilon and
  GELU form tried, so the result says which reproduce block_emb.

  Raises:
    SystemExit: the run's own tower does not reproduce block_emb (evaluating it would
      measure a wrong model).
  """
  from realm_tf.import_released import importer  # noqa: PLC0415  benchmark entry point: flags parse and --help answers before TensorFlow loads
  check = importer.check_block_emb(run, rows, all_variants=True)
  if not check["run"]["matches"]:
    raise SystemExit(f"{run}: the imported document tower does not reproduce block_emb: "
                     f"{json.dumps(check)}")
  return check


def evaluate(run: str, questions: str, max_questions: int = 0, overrides=()) -> dict:
  """realm_tf.evaluate's metrics of `run` on `questions`, with the paper's figure beside."""
  from realm_tf.evaluate import evaluate_run  # noqa: PLC0415  benchmark entry point: flags parse and --help answers before TensorFlow loads
  result = evaluate_run(run, questions, max_questions=max_questions, overrides=overrides)
  return dict(result, paper_exact_match=PAPER_EXACT_MATCH, paper=PAPER_LABEL,
              exact_match_minus_paper=result["exact_match"] - PAPER_EXACT_MATCH,
              whole_test_set=result["num_questions"] == NQ_OPEN_TEST_QUESTIONS)


def markdown(payload: dict) -> str:
  r = payload["result"]
  lines = [
      "# The released REALM NQ model through realm_tf.evaluate", "",
      f"Run `{payload['run']}` on `{payload['questions']}` ({r['num_questions']} questions"
      f"{'' if r['whole_test_set'] else ', not the whole test set'}), "
      f"measured {payload['machine']['when']}.", "",
      f"Document tower against block_emb over {payload['block_emb_check']['rows']} blocks: "
      f"relative error {payload['block_emb_check']['run']['max_relative_error']}, minimum "
      f"cosine {payload['block_emb_check']['run']['min_cosine']} (LayerNorm epsilon "
      f"{payload['block_emb_check']['run']['epsilon']}, "
      f"{payload['block_emb_check']['run']['activation']}).", "",
      f"| exact match | paper ({PAPER_LABEL}) | difference | recall@5 | recall@20 | reader oracle |"
      " evaluation |",
      "|---|---|---|---|---|---|---|",
      f"| {r['exact_match']:.3f} | {PAPER_EXACT_MATCH:.3f} | "
      f"{r['exact_match_minus_paper']:+.3f} | {r['recall@5']:.3f} | {r['recall@20']:.3f} | "
      f"{r['reader_oracle']:.3f} | {r['eval_seconds']:.0f} s |"]
  return "\n".join(lines) + "\n"


def run(released_dir: str, run_dir: str = "", questions: str = "", max_questions: int = 0,
        overrides=()) -> dict:
  """The released NQ model imported into `run_dir` (default <released_dir>/realm_nq_run)
  unless it holds a run, its tower checked against block_emb, and evaluated on `questions`
  (default: the release's NQ-Open test): the result to write."""
  run_dir = run_dir or os.path.join(released_dir, "realm_nq_run")
  questions = questions or released_paths(released_dir)["questions"]
  start = time.time()
  imported = ensure_import(released_dir, run_dir)
  check = check_tower(run_dir)
  result = evaluate(run_dir, questions, max_questions, overrides)
  return dict(run=run_dir, questions=questions, imported=imported, block_emb_check=check,
              result=result, seconds=round(time.time() - start, 1), machine=harness.machine())


def main(argv):
  del argv  # absl has parsed the flags
  payload = run(FLAGS.released_dir, FLAGS.run, FLAGS.questions, FLAGS.max_questions,
                FLAGS.override)
  path = harness.Output(FLAGS.name, markdown).write(payload)
  print(json.dumps(dict(results=path, exact_match=payload["result"]["exact_match"],
                        paper=PAPER_EXACT_MATCH), indent=2))


if __name__ == "__main__":
  define_flags()
  logging.getLogger().setLevel(logging.INFO)
  app.run(main)
