"""Corpus preprocessing: Wikipedia / JSON lines / CC-News → REALM blocks and examples.

    from realm_tf.pipelines.preprocess import PreprocessConfig, prepare_corpus
    corpus_dir = prepare_corpus(PreprocessConfig(input_format="jsonl", input="gs://b/x*",
                                                 output_dir="gs://b/corpus"),
                                pipeline_args=["--runner", "DataflowRunner", ...])

The pipeline, step by step (each a PTransform under realm_tf/pipelines/transforms/):

  MatchInputs ─┬─ ReadRecords ─ ParseDocuments ─ DropDuplicates ─ PackBlocks ─┬─ WriteBlocks ─────┐
  (+Reshuffle) │                      │                │                      ├─ MakePretraining… ─ WritePretraining ─┤
               │                      └── set aside ───┴─ WriteDeadLetters ───┼───────────────────┤
               │                                                              └─ MakeIct… ─ WriteIct ─┤
               └─ FingerprintInputs ─┐                     ChecksumFiles (every written file) ─┘
     counts of every step ───────────┴─ WriteStats → manifest.json, written last by the launcher

With --title_gazetteer, BuildTitleGazetteer turns the unique documents' titles into one
TitleGazetteer that MakePretrainingExamples reads as a side input (title mentions of other
articles become salient spans, beside the tagger's entities and the dates).

The launcher only matches the input pattern and checks paths: it never reads the corpus.
The output is published with realm_tf.io.versioned.OutputWriter over Beam's FileSystems:
files straight into the output directory (object stores have no directory rename), then
manifest.json, which lists every file with the size and CRC32C the workers computed.
"""
import dataclasses
import logging
from typing import Any, Dict, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from realm_tf.corpus import blocks as blocks_lib
from realm_tf.corpus import config as corpus_config
from realm_tf.corpus import manifest, schema
from realm_tf.io import storage, versioned
from realm_tf.pipelines.filesystems import BEAM
from realm_tf.pipelines.transforms.blocks import PackBlocks
from realm_tf.pipelines.transforms.checksums import FILE_PREFIX, ChecksumFiles
from realm_tf.pipelines.transforms.dedup import DropDuplicateDocuments
from realm_tf.pipelines.transforms.ict import MakeIctExamples
from realm_tf.pipelines.transforms.parse import ParseDocuments
from realm_tf.pipelines.transforms.pretraining import MakePretrainingExamples
from realm_tf.pipelines.transforms.read import FingerprintInputs, MatchInputs, ReadRawRecords
from realm_tf.pipelines.transforms.salient_spans import BuildTitleGazetteer
from realm_tf.pipelines.transforms.stats import CountAs, CountSetAsideByReason, WriteStats
from realm_tf.pipelines.transforms.write import WriteDeadLetters, WriteExamples
from realm_tf.pretrained.minilm import minilm_vocab_file

STATS_FILE = "_stats.json"
_LOG = logging.getLogger("realm_tf.preprocess")


@dataclasses.dataclass
class PreprocessConfig(corpus_config.CorpusConfig):
  """The corpus settings (realm_tf.corpus.config) plus how the job runs inference."""
  # > 0: the tagger is loaded once per worker VM and shared by its SDK processes, at most
  # this many copies (RunInference large_model); 0: one copy per SDK process.
  tagger_model_copies: int = 0

  def validate(self) -> None:
    super().validate()
    if self.tagger_model_copies < 0:
      raise ValueError("invalid preprocessing config: tagger_model_copies must be >= 0")


def build_pipeline(pipeline: beam.Pipeline, config: PreprocessConfig, output_dir: str) -> None:
  """Adds every step, writing outputs and the stats file into `output_dir`."""
  def out(name: str) -> str:
    return FileSystems.join(output_dir, name)

  files = pipeline | "MatchInputs" >> MatchInputs(config.input)
  raw = files | "ReadRecords" >> ReadRawRecords(config.input_format, config.max_record_bytes,
                                                config.max_records)
  parsed = raw | "ParseDocuments" >> ParseDocuments(config.input_format, config.max_chars,
                                                    config.news_language)
  unique = parsed.documents | "DropDuplicates" >> DropDuplicateDocuments()
  blocks = unique.documents | "PackBlocks" >> PackBlocks(
      config.max_block_length, config.max_title_length, config.vocab_file,
      config.tokenize_batch_size)
  gazetteer = None
  if config.title_gazetteer:
    gazetteer = unique.documents | "BuildTitleGazetteer" >> BuildTitleGazetteer()
  pretraining = blocks | "MakePretrainingExamples" >> MakePretrainingExamples(
      config.query_length, config.vocab_file, config.tagger_dir, config.tagger_batch_size,
      config.tokenize_batch_size, getattr(config, "tagger_model_copies", 0), gazetteer)
  ict = blocks | "MakeIctExamples" >> MakeIctExamples(config.ict_keep_query_prob, config.seed)
  set_aside = (parsed.set_aside, unique.set_aside) | "AllSetAside" >> beam.Flatten()

  written = (
      blocks
      | "BlockFeatures" >> beam.Map(blocks_lib.block_features)
      | "WriteBlocks" >> WriteExamples(schema.BLOCK, out("blocks"), config.num_shards),
      pretraining | "WritePretraining" >> WriteExamples(schema.PRETRAINING,
                                                        out("pretraining"), config.num_shards),
      ict | "WriteIct" >> WriteExamples(schema.ICT, out("ict"), config.num_shards),
      set_aside | "WriteDeadLetters" >> WriteDeadLetters(out("dead_letter"),
                                                         config.num_shards),
  )

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
      written | "AllWritten" >> beam.Flatten() | "ChecksumFiles" >> ChecksumFiles(),
  )
  stats | "AllStats" >> beam.Flatten() | "WriteStats" >> WriteStats(out(STATS_FILE))


def _relative(path: str, output_dir: str) -> str:
  prefix = output_dir.rstrip("/") + "/"
  if not path.startswith(prefix):
    raise ValueError(f"{path}: written outside the output directory {output_dir}")
  return path[len(prefix):]


def run_preprocess(config: PreprocessConfig,
                   pipeline_args: Sequence[str] = ()) -> Dict[str, Any]:
  """Runs the pipeline to completion and publishes the output; returns the manifest."""
  config.validate()
  if not BEAM.match_files(config.input):
    raise FileNotFoundError(f"--input {config.input} matches no files"
                            f"{storage.why_nothing_matches(config.input)}")
  versioned.check_output_dir(config.output_dir, config.overwrite, BEAM)
  if config.tagger_dir:
    if not BEAM.is_dir_like(config.tagger_dir):
      raise FileNotFoundError(f"--tagger_dir {config.tagger_dir} does not exist (no files "
                              "under it)")
  elif not config.title_gazetteer:
    _LOG.warning("No --tagger_dir: pre-training examples get date spans only. Train and "
                 "export the tagger (python -m realm_tf.tagger train) for entities, or "
                 "add --title_gazetteer.")
  salient_spans = {(True, False): "entities_and_dates",
                   (False, True): "title_mentions_and_dates",
                   (True, True): "entities_title_mentions_and_dates",
                   (False, False): "dates_only"}[(bool(config.tagger_dir),
                                                  bool(config.title_gazetteer))]
  vocab_file = config.vocab_file or minilm_vocab_file()
  output_dir = config.output_dir.rstrip("/")
  with versioned.OutputWriter(output_dir, config.overwrite, BEAM) as writer:
    if writer.deleted:
      _LOG.info("--overwrite: deleted %d objects of the previous output %s", writer.deleted,
                output_dir)
    with beam.Pipeline(options=PipelineOptions(list(pipeline_args))) as pipeline:
      build_pipeline(pipeline, config, output_dir)
    stats_path = FileSystems.join(output_dir, STATS_FILE)
    stats = versioned.read_json(stats_path, BEAM)
    FileSystems.delete([stats_path])
    files = [dict(name=_relative(v["path"], output_dir), size=v["size"], crc32c=v["crc32c"])
             for k, v in stats.items() if k.startswith(FILE_PREFIX)]
    stats = {k: v for k, v in stats.items() if not k.startswith(FILE_PREFIX)}
    result = writer.commit(
        manifest.build_manifest(stats, config.as_dict(), vocab_file, salient_spans), files)
  counts = result["counts"]
  _LOG.info("%s: %d records in, %d accepted, %d blocks, %d pre-training and %d ICT "
            "examples; set aside %s", output_dir, counts["records_in"],
            counts["accepted"], counts["blocks"], counts["pretraining_examples"],
            counts["ict_examples"], counts["set_aside"])
  return result


def prepare_corpus(config: PreprocessConfig, pipeline_args: Sequence[str] = ()) -> str:
  """Runs the corpus pipeline; returns the published corpus directory (its manifest.json
  lists every file with size and CRC32C)."""
  run_preprocess(config, pipeline_args)
  return config.output_dir.rstrip("/")
