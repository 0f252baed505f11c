"""The one assembly of a served QA module: a trained Open-QA model and its knowledge index
in, the QAModule a QA export saves out, with the search named by a small typed value.

    served_qa_module(model, index, tokenizer, config, search=ExactSearch())
    served_qa_module(model, index, tokenizer, config, search=ScannSearch())

  ExactSearch(embedding_dtype)   realm_qa: exact search over the served embeddings
                                 (float32, as evaluated, or float16: half the memory)
  ScannSearch(rescore_dtype, rows_per_shard, overrides)
                                 realm_qa_scann: ScaNN's ops over the index version's
                                 shards (built shard by shard where it carries none); its
                                 candidates re-scored from float16 (the default) or
                                 float32 embeddings, the shards then served without their
                                 int8 reordering; or, rescore_dtype None, ranked by
                                 ScaNN's own scores, no embeddings held

Why one function: `python -m realm_tf.export` (exporter.build_module) and every benchmark
that measures a served export (benchmarks/scale.py, scann_scale.py, released_scale.py)
build the module here, so a figure measured is the figure of what ships. What a question
retrieves and reads comes from the task's own rules (tasks.openqa.retrieved_blocks,
reader_body_length), so an export answers as evaluation does.
"""
import dataclasses
from typing import Mapping, Optional, Sequence, Union

from realm_tf.configs.experiment import ExperimentConfig
from realm_tf.export.qa import QAModule
from realm_tf.export.served_index import served_index_from
from realm_tf.modeling.models.openqa import OpenQAModel
from realm_tf.retrieval import scann_index
from realm_tf.retrieval.index_loading import version_scann_shards
from realm_tf.retrieval.knowledge_index import KnowledgeIndex
from realm_tf.tasks.openqa import reader_body_length, retrieved_blocks
from realm_tf.text.tokenization import Tokenizer

# Blocks per reader pass of a QA export (QAModule's max_blocks_per_pass): on a CPU a block
# costs the same in passes of up to about 20 blocks and more per block in larger ones
# (benchmarks/results/serving.md, "cost per block"), so a request of many questions is
# read 20 blocks at a time. 0 for accelerators whose throughput grows with the pass.
MAX_BLOCKS_PER_PASS = 20
# A QA export reads each request at the shortest multiple of this many wordpieces that holds
# its longest question + block (QAModule's reader_length_step; 0: always the full length):
# most reader inputs are far shorter than the reader's length (benchmarks/results/
# serving.md, "reader input used").
READER_LENGTH_STEP = 32
# Whether a QA export's reader pass is XLA-compiled (QAModule's reader_xla): the one place
# the shipped default is set (python -m realm_tf.export --reader_xla, benchmarks). Off until
# benchmarks/results/serving.md's variants show it faster on an idle machine within the
# memory rule of serving_memory.md; on, tensorflow_model_server needs
# --xla_cpu_compilation_enabled=true (deploy/entrypoint.sh passes it when this is on).
READER_XLA = False
EMBEDDING_DTYPES = ("float32", "float16")


@dataclasses.dataclass(frozen=True)
class ExactSearch:
  """Exact search over the served embeddings, in stock TensorFlow ops (realm_qa).

  Attributes:
    embedding_dtype: 'float32' (retrieval scores as evaluated) or 'float16' (half the
      memory of the largest part of a loaded version; scores carry float16 rounding).

  Raises:
    ValueError: another embedding_dtype.
  """
  embedding_dtype: str = "float32"

  kind = "realm_qa"  # the export kind this search serves

  def __post_init__(self):
    if self.embedding_dtype not in EMBEDDING_DTYPES:
      raise ValueError(f"ExactSearch: embedding_dtype must be one of {EMBEDDING_DTYPES}, "
                       f"got {self.embedding_dtype!r}")

  def describe(self) -> dict:
    """The search as a JSON-serialisable dict (an export's provenance records it)."""
    return dict(search="exact", embedding_dtype=self.embedding_dtype)


@dataclasses.dataclass(frozen=True)
class ScannSearch:
  """ScaNN's TensorFlow ops over the index version's shards (realm_qa_scann).

  Attributes:
    rescore_dtype: the embeddings that re-score ScaNN's candidates, 'float16' (the
      default: quantized scores misorder near-ties that float16 ones do not) or
      'float32', the shards then served without their int8 reordering data
      (scann_index.without_reordering); None: the shards as built, ranked and scored by
      ScaNN's own scores, and no embeddings held.
    rows_per_shard: rows of a shard built here at most, where the index version carries
      no ScaNN states (0: row_blocks.ROWS_PER_BLOCK).
    overrides: ScannParams fields of the shards built here.

  Raises:
    ValueError: another rescore_dtype, or a negative rows_per_shard.
  """
  rescore_dtype: Optional[str] = "float16"
  rows_per_shard: int = 0
  overrides: Mapping[str, object] = dataclasses.field(default_factory=dict)

  kind = "realm_qa_scann"  # the export kind this search serves

  def __post_init__(self):
    if self.rescore_dtype is not None and self.rescore_dtype not in EMBEDDING_DTYPES:
      raise ValueError(f"ScannSearch: rescore_dtype must be one of {EMBEDDING_DTYPES} or "
                       f"None (ScaNN's own scores), got {self.rescore_dtype!r}")
    if self.rows_per_shard < 0:
      raise ValueError(f"ScannSearch: rows_per_shard must be 0 (the default) or positive, "
                       f"got {self.rows_per_shard}")

  def describe(self) -> dict:
    """The search as a JSON-serialisable dict (an export's provenance records it)."""
    return dict(search="scann", rescore_dtype=self.rescore_dtype,
                rows_per_shard=self.rows_per_shard, overrides=dict(self.overrides))


Search = Union[ExactSearch, ScannSearch]


def served_shards(shards: Sequence[scann_index.ScannShard],
                  search: ScannSearch) -> list[scann_index.ScannShard]:
  """The ScaNN shards as `search` serves them: without their int8 reordering data where
  it re-scores their candidates from embeddings of its own (scann_index.
  without_reordering), else as built. What served_qa_module serves, and what a benchmark
  measures a served shard's memory on.

  Args:
    shards: the index version's (or built) ScannShards.
    search: the ScannSearch.

  Returns:
    One ScannShard per shard, in order.
  """
  if search.rescore_dtype is None:
    return list(shards)
  return [scann_index.without_reordering(shard) for shard in shards]


def served_searcher(shards: Sequence[scann_index.ScannShard], dimension: int,
                    search: ScannSearch) -> tuple:
  """The in-graph searcher a ScaNN export serves over `shards` (served_shards, then
  scann_index.graph_searcher): what served_qa_module builds, and what a benchmark of the
  served search searches with.

  Args:
    shards: the index version's (or built) ScannShards.
    dimension: the embeddings' width.
    search: the ScannSearch.

  Returns:
    (searcher, handles): the Searcher, and the ScaNN handles the module keeps tracked.
  """
  return scann_index.graph_searcher(served_shards(shards, search), dimension)


def served_qa_module(model: OpenQAModel, index: KnowledgeIndex, tokenizer: Tokenizer,
                     config: ExperimentConfig, search: Search = ExactSearch(),
                     max_blocks_per_pass: int = MAX_BLOCKS_PER_PASS,
                     reader_length_step: int = READER_LENGTH_STEP,
                     reader_xla: bool = READER_XLA,
                     release_index: bool = False) -> QAModule:
  """The QA module a QA export serves: `model` answering from `index` searched by `search`.

  Args:
    model: the fine-tuned OpenQAModel (dense retrieval), its variables built.
    index: its KnowledgeIndex with embeddings (swap / set_embeddings), backend 'exact', on
      one replica, built by the task (tasks.get_task(config).build_index) so that it
      keeps config's bodies; a committed version's ScaNN states are what ScannSearch
      serves.
    tokenizer: the run's Tokenizer.
    config: the run's ExperimentConfig (task.openqa: question length, blocks read).
    search: ExactSearch or ScannSearch (the module docstring).
    max_blocks_per_pass: blocks read per reader pass at most (0: no limit; QAModule).
    reader_length_step: reader lengths are multiples of this (0: full length; QAModule).
    reader_xla: the reader's pass XLA-compiled (QAModule).
    release_index: the index's embeddings are given up once the module has what it needs
      of them (served_index_from: a copy in another dtype, or none; a ScaNN search's states
      are loaded first), so they are not held beside it to the end: for the caller's last
      use of the index (benchmarks/results/released_scale.md profiles the ScaNN export's
      memory). Not for float32 exact search, which serves the index's own.

  Returns:
    The QAModule (kind 'realm_qa' or 'realm_qa_scann'); its `signatures()` are what the
    SavedModel serves.

  Raises:
    TypeError: `search` is neither an ExactSearch nor a ScannSearch.
    ValueError: the index keeps other bodies than config's reader reads, or as
      served_index_from and QAModule refuse their arguments.
  """
  openqa = config.task.openqa
  if index.body_length != reader_body_length(config):
    raise ValueError(f"the index keeps bodies of {index.body_length} wordpieces, the "
                     f"config's reader reads {reader_body_length(config)} "
                     "(tasks.openqa.reader_body_length): build the index with the task")
  handles = ()
  if isinstance(search, ExactSearch):
    served = served_index_from(index, tokenizer, embedding_dtype=search.embedding_dtype,
                               release_index=release_index)
  elif isinstance(search, ScannSearch):
    shards = version_scann_shards(index.export, index.embedding_blocks,
                                  index.store.block_ids, search.rows_per_shard,
                                  **search.overrides)
    searcher, handles = served_searcher(shards, index.dimension, search)
    served = served_index_from(index, tokenizer, searcher=searcher,
                               embedding_dtype=search.rescore_dtype,
                               release_index=release_index)
  else:
    raise TypeError(f"search must be an ExactSearch or a ScannSearch, got {search!r}")
  return QAModule(model, served, tokenizer, openqa.query_seq_length,
                  retrieved_blocks(openqa, index.num_blocks, training=False),
                  openqa.num_candidates, scann_handles=handles, kind=search.kind,
                  max_blocks_per_pass=max_blocks_per_pass,
                  reader_length_step=reader_length_step, reader_xla=reader_xla)


__all__ = ["ExactSearch", "MAX_BLOCKS_PER_PASS", "READER_LENGTH_STEP", "READER_XLA",
           "ScannSearch",
           "Search", "served_qa_module", "served_searcher", "served_shards"]
