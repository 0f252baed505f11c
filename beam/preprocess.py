"""Command line of realm_tf.pipelines.preprocess: raw corpus → REALM blocks and examples.

    python -m beam.preprocess --input_format wikipedia_xml \\
        --input enwiki-latest-pages-articles.xml.bz2 --output_dir corpus/ \\
        [--max_block_length 288] [--tagger_dir tagger/] [--ict_keep_query_prob 0.1] \\
        [--tagger_model_copies N] [--title_gazetteer] \\
        [runner options, e.g. --direct_num_workers 2 --direct_running_mode multi_processing,
         or --runner DataflowRunner --project P --region R --temp_location gs://...
            --setup_file ./setup.py]

Flags this module does not know are passed untouched to Beam's PipelineOptions. The
pipeline itself (its diagram, and `prepare_corpus` to call it from Python) is in
realm_tf/pipelines/preprocess.py.
"""
import argparse
import logging
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from realm_tf.corpus import formats
from realm_tf.io import command_line
from realm_tf.pipelines.preprocess import (  # noqa: F401  (re-exported)
    STATS_FILE, PreprocessConfig, build_pipeline, prepare_corpus, run_preprocess)

_LOG = logging.getLogger("realm_tf.preprocess")
_HELP = {
    "input_format": "wikipedia_xml (pages-articles .xml/.xml.bz2), jsonl ({title, text} "
                    "lines) or ccnews (news-please JSON lines: title, maintext or text)",
    "input": "input file or glob (local or any Beam file system, e.g. gs://)",
    "output_dir": "output directory; must not exist unless --overwrite",
    "max_block_length": "wordpieces of [CLS] title [SEP] body [SEP]",
    "max_title_length": "titles longer than this many wordpieces are cut",
    "query_length": "wordpieces of [CLS] x [SEP] for pre-training queries",
    "tagger_dir": "exported salient-span tagger SavedModel; without it (and without "
                  "--title_gazetteer), dates only",
    "tagger_batch_size": "sentences per tagger call",
    "title_gazetteer": "also mark exact, case-sensitive, word-bounded mentions of other "
                       "articles' titles as entities (label TITLE); without --tagger_dir, "
                       "salient spans are then these plus dates",
    "ict_keep_query_prob": "probability that an ICT query stays in its evidence block",
    "seed": "seed of the per-block ICT draws",
    "max_chars": "records with more characters of text are set aside as too_large",
    "max_records": "read at most this many records per input file (0: all)",
    "news_language": "ccnews: keep articles whose 'language' is this ('' keeps all)",
    "vocab_file": "WordPiece vocabulary (default: the MiniLM package's uncased vocab)",
    "tokenize_batch_size": "documents (or blocks) per tokenizer call",
    "num_shards": "output shards per output (0: the runner decides)",
    "overwrite": "delete everything under an existing output directory first",
    "tagger_model_copies": "RunInference: share the tagger between a worker VM's SDK "
                           "processes, at most this many copies (0: one per process)",
}


def parse_args(argv: Optional[Sequence[str]] = None) -> Tuple[PreprocessConfig, List[str]]:
  """Known flags → a validated PreprocessConfig; the rest is for Beam, untouched."""
  defaults = PreprocessConfig()
  parser = argparse.ArgumentParser(prog="python -m beam.preprocess", description=__doc__,
                                   allow_abbrev=False,  # runner flags pass untouched
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  for name, default in defaults.as_dict().items():
    if isinstance(default, bool):
      parser.add_argument(f"--{name}", action="store_true", help=_HELP[name])
    else:
      parser.add_argument(f"--{name}", type=type(default), default=default, help=_HELP[name],
                          required=name in ("input", "output_dir"),
                          choices=formats.NAMES if name == "input_format" else None)
  parser.add_argument("--verbosity", choices=command_line.VERBOSITY_CHOICES, default="info",
                      help="debug: errors with their traceback (default: one line)")
  known, beam_args = parser.parse_known_args(argv)
  settings = vars(known)
  settings.pop("verbosity")
  config = PreprocessConfig(**settings)
  config.validate()
  return config, beam_args


def run(config: PreprocessConfig, beam_args: Sequence[str] = ()) -> Dict[str, Any]:
  """Runs the pipeline and publishes the output; returns the manifest."""
  return run_preprocess(config, beam_args)


def main(argv: Optional[Sequence[str]] = None) -> int:
  logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
  _LOG.setLevel(logging.INFO)
  debug, argv = command_line.split_verbosity(argv)
  with command_line.errors_reported("beam.preprocess", debug):
    config, beam_args = parse_args(argv)
    run(config, beam_args)
  return 0


if __name__ == "__main__":
  sys.exit(main())
