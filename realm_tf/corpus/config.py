"""The corpus pipeline's settings, typed like the experiment configs.

Written to every manifest, so an output says exactly how it was made.
"""
import dataclasses

from official.modeling.hyperparams import base_config

from realm_tf.corpus import formats


@dataclasses.dataclass
class CorpusConfig(base_config.Config):
  """How a corpus is made: the settings of `python -m beam.preprocess` that shape its
  output (see there for help). realm_tf.pipelines.preprocess.PreprocessConfig adds how
  the job runs."""
  input_format: str = "wikipedia_xml"
  input: str = ""
  output_dir: str = ""
  max_block_length: int = 288
  max_title_length: int = 64
  query_length: int = 96
  tagger_dir: str = ""
  tagger_batch_size: int = 64
  # Mentions of other articles' titles as entities (realm_tf.corpus.gazetteer): salient
  # spans for a machine with no tagger, or added to the tagger's.
  title_gazetteer: bool = False
  ict_keep_query_prob: float = 0.1
  seed: int = 0
  max_chars: int = 1_000_000
  max_records: int = 0  # per input file; 0 = all
  news_language: str = "en"
  vocab_file: str = ""  # '' = the MiniLM package's uncased vocab.txt
  tokenize_batch_size: int = 64  # documents per tokenizer call
  num_shards: int = 0  # per output; 0 = the runner decides
  overwrite: bool = False

  @property
  def max_record_bytes(self) -> int:
    """Reader memory guard: generous for XML escaping and 4-byte UTF-8 characters."""
    return 8 * self.max_chars + (1 << 16)

  def validate(self) -> None:
    problems = []
    if self.input_format not in formats.NAMES:
      problems.append(f"input_format must be one of {list(formats.NAMES)}")
    if not self.input:
      problems.append("input is required")
    if not self.output_dir:
      problems.append("output_dir is required")
    if self.max_title_length < 1 or self.max_title_length + 3 >= self.max_block_length:
      problems.append("need 1 <= max_title_length < max_block_length - 3")
    if self.query_length < 3:
      problems.append("query_length must be at least 3")
    if not 0.0 <= self.ict_keep_query_prob <= 1.0:
      problems.append("ict_keep_query_prob must be in [0, 1]")
    for name in ("max_chars", "tagger_batch_size", "tokenize_batch_size"):
      if getattr(self, name) < 1:
        problems.append(f"{name} must be positive")
    for name in ("max_records", "num_shards"):
      if getattr(self, name) < 0:
        problems.append(f"{name} must be >= 0")
    if problems:
      raise ValueError("invalid preprocessing config: " + "; ".join(problems))
