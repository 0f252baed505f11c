"""Corpus preprocessing: Wikipedia / JSON lines / CC-News → REALM blocks and examples.

    python -m beam.preprocess --input_format wikipedia_xml \\
        --input enwiki-latest-pages-articles.xml.bz2 --output_dir corpus/ \\
        [--max_block_length 288] [--tagger_dir tagger/] [--ict_keep_query_prob 0.1] \\
        [runner options, e.g. --direct_num_workers 2 --direct_running_mode multi_processing,
         or --runner DataflowRunner --project P --region R --temp_location gs://...
            --setup_file ./setup.py]

Flags this module does not know are passed untouched to Beam's PipelineOptions.

The pipeline, step by step (each a PTransform under beam/transforms/):

  MatchInputs ─┬─ ReadRecords ─ ParseDocuments ─ DropDuplicates ─ PackBlocks ─┬─ WriteBlocks
               │                      │                │                      ├─ MakePretrainingExamples ─ WritePretraining
               │                      └── set aside ───┴─ WriteDeadLetters     └─ MakeIctExamples ─ WriteIct
               └─ FingerprintInputs ─┐
     counts of every step ───────────┴─ WriteStats → manifest.json (written last, then the
                                                     output directory is renamed into place)
"""
import argparse
import logging
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam import publish
from beam.transforms.blocks import PackBlocks
from beam.transforms.dedup import DropDuplicateDocuments
from beam.transforms.ict import MakeIctExamples
from beam.transforms.parse import ParseDocuments
from beam.transforms.pretraining import MakePretrainingExamples
from beam.transforms.read import FingerprintInputs, ReadRawRecords
from beam.transforms.stats import CountAs, CountSetAsideByReason, WriteStats
from beam.transforms.write import WriteDeadLetters, WriteExamples
from realm_tf.corpus import blocks as blocks_lib
from realm_tf.corpus import formats, manifest, schema
from realm_tf.corpus.config import PreprocessConfig

STATS_FILE = "_stats.json"
_LOG = logging.getLogger("realm_tf.preprocess")

_HELP = {
    "input_format": "wikipedia_xml (pages-articles .xml/.xml.bz2), jsonl ({title, text} "
                    "lines) or ccnews (news-please JSON lines: title, maintext or text)",
    "input": "input file or glob (local or any Beam file system, e.g. gs://)",
    "output_dir": "output directory; must not exist unless --overwrite",
    "max_block_length": "wordpieces of [CLS] title [SEP] body [SEP]",
    "max_title_length": "titles longer than this many wordpieces are cut",
    "query_length": "wordpieces of [CLS] x [SEP] for pre-training queries",
    "tagger_dir": "exported salient-span tagger SavedModel; without it, dates only",
    "tagger_batch_size": "sentences per tagger call",
    "ict_keep_query_prob": "probability that an ICT query stays in its evidence block",
    "seed": "seed of the per-block ICT draws",
    "max_chars": "records with more characters of text are set aside as too_large",
    "max_records": "read at most this many records per input file (0: all)",
    "news_language": "ccnews: keep articles whose 'language' is this ('' keeps all)",
    "vocab_file": "WordPiece vocabulary (default: the MiniLM package's uncased vocab)",
    "tokenize_batch_size": "documents (or blocks) per tokenizer call",
    "num_shards": "output shards per output (0: the runner decides)",
    "overwrite": "replace an existing output directory",
}


def parse_args(argv: Optional[Sequence[str]] = None) -> Tuple[PreprocessConfig, List[str]]:
  """Known flags → a validated PreprocessConfig; the rest is for Beam, untouched."""
  defaults = PreprocessConfig()
  parser = argparse.ArgumentParser(prog="python -m beam.preprocess", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  for name, default in defaults.as_dict().items():
    if isinstance(default, bool):
      parser.add_argument(f"--{name}", action="store_true", help=_HELP[name])
    else:
      parser.add_argument(f"--{name}", type=type(default), default=default, help=_HELP[name],
                          required=name in ("input", "output_dir"),
                          choices=formats.NAMES if name == "input_format" else None)
  known, beam_args = parser.parse_known_args(argv)
  config = PreprocessConfig(**vars(known))
  config.validate()
  return config, beam_args


def build_pipeline(pipeline: beam.Pipeline, config: PreprocessConfig, work_dir: str) -> None:
  """Adds every step, writing outputs and the stats file into `work_dir`."""
  def out(name: str) -> str:
    return FileSystems.join(work_dir, name)

  files = pipeline | "MatchInputs" >> fileio.MatchFiles(
      config.input, empty_match_treatment=fileio.EmptyMatchTreatment.DISALLOW)
  raw = files | "ReadRecords" >> ReadRawRecords(config.input_format, config.max_record_bytes,
                                                config.max_records)
  parsed = raw | "ParseDocuments" >> ParseDocuments(config.input_format, config.max_chars,
                                                    config.news_language)
  unique = parsed.documents | "DropDuplicates" >> DropDuplicateDocuments()
  blocks = unique.documents | "PackBlocks" >> PackBlocks(
      config.max_block_length, config.max_title_length, config.vocab_file,
      config.tokenize_batch_size)
  pretraining = blocks | "MakePretrainingExamples" >> MakePretrainingExamples(
      config.query_length, config.vocab_file, config.tagger_dir, config.tagger_batch_size,
      config.tokenize_batch_size)
  ict = blocks | "MakeIctExamples" >> MakeIctExamples(config.ict_keep_query_prob, config.seed)
  set_aside = (parsed.set_aside, unique.set_aside) | "AllSetAside" >> beam.Flatten()

  (blocks
   | "BlockFeatures" >> beam.Map(blocks_lib.block_features)
   | "WriteBlocks" >> WriteExamples(schema.BLOCK, out("blocks"), config.num_shards))
  pretraining | "WritePretraining" >> WriteExamples(schema.PRETRAINING, out("pretraining"),
                                                    config.num_shards)
  ict | "WriteIct" >> WriteExamples(schema.ICT, out("ict"), config.num_shards)
  set_aside | "WriteDeadLetters" >> WriteDeadLetters(out("dead_letter"), config.num_shards)

  stats = (
      files | "FingerprintInputs" >> FingerprintInputs(),
      raw | "CountRecordsIn" >> CountAs("records_in"),
      unique.documents | "CountAccepted" >> CountAs("accepted"),
      set_aside | "CountSetAside" >> CountSetAsideByReason(),
      blocks | "CountBlocks" >> CountAs("blocks"),
      pretraining | "CountPretraining" >> CountAs("pretraining_examples"),
      pretraining | "CountWithSpans" >> CountAs(
          "pretraining_examples_with_spans", where=lambda e: e["salient_span_labels"]),
      ict | "CountIct" >> CountAs("ict_examples"),
      ict | "CountIctRemoved" >> CountAs("ict_queries_removed",
                                         where=lambda e: e["query_removed"]),
  )
  stats | "AllStats" >> beam.Flatten() | "WriteStats" >> WriteStats(out(STATS_FILE))


def run(config: PreprocessConfig, beam_args: Sequence[str] = ()) -> Dict[str, Any]:
  """Runs the pipeline to completion and publishes the output; returns the manifest."""
  from realm_tf.pretrained.minilm import minilm_vocab_file  # pylint: disable=g-import-not-at-top
  config.validate()
  if not FileSystems.match([config.input])[0].metadata_list:
    raise FileNotFoundError(f"--input {config.input} matches no files")
  publish.check_output_dir(config.output_dir, config.overwrite)
  if config.tagger_dir:
    if not FileSystems.exists(config.tagger_dir):
      raise FileNotFoundError(f"--tagger_dir {config.tagger_dir} does not exist")
    salient_spans = "entities_and_dates"
  else:
    _LOG.warning("No --tagger_dir: pre-training examples get date spans only. Train and "
                 "export the tagger (python -m realm_tf.tagger train) for entities.")
    salient_spans = "dates_only"
  vocab_file = config.vocab_file or minilm_vocab_file()
  work_dir = publish.temporary_dir(config.output_dir)
  try:
    with beam.Pipeline(options=PipelineOptions(list(beam_args))) as pipeline:
      build_pipeline(pipeline, config, work_dir)
    stats_path = FileSystems.join(work_dir, STATS_FILE)
    stats = publish.read_json(stats_path)
    FileSystems.delete([stats_path])
    result = manifest.build_manifest(stats, config.as_dict(), vocab_file, salient_spans)
    publish.publish(work_dir, config.output_dir, result, config.overwrite)
  except BaseException:
    publish.discard(work_dir)
    raise
  counts = result["counts"]
  _LOG.info("%s: %d records in, %d accepted, %d blocks, %d pre-training and %d ICT "
            "examples; set aside %s", config.output_dir, counts["records_in"],
            counts["accepted"], counts["blocks"], counts["pretraining_examples"],
            counts["ict_examples"], counts["set_aside"])
  return result


def main(argv: Optional[Sequence[str]] = None) -> int:
  logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
  _LOG.setLevel(logging.INFO)
  config, beam_args = parse_args(argv)
  run(config, beam_args)
  return 0


if __name__ == "__main__":
  sys.exit(main())
