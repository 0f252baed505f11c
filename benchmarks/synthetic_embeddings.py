"""Block and query embeddings with the structure of real ones, for ScaNN at sizes no real
corpus here reaches, checked against real embeddings they were not fitted to.

    python -m benchmarks.synthetic_embeddings --work_dir ../synthetic68 [--clusters 48]

Why: a recall measured on vectors that look like no real embedding says nothing about real
retrieval. The earlier ScaNN benchmark drew each block as its article's N(0, I) centroid
plus equal N(0, I) noise, so the 5th and 6th neighbours of a query were near-ties and
recall@5 was mostly a coin toss between them. Here a generator is fitted to real
embeddings, and trusted at 13,353,718 rows only if, on real embeddings it was not fitted
to, it gives the same recall curves and the same score gaps as the real vectors at their
size.

Steps (each kept in the work directory once done: harness.cached; each records its
commit, start, duration and the machine's load: harness.recorded):
  encoders   configs/demo.yaml's retriever at step 0 (all-MiniLM-L6-v2, mean pooling, unit
             norm: a trained sentence embedder, as the demo and the Open-QA benchmark use
             it), its block and query towers exported once.
  corpus     per real corpus in ../shared/data (CORPORA: Wikipedia leads, SQuAD's
             paragraphs, BBC news): cut into 128-wordpiece blocks (beam's preprocessing)
             and embedded by the block tower, [n, 384].
  documents  per corpus, each block's document for the splits, its title (document_key:
             a SQuAD article's paragraphs are one document, and a Wikipedia lead and its
             article's SQuAD paragraphs the same one), and the text it was cut from, the
             generator's documents (a lead, a SQuAD paragraph, a news article).
  questions  every real question set (QUESTION_SETS) embedded by the query tower, [q, 384];
             a SQuAD question belongs to its article (its title), the others to none.
Then, per split of the real data into a side the generator is fitted on and a side it is
validated on (SPLITS; nothing of the validation side is read before the validation):
  document_halves   each document on one side by a seeded hash of its title, its blocks
                    and the questions that belong to it with it; a question of no
                    document on a side by a seeded hash of its text (split_by_documents);
  corpus_to_corpus  fitted on the Wikipedia leads (less those of SQuAD's articles) and the
                    questions of no document, validated on SQuAD's paragraphs and SQuAD's
                    questions: another corpus, whole articles cut into blocks as REALM's
                    are rather than leads (split_by_corpus).
  fit       blocks and questions projected onto the fit side's blocks' top 128 right
            singular vectors (REALM's released embeddings are 128-d, a learned linear map
            of BERT's 768; this fixed map keeps the inner products' dominant structure);
            EmbeddingGenerator.fit on the fit side, its residual_scale calibrated there
            (calibrate_residual_scale). A generator changed after a validation keeps the
            earlier one's figures in <work>/superseded/, and the result reports them.
  validate  at the validation side's size, its real blocks and (up to --num_queries) real
            questions against as many generated ones: the median gap between the 5th and
            6th exact scores, and recall@5 against exact search of three ScaNN
            configurations, each at four fractions of its leaves (CONFIGURATIONS):
            the shipped tree as a realm_qa_scann export serves it, the same tree as built
            (the trainer's host search) and the REALM authors' (ORQA's).
  curve     ScaNN's recall curves at one full-size shard drawn from the document halves'
            generator (the one benchmarks.released_scale and scann_rescoring draw from).
The generator is trusted when, in every split, every recall agrees within RECALL_TOLERANCE
and the median gap within GAP_TOLERANCE (relative); the verdict is in the result either
way, with each check that failed and by how much.
"""
import argparse
import dataclasses
import hashlib
import inspect
import json
import math
import os
import tempfile
import time
from typing import NamedTuple

import numpy as np

from benchmarks import harness

DIMENSION = 128  # the released block_emb's width
RECALL_TOLERANCE = 0.02
GAP_TOLERANCE = 0.20
K = 5
# name → its file under ../shared/data. Each row a document (title, text).
CORPORA = (("wikipedia", ("wikipedia", "vital_articles.jsonl")),
           ("squad", ("openqa", "squad_open", "corpus.jsonl")),
           ("news", ("news", "bbc.jsonl")))
# name → its file. A row with a `title` (SQuAD's) belongs to that document.
QUESTION_SETS = (("nq_open", ("openqa", "nq_open", "train_subset.jsonl")),
                 ("webquestions", ("openqa", "webquestions", "train.jsonl")),
                 ("curatedtrec", ("openqa", "curatedtrec", "train.jsonl")),
                 ("squad_train", ("openqa", "squad_open", "train.jsonl")),
                 ("squad_dev", ("openqa", "squad_open", "dev.jsonl")))
# The corpus-to-corpus split: the corpus and question sets fitted on, and those validated
# on. SQuAD's paragraphs are the second corpus because SQuAD's questions belong to them
# (BBC news has none of its own) and because they are whole articles in blocks, as REALM's
# corpus is, where the leads are one to three blocks each.
FIT_CORPUS, FIT_QUESTIONS = "wikipedia", ("nq_open", "webquestions", "curatedtrec")
VALIDATION_CORPUS, VALIDATION_QUESTIONS = "squad", ("squad_train", "squad_dev")
SPLITS = ("document_halves", "corpus_to_corpus")
# Fractions of the leaves the shipped tree searches in the validation: from ScaNN's usual
# starting point (a twentieth) to the shipped default (scann_index.SEARCHED_LEAVES_FRACTION),
# since a served request can ask for any of them; the authors' at multiples of their own
# 100 of 1,000.
SHIPPED_FRACTIONS = (1 / 40, 1 / 20, 1 / 10, 1 / 5)
AUTHORS_MULTIPLES = (0.5, 1.0, 2.0, 4.0)
# The configurations validated, in the order the tables list them: name → what it is.
CONFIGURATIONS = {
    "served": "shipped tree as a realm_qa_scann export serves it (no int8 reordering, "
              "ScaNN's candidates re-scored from float16 embeddings)",
    "host": "shipped tree as built (int8 reordering of 100, ScaNN's scores: the trainer's "
            "host search)",
    "authors": "the REALM authors' (ORQA: 1,000 leaves, AH, no reordering)",
}
# The fraction the residual scale is calibrated at: low, where recall depends most on how
# scattered a question's neighbours are.
CALIBRATION_FRACTION = 1 / 20


# ------------------------------------------------------------------------- the generator

@dataclasses.dataclass
class EmbeddingGenerator:
  """Documents from a mixture of per-cluster Gaussians (each a low-rank covariance plus a
  diagonal), their blocks around them, and queries made from an indexed block as a real
  question is made from its top-1 block.

  Why this shape: real sentence embeddings cluster by topic (k-means centroids of the
  documents' mean embeddings), vary within a topic along a few directions (the low-rank
  part) and a little in every other one (the diagonal); the blocks of one article lie
  close together (a question's neighbours are often one article's blocks, which sets how
  far the 5th is from the 6th), so documents are drawn first, with the real number of
  blocks each, and their blocks around them as real blocks lie around their article's
  mean; their norms are narrow (unit vectors before the projection), which a
  Gaussian's are not, so each block is rescaled to a norm drawn from its cluster's real
  ones; a question lies near, not on, the block that answers it, and how near is what
  makes the 5th and 6th neighbours close or far. A real question q with top-1 block b is
  kept as q = scale * b + residual (residual orthogonal to b), not as the offset q - b:
  the query tower's vectors are about 20 times longer than the blocks' (MiniLM's cosine
  x 20), so an offset is mostly the question itself, and adding it to another block would
  lose the score the block gives it. And a question's top-1 block is not a random one: inner
  products favour long blocks, so a generated question takes as its block the one of its
  cluster whose norm is nearest the real top-1 block's.

  Attributes (C clusters, D dims, r rank, M real questions):
    weights: [C] cluster shares of the real documents.
    means: [C, D].
    factors: [C, D, r] principal directions x their standard deviations.
    residual_std: [C, D] the remaining per-dimension standard deviation.
    document_sizes: [S] the real documents' numbers of blocks (drawn from).
    block_factors: [C, D, r] a block's deviation from its document's mean, per cluster:
      principal directions x standard deviations (over the cluster's real documents of 2+
      blocks; a news article's blocks spread differently from an encyclopedia lead's).
    block_std: [C, D] the deviation's remaining per-dimension standard deviation.
    query_scales: [M] q.b / b.b of each real question q and its exact top-1 block b.
    query_residuals: [M, D] q - scale * b (orthogonal to b).
    query_clusters: [M] the cluster of that top-1 block.
    query_anchor_norms: [M] that block's norm.
    norms: [N] the real blocks' norms, ordered by cluster.
    norm_starts: [C + 1] where each cluster's norms start in `norms`.
    residual_scale: what a question's residual is multiplied by (calibrate_residual_scale;
      1 as fitted).
  """
  weights: np.ndarray
  means: np.ndarray
  factors: np.ndarray
  residual_std: np.ndarray
  document_sizes: np.ndarray
  block_factors: np.ndarray
  block_std: np.ndarray
  query_scales: np.ndarray
  query_residuals: np.ndarray
  query_clusters: np.ndarray
  query_anchor_norms: np.ndarray
  norms: np.ndarray
  norm_starts: np.ndarray
  residual_scale: float = 1.0

  @classmethod
  def fit(cls, blocks: np.ndarray, queries: np.ndarray, clusters: int, rank: int,
          seed: int = 0, documents: np.ndarray | None = None) -> "EmbeddingGenerator":
    """Fitted to real blocks [N, D] and real questions [Q, D] (inner-product geometry).

    Args:
      blocks: [N, D] real block embeddings.
      queries: [Q, D] real question embeddings.
      clusters: C, the k-means clusters.
      rank: r, the principal directions kept per cluster (and for blocks in documents).
      seed: k-means' seed.
      documents: [N] each block's document number (None: a document per block).

    Returns:
      The generator.
    """
    from sklearn.cluster import KMeans  # noqa: PLC0415  benchmark-only dependency
    documents = (np.arange(len(blocks)) if documents is None
                 else np.unique(documents, return_inverse=True)[1])
    sizes = np.bincount(documents)  # [S]
    doc_means = np.zeros([len(sizes), blocks.shape[1]], np.float64)
    np.add.at(doc_means, documents, blocks)
    doc_means = (doc_means / sizes[:, None]).astype(np.float32)  # [S, D]
    kmeans = KMeans(clusters, n_init=1, random_state=seed).fit(doc_means)
    doc_labels = kmeans.labels_
    labels = doc_labels[documents]  # [N]: a block's cluster is its document's
    dim = blocks.shape[1]
    weights = np.bincount(doc_labels, minlength=clusters) / len(sizes)
    in_documents = sizes[documents] > 1
    deviations = (blocks - doc_means[documents])[in_documents]  # [n, D]
    # A block's deviation from the mean of its n blocks has (n-1)/n of the variance a
    # block has around its document's centre: scaled back up.
    deviations /= np.sqrt((sizes[documents][in_documents] - 1) /
                          sizes[documents][in_documents])[:, None]
    deviation_labels = labels[in_documents]

    def spread(rows):  # [n, D] → (factors [D, r], remaining std [D])
      factors, std = np.zeros([dim, rank], np.float32), np.zeros([dim], np.float32)
      if len(rows) > 1:
        _, values, vectors = np.linalg.svd(rows, full_matrices=False)
        r = min(rank, len(values))
        factors[:, :r] = vectors[:r].T * (values[:r] / math.sqrt(len(rows)))
        std = (rows - (rows @ vectors[:r].T) @ vectors[:r]).std(0)
      return factors, std

    everyone = spread(deviations)  # for a cluster with too few documents of 2+ blocks
    block_factors = np.zeros([clusters, dim, rank], np.float32)
    block_std = np.zeros([clusters, dim], np.float32)
    for c in range(clusters):
      mine = deviations[deviation_labels == c]
      block_factors[c], block_std[c] = spread(mine) if len(mine) > rank else everyone
    means = np.zeros([clusters, dim], np.float32)
    factors = np.zeros([clusters, dim, rank], np.float32)
    residual_std = np.zeros([clusters, dim], np.float32)
    for c in range(clusters):
      members = doc_means[doc_labels == c]
      means[c] = members.mean(0)
      centred = members - means[c]
      if len(members) < 2:
        continue
      _, values, vectors = np.linalg.svd(centred, full_matrices=False)
      r = min(rank, len(values))
      std = values[:r] / math.sqrt(len(members))
      factors[c, :, :r] = vectors[:r].T * std  # [D, r]
      remainder = centred - (centred @ vectors[:r].T) @ vectors[:r]
      residual_std[c] = remainder.std(0)
    top1 = np.concatenate([np.argmax(queries[i:i + 1024] @ blocks.T, axis=1)
                           for i in range(0, len(queries), 1024)])  # [Q]
    anchors = blocks[top1]  # [Q, D]
    scales = np.sum(queries * anchors, 1) / np.sum(anchors * anchors, 1)  # [Q]
    order = np.argsort(labels, kind="stable")
    norm_starts = np.searchsorted(labels[order], np.arange(clusters + 1))
    return cls(weights.astype(np.float64), means, factors, residual_std,
               sizes.astype(np.int32), block_factors, block_std.astype(np.float32),
               scales.astype(np.float32),
               (queries - scales[:, None] * anchors).astype(np.float32),
               labels[top1].astype(np.int32),
               np.linalg.norm(anchors, axis=1).astype(np.float32),
               np.linalg.norm(blocks[order], axis=1).astype(np.float32),
               norm_starts.astype(np.int64))

  def save(self, path: str) -> str:
    np.savez(path, **dataclasses.asdict(self))
    return path

  def fingerprint(self) -> str:
    """A short hash of every field's values: which generator a result was measured with
    (benchmarks.released_scale compares its generator's with the one validated here)."""
    digest = hashlib.sha256()
    for field in dataclasses.fields(self):
      value = np.asarray(getattr(self, field.name))
      digest.update(f"{field.name}:{value.dtype.str}:{value.shape}".encode())
      digest.update(np.ascontiguousarray(value).tobytes())
    return digest.hexdigest()[:16]

  @classmethod
  def load(cls, path: str) -> "EmbeddingGenerator":
    with np.load(path) as data:
      return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)})

  def blocks(self, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` block embeddings and their clusters, a function of (count, seed) alone: a
    full-size run writes shard s as blocks(shard_rows, seed=s).

    Returns:
      (vectors [count, D] float32, clusters [count] int32).
    """
    rng = np.random.default_rng(seed)
    # Enough documents for `count` blocks (the real mean size, with a margin), cut to fit.
    num_docs = int(count / self.document_sizes.mean() * 1.1) + 10
    sizes = rng.choice(self.document_sizes, size=num_docs)
    while sizes.sum() < count:
      sizes = np.concatenate([sizes, rng.choice(self.document_sizes, size=num_docs)])
    doc_clusters = rng.choice(len(self.weights), size=len(sizes), p=self.weights)
    dim, rank = self.means.shape[1], self.factors.shape[2]
    centres = self.means[doc_clusters] + (
        rng.standard_normal([len(sizes), dim], dtype=np.float32) *
        self.residual_std[doc_clusters])
    z = rng.standard_normal([len(sizes), rank], dtype=np.float32)
    for c in np.unique(doc_clusters):  # one matmul per cluster, not per document
      docs = doc_clusters == c
      centres[docs] += z[docs] @ self.factors[c].T
    owner = np.repeat(np.arange(len(sizes)), sizes)[:count]  # [count] document of each
    clusters = doc_clusters[owner].astype(np.int32)
    w = rng.standard_normal([count, self.block_factors.shape[2]], dtype=np.float32)
    out = centres[owner] + (rng.standard_normal([count, dim], dtype=np.float32) *
                            self.block_std[clusters])
    for c in np.unique(clusters):
      rows = clusters == c
      out[rows] += w[rows] @ self.block_factors[c].T
      real = self.norms[self.norm_starts[c]:self.norm_starts[c + 1]]
      target = rng.choice(real, size=int(rows.sum()))
      out[rows] *= (target / np.maximum(np.linalg.norm(out[rows], axis=1), 1e-12))[:, None]
    return out.astype(np.float32), clusters

  def queries(self, pool: np.ndarray, pool_clusters: np.ndarray, count: int,
              seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Questions about blocks of `pool` (generated blocks [n, D] and their clusters [n]):
    each a real question (drawn among those whose top-1 block's cluster is in the pool)
    made again from the pool's block of that cluster whose norm is nearest the real top-1
    block's: scale * x plus the real residual with its component along x taken out, at the
    residual's own length.

    Returns:
      (questions [count, D] float32, their blocks' rows in `pool` [count]).
    """
    rng = np.random.default_rng(seed)
    norms = np.linalg.norm(pool, axis=1)
    by_cluster = {}  # cluster → (its pool rows sorted by norm, those norms)
    for c in np.unique(pool_clusters):
      rows = np.flatnonzero(pool_clusters == c)
      rows = rows[np.argsort(norms[rows])]
      by_cluster[int(c)] = (rows, norms[rows])
    usable = np.flatnonzero(np.isin(self.query_clusters, list(by_cluster)))
    picks = rng.choice(usable, size=count)
    anchors = np.empty(count, np.int64)
    for j, i in enumerate(picks):
      rows, sorted_norms = by_cluster[int(self.query_clusters[i])]
      at = np.clip(np.searchsorted(sorted_norms, self.query_anchor_norms[i]), 1, len(rows) - 1)
      nearer = at - (abs(sorted_norms[at - 1] - self.query_anchor_norms[i]) <=
                     abs(sorted_norms[at] - self.query_anchor_norms[i]))
      anchors[j] = rows[nearer if len(rows) > 1 else 0]
    x = pool[anchors]
    residual = self.query_residuals[picks]  # [count, D]
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    orthogonal = residual - np.sum(residual * unit, 1, keepdims=True) * unit
    orthogonal *= (self.residual_scale * np.linalg.norm(residual, axis=1) /
                   np.maximum(np.linalg.norm(orthogonal, axis=1), 1e-12))[:, None]
    return (self.query_scales[picks][:, None] * x + orthogonal).astype(np.float32), anchors


CALIBRATION_SCALES = (0.9, 1.0, 1.1, 1.2, 1.3, 1.4)


def calibrate_residual_scale(generator: EmbeddingGenerator, blocks: np.ndarray,
                             documents: np.ndarray, queries: np.ndarray, seed: int,
                             repeats: int = 2) -> tuple[float, list]:
  """The residual_scale at which generated questions are as hard to search as real ones,
  fitted where the validation does not look: at half the real corpus, on other questions.

  Why a scale at all: a real question's residual (what is left of it beside its top-1
  block) points at other real blocks, since the same towers embedded both; moved onto a
  generated block it points at nothing in particular. So a generated question's top-1
  stands further above its other neighbours than a real one's (median top-1 minus 5th
  score 2.58 against 1.18 as fitted), its top 5 lie closer together, and ScaNN's tree finds
  them more easily (recall@5 +0.014 to +0.024 over the real vectors' at every leaf
  fraction, as first measured in sample). A longer residual scatters the neighbours
  again. The scale is one number, fitted to one recall (the shipped tree searching
  CALIBRATION_FRACTION of its leaves) on the fit side's even-numbered documents (half its
  blocks) and some of its questions; the validation then checks it on the other side, at
  every fraction, for every configuration. It is an extrapolation all the same: from
  thousands of blocks to about twice as many, not to 500 times as many.

  Args:
    generator: fitted, residual_scale 1.
    blocks: [N, D] the fit side's real blocks.
    documents: [N] each block's document number.
    queries: [M, D] some of the fit side's real questions.
    seed: the generated half's seed (questions: seed + 1).
    repeats: ScaNN builds each recall is the mean of.

  Returns:
    (the scale, [{residual_scale, recall_at_5}] the synthetic recall at each
    CALIBRATION_SCALES plus the real one as residual_scale None), the scale interpolated
    linearly between the two grid points whose recalls straddle the real one (the grid's
    end when none do).
  """
  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval.scann_index import scann_params_for  # noqa: PLC0415
  # pylint: enable=g-import-not-at-top
  half = blocks[documents % 2 == 0]
  tree = scann_params_for(len(half), mode="tree_ah_reorder")
  _, params = searching(tree, CALIBRATION_FRACTION * tree.num_leaves)

  def recall(vectors, questions):
    truth, _ = exact_top(vectors, questions, K)
    return float(np.mean(build_recalls(vectors, questions, truth, params, repeats)))

  target = recall(half, queries)
  synthetic, clusters = generator.blocks(len(half), seed=seed)
  table = [dict(residual_scale=None, recall_at_5=target, blocks=len(half),
                leaves=params.num_leaves, leaves_searched=params.num_leaves_to_search)]
  recalls = []
  for scale in CALIBRATION_SCALES:
    scaled = dataclasses.replace(generator, residual_scale=scale)
    questions, _ = scaled.queries(synthetic, clusters, len(queries), seed=seed + 1)
    recalls.append(recall(synthetic, questions))
    table.append(dict(residual_scale=scale, recall_at_5=recalls[-1]))
  return straddle(CALIBRATION_SCALES, recalls, target), table


def straddle(scales, recalls, target: float) -> float:
  """The scale at which recall reaches `target`, interpolated linearly between the first
  two neighbouring grid points whose recalls straddle it (recall falls as the scale grows);
  the grid's first scale when every recall is below the target, its last when every one is
  above."""
  for s0, r0, s1, r1 in zip(scales, recalls, scales[1:], recalls[1:]):
    if r0 >= target >= r1:
      return float(s0 if r0 == r1 else s0 + (s1 - s0) * (r0 - target) / (r0 - r1))
  return float(scales[0] if target >= max(recalls) else scales[-1])


# ------------------------------------------------------------------------ the real data

def _jsonl(path: str) -> list:
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def document_key(title: str) -> str:
  """The document a title names, across corpora: spaces collapsed, case folded (SQuAD's
  "Amazon rainforest" paragraphs and the Wikipedia lead of that title are one document)."""
  return " ".join(title.split()).casefold()


def encoders_step(work_dir: str) -> dict:
  """configs/demo.yaml's retriever at step 0, its block and query towers exported."""
  # pylint: disable=g-import-not-at-top
  from realm_tf.configs import load_config  # noqa: PLC0415  heavy: only steps that embed
  from realm_tf.modeling import factory  # noqa: PLC0415
  from realm_tf.retrieval.encoders import (  # noqa: PLC0415
      BlockEncoder, QueryEncoder, export_encoder)
  from realm_tf.text import Tokenizer  # noqa: PLC0415
  # pylint: enable=g-import-not-at-top
  config = load_config(os.path.join(harness.REPO, "configs", "demo.yaml"))
  retriever = factory.build_retriever(config)
  tokenizer = Tokenizer()
  r = config.model.retriever
  return dict(
      block_encoder=export_encoder(
          BlockEncoder(retriever.document_embedder, tokenizer, r.block_seq_length),
          os.path.join(work_dir, "export", "block_encoder"), step=0),
      query_encoder=export_encoder(
          QueryEncoder(retriever.query_embedder, tokenizer, r.query_seq_length),
          os.path.join(work_dir, "export", "query_encoder"), step=0),
      encoder="all-MiniLM-L6-v2 (configs/demo.yaml, step 0)",
      block_seq_length=int(r.block_seq_length))


def _index_rows(directory: str) -> tuple:
  """(embeddings [n, 384], block ids [n]) of <directory>/index in its row order."""
  # pylint: disable-next=g-import-not-at-top
  from realm_tf.retrieval import load_searcher  # noqa: PLC0415  heavy: loads TensorFlow
  shards = load_searcher(os.path.join(directory, "index"), backend="exact").shards
  return (np.concatenate([s.embeddings.numpy() for s in shards]),
          np.concatenate([s.block_ids for s in shards]))


def corpus_step(work_dir: str, name: str, parts: tuple, block_encoder: str,
                batch_size: int) -> dict:
  """One corpus's documents in 128-wordpiece blocks, embedded: <work>/corpora/<name>/
  blocks.npy [n, 384] in the index's row order."""
  # pylint: disable-next=g-import-not-at-top
  from realm_tf.pipelines import embed, preprocess  # noqa: PLC0415  heavy: Beam, TensorFlow
  directory = os.path.join(work_dir, "corpora", name)
  os.makedirs(directory, exist_ok=True)
  rows = _jsonl(os.path.join(harness.SHARED_DATA, *parts))
  articles = os.path.join(directory, "articles.jsonl")
  harness.write_text(articles, "".join(
      json.dumps(dict(title=row["title"], text=row["text"])) + "\n" for row in rows))
  preprocess.prepare_corpus(preprocess.PreprocessConfig(
      input_format="jsonl", input=articles, output_dir=os.path.join(directory, "corpus"),
      max_block_length=128))
  embed.embed_corpus(embed.EmbedConfig(
      blocks=os.path.join(directory, "corpus"), encoder=block_encoder,
      output_dir=os.path.join(directory, "index"), num_shards=1, batch_size=batch_size,
      build_scann=False))
  blocks, _ = _index_rows(directory)
  np.save(os.path.join(directory, "blocks.npy"), blocks)
  return dict(file="/".join(parts), rows_read=len(rows), blocks=len(blocks))


def documents_step(work_dir: str, name: str) -> dict:
  """Each block's documents, in blocks.npy's row order, into <work>/corpora/<name>/
  documents.json: `documents`, its title's document_key (what a split keeps on one side:
  a SQuAD article's paragraphs, and a lead of that title), and `sources`, the text it was
  cut from (the preprocessing's doc_uid: a lead, a SQuAD paragraph, a news article: the
  documents the generator is fitted with, as it always was)."""
  # pylint: disable-next=g-import-not-at-top
  from realm_tf.data import block_store  # noqa: PLC0415  heavy: loads TensorFlow
  directory = os.path.join(work_dir, "corpora", name)
  _, block_ids = _index_rows(directory)
  store = block_store.BlockStore.from_tfrecords(
      block_store.blocks_pattern(os.path.join(directory, "corpus")))
  rows = store.rows(block_ids)
  titles = store.title_strings
  documents = [document_key(titles[row]) for row in rows]
  sources = [uid.decode() if isinstance(uid, bytes) else str(uid)
             for uid in store.doc_uids[rows]]
  harness.write_json(os.path.join(directory, "documents.json"),
                     dict(documents=documents, sources=sources))
  return dict(documents=len(set(documents)), sources=len(set(sources)))


def questions_step(work_dir: str, query_encoder: str) -> dict:
  """Every question set embedded: <work>/questions/<set>.npy [q, 384] and <set>.json (the
  texts, and each question's document_key or '' for none)."""
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # noqa: PLC0415
  from realm_tf.retrieval.encoders import load_encoder  # noqa: PLC0415
  # pylint: enable=g-import-not-at-top
  directory = os.path.join(work_dir, "questions")
  os.makedirs(directory, exist_ok=True)
  encode = load_encoder(query_encoder)
  out = {}
  for name, parts in QUESTION_SETS:
    rows = _jsonl(os.path.join(harness.SHARED_DATA, *parts))
    texts = [row["question"] for row in rows]
    vectors = np.concatenate([encode(text=tf.constant(texts[i:i + 256]))["embeddings"].numpy()
                              for i in range(0, len(texts), 256)])
    np.save(os.path.join(directory, f"{name}.npy"), vectors)
    documents = [document_key(row["title"]) if row.get("title") else "" for row in rows]
    harness.write_json(os.path.join(directory, f"{name}.json"),
                       dict(texts=texts, documents=documents))
    out[name] = dict(file="/".join(parts), questions=len(rows),
                     with_a_document=sum(1 for d in documents if d))
  return out


class RealData(NamedTuple):
  """Every real block and question, corpus after corpus and set after set."""
  blocks: np.ndarray  # [N, D]
  block_corpora: np.ndarray  # [N] str: the corpus's name
  block_documents: np.ndarray  # [N] str: document_key (of its title)
  block_sources: np.ndarray  # [N] str: the text it was cut from (documents_step)
  questions: np.ndarray  # [Q, D]
  question_sets: np.ndarray  # [Q] str
  question_documents: np.ndarray  # [Q] str: document_key, '' for none
  question_texts: np.ndarray  # [Q] str


def real_data(work_dir: str) -> RealData:
  """What the corpus and questions steps wrote, read back."""
  blocks, corpora, documents, sources = [], [], [], []
  for name, _ in CORPORA:
    directory = os.path.join(work_dir, "corpora", name)
    blocks.append(np.load(os.path.join(directory, "blocks.npy")))
    read = harness.read_json(os.path.join(directory, "documents.json"))
    documents += read["documents"]
    sources += read["sources"]
    corpora += [name] * len(blocks[-1])
  questions, sets, question_documents, texts = [], [], [], []
  for name, _ in QUESTION_SETS:
    questions.append(np.load(os.path.join(work_dir, "questions", f"{name}.npy")))
    read = harness.read_json(os.path.join(work_dir, "questions", f"{name}.json"))
    question_documents += read["documents"]
    texts += read["texts"]
    sets += [name] * len(questions[-1])
  return RealData(np.concatenate(blocks), np.array(corpora), np.array(documents),
                  np.array(sources), np.concatenate(questions), np.array(sets), np.array(question_documents),
                  np.array(texts))


# ----------------------------------------------------------------------------- splits

class Split(NamedTuple):
  """Rows of RealData on each side: the generator is fitted on one, validated on the
  other."""
  fit_blocks: np.ndarray  # [n] int64 rows of RealData.blocks
  fit_questions: np.ndarray  # [m] int64 rows of RealData.questions
  validation_blocks: np.ndarray
  validation_questions: np.ndarray


def in_first_half(keys, seed: int) -> np.ndarray:
  """[n] bool: whether each key falls in the first half, by a seeded hash of the key alone
  (ids.record_rng), so its side depends on neither the order nor the other keys."""
  # pylint: disable-next=g-import-not-at-top
  from realm_tf.corpus import ids  # noqa: PLC0415
  return np.array([ids.record_rng(seed, key).random() < 0.5 for key in keys], bool)


def split_by_documents(data: RealData, seed: int) -> Split:
  """Every corpus's documents in two halves, each document's blocks on one side and the
  questions that belong to it with them; a question of no document on a side of its own,
  by a seeded hash of its text (a question asked twice, in one set or two, lands on one
  side).

  Args:
    data: RealData.
    seed: the hash's seed.

  Returns:
    The Split.

  Raises:
    ValueError: a question belongs to a document no corpus holds.
  """
  held = set(data.block_documents.tolist())
  orphans = sorted(set(d for d in data.question_documents.tolist() if d) - held)
  if orphans:
    raise ValueError(f"questions belong to documents no corpus holds: {orphans[:5]}")
  block_side = in_first_half([f"document:{d}" for d in data.block_documents], seed)
  question_side = in_first_half(
      [f"document:{d}" if d else f"question:{document_key(t)}"
       for d, t in zip(data.question_documents, data.question_texts)], seed)
  return Split(np.flatnonzero(block_side), np.flatnonzero(question_side),
               np.flatnonzero(~block_side), np.flatnonzero(~question_side))


def split_by_corpus(data: RealData, fit_corpus: str, fit_questions, validation_corpus: str,
                    validation_questions) -> Split:
  """Fitted on one corpus, validated on another: the fit corpus less its documents the
  validation corpus holds too (a Wikipedia lead of a SQuAD article), each side with its
  own question sets.

  Args:
    data: RealData.
    fit_corpus, validation_corpus: corpus names (CORPORA).
    fit_questions, validation_questions: question set names (QUESTION_SETS), disjoint.

  Returns:
    The Split.

  Raises:
    ValueError: an unknown corpus or set, one corpus on both sides, or a set on both.
  """
  corpora, sets = set(data.block_corpora.tolist()), set(data.question_sets.tolist())
  unknown = ({fit_corpus, validation_corpus} - corpora) | (
      set(fit_questions) | set(validation_questions)) - sets
  if unknown:
    raise ValueError(f"split_by_corpus: no corpus or question set named {sorted(unknown)}")
  if fit_corpus == validation_corpus or set(fit_questions) & set(validation_questions):
    raise ValueError(f"split_by_corpus: {fit_corpus} {list(fit_questions)} and "
                     f"{validation_corpus} {list(validation_questions)} overlap")
  validation = data.block_corpora == validation_corpus
  shared = np.isin(data.block_documents, np.unique(data.block_documents[validation]))
  fit = (data.block_corpora == fit_corpus) & ~shared
  return Split(np.flatnonzero(fit), np.flatnonzero(np.isin(data.question_sets, fit_questions)),
               np.flatnonzero(validation),
               np.flatnonzero(np.isin(data.question_sets, validation_questions)))


def make_split(name: str, data: RealData, seed: int) -> Split:
  """The split named `name` (SPLITS) of `data`."""
  if name == "document_halves":
    return split_by_documents(data, seed)
  if name == "corpus_to_corpus":
    return split_by_corpus(data, FIT_CORPUS, FIT_QUESTIONS, VALIDATION_CORPUS,
                           VALIDATION_QUESTIONS)
  raise ValueError(f"unknown split {name!r}; one of {SPLITS}")


def describe_split(data: RealData, split: Split) -> dict:
  """What each side holds: blocks and documents by corpus, questions by set."""
  def side(blocks, questions):
    corpora = data.block_corpora[blocks]
    return dict(
        blocks=int(len(blocks)), documents=int(len(np.unique(data.block_documents[blocks]))),
        questions=int(len(questions)),
        blocks_by_corpus={c: int(n) for c, n in zip(*np.unique(corpora, return_counts=True))},
        documents_by_corpus={c: int(len(np.unique(data.block_documents[blocks][corpora == c])))
                             for c in np.unique(corpora)},
        questions_by_set={s: int(n) for s, n in zip(*np.unique(data.question_sets[questions],
                                                               return_counts=True))})
  return dict(fit=side(split.fit_blocks, split.fit_questions),
              validation=side(split.validation_blocks, split.validation_questions))


def sample(rows: np.ndarray, limit: int, seed: int) -> np.ndarray:
  """At most `limit` of `rows`, drawn without replacement by `seed`, in their order."""
  if len(rows) <= limit:
    return np.asarray(rows)
  return np.sort(np.random.default_rng(seed).choice(rows, size=limit, replace=False))


# -------------------------------------------------------------------------------- fit

def projection(blocks: np.ndarray) -> tuple:
  """The blocks' top DIMENSION right singular vectors (uncentred: inner products are what
  is searched) as a [D, DIMENSION] map, and the share of the blocks' energy it keeps."""
  _, values, vectors = np.linalg.svd(blocks, full_matrices=False)
  return (vectors[:DIMENSION].T.astype(np.float32),
          float((values[:DIMENSION] ** 2).sum() / (values ** 2).sum()))


def fit_generator(blocks: np.ndarray, documents: np.ndarray, questions: np.ndarray,
                  clusters: int, rank: int, num_queries: int, seed: int) -> tuple:
  """The generator fitted to one side's blocks and questions, then its residual_scale
  calibrated (calibrate_residual_scale) on up to num_queries // 2 of those questions.

  Args:
    blocks: [N, P] the side's projected blocks.
    documents: [N] each block's document (any labels).
    questions: [Q, P] the side's projected questions.
    clusters, rank: EmbeddingGenerator.fit's.
    num_queries: twice the calibration's questions at most.
    seed: the calibration's questions and generated half (seed + 2).

  Returns:
    (the generator, what the fit found: clusters, rank, residual_scale, calibration,
    calibration_questions, documents, blocks_per_document (mean, largest) and the
    smallest and largest cluster's documents).
  """
  codes = np.unique(documents, return_inverse=True)[1]
  generator = EmbeddingGenerator.fit(blocks, questions, clusters, rank, documents=codes)
  rows = sample(np.arange(len(questions)), max(1, num_queries // 2), seed)
  scale, calibration = calibrate_residual_scale(generator, blocks, codes, questions[rows],
                                                seed=seed + 2)
  generator = dataclasses.replace(generator, residual_scale=scale)
  documents_fitted = len(generator.document_sizes)
  return generator, dict(
      clusters=clusters, rank=rank, residual_scale=scale, calibration=calibration,
      calibration_questions=int(len(rows)), documents=documents_fitted,
      blocks_per_document=dict(mean=float(generator.document_sizes.mean()),
                               largest=int(generator.document_sizes.max())),
      smallest_cluster_documents=int(round(generator.weights.min() * documents_fitted)),
      largest_cluster_documents=int(round(generator.weights.max() * documents_fitted)))


def fit_step(work_dir: str, name: str, clusters: int, rank: int, num_queries: int,
             seed: int) -> dict:
  """Split `name`'s fit side: its projection (<work>/<name>/projection.npy) and its
  generator (<work>/<name>/generator.npz), from the fit side alone. The generator's
  documents are the texts the blocks were cut from (RealData.block_sources), as it was
  always fitted; the split's are titles, which hold a SQuAD article's paragraphs together
  on one side. (A first run fitted titles as documents too, a SQuAD article as one
  document of ~80 blocks: a change the fit side gave no reason for, reverted.)"""
  data = real_data(work_dir)
  split = make_split(name, data, seed)
  directory = os.path.join(work_dir, name)
  os.makedirs(directory, exist_ok=True)
  basis, energy = projection(data.blocks[split.fit_blocks])
  np.save(os.path.join(directory, "projection.npy"), basis)
  generator, found = fit_generator(
      data.blocks[split.fit_blocks] @ basis, data.block_sources[split.fit_blocks],
      data.questions[split.fit_questions] @ basis, clusters, rank, num_queries, seed)
  path = generator.save(os.path.join(directory, "generator.npz"))
  return dict(found, split=describe_split(data, split),
              projection=dict(dimension=DIMENSION, energy_kept=energy),
              generator=path, fingerprint=generator.fingerprint())


# ------------------------------------------------------------------------- validation

# Scores exact_top holds at a time: [questions, rows] float32 of at most this many (256 MiB;
# 1,024 questions at a time over a 1.03M-row shard held 4 GiB, and the run's peak with its
# partition's copies went past what the shared machine had free).
EXACT_CHUNK = 1 << 26


def exact_top(vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple:
  """Exact top-k rows and scores by inner product, best first ([Q, k] each)."""
  rows, scores = [], []
  step = max(1, min(1024, EXACT_CHUNK // max(1, len(vectors))))
  for start in range(0, len(queries), step):
    s = queries[start:start + step] @ vectors.T
    top = np.argpartition(-s, k, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(s, top, 1), axis=1)
    top = np.take_along_axis(top, order, 1)
    rows.append(top)
    scores.append(np.take_along_axis(s, top, 1))
  return np.concatenate(rows), np.concatenate(scores)


def searching(params, leaves: float):
  """(leaf fraction, params searching `leaves` of its leaves, rounded, at least 1)."""
  searched = max(1, min(params.num_leaves, int(round(leaves))))
  return searched / params.num_leaves, dataclasses.replace(params,
                                                           num_leaves_to_search=searched)


def configurations(n: int) -> dict:
  """name → [(leaf fraction, ScannParams)] of the configurations searched at their build
  settings: the shipped tree as built ('host') at SHIPPED_FRACTIONS of its leaves and the
  authors' configuration at AUTHORS_MULTIPLES of its own searched leaves."""
  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval.scann_index import AUTHORS_PARAMS, scann_params_for  # noqa: PLC0415
  # pylint: enable=g-import-not-at-top
  shipped = scann_params_for(n, mode="tree_ah_reorder")
  return dict(
      host=[searching(shipped, f * shipped.num_leaves) for f in SHIPPED_FRACTIONS],
      authors=[searching(AUTHORS_PARAMS, m * AUTHORS_PARAMS.num_leaves_to_search)
               for m in AUTHORS_MULTIPLES])


def build_recalls(vectors: np.ndarray, queries: np.ndarray, truth: np.ndarray, params,
                  repeats: int) -> list:
  """recall@K against `truth` [Q, K] of `repeats` ScaNN builds of `params` over `vectors`
  (each searched at its build-time settings, then released)."""
  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval.scann_index import build_scann, release  # noqa: PLC0415
  # pylint: enable=g-import-not-at-top
  recalls = []
  for _ in range(repeats):
    searcher = build_scann(vectors, params, num_neighbors=K)
    found, _ = searcher.search_batched(queries, final_num_neighbors=K)
    release(searcher)
    recalls.append(harness.recall(found.numpy(), truth))
  return recalls


def served_curve(vectors: np.ndarray, queries: np.ndarray, truth: np.ndarray,
                 repeats: int) -> list:
  """recall@K against `truth` [Q, K] of the shipped tree as a realm_qa_scann export serves
  it, at SHIPPED_FRACTIONS of its leaves, each the mean over `repeats` builds.

  Served as the one assembly serves it (realm_tf.export.assembly.served_qa_module with the
  default ScannSearch), from its own pieces: the shard built as the index builder builds
  one (scann_index.build_shards; the tree asked for at this size, as in the other rows),
  stripped of its int8 reordering and searched through in-graph handles
  (assembly.served_searcher, as the export builds it), under a ServedIndex that holds the
  rows in the search's rescore_dtype and re-scores the searcher's rescored_candidates; each
  fraction asked per call, as a request's leaves_fraction (scann_index.searching_with).

  Args:
    vectors: [N, P] the rows served.
    queries: [Q, P] the questions.
    truth: [Q, K] their exact top K rows.
    repeats: builds (ScaNN's k-means is not seeded).

  Returns:
    [dict(leaf_fraction: of the leaves searched, leaves, leaves_searched,
    rescored_candidates, recall_at_5: the mean, builds: each build's)], one per fraction.
  """
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # noqa: PLC0415
  from realm_tf.data import block_texts  # noqa: PLC0415
  from realm_tf.export import assembly, served_index  # noqa: PLC0415
  from realm_tf.retrieval import scann_index  # noqa: PLC0415
  from realm_tf.text import Tokenizer  # noqa: PLC0415
  # pylint: enable=g-import-not-at-top
  search = assembly.ScannSearch()
  ids = np.arange(len(vectors), dtype=np.int64)
  fetch = served_index.rescored_candidates(K, len(ids))
  builds = [[] for _ in SHIPPED_FRACTIONS]
  with tempfile.TemporaryDirectory(prefix="served-texts-") as scratch:
    # A ServedIndex reads the retrieved blocks' texts from a store; recall reads ids only,
    # so every block's title and text are empty.
    texts_dir = os.path.join(scratch, "texts")
    block_texts.write_block_texts(texts_dir, ((i, "", "") for i in ids.tolist()), len(ids))
    texts, tokenizer = block_texts.BlockTexts(texts_dir), Tokenizer()
    for _ in range(repeats):
      shards = scann_index.build_shards(vectors, ids, rows_per_shard=len(ids),
                                        mode="tree_ah_reorder")
      searcher, _ = assembly.served_searcher(shards, vectors.shape[1], search)
      # Lc and Lb matter only to gather, which recall does not call.
      index = served_index.ServedIndex(vectors, ids, texts, tokenizer, 2, 1,
                                       searcher=searcher, embedding_dtype=search.rescore_dtype)
      for fraction, recalls in zip(SHIPPED_FRACTIONS, builds):
        with scann_index.searching_with(scann_index.SearchOptions(leaves_fraction=fraction)):
          found = np.concatenate([index.search(tf.constant(queries[i:i + 1000]), K)
                                  .block_ids.numpy() for i in range(0, len(queries), 1000)])
        recalls.append(harness.recall(found, truth))
      layout = shards[0].layout
  out = []
  for fraction, recalls in zip(SHIPPED_FRACTIONS, builds):
    # A shard without a tree (brute force) scores every block, whatever the fraction.
    searched = (scann_index.leaves_to_search(fraction, layout) if layout.num_leaves else 0)
    out.append(dict(leaf_fraction=searched / layout.num_leaves if layout.num_leaves else 1.0,
                    leaves=layout.num_leaves, leaves_searched=searched,
                    rescored_candidates=fetch,
                    recall_at_5=float(np.mean(recalls)), builds=recalls))
  return out


def recall_curves(vectors: np.ndarray, queries: np.ndarray, truth: np.ndarray,
                  repeats: int) -> dict:
  """recall@K against `truth` [Q, K] for every configuration (CONFIGURATIONS) and leaf
  fraction, the mean over `repeats` builds: ScaNN's k-means is not seeded, and one build's
  recall moves by about 0.01 from the next, half the tolerance compared against."""
  out = dict(served=served_curve(vectors, queries, truth, repeats))
  for name, rows in configurations(len(vectors)).items():
    curve = []
    for fraction, params in rows:
      recalls = build_recalls(vectors, queries, truth, params, repeats)
      curve.append(dict(leaf_fraction=fraction, leaves=params.num_leaves,
                        leaves_searched=params.num_leaves_to_search,
                        recall_at_5=float(np.mean(recalls)), builds=recalls))
    out[name] = curve
  return out


def describe(vectors: np.ndarray, queries: np.ndarray, repeats: int) -> dict:
  """What the validation compares, for one set of vectors and questions."""
  rows, scores = exact_top(vectors, queries, K + 1)
  gap = scores[:, K - 1] - scores[:, K]
  norms = np.linalg.norm(vectors, axis=1)
  # How close a question's top 5 lie together (one article's paragraphs, or five
  # documents'): the mean cosine of its top 5 blocks' pairs.
  top = vectors[rows[:, :K]] / norms[rows[:, :K]][:, :, None]  # [Q, K, P]
  cosines = np.einsum("qip,qjp->qij", top, top)
  pairs = (cosines.sum(axis=(1, 2)) - K) / (K * (K - 1))
  return dict(
      top5_pair_cosine_median=float(np.median(pairs)),
      gap_5th_6th_median=float(np.median(gap)),
      gap_5th_6th_median_relative=float(np.median(gap / np.abs(scores[:, 0]))),
      top1_score_median=float(np.median(scores[:, 0])),
      top1_minus_5th_median=float(np.median(scores[:, 0] - scores[:, K - 1])),
      norm_quantiles=[float(q) for q in np.quantile(norms, [0.05, 0.5, 0.95])],
      recall=recall_curves(vectors, queries, rows[:, :K], repeats))


def validate(blocks: np.ndarray, questions: np.ndarray, generator: "EmbeddingGenerator",
             seed: int, repeats: int) -> dict:
  """Real blocks [N, P] and questions [Q, P] against N blocks and Q questions about them
  drawn from `generator` (blocks at `seed`, questions at seed + 1): every configuration's
  recall curve and the median 5th-6th score gap, and the verdict.

  Returns:
    dict(blocks, queries, repeats, real, synthetic: describe's, table: a row per
    configuration and fraction, gap_ratio: synthetic / real, recall_agrees, gap_agrees,
    failed: the checks outside their tolerance, each with by how much, verdict).
  """
  synthetic, clusters = generator.blocks(len(blocks), seed=seed)
  synthetic_q, _ = generator.queries(synthetic, clusters, len(questions), seed=seed + 1)
  real = describe(blocks, questions, repeats)
  made = describe(synthetic, synthetic_q, repeats)
  rows, failed = [], []
  for name in CONFIGURATIONS:
    for a, b in zip(real["recall"][name], made["recall"][name]):
      difference = b["recall_at_5"] - a["recall_at_5"]
      rows.append(dict(configuration=name, leaf_fraction=a["leaf_fraction"],
                       leaves=a["leaves"], leaves_searched=a["leaves_searched"],
                       real=a["recall_at_5"], synthetic=b["recall_at_5"],
                       difference=difference))
      if abs(difference) > RECALL_TOLERANCE:
        failed.append(dict(check="recall@5", configuration=name,
                           leaves_searched=a["leaves_searched"], leaves=a["leaves"],
                           measured=difference,
                           beyond_tolerance=abs(difference) - RECALL_TOLERANCE))
  gap_ratio = made["gap_5th_6th_median"] / real["gap_5th_6th_median"]
  gap_ok = abs(gap_ratio - 1) <= GAP_TOLERANCE
  if not gap_ok:
    failed.append(dict(check="median 5th-6th gap ratio", measured=gap_ratio,
                       beyond_tolerance=abs(gap_ratio - 1) - GAP_TOLERANCE))
  recall_ok = all(abs(r["difference"]) <= RECALL_TOLERANCE for r in rows)
  return dict(blocks=len(blocks), queries=len(questions), repeats=repeats, real=real,
              synthetic=made, table=rows, gap_ratio=gap_ratio, recall_agrees=recall_ok,
              gap_agrees=gap_ok, failed=failed,
              verdict="trusted" if recall_ok and gap_ok else "not trusted")


def validate_step(work_dir: str, name: str, num_queries: int, seed: int,
                  repeats: int) -> dict:
  """Split `name`'s generator against its validation side, projected by its fit side's
  map: the side's blocks and up to num_queries of its questions (seeded)."""
  data = real_data(work_dir)
  split = make_split(name, data, seed)
  directory = os.path.join(work_dir, name)
  basis = np.load(os.path.join(directory, "projection.npy"))
  generator = EmbeddingGenerator.load(os.path.join(directory, "generator.npz"))
  questions = sample(split.validation_questions, num_queries, seed)
  return dict(validate(data.blocks[split.validation_blocks] @ basis,
                       data.questions[questions] @ basis, generator, seed, repeats),
              generator_fingerprint=generator.fingerprint())


# ------------------------------------------------------------------ full-size curves

# One full-size shard: REALM's 13,353,718 blocks in 13 shards (about sqrt(n) leaves each).
SHARD_ROWS = -(-13_353_718 // 13)
CURVE_FRACTIONS = (1 / 80, 1 / 40, 1 / 20, 1 / 10, 1 / 5)
CURVE_REORDERS = (100, 250, 500)
AUTHORS_SEARCHED = (50, 100, 200, 400)


def _search_curve(vectors, params, queries, truth, settings) -> dict:
  """recall@K and batched ms a query of one built searcher, per (leaves, reorder) setting,
  passed per call (ScaNN's search takes both), and the state's bytes a block."""
  # pylint: disable=g-import-not-at-top
  from scann.scann_ops.py import scann_ops  # noqa: PLC0415
  from realm_tf.retrieval.scann_index import scann_state  # noqa: PLC0415
  # pylint: enable=g-import-not-at-top
  start = time.perf_counter()
  state = scann_state(vectors, params)
  build_seconds = time.perf_counter() - start
  searcher = scann_ops.searcher_from_module(state)
  state_bytes = sum(int(np.prod(v.shape)) * v.dtype.size for v in state.variables)
  rows = []
  for leaves, reorder in settings:
    searcher.search_batched(queries[:10], final_num_neighbors=K, leaves_to_search=leaves,
                            pre_reorder_num_neighbors=reorder)  # warm
    start = time.perf_counter()
    found, _ = searcher.search_batched(queries, final_num_neighbors=K,
                                       leaves_to_search=leaves,
                                       pre_reorder_num_neighbors=reorder)
    ms = (time.perf_counter() - start) * 1000 / len(queries)
    rows.append(dict(leaves_searched=leaves, leaf_fraction=leaves / params.num_leaves,
                     reorder_num_neighbors=reorder, ms_per_query_batched=ms,
                     recall_at_5=harness.recall(found.numpy(), truth)))
  return dict(params=params.to_dict(), build_seconds=build_seconds,
              state_bytes_per_block=state_bytes / len(vectors), rows=rows)


def curve_step(generator_path: str, rows: int, num_queries: int, seed: int) -> dict:
  """The recall curves at one full-size shard drawn from the generator at
  `generator_path`: the shipped tree (about sqrt(n) leaves, AH with the anisotropic loss at
  0.2, int8 reordering) by leaves searched and reorder count, and the authors'
  configuration by leaves searched, with exact search's time for the same queries."""
  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval.scann_index import AUTHORS_PARAMS, scann_params_for  # noqa: PLC0415
  # pylint: enable=g-import-not-at-top
  generator = EmbeddingGenerator.load(generator_path)
  vectors, clusters = generator.blocks(rows, seed=seed)
  queries, _ = generator.queries(vectors, clusters, num_queries, seed=seed + 1)
  start = time.perf_counter()
  truth, _ = exact_top(vectors, queries, K)
  exact_ms = (time.perf_counter() - start) * 1000 / num_queries
  shipped = scann_params_for(rows, mode="tree_ah_reorder")  # the full size's mode
  shipped_settings = [(max(1, math.ceil(f * shipped.num_leaves)), r)
                      for r in CURVE_REORDERS for f in CURVE_FRACTIONS]
  out = dict(rows=rows, queries=num_queries, generator_fingerprint=generator.fingerprint(),
             exact_ms_per_query_batched=exact_ms,
             shipped=_search_curve(vectors, shipped, queries, truth, shipped_settings))
  out["authors"] = _search_curve(vectors, AUTHORS_PARAMS, queries, truth,
                                 [(n, -1) for n in AUTHORS_SEARCHED])
  return out


# ----------------------------------------------------------------------------- output

def superseded_runs(work_dir: str) -> dict:
  """The validations kept in <work>/superseded/<label>/ (a split's fit.json and
  validate.json as a run left them, and reason.json: why they were superseded), so that a
  generator changed after a validation is reported beside the verdict of the one it
  replaced.

  Returns:
    label → dict(reason, splits: name → dict(verdict, differences: synthetic − real of
    each row, gap_ratio, calibration: the fit's, residual_scale, commit)).
  """
  root = os.path.join(work_dir, "superseded")
  out = {}
  for label in sorted(os.listdir(root)) if os.path.isdir(root) else []:
    directory = os.path.join(root, label)
    splits = {}
    for name in SPLITS:
      if not os.path.exists(os.path.join(directory, name, "validate.json")):
        continue
      v = harness.read_json(os.path.join(directory, name, "validate.json"))
      fit = harness.read_json(os.path.join(directory, name, "fit.json"))
      splits[name] = dict(verdict=v["verdict"], gap_ratio=v["gap_ratio"],
                          differences=[r["difference"] for r in v["table"]],
                          calibration=fit["calibration"], residual_scale=fit["residual_scale"],
                          commit=v["provenance"]["commit"])
    out[label] = dict(reason=harness.read_json(os.path.join(directory, "reason.json"))["reason"],
                      splits=splits)
  return out


def _superseded_lines(superseded: dict) -> list:
  lines = ["## Superseded validations in the work directory", ""]
  for label, run in superseded.items():
    lines.append(f"**{label}**: {run['reason']}")
    for name, split in _in_order(run["splits"], SPLITS):
      real, *grid = split["calibration"]
      lines.append(
          f"- {name}: {split['verdict']}, synthetic − real {min(split['differences']):+.3f} "
          f"to {max(split['differences']):+.3f} over {len(split['differences'])} rows, gap "
          f"ratio {split['gap_ratio']:.3f}; calibration: real {real['recall_at_5']:.3f}, "
          f"generated {min(r['recall_at_5'] for r in grid):.3f}-"
          f"{max(r['recall_at_5'] for r in grid):.3f} over the grid, scale "
          f"x{split['residual_scale']:.3f} (at {split['commit'][:12]}).")
    lines.append("")
  return lines


def overall_verdict(splits: dict) -> str:
  """'trusted' when every split's validation is, else 'not trusted'."""
  trusted = splits and all(s["validate"]["verdict"] == "trusted" for s in splits.values())
  return "trusted" if trusted else "not trusted"


def _in_order(mapping: dict, names) -> list:
  """(name, value) of `mapping` in the order of `names` (a result's JSON sorts its keys)."""
  return [(name, mapping[name]) for name in names if name in mapping]


def _counts(counts: dict) -> str:
  return ", ".join(f"{name} {n:,}" for name, n in sorted(counts.items()))


def _calibration_line(fit: dict) -> str:
  real, *grid = fit["calibration"]
  return (f"Residual scale, calibrated on the fit side (calibrate_residual_scale): at "
          f"{real['blocks']:,} of its blocks (its even-numbered documents) and "
          f"{fit['calibration_questions']:,} of its questions, the shipped tree searching "
          f"{real['leaves_searched']} of its {real['leaves']} leaves finds "
          f"{real['recall_at_5']:.3f} of the real top 5, and as many generated ones " +
          ", ".join(f"{r['recall_at_5']:.3f} at x{r['residual_scale']:.1f}" for r in grid) +
          (f"; interpolated: x{fit['residual_scale']:.3f}." if min(
              r["recall_at_5"] for r in grid) <= real["recall_at_5"] <= max(
              r["recall_at_5"] for r in grid) else
           f"; no scale of the grid reaches the real recall: x{fit['residual_scale']:.3f}, "
           "its end nearest it."))


def _failed_line(check: dict) -> str:
  if check["check"] == "recall@5":
    return (f"recall@5, {check['configuration']} searching {check['leaves_searched']} of "
            f"{check['leaves']} leaves: synthetic − real {check['measured']:+.3f}, "
            f"{check['beyond_tolerance']:.3f} beyond ±{RECALL_TOLERANCE}")
  return (f"median 5th-6th gap, synthetic / real {check['measured']:.3f}: "
          f"{100 * check['beyond_tolerance']:.1f} points beyond ±{100 * GAP_TOLERANCE:.0f}%")


def _blocks_per_title(side: dict) -> float:
  return side["blocks"] / max(1, side["documents"])


def _findings(split: dict) -> str:
  """What the failed checks say of the generator, in its figures: which way the recalls
  miss and how far, how far a question's top 1 stands above its 5th, how close its top 5
  lie together, and how many blocks a document holds on each side."""
  v, sides = split["validate"], split["fit"]["split"]
  differences = [r["difference"] for r in v["table"]]
  way = ("easier to find than real ones at every row" if min(differences) > 0 else
         "harder to find than real ones at every row" if max(differences) < 0 else
         "easier at some rows, harder at others")
  real, made = v["real"], v["synthetic"]
  return (f"What the checks show: generated questions' top 5 are {way} (synthetic − real "
          f"{min(differences):+.3f} to {max(differences):+.3f}, the tolerance ±"
          f"{RECALL_TOLERANCE}). A generated question's top 1 stands "
          f"{made['top1_minus_5th_median']:.2f} above its 5th (median), a real one's "
          f"{real['top1_minus_5th_median']:.2f}; the median cosine between a question's top "
          f"5 blocks is {made['top5_pair_cosine_median']:.3f} generated, "
          f"{real['top5_pair_cosine_median']:.3f} real. The fit side holds "
          f"{_blocks_per_title(sides['fit']):.1f} blocks a title, the validation side "
          f"{_blocks_per_title(sides['validation']):.1f}; the generator's documents hold "
          f"{split['fit']['blocks_per_document']['mean']:.2f} on average (at most "
          f"{split['fit']['blocks_per_document']['largest']}).")


def _split_lines(name: str, split: dict) -> list:
  fit, v = split["fit"], split["validate"]
  sides = fit["split"]
  failed = "; ".join(_failed_line(c) for c in v["failed"]) or "none"
  lines = [
      f"## {name.replace('_', ' ').capitalize()}: fitted on "
      f"{', '.join(sorted(sides['fit']['blocks_by_corpus']))}, validated on "
      f"{', '.join(sorted(sides['validation']['blocks_by_corpus']))}", "",
      f"**{v['verdict']}** (every recall@5 within ±{RECALL_TOLERANCE} of the real vectors': "
      f"{'yes' if v['recall_agrees'] else 'no'}; median 5th-6th score gap within "
      f"{100 * GAP_TOLERANCE:.0f}%: {'yes' if v['gap_agrees'] else 'no'}, ratio "
      f"{v['gap_ratio']:.3f}). Checks failed: {failed}.", "",
      "| side | blocks | documents | questions |", "|---|---|---|---|"]
  for side in ("fit", "validation"):
    s = sides[side]
    asked = (f"{v['queries']:,} drawn of {s['questions']:,}" if side == "validation"
             else f"{s['questions']:,}")
    lines.append(f"| {side} | {s['blocks']:,} ({_counts(s['blocks_by_corpus'])}) | "
                 f"{s['documents']:,} ({_counts(s['documents_by_corpus'])}) | {asked} "
                 f"({_counts(s['questions_by_set'])}) |")
  lines += [
      "", f"Fit: projected to {fit['projection']['dimension']} dimensions on the fit side's "
      f"blocks ({100 * fit['projection']['energy_kept']:.1f}% of their energy kept); "
      f"{fit['clusters']} clusters, rank {fit['rank']}, {fit['documents']:,} documents "
      f"({fit['smallest_cluster_documents']}-{fit['largest_cluster_documents']} a "
      f"cluster) of {fit['blocks_per_document']['mean']:.2f} blocks on average (at most "
      f"{fit['blocks_per_document']['largest']}); generator {fit['fingerprint']}. Validation: the validation side's blocks "
      f"and questions against as many generated; each recall the mean of {v['repeats']} "
      "ScaNN builds (ScaNN's k-means is not seeded).", "",
      _calibration_line(fit), "",
      "| configuration | leaves searched | fraction | recall@5 real | recall@5 synthetic | "
      "difference |", "|---|---|---|---|---|---|"]
  for r in v["table"]:
    lines.append(f"| {r['configuration']} | {r['leaves_searched']} of {r['leaves']} | "
                 f"{r['leaf_fraction']:.3f} | {r['real']:.3f} | {r['synthetic']:.3f} | "
                 f"{r['difference']:+.3f} |")
  lines += ["", "| | real | synthetic |", "|---|---|---|"]
  for key, label in (("gap_5th_6th_median", "median gap, 5th − 6th exact score"),
                     ("gap_5th_6th_median_relative", "the same / top-1 score"),
                     ("top1_minus_5th_median", "median gap, top-1 − 5th exact score"),
                     ("top5_pair_cosine_median", "median cosine between a question's top 5"),
                     ("top1_score_median", "median top-1 score")):
    lines.append(f"| {label} | {v['real'][key]:.4f} | {v['synthetic'][key]:.4f} |")
  lines.append(f"| block norm, 5% / 50% / 95% | "
               f"{' / '.join(f'{x:.3f}' for x in v['real']['norm_quantiles'])} | "
               f"{' / '.join(f'{x:.3f}' for x in v['synthetic']['norm_quantiles'])} |")
  lines += ["", _findings(split)] if v["failed"] else []
  return lines + [""]


def _provenance_rows(result: dict) -> list:
  steps = [("encoders", result["encoders"])]
  for name, step in _in_order(result["corpora"], [n for n, _ in CORPORA]):
    steps += [(f"corpus {name}", step), (f"documents {name}", step["documents"])]
  steps.append(("questions", result["questions"]))
  for name, split in _in_order(result["splits"], SPLITS):
    steps += [(f"{name} fit", split["fit"]), (f"{name} validate", split["validate"])]
  if "curve" in result:
    steps.append(("curve", result["curve"]))
  rows = []
  for label, step in steps:
    p = step["provenance"]
    rows.append(f"| {label} | {p['commit'][:12]}{'+' if '+' in p['commit'] else ''} | "
                f"{p['started']} | {p['seconds']:,.0f} | "
                f"{' / '.join(f'{x:.2f}' for x in p['load_average_at_start'])} | "
                f"{' / '.join(f'{x:.2f}' for x in p['load_average_at_end'])} |")
  return rows


def markdown(result: dict) -> str:
  splits = result["splits"]
  encoders = result["encoders"]
  lines = [
      "# Synthetic embeddings against real ones they were not fitted to",
      "",
      "Written by `python -m benchmarks.synthetic_embeddings` (its module docstring: the "
      "steps, the splits, the configurations); the generator is "
      "`benchmarks.synthetic_embeddings.EmbeddingGenerator`. Real: "
      + ", ".join(f"{c['file']} ({c['rows_read']:,} rows, {c['blocks']:,} blocks of "
                  f"{encoders['block_seq_length']} wordpieces, {c['documents']['sources']:,} "
                  f"texts, {c['documents']['documents']:,} titles)"
                  for _, c in _in_order(result["corpora"], [n for n, _ in CORPORA]))
      + "; questions: " + ", ".join(
          f"{q['file']} ({q['questions']:,})"
          for _, q in _in_order(result["questions"]["sets"], [n for n, _ in QUESTION_SETS]))
      + f"; embedded by {encoders['encoder']}.",
      "",
      f"**Verdict: {result['verdict']}** (every split's every check: recall@5 within "
      f"±{RECALL_TOLERANCE} of the real vectors' for each configuration at each fraction "
      f"of its leaves, the median 5th-6th exact score gap within {100 * GAP_TOLERANCE:.0f}%)"
      f"; the generator benchmarks.released_scale draws from is the document halves' "
      f"({result['generator']['fingerprint']}).", "",
      "| split | verdict | recall@5 rows within ±" + f"{RECALL_TOLERANCE} | worst difference "
      "| gap ratio |", "|---|---|---|---|---|"]
  for name, split in _in_order(splits, SPLITS):
    v = split["validate"]
    worst = max(v["table"], key=lambda r: abs(r["difference"]))
    within = sum(abs(r["difference"]) <= RECALL_TOLERANCE for r in v["table"])
    lines.append(f"| {name} | {v['verdict']} | {within} of {len(v['table'])} | "
                 f"{worst['difference']:+.3f} ({worst['configuration']}, "
                 f"{worst['leaves_searched']} of {worst['leaves']} leaves) | "
                 f"{v['gap_ratio']:.3f} |")
  lines += ["", "Configurations: " + "; ".join(f"**{name}**: {what}"
                                               for name, what in CONFIGURATIONS.items())
            + ".", ""]
  for name, split in _in_order(splits, SPLITS):
    lines += _split_lines(name, split)
  if "curve" in result:
    c = result["curve"]
    lines += [f"## Recall curves at one full-size shard ({c['rows']:,} rows drawn from the "
              f"document halves' generator, {c['queries']:,} generated questions)", "",
              f"Exact search: {c['exact_ms_per_query_batched']:.2f} ms a question (NumPy, "
              f"batched). ScaNN's times are batched too, on this machine, as loaded as the "
              "provenance below says.", "",
              "| configuration | leaves searched | fraction | reordered | recall@5 | "
              "ms a question | state bytes a block | build s |",
              "|---|---|---|---|---|---|---|---|"]
    for name in ("shipped", "authors"):
      curve = c[name]
      for r in curve["rows"]:
        reordered = r["reorder_num_neighbors"] if r["reorder_num_neighbors"] > 0 else "—"
        lines.append(f"| {name} | {r['leaves_searched']} of {curve['params']['num_leaves']} "
                     f"| {r['leaf_fraction']:.4f} | {reordered} | {r['recall_at_5']:.3f} | "
                     f"{r['ms_per_query_batched']:.3f} | "
                     f"{curve['state_bytes_per_block']:.0f} | {curve['build_seconds']:.0f} |")
    lines.append("")
  if result.get("superseded"):
    lines += _superseded_lines(result["superseded"])
  lines += ["## Provenance", "",
            "Each step as it ran (steps an earlier run in the work directory did are kept "
            "with theirs); the machine: "
            + json.dumps(result["machine"], sort_keys=True) + ".", "",
            "| step | commit | started | seconds | load average at start (1 / 5 / 15 min) | "
            "at end |", "|---|---|---|---|---|---|"]
  lines += _provenance_rows(result)
  return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ driver

def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--work_dir", required=True,
                      help="beside the checkout; every step's files are kept there")
  parser.add_argument("--clusters", type=int, default=48)
  parser.add_argument("--rank", type=int, default=32)
  parser.add_argument("--num_queries", type=int, default=8000,
                      help="real questions (and as many generated) each validation searches, "
                      "and twice those the calibration searches: at 2,000 the standard error "
                      "of a recall difference is about 0.01, half the tolerance")
  parser.add_argument("--repeats", type=int, default=3,
                      help="ScaNN builds each validation recall is the mean of")
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--curve_rows", type=int, default=SHARD_ROWS,
                      help="rows of the generated shard the recall curves are measured on "
                      "(0: no curves)")
  parser.add_argument("--curve_queries", type=int, default=1000)
  parser.add_argument("--output", default="", help="results JSON path (default "
                      "benchmarks/results/synthetic_embeddings.json)")
  return parser.parse_args(argv)


# What a kept fit or validation was made by: an earlier one is kept only when these did
# not change (a generator's fields can keep their names while their meaning changes).
FITTED_BY = (EmbeddingGenerator, calibrate_residual_scale, straddle, sample, projection,
             fit_generator, fit_step, split_by_documents, split_by_corpus, make_split,
             in_first_half, document_key, searching, build_recalls)
VALIDATED_BY = FITTED_BY + (configurations, served_curve, recall_curves, describe, validate,
                            validate_step)


def code_hash(functions) -> str:
  """A short hash of the functions' and classes' source."""
  return hashlib.sha256("".join(inspect.getsource(f) for f in functions).encode()
                        ).hexdigest()[:16]


def step(work: str, name: str, make, keep=lambda result: True) -> dict:
  """The step `name` of the work directory `work` (<work>/<name>.json): harness.cached of
  make, recorded (harness.recorded)."""
  return harness.cached(os.path.join(work, f"{name}.json"), harness.recorded(make), keep=keep)


def embedded(work: str, batch_size: int) -> dict:
  """The encoders, corpus and questions steps: every real corpus and question set
  embedded once (the longest part of a run), kept in `work` for every later run."""
  encoders = step(work, "encoders", lambda: encoders_step(work),
                  keep=lambda r: os.path.isdir(r["block_encoder"]))
  result = dict(encoders=encoders, corpora={})
  for name, parts in CORPORA:
    result["corpora"][name] = step(
        work, f"corpus_{name}",
        lambda name=name, parts=parts: corpus_step(work, name, parts,
                                                   encoders["block_encoder"], batch_size),
        keep=lambda r, name=name: os.path.exists(os.path.join(work, "corpora", name,
                                                              "blocks.npy")))
    result["corpora"][name]["documents"] = step(
        work, f"documents_{name}", lambda name=name: documents_step(work, name))
  result["questions"] = step(
      work, "questions", lambda: dict(sets=questions_step(work, encoders["query_encoder"])),
      keep=lambda r: "sets" in r)
  return result


def run(args) -> dict:
  work = os.path.abspath(args.work_dir)
  os.makedirs(work, exist_ok=True)
  result = embedded(work, args.batch_size)
  fit_settings = dict(clusters=args.clusters, rank=args.rank, num_queries=args.num_queries,
                      seed=args.seed, code=code_hash(FITTED_BY))
  result["splits"] = {}
  for name in SPLITS:
    fit = step(work, f"{name}/fit", lambda name=name: dict(
        fit_step(work, name, args.clusters, args.rank, args.num_queries, args.seed),
        settings=fit_settings), keep=lambda r: r.get("settings") == fit_settings)
    settings = dict(num_queries=args.num_queries, seed=args.seed, repeats=args.repeats,
                    code=code_hash(VALIDATED_BY), generator=fit["fingerprint"])
    validated = step(work, f"{name}/validate", lambda name=name: dict(
        validate_step(work, name, args.num_queries, args.seed, args.repeats),
        settings=settings), keep=lambda r: r.get("settings") == settings)
    result["splits"][name] = dict(fit=fit, validate=validated)
  result["verdict"] = overall_verdict(result["splits"])
  result["superseded"] = superseded_runs(work)
  shipped = result["splits"]["document_halves"]["fit"]
  result["generator"] = dict(path=shipped["generator"], fingerprint=shipped["fingerprint"])
  if args.curve_rows:
    settings = dict(rows=args.curve_rows, queries=args.curve_queries, seed=args.seed,
                    generator=shipped["fingerprint"])
    result["curve"] = step(work, "curve", lambda: dict(
        curve_step(shipped["generator"], args.curve_rows, args.curve_queries, args.seed),
        settings=settings), keep=lambda r: r.get("settings") == settings)
  result.update(machine=harness.machine(), settings=dict(
      clusters=args.clusters, rank=args.rank, num_queries=args.num_queries, seed=args.seed,
      repeats=args.repeats, curve_rows=args.curve_rows, curve_queries=args.curve_queries))
  return result


def main(argv=None):
  args = parse_args(argv)
  output = (harness.output_at(args.output, markdown) if args.output
            else harness.Output("synthetic_embeddings", markdown))
  output.write(run(args))
  print(output.render())


if __name__ == "__main__":
  main()
