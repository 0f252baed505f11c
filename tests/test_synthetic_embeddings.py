"""The embedding generator the full-size ScaNN run draws from: fitted, seeded, and the
validation it must pass, on a small known mixture."""
import numpy as np
import pytest

from benchmarks import synthetic_embeddings as se


def _mixture(n, dim=16, centres=6, seed=0):
  rng = np.random.default_rng(seed)
  means = rng.normal(size=[centres, dim]).astype(np.float32) * 3
  labels = rng.integers(0, centres, size=n)
  # Each cluster stretched along one direction of its own, plus small isotropic noise.
  directions = rng.normal(size=[centres, dim]).astype(np.float32)
  directions /= np.linalg.norm(directions, axis=1, keepdims=True)
  stretch = rng.normal(size=[n, 1]).astype(np.float32) * 2
  blocks = means[labels] + stretch * directions[labels] + 0.1 * rng.normal(size=[n, dim])
  return blocks.astype(np.float32), means, directions


def test_the_generator_recovers_the_mixture_and_is_seeded():
  blocks, means, directions = _mixture(3000)
  queries = blocks[:300] + np.float32(0.05)
  generator = se.EmbeddingGenerator.fit(blocks, queries, clusters=6, rank=2, seed=0)
  # Every true centre has a fitted mean close by, and its stretch is the leading factor.
  for mean, direction in zip(means, directions):
    c = np.argmin(np.linalg.norm(generator.means - mean, axis=1))
    assert np.linalg.norm(generator.means[c] - mean) < 0.3
    lead = generator.factors[c, :, 0]
    assert abs(lead @ direction) / np.linalg.norm(lead) > 0.99
    assert np.linalg.norm(lead) == pytest.approx(2.0, rel=0.15)
    assert generator.residual_std[c].max() < 0.15
  assert generator.weights.sum() == pytest.approx(1.0)
  # A real question is scale x its exact top-1 block plus a residual orthogonal to it.
  top1 = np.argmax(queries @ blocks.T, axis=1)
  np.testing.assert_allclose(
      generator.query_scales[:, None] * blocks[top1] + generator.query_residuals, queries,
      atol=1e-4)
  np.testing.assert_allclose(np.sum(generator.query_residuals * blocks[top1], 1), 0,
                             atol=1e-3)

  a, ca = generator.blocks(500, seed=3)
  b, cb = generator.blocks(500, seed=3)
  np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(ca, cb)
  assert a.shape == (500, 16) and a.dtype == np.float32
  assert not np.array_equal(a, generator.blocks(500, seed=4)[0])
  # A generated block lies near its own cluster's mean, with a norm of a real block of
  # that cluster.
  assert np.median(np.linalg.norm(a - generator.means[ca], axis=1)) < 2.5
  for row, c in zip(a[:50], ca[:50]):
    real = generator.norms[generator.norm_starts[c]:generator.norm_starts[c + 1]]
    assert np.isclose(real, np.linalg.norm(row), rtol=1e-5).any()

  q, rows = generator.queries(a, ca, 50, seed=1)
  assert q.shape == (50, 16) and rows.shape == (50,)
  # Each made from its anchor as some real question of the anchor's cluster: the same
  # score against its anchor (scale x |x|^2) and a residual of the same length.
  for question, x, c in zip(q, a[rows], ca[rows]):
    mine = generator.query_clusters == c
    scale = (question @ x) / (x @ x)
    residual = np.linalg.norm(question - scale * x)
    assert np.any(np.isclose(generator.query_scales[mine], scale, rtol=1e-3) &
                  np.isclose(np.linalg.norm(generator.query_residuals[mine], axis=1),
                             residual, rtol=1e-3))


def test_residual_scale_lengthens_only_the_residual():
  """A calibrated generator's questions: the same anchors and the same score against them
  (the residual is orthogonal to the anchor), a residual `residual_scale` times as long."""
  blocks, _, _ = _mixture(1500, seed=3)
  generator = se.EmbeddingGenerator.fit(blocks, blocks[:200] + np.float32(0.3), clusters=4,
                                        rank=2)
  pool, clusters = generator.blocks(400, seed=0)
  q1, rows1 = generator.queries(pool, clusters, 30, seed=2)
  scaled = se.dataclasses.replace(generator, residual_scale=1.5)
  q2, rows2 = scaled.queries(pool, clusters, 30, seed=2)
  np.testing.assert_array_equal(rows1, rows2)
  x = pool[rows1]
  np.testing.assert_allclose(np.sum(q2 * x, 1), np.sum(q1 * x, 1), rtol=1e-4, atol=1e-4)
  unit = x / np.linalg.norm(x, axis=1, keepdims=True)
  def residual(q):
    return q - np.sum(q * unit, 1, keepdims=True) * unit
  np.testing.assert_allclose(residual(q2), 1.5 * residual(q1), rtol=1e-4, atol=1e-4)


def test_straddle_interpolates_where_recall_crosses_the_target():
  scales = (1.0, 1.1, 1.2, 1.3)
  recalls = (0.90, 0.86, 0.80, 0.78)
  assert se.straddle(scales, recalls, 0.86) == pytest.approx(1.1)
  assert se.straddle(scales, recalls, 0.83) == pytest.approx(1.15)
  assert se.straddle(scales, recalls, 0.95) == 1.0  # easier than any: the grid's start
  assert se.straddle(scales, recalls, 0.70) == 1.3  # harder than any: its end
  # A noisy grid: the first crossing.
  assert se.straddle(scales, (0.90, 0.84, 0.85, 0.80), 0.845) == pytest.approx(
      1.0 + 0.1 * 0.055 / 0.06)


def test_calibration_searches_half_the_real_corpus_at_every_scale():
  blocks, _, _ = _mixture(2000, seed=4)
  documents = np.arange(2000) // 2  # documents of 2 blocks: the even ones hold 1,000
  rng = np.random.default_rng(0)
  queries = blocks[rng.choice(2000, 150, replace=False)] + rng.normal(
      size=[150, 16]).astype(np.float32) * 0.3
  generator = se.EmbeddingGenerator.fit(blocks, queries, clusters=6, rank=2,
                                        documents=documents)
  scale, table = se.calibrate_residual_scale(generator, blocks, documents, queries[:100],
                                             seed=0, repeats=1)
  real, *grid = table
  assert real["residual_scale"] is None and real["blocks"] == 1000
  assert (real["leaves"], real["leaves_searched"]) == (32, 2)  # round(sqrt(1000)); 1.6
  assert [r["residual_scale"] for r in grid] == list(se.CALIBRATION_SCALES)
  assert all(0.0 <= r["recall_at_5"] <= 1.0 for r in table)
  assert scale == se.straddle(se.CALIBRATION_SCALES, [r["recall_at_5"] for r in grid],
                              real["recall_at_5"])


def test_question_split_is_disjoint_and_seeded():
  validation, calibration = se.question_split(1000, 400, seed=3)
  assert len(validation) == 400 and len(calibration) == 200
  assert not set(validation) & set(calibration)
  again = se.question_split(1000, 400, seed=3)
  np.testing.assert_array_equal(again[0], validation)
  small = se.question_split(100, 400, seed=0)  # a quarter always left to calibrate on
  assert len(small[0]) == 75 and len(small[1]) == 25


def test_blocks_come_in_documents_spread_as_the_real_ones():
  """Documents of 1-3 blocks, each block its document's centre plus a deviation along one
  direction: the sizes are kept, the deviation's direction and spread are found, and
  generated blocks of one document lie that close together."""
  rng = np.random.default_rng(5)
  centres, _, _ = _mixture(900, seed=5)
  sizes = rng.integers(1, 4, size=900)
  documents = np.repeat(np.arange(900), sizes)
  direction = np.eye(16, dtype=np.float32)[3]
  blocks = (centres[documents] + rng.normal(size=[len(documents), 1]).astype(np.float32)
            * 0.5 * direction).astype(np.float32)
  generator = se.EmbeddingGenerator.fit(blocks, blocks[:100], clusters=6, rank=1,
                                        documents=documents)
  assert sorted(generator.document_sizes.tolist()) == sorted(sizes.tolist())
  for c in range(6):  # every cluster's documents spread along the same direction here
    lead = generator.block_factors[c, :, 0]
    assert abs(lead @ direction) / np.linalg.norm(lead) > 0.98
    assert np.linalg.norm(lead) == pytest.approx(0.5, rel=0.25)
  assert generator.weights.sum() == pytest.approx(1.0)
  vectors, clusters = generator.blocks(2000, seed=0)
  assert vectors.shape == (2000, 16) and clusters.shape == (2000,)


def test_a_saved_generator_loads_the_same(tmp_path):
  blocks, _, _ = _mixture(600)
  generator = se.EmbeddingGenerator.fit(blocks, blocks[:50], clusters=4, rank=2)
  path = generator.save(str(tmp_path / "g.npz"))
  again = se.EmbeddingGenerator.load(path)
  np.testing.assert_array_equal(again.blocks(100, 7)[0], generator.blocks(100, 7)[0])


def test_exact_top_is_numpy_sort_order():
  rng = np.random.default_rng(1)
  vectors = rng.normal(size=[500, 8]).astype(np.float32)
  queries = rng.normal(size=[40, 8]).astype(np.float32)
  rows, scores = se.exact_top(vectors, queries, 6)
  want = np.argsort(-(queries @ vectors.T), axis=1)[:, :6]
  np.testing.assert_array_equal(rows, want)
  np.testing.assert_allclose(scores, np.take_along_axis(queries @ vectors.T, want, 1),
                             rtol=1e-6)


def test_the_validation_compares_curves_and_gaps_and_renders(tmp_path):
  """The validate step on a mixture against itself drawn again: every row present, the
  verdict follows the tolerances, and the Markdown comes from the JSON alone."""
  blocks, _, _ = _mixture(3000, seed=2)
  rng = np.random.default_rng(0)
  queries = blocks[rng.choice(3000, 400, replace=False)] + rng.normal(
      size=[400, 16]).astype(np.float32) * 0.3
  np.save(tmp_path / "blocks.npy", blocks)
  np.save(tmp_path / "queries.npy", queries)
  se.EmbeddingGenerator.fit(blocks, queries, clusters=6, rank=2).save(
      str(tmp_path / "generator.npz"))
  v = se.validate_step(str(tmp_path), num_queries=200, seed=0, repeats=2)
  assert len(v["table"]) == len(se.SHIPPED_FRACTIONS) + len(se.AUTHORS_MULTIPLES)
  for row in v["table"]:
    assert 0.0 <= row["real"] <= 1.0 and 0.0 <= row["synthetic"] <= 1.0
    assert row["difference"] == pytest.approx(row["synthetic"] - row["real"])
  for curve in v["real"]["recall"]["shipped"]:  # the mean of its builds
    assert len(curve["builds"]) == 2
    assert curve["recall_at_5"] == pytest.approx(np.mean(curve["builds"]))
  shipped = [r for r in v["table"] if r["configuration"] == "shipped"]
  assert [r["leaves"] for r in shipped] == [55] * 4  # round(sqrt(3000))
  # A fortieth, a twentieth, a tenth and a fifth of 55, rounded (at least 1).
  assert [r["leaves_searched"] for r in shipped] == [1, 3, 6, 11]
  assert v["recall_agrees"] == all(abs(r["difference"]) <= se.RECALL_TOLERANCE
                                   for r in v["table"])
  assert v["verdict"] == ("trusted" if v["recall_agrees"] and v["gap_agrees"]
                          else "not trusted")
  c = se.curve_step(str(tmp_path), rows=3000, num_queries=100, seed=0)
  shipped_curve = c["shipped"]["rows"]
  assert len(shipped_curve) == len(se.CURVE_REORDERS) * len(se.CURVE_FRACTIONS)
  assert [r["leaves_searched"] for r in shipped_curve[:len(se.CURVE_FRACTIONS)]] == [
      1, 2, 3, 6, 11]  # ceil(f x 55)
  first = [r["recall_at_5"] for r in shipped_curve[:len(se.CURVE_FRACTIONS)]]
  assert all(0.0 <= x <= 1.0 for x in first) and first[-1] >= first[0]
  assert [r["leaves_searched"] for r in c["authors"]["rows"]] == list(se.AUTHORS_SEARCHED)
  assert c["shipped"]["state_bytes_per_block"] > 0 and c["exact_ms_per_query_batched"] > 0
  result = dict(validate=v, curve=c, real=dict(blocks=3000, rows_read={},
                                      encoder="test"),
                project=dict(dimension=16, energy_kept=1.0),
                fit=dict(clusters=6, rank=2, residual_scale=1.05, calibration_questions=100,
                         calibration=[dict(residual_scale=None, recall_at_5=0.8, blocks=1500,
                                           leaves=39, leaves_searched=1),
                                      dict(residual_scale=1.0, recall_at_5=0.82),
                                      dict(residual_scale=1.1, recall_at_5=0.78)]))
  path = tmp_path / "out.json"
  output = se.harness.output_at(str(path), se.markdown)
  output.write(result)
  text = (tmp_path / "out.md").read_text()
  assert f"**Verdict: {v['verdict']}**" in text
  assert text.count("| shipped |") == 4 + len(shipped_curve)
  assert text.count("| authors |") == 4 + len(se.AUTHORS_SEARCHED)
  assert "## Recall curves at one full-size shard (3,000 generated rows" in text
  assert "0.820 at x1.0, 0.780 at x1.1; interpolated: x1.050." in text


def test_the_released_block_emb_is_drawn_part_by_part_from_the_generator(tmp_path):
  """benchmarks.released_scale's rows: every part from the generator with its own seed, in
  order, as many rows as blocks; 128-d only (the released width)."""
  from benchmarks import released_scale  # noqa: PLC0415  heavy module, this test only
  blocks, _, _ = _mixture(800, dim=128)
  path = se.EmbeddingGenerator.fit(blocks, blocks[:40], clusters=4, rank=2).save(
      str(tmp_path / "g.npz"))
  articles = np.zeros(250, np.int64)
  parts = list(released_scale.embedding_rows(articles, 1, path, rows_per_part=100))
  assert [len(p) for p in parts] == [100, 100, 50]
  generator = se.EmbeddingGenerator.load(path)
  np.testing.assert_array_equal(parts[1], generator.blocks(100, released_scale.SEED + 1)[0])
  seeded = np.concatenate(list(released_scale.embedding_rows(articles, 1)))
  assert seeded.shape == (250, 128)
  small = se.EmbeddingGenerator.fit(blocks[:, :16], blocks[:40, :16], clusters=4, rank=2)
  with pytest.raises(ValueError, match="16-d rows"):
    list(released_scale.embedding_rows(articles, 1, small.save(str(tmp_path / "s.npz"))))


def test_the_recall_leaves_the_checked_rows_out_of_both_searches():
  """benchmarks.released_scale.without: the first k ids of each row not excluded, in order,
  padded with -1 when too few remain."""
  from benchmarks import released_scale  # noqa: PLC0415  heavy module, this test only
  found = np.array([[7, 0, 3, 9, 4, 5, 6], [0, 890, 1, 2, 3, 4, 8], [0, 890, 5, 0, 890, 0, 1]])
  got = released_scale.without(found, [0, 890], k=5)
  np.testing.assert_array_equal(got, [[7, 3, 9, 4, 5], [1, 2, 3, 4, 8], [5, 1, -1, -1, -1]])
