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


def _recall_by_brute_force(found, vectors, queries) -> float:
  """recall@5 of `found` [Q, 5] rows: the share of each question's true top 5 by inner
  product (a full NumPy sort, no partition) among them, over every question."""
  truth = np.argsort(-(queries @ vectors.T), axis=1)[:, :se.K]  # [Q, 5]
  return float(np.mean(np.any(found[:, :, None] == truth[:, None, :], axis=2)))


def _record_searches(monkeypatch, module, name: str) -> list:
  """Every search of every ScaNN searcher `module.name` makes (build_recalls' build_scann,
  curve_step's searcher_from_module), recorded as it is made: [dict(made_from: the
  maker's arguments, queries, found, options: the search's)] in order."""
  make = getattr(module, name)
  searches = []

  def recorded(*args, **kwargs):
    searcher = make(*args, **kwargs)
    search = searcher.search_batched

    def search_batched(queries, **options):
      found, scores = search(queries, **options)
      searches.append(dict(made_from=args, queries=np.asarray(queries), found=found.numpy(),
                           options=options))
      return found, scores

    searcher.search_batched = search_batched
    return searcher

  monkeypatch.setattr(module, name, recorded)
  return searches


def _builds(monkeypatch) -> list:
  """_record_searches of build_recalls' ScaNN builds (made_from: (vectors, params))."""
  from realm_tf.retrieval import scann_index  # noqa: PLC0415  as build_recalls imports it
  return _record_searches(monkeypatch, scann_index, "build_scann")


@pytest.fixture
def one_build_per_table(monkeypatch):
  """build_recalls' ScaNN builds made once per table and settings, and that build searched
  whenever the same table is built again; yields {(table, settings): build}. Why: ScaNN's
  k-means is not seeded, so two builds of one table differ by about 0.01 in recall; a
  table compared with itself should read as the same table."""
  from realm_tf.retrieval import scann_index  # noqa: PLC0415  as build_recalls imports it
  built = {}
  build_scann, release = scann_index.build_scann, scann_index.release

  def build_once(vectors, params, **kwargs):
    key = (np.asarray(vectors).tobytes(), repr(params), repr(kwargs))
    if key not in built:
      built[key] = build_scann(vectors, params, **kwargs)
    return built[key]

  monkeypatch.setattr(scann_index, "build_scann", build_once)
  monkeypatch.setattr(scann_index, "release", lambda searcher: None)  # each once, below
  yield built
  for searcher in built.values():
    release(searcher)


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


def test_calibration_searches_half_the_real_corpus_at_every_scale(monkeypatch):
  """The real row: the shipped tree over the even-numbered documents' blocks, searched
  with the calibration questions; a row per scale: as many generated blocks, searched with
  generated questions at that residual scale; each recall@5 the share of the true top 5
  the tree found (against a NumPy sort); the scale interpolated between them."""
  searches = _builds(monkeypatch)
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
  # What each row searched: the real half, then the generated half at each scale.
  assert len(searches) == len(table)
  half = blocks[documents % 2 == 0]
  synthetic, clusters = generator.blocks(1000, seed=0)
  np.testing.assert_array_equal(searches[0]["made_from"][0], half)
  np.testing.assert_array_equal(searches[0]["queries"], queries[:100])
  for search, row in zip(searches[1:], grid):
    questions, _ = se.dataclasses.replace(generator, residual_scale=row["residual_scale"]) \
        .queries(synthetic, clusters, 100, seed=1)
    np.testing.assert_array_equal(search["made_from"][0], synthetic)
    np.testing.assert_array_equal(search["queries"], questions)
  for search, row in zip(searches, table):
    vectors, params = search["made_from"]
    assert (params.num_leaves, params.num_leaves_to_search) == (32, 2)
    assert row["recall_at_5"] == pytest.approx(
        _recall_by_brute_force(search["found"], vectors, search["queries"]), abs=1e-12)
  assert 0.0 < real["recall_at_5"] < 1.0  # 2 of 32 leaves: some true neighbours missed
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


def _median_gap(vectors, queries) -> float:
  """The median over questions of the 5th minus the 6th best inner product (a full sort)."""
  scores = -np.sort(-(queries @ vectors.T), axis=1)
  return float(np.median(scores[:, se.K - 1] - scores[:, se.K]))


def test_the_validation_compares_curves_and_gaps_and_renders(tmp_path, monkeypatch):
  """The validate step on a mixture against itself drawn again: every row's recall@5 is
  the mean over its builds of the share of the true top 5 (a NumPy sort) each build of the
  tree found, for the real vectors with real questions and the generated with generated;
  the gap ratio is the two NumPy medians'; the verdict follows the tolerances; the curve
  step's recalls are its searches' at each setting; the Markdown comes from the JSON
  alone."""
  builds = _builds(monkeypatch)
  from scann.scann_ops.py import scann_ops  # noqa: PLC0415  as curve_step imports it
  curve_searches = _record_searches(monkeypatch, scann_ops, "searcher_from_module")
  blocks, _, _ = _mixture(3000, seed=2)
  rng = np.random.default_rng(0)
  queries = blocks[rng.choice(3000, 400, replace=False)] + rng.normal(
      size=[400, 16]).astype(np.float32) * 0.3
  np.save(tmp_path / "blocks.npy", blocks)
  np.save(tmp_path / "queries.npy", queries)
  se.EmbeddingGenerator.fit(blocks, queries, clusters=6, rank=2).save(
      str(tmp_path / "generator.npz"))
  v = se.validate_step(str(tmp_path), num_queries=200, seed=0, repeats=2)
  generator = se.EmbeddingGenerator.load(str(tmp_path / "generator.npz"))
  real_q = queries[se.question_split(400, 200, seed=0)[0]]
  synthetic, clusters = generator.blocks(3000, seed=0)
  synthetic_q, _ = generator.queries(synthetic, clusters, 200, seed=1)
  rows = v["table"]
  assert len(rows) == len(se.SHIPPED_FRACTIONS) + len(se.AUTHORS_MULTIPLES)
  # Two builds a row, the real vectors' rows first, then the generated vectors'.
  assert len(builds) == 2 * 2 * len(rows)

  def recalls(searches, vectors, questions):  # [row][build], checking what was searched
    for search, row in zip(searches[::2], rows):
      assert search["made_from"][1].num_leaves_to_search == row["leaves_searched"]
    for search in searches:
      np.testing.assert_array_equal(search["made_from"][0], vectors)
      np.testing.assert_array_equal(search["queries"], questions)
    return np.array([_recall_by_brute_force(s["found"], vectors, questions)
                     for s in searches]).reshape(len(rows), 2)

  real = recalls(builds[:len(builds) // 2], blocks, real_q)
  made = recalls(builds[len(builds) // 2:], synthetic, synthetic_q)
  for row, a, b in zip(rows, real, made):
    assert row["real"] == pytest.approx(a.mean(), abs=1e-12)
    assert row["synthetic"] == pytest.approx(b.mean(), abs=1e-12)
    assert row["difference"] == pytest.approx(b.mean() - a.mean(), abs=1e-12)
  np.testing.assert_allclose([c["builds"] for c in v["real"]["recall"]["shipped"]],
                             real[:len(se.SHIPPED_FRACTIONS)], atol=1e-12)
  gap_ratio = _median_gap(synthetic, synthetic_q) / _median_gap(blocks, real_q)
  assert v["gap_ratio"] == pytest.approx(gap_ratio, rel=1e-5)
  shipped = [r for r in rows if r["configuration"] == "shipped"]
  assert [r["leaves"] for r in shipped] == [55] * 4  # round(sqrt(3000))
  # A fortieth, a twentieth, a tenth and a fifth of 55, rounded (at least 1).
  assert [r["leaves_searched"] for r in shipped] == [1, 3, 6, 11]
  agrees = np.all(np.abs(made.mean(1) - real.mean(1)) <= se.RECALL_TOLERANCE)
  assert v["recall_agrees"] == agrees
  assert v["gap_agrees"] == (abs(gap_ratio - 1) <= se.GAP_TOLERANCE)
  assert v["verdict"] == ("trusted" if agrees and v["gap_agrees"] else "not trusted")
  c = se.curve_step(str(tmp_path), rows=3000, num_queries=100, seed=0)
  shipped_curve = c["shipped"]["rows"]
  assert len(shipped_curve) == len(se.CURVE_REORDERS) * len(se.CURVE_FRACTIONS)
  assert [r["leaves_searched"] for r in shipped_curve[:len(se.CURVE_FRACTIONS)]] == [
      1, 2, 3, 6, 11]  # ceil(f x 55)
  # Each row's recall is its own search's (the 10-question warm-up searches aside), of
  # the generated shard (the validation's blocks: the same seed) with generated questions.
  curve_q, _ = generator.queries(synthetic, clusters, 100, seed=1)
  searched = [s for s in curve_searches if len(s["queries"]) == 100]
  curve = shipped_curve + c["authors"]["rows"]
  assert len(searched) == len(curve)
  for search, row in zip(searched, curve):
    np.testing.assert_array_equal(search["queries"], curve_q)
    assert search["options"]["leaves_to_search"] == row["leaves_searched"]
    assert search["options"]["pre_reorder_num_neighbors"] == row["reorder_num_neighbors"]
    assert row["recall_at_5"] == pytest.approx(
        _recall_by_brute_force(search["found"], synthetic, curve_q), abs=1e-12)
  first = [r["recall_at_5"] for r in shipped_curve[:len(se.CURVE_FRACTIONS)]]
  assert first[-1] >= first[0]
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


@pytest.fixture
def exact_builds(monkeypatch):
  """build_recalls' ScaNN builds made brute force in float32: exact search, so every
  recall@5 is 1 and a verdict turns on the score gap alone."""
  from realm_tf.retrieval import scann_index  # noqa: PLC0415  as build_recalls imports it
  build_scann = scann_index.build_scann
  monkeypatch.setattr(scann_index, "build_scann", lambda vectors, params, **kwargs: build_scann(
      vectors, se.dataclasses.replace(params, mode="brute_force", reorder_dtype="float32"),
      **kwargs))


def _validated_against_draws(work, drawn_by="generator.npz", num_queries=100,
                            seed=0) -> dict:
  """validate_step of the work directory's generator.npz against 'real' blocks and
  questions drawn by the saved generator `drawn_by` as validate_step draws them (blocks at
  `seed`, questions about them at seed + 1, at the rows question_split gives the
  validation): by generator.npz itself, the very draws it is compared with."""
  generator = se.EmbeddingGenerator.load(str(work / drawn_by))  # loaded, as validate_step
  blocks, clusters = generator.blocks(1000, seed=seed)
  asked, _ = generator.queries(blocks, clusters, num_queries, seed=seed + 1)
  queries = np.zeros([2 * num_queries, blocks.shape[1]], np.float32)  # the rest unread
  queries[se.question_split(len(queries), num_queries, seed)[0]] = asked
  np.save(work / "blocks.npy", blocks)
  np.save(work / "queries.npy", queries)
  return se.validate_step(str(work), num_queries=num_queries, seed=seed, repeats=1)


def test_a_generator_validated_against_its_own_draws_is_trusted(tmp_path,
                                                                one_build_per_table):
  """The real side is the synthetic side, table for table (each searched by the same
  build: one build per table): every recall agrees to the last digit, the gap ratio is 1,
  and the verdict is "trusted"."""
  blocks, _, _ = _mixture(1000, seed=6)
  generator = se.EmbeddingGenerator.fit(blocks, blocks[:150] + np.float32(0.2), clusters=4,
                                        rank=2)
  generator.save(str(tmp_path / "generator.npz"))
  v = _validated_against_draws(tmp_path)
  # One build a row, shared by both sides: the tables were the same.
  assert len(one_build_per_table) == len(v["table"])
  assert [r["difference"] for r in v["table"]] == [0.0] * len(v["table"])
  assert v["gap_ratio"] == 1.0
  assert v["recall_agrees"] and v["gap_agrees"]
  assert v["verdict"] == "trusted"


@pytest.mark.usefixtures("exact_builds")
def test_a_generator_whose_questions_score_half_again_as_high_is_not_trusted(tmp_path):
  """A fitted generator's own draws, validated by a copy whose questions are all 1.5 times
  as long (scale and residual each x1.5), about the same blocks: searched exactly, every
  recall is 1 on both sides and agrees, but every score, and so the median 5th-6th gap,
  is 1.5 times the real one's, outside GAP_TOLERANCE: "not trusted"."""
  blocks, _, _ = _mixture(1000, seed=6)
  generator = se.EmbeddingGenerator.fit(blocks, blocks[:150] + np.float32(0.2), clusters=4,
                                        rank=2)
  generator.save(str(tmp_path / "fitted.npz"))
  se.dataclasses.replace(generator, query_scales=generator.query_scales * np.float32(1.5),
                         query_residuals=generator.query_residuals * np.float32(1.5)).save(
                             str(tmp_path / "generator.npz"))
  v = _validated_against_draws(tmp_path, drawn_by="fitted.npz")
  assert [(r["real"], r["synthetic"]) for r in v["table"]] == [(1.0, 1.0)] * len(v["table"])
  assert v["recall_agrees"]
  assert v["gap_ratio"] == pytest.approx(1.5, rel=1e-4)
  assert not v["gap_agrees"]
  assert v["verdict"] == "not trusted"


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
