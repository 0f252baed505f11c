"""Blocks → Inverse Cloze Task examples for the retriever's warm start."""
import apache_beam as beam

from realm_tf.corpus import examples


class MakeIctExamples(beam.PTransform):
  """Blocks → ICT feature dicts; the query is removed from its block with 1 - keep prob.

  Draws are seeded by (seed, block_id), so a rerun gives the same examples.
  """

  def __init__(self, keep_query_prob: float, seed: int):
    super().__init__()
    self._keep_query_prob = keep_query_prob
    self._seed = seed

  def expand(self, blocks):
    keep, seed = self._keep_query_prob, self._seed
    return blocks | "DrawQueries" >> beam.FlatMap(_draw, keep, seed)


def _draw(block, keep_query_prob, seed):
  """[] for a block of one sentence, else its one ICT example."""
  example = examples.ict_example(block, keep_query_prob, seed)
  return [] if example is None else [example]
