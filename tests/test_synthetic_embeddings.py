"""The embedding generator the full-size ScaNN run draws from: fitted, seeded, the splits
it is fitted and validated on (disjoint by document; corpus to corpus), and the validation
it must pass, the served configuration's rows included, on small known mixtures."""
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


def test_sample_is_seeded_without_replacement_in_order():
  rows = np.arange(100, 400, 3)
  drawn = se.sample(rows, 40, seed=3)
  assert len(drawn) == 40 and len(set(drawn)) == 40 and set(drawn) <= set(rows)
  assert list(drawn) == sorted(drawn)
  np.testing.assert_array_equal(se.sample(rows, 40, seed=3), drawn)
  assert not np.array_equal(se.sample(rows, 40, seed=4), drawn)
  np.testing.assert_array_equal(se.sample(rows, 500, seed=0), rows)  # all when too few


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


def test_a_saved_generator_loads_the_same_and_its_fingerprint_says_which_it_is(tmp_path):
  blocks, _, _ = _mixture(600)
  generator = se.EmbeddingGenerator.fit(blocks, blocks[:50], clusters=4, rank=2)
  path = generator.save(str(tmp_path / "g.npz"))
  again = se.EmbeddingGenerator.load(path)
  np.testing.assert_array_equal(again.blocks(100, 7)[0], generator.blocks(100, 7)[0])
  assert again.fingerprint() == generator.fingerprint()
  assert len(generator.fingerprint()) == 16
  # One value of one field, or the scale alone, is another generator.
  means = generator.means.copy()
  means[0, 0] += np.float32(1e-3)
  assert se.dataclasses.replace(generator, means=means).fingerprint() != generator.fingerprint()
  assert (se.dataclasses.replace(generator, residual_scale=1.1).fingerprint()
          != generator.fingerprint())


def test_exact_top_is_numpy_sort_order():
  rng = np.random.default_rng(1)
  vectors = rng.normal(size=[500, 8]).astype(np.float32)
  queries = rng.normal(size=[40, 8]).astype(np.float32)
  rows, scores = se.exact_top(vectors, queries, 6)
  want = np.argsort(-(queries @ vectors.T), axis=1)[:, :6]
  np.testing.assert_array_equal(rows, want)
  np.testing.assert_allclose(scores, np.take_along_axis(queries @ vectors.T, want, 1),
                             rtol=1e-6)


@pytest.fixture
def exact_builds(monkeypatch):
  """Every ScaNN build made brute force in float32 (build_recalls', the calibration's and
  the served shards'): exact search, so every recall@5 that nothing re-scores is 1, and
  none depends on ScaNN's unseeded k-means."""
  from realm_tf.retrieval import scann_index  # noqa: PLC0415  as build_recalls imports it
  build_scann = scann_index.build_scann
  monkeypatch.setattr(scann_index, "build_scann", lambda vectors, params, **kwargs: build_scann(
      vectors, se.dataclasses.replace(params, mode="brute_force", reorder_dtype="float32"),
      **kwargs))


def _real(dim=16, seed=0) -> se.RealData:
  """RealData named as CORPORA and QUESTION_SETS: 160 Wikipedia leads "Doc i" of 1-3
  blocks, 12 SQuAD articles of 4-8 blocks in paragraphs of two (four titled "DOC  0"..
  "DOC  3": the leads' documents, spelt otherwise), 60 news articles of 1-4 blocks, each
  document a centre with its blocks around it; questions near a block (of their document,
  for SQuAD's), 30 of NQ's asked twice."""
  rng = np.random.default_rng(seed)
  blocks, corpora, documents, sources = [], [], [], []

  def document(corpus, title, count):
    centre = rng.normal(size=dim) * 2
    for i in range(count):
      blocks.append(centre + rng.normal(size=dim) * 0.5)
      corpora.append(corpus)
      documents.append(se.document_key(title))
      # A SQuAD article's paragraphs are texts of their own, two blocks each.
      sources.append(f"{corpus}/{title}/{i // 2 if corpus == 'squad' else 0}")

  for i in range(160):
    document("wikipedia", f"Doc {i}", rng.integers(1, 4))
  squad = [f"DOC  {i}" for i in range(4)] + [f"Article {i}" for i in range(8)]
  for title in squad:
    document("squad", title, rng.integers(4, 9))
  for i in range(60):
    document("news", f"News {i}", rng.integers(1, 5))
  keys = np.array(documents)
  questions, sets, owners, texts = [], [], [], []

  def ask(name, text, title=""):
    rows = np.flatnonzero(keys == se.document_key(title)) if title else np.arange(len(keys))
    questions.append(blocks[rng.choice(rows)] + rng.normal(size=dim) * 0.3)
    sets.append(name)
    owners.append(se.document_key(title) if title else "")
    texts.append(text)

  for i in range(150):
    ask("nq_open", f"who is {i % 120}?")
  for i in range(50):
    ask("webquestions", f"what is {i}?")
  for i in range(30):
    ask("curatedtrec", f"when was {i}?")
  for i in range(80):
    ask("squad_train", f"why {i}?", squad[i % 10])
  for i in range(20):
    ask("squad_dev", f"how {i}?", squad[10 + i % 2])
  return se.RealData(np.array(blocks, np.float32), np.array(corpora), keys,
                     np.array(sources), np.array(questions, np.float32), np.array(sets), np.array(owners),
                     np.array(texts))


def _write_real(work, data: se.RealData):
  """`data` as the corpus and questions steps leave it in the work directory `work`."""
  for name, _ in se.CORPORA:
    rows = data.block_corpora == name
    directory = work / "corpora" / name
    directory.mkdir(parents=True, exist_ok=True)
    np.save(directory / "blocks.npy", data.blocks[rows])
    se.harness.write_json(str(directory / "documents.json"),
                          dict(documents=data.block_documents[rows].tolist(),
                               sources=data.block_sources[rows].tolist()))
  (work / "questions").mkdir(exist_ok=True)
  for name, _ in se.QUESTION_SETS:
    rows = data.question_sets == name
    np.save(work / "questions" / f"{name}.npy", data.questions[rows])
    se.harness.write_json(str(work / "questions" / f"{name}.json"),
                          dict(texts=data.question_texts[rows].tolist(),
                               documents=data.question_documents[rows].tolist()))


def _sides(split: se.Split, data: se.RealData) -> tuple:
  """(the fit side's documents, the validation side's)."""
  return (set(data.block_documents[split.fit_blocks].tolist()),
          set(data.block_documents[split.validation_blocks].tolist()))


def test_document_halves_keep_each_document_and_its_questions_on_one_side():
  """Every block and question on one side; no document on both, a lead and its article's
  SQuAD paragraphs (one title) included; a question that belongs to a document on that
  document's side, one asked twice on one side; each corpus's documents and each
  question set roughly halved; the sides a function of the seed and each key alone (the
  data in reverse order splits the same); a question of a document no corpus holds
  refused."""
  data = _real()
  split = se.split_by_documents(data, seed=0)
  np.testing.assert_array_equal(np.sort(np.concatenate([split.fit_blocks,
                                                        split.validation_blocks])),
                                np.arange(len(data.blocks)))
  np.testing.assert_array_equal(np.sort(np.concatenate([split.fit_questions,
                                                        split.validation_questions])),
                                np.arange(len(data.questions)))
  fit, validation = _sides(split, data)
  assert not fit & validation
  shared = data.block_documents == "doc 0"
  assert set(data.block_corpora[shared]) == {"wikipedia", "squad"}
  for rows, documents in ((split.fit_questions, fit),
                          (split.validation_questions, validation)):
    owned = [d for d in data.question_documents[rows] if d]
    assert owned and set(owned) <= documents
  side = {}
  for row in split.fit_questions:
    side.setdefault(data.question_texts[row], set()).add("fit")
  for row in split.validation_questions:
    side.setdefault(data.question_texts[row], set()).add("validation")
  assert sum(1 for t in data.question_texts if t == "who is 7?") == 2
  assert all(len(s) == 1 for s in side.values())
  for corpus in ("wikipedia", "news"):
    mine = set(data.block_documents[data.block_corpora == corpus].tolist())
    assert 0.3 < len(mine & fit) / len(mine) < 0.7
  for name in ("nq_open", "webquestions"):
    mine = np.flatnonzero(data.question_sets == name)
    assert 0.3 < np.mean(np.isin(mine, split.fit_questions)) < 0.7
  for again, first in zip(se.split_by_documents(data, seed=0), split):
    np.testing.assert_array_equal(again, first)
  assert _sides(se.split_by_documents(data, seed=1), data)[0] != fit
  backwards = se.RealData(*(field[::-1] for field in data))
  assert _sides(se.split_by_documents(backwards, seed=0), backwards) == (fit, validation)
  stray = data.question_documents.copy()
  stray[0] = "nowhere"
  with pytest.raises(ValueError, match="nowhere"):
    se.split_by_documents(data._replace(question_documents=stray), seed=0)


def test_corpus_to_corpus_fits_on_one_corpus_and_validates_on_another():
  """make_split's corpus_to_corpus: every SQuAD paragraph and question validated; fitted
  on the Wikipedia leads less those of SQuAD's articles (no document on both sides) and on
  the questions of no document; news on neither side. Corpora or sets that overlap, or
  that do not exist, are refused by name."""
  data = _real()
  split = se.make_split("corpus_to_corpus", data, seed=0)
  np.testing.assert_array_equal(split.validation_blocks,
                                np.flatnonzero(data.block_corpora == "squad"))
  leads = data.block_corpora == "wikipedia"
  of_squad = np.isin(data.block_documents, ["doc 0", "doc 1", "doc 2", "doc 3"])
  np.testing.assert_array_equal(split.fit_blocks, np.flatnonzero(leads & ~of_squad))
  assert of_squad[leads].sum() > 0  # some leads left out
  fit, validation = _sides(split, data)
  assert not fit & validation
  assert set(data.question_sets[split.fit_questions]) == {"nq_open", "webquestions",
                                                          "curatedtrec"}
  np.testing.assert_array_equal(
      split.validation_questions,
      np.flatnonzero(np.isin(data.question_sets, ["squad_train", "squad_dev"])))
  with pytest.raises(ValueError, match="overlap"):
    se.split_by_corpus(data, "wikipedia", ["nq_open"], "wikipedia", ["squad_dev"])
  with pytest.raises(ValueError, match="overlap"):
    se.split_by_corpus(data, "wikipedia", ["nq_open"], "news", ["nq_open"])
  with pytest.raises(ValueError, match="'blogs'"):
    se.split_by_corpus(data, "blogs", ["nq_open"], "news", ["squad_dev"])
  with pytest.raises(ValueError, match="unknown split"):
    se.make_split("by_year", data, seed=0)


@pytest.mark.usefixtures("exact_builds")
def test_the_fit_reads_only_its_side_and_the_validation_the_other(tmp_path, monkeypatch):
  """For each split, fit_step's projection and generator are the same whatever the rest of
  the real data holds (here replaced by noise), and move with one fit-side block;
  validate_step compares the validation side's blocks and a seeded sample of its
  questions, projected by the fit side's map, with the fit side's generator. The builds
  are exact, so the calibration (and so the generator) does not depend on ScaNN's
  unseeded k-means."""
  data = _real()
  _write_real(tmp_path, data)
  for got, want in zip(se.real_data(str(tmp_path)), data):
    np.testing.assert_array_equal(got, want)
  work = str(tmp_path)
  seen = []
  monkeypatch.setattr(se, "validate", lambda blocks, questions, generator, seed, repeats: (
      seen.append((blocks, questions, generator.fingerprint(), seed, repeats))
      or dict(verdict="trusted")))
  for name in se.SPLITS:
    split = se.make_split(name, data, seed=0)
    first = se.fit_step(work, name, clusters=3, rank=2, num_queries=60, seed=0)
    assert first["split"]["fit"]["blocks"] == len(split.fit_blocks)
    # The generator's documents are the texts the blocks were cut from, not titles.
    assert first["documents"] == len(np.unique(data.block_sources[split.fit_blocks]))
    if name == "document_halves":  # SQuAD's articles on the fit side: more texts than titles
      assert first["documents"] > len(np.unique(data.block_documents[split.fit_blocks]))
    assert first["calibration_questions"] == 30
    basis = np.load(tmp_path / name / "projection.npy")
    rng = np.random.default_rng(1)
    noisy = data._replace(blocks=data.blocks.copy(), questions=data.questions.copy())
    rest = np.setdiff1d(np.arange(len(data.blocks)), split.fit_blocks)
    noisy.blocks[rest] = rng.normal(size=[len(rest), 16])
    rest = np.setdiff1d(np.arange(len(data.questions)), split.fit_questions)
    noisy.questions[rest] = rng.normal(size=[len(rest), 16])
    _write_real(tmp_path, noisy)
    assert se.fit_step(work, name, 3, 2, 60, 0)["fingerprint"] == first["fingerprint"]
    np.testing.assert_array_equal(np.load(tmp_path / name / "projection.npy"), basis)
    noisy.blocks[split.fit_blocks[0]] += 1.0
    _write_real(tmp_path, noisy)
    assert se.fit_step(work, name, 3, 2, 60, 0)["fingerprint"] != first["fingerprint"]
    _write_real(tmp_path, data)
    se.fit_step(work, name, 3, 2, 60, 0)
    v = se.validate_step(work, name, num_queries=25, seed=0, repeats=1)
    blocks, questions, fingerprint, seed, repeats = seen[-1]
    np.testing.assert_allclose(blocks, data.blocks[split.validation_blocks] @ basis,
                               rtol=1e-6)
    asked = se.sample(split.validation_questions, 25, seed=0)
    assert len(asked) == 25 and set(asked) <= set(split.validation_questions)
    np.testing.assert_allclose(questions, data.questions[asked] @ basis, rtol=1e-6)
    assert (fingerprint, seed, repeats) == (first["fingerprint"], 0, 1)
    assert v["generator_fingerprint"] == first["fingerprint"]


def test_the_served_rows_search_as_the_assembly_serves(monkeypatch):
  """served_curve: per build, one shard as the index builds it with the tree at this size
  and served without its int8 reordering (assembly.served_shards), searched for each
  fraction as a request asks it (a leaves_fraction) for K x RESCORED_PER_NEIGHBOUR
  candidates, which the float16 rows re-score. Each row's recall@5 is a NumPy reference's:
  the searcher's candidates (padding, scored lowest, left out) ranked by inner products
  with the rows rounded to float16, the top 5 against the exact top 5, averaged over the
  builds."""
  from realm_tf.export import served_index  # noqa: PLC0415  as served_curve imports it
  from realm_tf.retrieval import scann_index  # noqa: PLC0415  as served_curve imports it
  made = []
  graph_searcher = scann_index.graph_searcher

  def recording(shards, dimension):
    searcher, handles = graph_searcher(shards, dimension)
    search, calls = searcher.search, []

    def recorded(queries, k):
      found = search(queries, k)
      calls.append(dict(queries=queries.numpy(), k=k, ids=found.block_ids.numpy(),
                        scores=found.scores.numpy(),
                        fraction=scann_index.bound_options().leaves_fraction))
      return found

    searcher.search = recorded
    made.append(dict(shards=shards, calls=calls))
    return searcher, handles

  monkeypatch.setattr(scann_index, "graph_searcher", recording)
  vectors, _, _ = _mixture(1500, seed=7)
  rng = np.random.default_rng(2)
  queries = (vectors[rng.choice(1500, 60, replace=False)]
             + rng.normal(size=[60, 16]).astype(np.float32) * 0.3)
  truth = np.argsort(-(queries @ vectors.T), axis=1)[:, :se.K]
  rows = se.served_curve(vectors, queries, truth, repeats=2)
  assert len(made) == 2
  fetch = se.K * served_index.RESCORED_PER_NEIGHBOUR
  half = vectors.astype(np.float16).astype(np.float32)
  references = np.zeros([2, len(se.SHIPPED_FRACTIONS)])
  for b, build in enumerate(made):
    (shard,) = build["shards"]
    assert shard.layout == scann_index.ShardLayout(39, 7, 0)  # round(sqrt(1500)); a fifth
    np.testing.assert_array_equal(shard.block_ids, np.arange(1500))
    assert [c["fraction"] for c in build["calls"]] == list(se.SHIPPED_FRACTIONS)
    for f, call in enumerate(build["calls"]):
      assert call["k"] == fetch and call["ids"].shape == (60, fetch)
      np.testing.assert_array_equal(call["queries"], queries)
      scores = np.einsum("qp,qfp->qf", queries, half[call["ids"]])
      scores[call["scores"] == np.finfo(np.float32).min] = -np.inf
      top = np.take_along_axis(call["ids"], np.argsort(-scores, axis=1, kind="stable"),
                               1)[:, :se.K]
      references[b, f] = _recall_by_brute_force(top, vectors, queries)
  for row, reference in zip(rows, references.T):
    assert row["rescored_candidates"] == fetch and row["leaves"] == 39
    assert row["builds"] == pytest.approx(list(reference), abs=1 / (60 * se.K))
    assert row["recall_at_5"] == pytest.approx(np.mean(row["builds"]), abs=1e-12)
  # ceil(f x 39): a search of 1 leaf of 39 misses neighbours a fifth of them finds.
  assert [r["leaves_searched"] for r in rows] == [1, 2, 4, 8]
  assert rows[0]["recall_at_5"] < rows[-1]["recall_at_5"]


def _median_gap(vectors, queries) -> float:
  """The median over questions of the 5th minus the 6th best inner product (a full sort)."""
  scores = -np.sort(-(queries @ vectors.T), axis=1)
  return float(np.median(scores[:, se.K - 1] - scores[:, se.K]))


def _provenance(commit="0123456789abcdef0123", seconds=12.0) -> dict:
  return dict(provenance=dict(commit=commit, started="2026-11-29T08:00:00+0000",
                              seconds=seconds, load_average_at_start=[1.0, 2.0, 3.0],
                              load_average_at_end=[1.5, 2.5, 3.5]))


def test_the_validation_compares_curves_and_gaps_and_renders(tmp_path, monkeypatch):
  """validate on a mixture against a generator fitted to it: the host and authors' rows'
  recall@5 is the mean over their builds of the share of the true top 5 (a NumPy sort)
  each build of the tree found, for the real vectors with real questions and the
  generated with generated; the served rows come first, at ceil(f x leaves); the gap
  ratio is the two NumPy medians'; every row or gap outside its tolerance is a failed
  check, by how much; the verdict follows. The curve step's recalls are its searches' at
  each setting; the Markdown (both splits, the curve, each step's provenance) comes from
  the JSON alone."""
  builds = _builds(monkeypatch)
  from scann.scann_ops.py import scann_ops  # noqa: PLC0415  as curve_step imports it
  curve_searches = _record_searches(monkeypatch, scann_ops, "searcher_from_module")
  blocks, _, _ = _mixture(3000, seed=2)
  rng = np.random.default_rng(0)
  queries = blocks[rng.choice(3000, 200, replace=False)] + rng.normal(
      size=[200, 16]).astype(np.float32) * 0.3
  path = se.EmbeddingGenerator.fit(blocks, queries, clusters=6, rank=2).save(
      str(tmp_path / "generator.npz"))
  generator = se.EmbeddingGenerator.load(path)  # as validate_step and curve_step load it
  v = se.validate(blocks, queries, generator, seed=0, repeats=2)
  synthetic, clusters = generator.blocks(3000, seed=0)
  synthetic_q, _ = generator.queries(synthetic, clusters, 200, seed=1)
  rows = v["table"]
  per = len(se.SHIPPED_FRACTIONS)
  assert [r["configuration"] for r in rows] == ["served"] * per + ["host"] * per + [
      "authors"] * len(se.AUTHORS_MULTIPLES)
  built = rows[per:]  # the rows searched at their build settings, two builds each
  # The real vectors' rows first, then the generated vectors' (the served rows' searches
  # are not build_scann's: test_the_served_rows_search_as_the_assembly_serves).
  assert len(builds) == 2 * 2 * len(built)

  def recalls(searches, vectors, questions):  # [row][build], checking what was searched
    for search, row in zip(searches[::2], built):
      assert search["made_from"][1].num_leaves_to_search == row["leaves_searched"]
    for search in searches:
      np.testing.assert_array_equal(search["made_from"][0], vectors)
      np.testing.assert_array_equal(search["queries"], questions)
    return np.array([_recall_by_brute_force(s["found"], vectors, questions)
                     for s in searches]).reshape(len(built), 2)

  real = recalls(builds[:len(builds) // 2], blocks, queries)
  made = recalls(builds[len(builds) // 2:], synthetic, synthetic_q)
  for row, a, b in zip(built, real, made):
    assert row["real"] == pytest.approx(a.mean(), abs=1e-12)
    assert row["synthetic"] == pytest.approx(b.mean(), abs=1e-12)
    assert row["difference"] == pytest.approx(b.mean() - a.mean(), abs=1e-12)
  np.testing.assert_allclose([c["builds"] for c in v["real"]["recall"]["host"]],
                             real[:per], atol=1e-12)
  gap_ratio = _median_gap(synthetic, synthetic_q) / _median_gap(blocks, queries)
  assert v["gap_ratio"] == pytest.approx(gap_ratio, rel=1e-5)
  top = np.argsort(-(queries @ blocks.T), axis=1)[:, :se.K]
  unit = blocks / np.linalg.norm(blocks, axis=1, keepdims=True)
  pairs = [np.mean([unit[a] @ unit[b] for i, a in enumerate(row) for b in row[i + 1:]])
           for row in top]
  assert v["real"]["top5_pair_cosine_median"] == pytest.approx(np.median(pairs), rel=1e-5)
  for name, searched in (("served", [2, 3, 6, 11]),  # ceil(f x 55), as a request asks
                         ("host", [1, 3, 6, 11])):  # round(f x 55), as a build is made
    mine = [r for r in rows if r["configuration"] == name]
    assert [r["leaves"] for r in mine] == [55] * 4  # round(sqrt(3000))
    assert [r["leaves_searched"] for r in mine] == searched
  assert all(0 < r["real"] <= 1 and 0 < r["synthetic"] <= 1 for r in rows[:per])
  outside = [r for r in rows if abs(r["difference"]) > se.RECALL_TOLERANCE]
  assert [(c["configuration"], c["leaves_searched"]) for c in v["failed"]
          if c["check"] == "recall@5"] == [(r["configuration"], r["leaves_searched"])
                                           for r in outside]
  for check, row in zip(v["failed"], outside):
    assert check["beyond_tolerance"] == pytest.approx(
        abs(row["difference"]) - se.RECALL_TOLERANCE)
  assert v["recall_agrees"] == (not outside)
  assert v["gap_agrees"] == (abs(gap_ratio - 1) <= se.GAP_TOLERANCE)
  assert any(c["check"] != "recall@5" for c in v["failed"]) == (not v["gap_agrees"])
  assert v["verdict"] == ("trusted" if not v["failed"] else "not trusted")

  c = se.curve_step(path, rows=3000, num_queries=100, seed=0)
  assert c["generator_fingerprint"] == generator.fingerprint()
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

  side = dict(blocks=3000, documents=3000, questions=200, blocks_by_corpus=dict(news=3000),
              documents_by_corpus=dict(news=3000), questions_by_set=dict(nq_open=200))
  fit = dict(_provenance(), clusters=6, rank=2, residual_scale=1.05, calibration_questions=100,
             documents=3000, smallest_cluster_documents=300, largest_cluster_documents=700,
             blocks_per_document=dict(mean=1.0, largest=1),
             fingerprint=generator.fingerprint(), generator=path,
             projection=dict(dimension=16, energy_kept=1.0),
             split=dict(fit=side, validation=dict(side, blocks_by_corpus=dict(squad=3000))),
             calibration=[dict(residual_scale=None, recall_at_5=0.8, blocks=1500, leaves=39,
                               leaves_searched=1),
                          dict(residual_scale=1.0, recall_at_5=0.82),
                          dict(residual_scale=1.1, recall_at_5=0.78)])
  worse = dict(v, verdict="not trusted", gap_agrees=False, gap_ratio=1.25, failed=[
      dict(check="recall@5", configuration="served", leaves_searched=2, leaves=55,
           measured=-0.031, beyond_tolerance=0.011),
      dict(check="median 5th-6th gap ratio", measured=1.25, beyond_tolerance=0.05)])
  splits = dict(document_halves=dict(fit=fit, validate=dict(v, **_provenance())),
                corpus_to_corpus=dict(fit=fit, validate=dict(worse, **_provenance())))
  result = dict(
      encoders=dict(_provenance(), encoder="test", block_seq_length=128),
      corpora=dict(news=dict(_provenance(), file="news/bbc.jsonl", rows_read=10, blocks=3000,
                             documents=dict(_provenance(seconds=3.0), documents=2900,
                                            sources=3000))),
      questions=dict(_provenance(), sets=dict(nq_open=dict(file="openqa/nq.jsonl",
                                                           questions=200))),
      splits=splits, verdict=se.overall_verdict(splits),
      generator=dict(path=path, fingerprint=generator.fingerprint()),
      curve=dict(c, **_provenance(commit="fedcba9876543210+modified")), machine=dict(cpus=2))
  assert result["verdict"] == "not trusted"
  # An earlier validation kept in the work directory is reported with why it was replaced.
  kept = tmp_path / "work" / "superseded" / "first_try" / "document_halves"
  kept.mkdir(parents=True)
  se.harness.write_json(str(kept / "fit.json"), fit)
  se.harness.write_json(str(kept / "validate.json"), dict(worse, **_provenance()))
  se.harness.write_json(str(kept.parent / "reason.json"), dict(reason="it was wrong."))
  result["superseded"] = se.superseded_runs(str(tmp_path / "work"))
  assert list(result["superseded"]["first_try"]["splits"]) == ["document_halves"]
  output = se.harness.output_at(str(tmp_path / "out.json"), se.markdown)
  output.write(result)
  text = (tmp_path / "out.md").read_text()
  assert "**Verdict: not trusted**" in text
  assert f"**{v['verdict']}** (every recall@5" in text
  assert ("Checks failed: recall@5, served searching 2 of 55 leaves: synthetic − real "
          "-0.031, 0.011 beyond ±0.02; median 5th-6th gap, synthetic / real 1.250: 5.0 "
          "points beyond ±20%.") in text
  assert "## Corpus to corpus: fitted on news, validated on squad" in text
  assert text.count("| served |") == 2 * 4
  assert text.count("| host |") == 2 * 4
  assert text.count("| shipped |") == len(shipped_curve)
  assert text.count("| authors |") == 2 * 4 + len(se.AUTHORS_SEARCHED)
  assert "## Recall curves at one full-size shard (3,000 rows" in text
  assert "0.820 at x1.0, 0.780 at x1.1; interpolated: x1.050." in text
  fit["calibration"][0]["recall_at_5"] = 0.9  # easier than any scale: the grid's start
  assert "0.780 at x1.1; no scale of the grid reaches the real recall: x1.050, its end" in (
      se.markdown(result))
  assert "| document_halves fit | 0123456789ab | 2026-11-29T08:00:00+0000 | 12 |" in text
  assert "| curve | fedcba987654+ |" in text
  assert "| documents news | 0123456789ab | 2026-11-29T08:00:00+0000 | 3 |" in text
  differences = [r["difference"] for r in worse["table"]]
  assert (f"**first_try**: it was wrong.\n- document_halves: not trusted, synthetic − real "
          f"{min(differences):+.3f} to {max(differences):+.3f} over 12 rows, gap ratio 1.250; "
          "calibration: real 0.800, generated 0.780-0.820 over the grid, scale x1.050 (at "
          "0123456789ab).") in text
  # A split that failed says what its figures show; one that passed does not.
  assert text.count("What the checks show: ") == 1 + (v["verdict"] != "trusted")
  assert (f"the median cosine between a question's top 5 blocks is "
          f"{worse['synthetic']['top5_pair_cosine_median']:.3f} generated") in text
  assert "The fit side holds 1.0 blocks a title, the validation side 1.0" in text
  assert "news/bbc.jsonl (10 rows, 3,000 blocks of 128 wordpieces, 3,000 texts, 2,900 " in text


def _validated_against_draws(drawn_by: se.EmbeddingGenerator,
                             validated_by: se.EmbeddingGenerator, num_queries=100,
                             seed=0) -> dict:
  """validate of `validated_by` against 'real' blocks and questions drawn by `drawn_by` as
  validate draws them (blocks at `seed`, questions about them at seed + 1): with
  drawn_by = validated_by, the very draws it is compared with."""
  blocks, clusters = drawn_by.blocks(1000, seed=seed)
  asked, _ = drawn_by.queries(blocks, clusters, num_queries, seed=seed + 1)
  return se.validate(blocks, asked, validated_by, seed=seed, repeats=1)


def test_a_generator_validated_against_its_own_draws_is_trusted(one_build_per_table):
  """The real side is the synthetic side, table for table (each searched by the same
  build: one build per table, the served shard's included): every recall agrees to the
  last digit, the gap ratio is 1, and the verdict is "trusted"."""
  blocks, _, _ = _mixture(1000, seed=6)
  generator = se.EmbeddingGenerator.fit(blocks, blocks[:150] + np.float32(0.2), clusters=4,
                                        rank=2)
  v = _validated_against_draws(generator, generator)
  # One build a built row and one served shard, shared by both sides.
  assert len(one_build_per_table) == len(v["table"]) - len(se.SHIPPED_FRACTIONS) + 1
  assert [r["difference"] for r in v["table"]] == [0.0] * len(v["table"])
  assert v["gap_ratio"] == 1.0
  assert v["recall_agrees"] and v["gap_agrees"] and v["failed"] == []
  assert v["verdict"] == "trusted"


@pytest.mark.usefixtures("exact_builds")
def test_a_generator_whose_questions_score_half_again_as_high_is_not_trusted():
  """A fitted generator's own draws, validated by a copy whose questions are all 1.5 times
  as long (scale and residual each x1.5), about the same blocks: searched exactly, every
  recall agrees (1 where nothing re-scores; the served rows re-score from float16), but
  every score, and so the median 5th-6th gap, is 1.5 times the real one's, outside
  GAP_TOLERANCE: "not trusted", the gap the one failed check."""
  blocks, _, _ = _mixture(1000, seed=6)
  generator = se.EmbeddingGenerator.fit(blocks, blocks[:150] + np.float32(0.2), clusters=4,
                                        rank=2)
  longer = se.dataclasses.replace(
      generator, query_scales=generator.query_scales * np.float32(1.5),
      query_residuals=generator.query_residuals * np.float32(1.5))
  v = _validated_against_draws(generator, longer)
  built = [r for r in v["table"] if r["configuration"] != "served"]
  assert [(r["real"], r["synthetic"]) for r in built] == [(1.0, 1.0)] * len(built)
  assert v["recall_agrees"]
  assert v["gap_ratio"] == pytest.approx(1.5, rel=1e-4)
  assert not v["gap_agrees"]
  assert [c["check"] for c in v["failed"]] == ["median 5th-6th gap ratio"]
  assert v["failed"][0]["beyond_tolerance"] == pytest.approx(0.5 - se.GAP_TOLERANCE,
                                                             rel=1e-3)
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


def test_released_recall_rows_say_whether_their_generator_was_validated(tmp_path,
                                                                        monkeypatch):
  """benchmarks.released_scale.generator_validation: '' only for a run drawn from the
  generator synthetic_embeddings validated, with the verdict 'trusted'; else 'generator
  not validated' and why. The Markdown reads the committed validation: its ScaNN section
  says so, and so does the recall target's measured figure, no other target's."""
  from benchmarks import released_scale  # noqa: PLC0415  heavy module, this test only
  check = released_scale.generator_validation
  run = dict(steps=dict(release=dict(generator_fingerprint="abc")))
  trusted = dict(verdict="trusted", generator=dict(fingerprint="abc"))
  assert check(run, trusted) == ""
  for validation, why in ((dict(trusted, verdict="not trusted"), "verdict is 'not trusted'"),
                          (dict(trusted, generator=dict(fingerprint="xyz")),
                           "drew from generator abc, the validated one is xyz"),
                          ({}, "holds no out-of-sample validation")):
    assert check(run, validation).startswith("generator not validated: ")
    assert why in check(run, validation)
  assert "records no generator fingerprint" in check(dict(steps=dict(release={})), trusted)

  recall = dict(questions=10, shards=1, leaves=[4], leaves_searched=[1], rows_left_out=0,
                exact_p50_ms=2.0, settings=[dict(leaves_fraction=None,
                                                 reorder_num_neighbors=None, recall_at_5=0.9,
                                                 p50_ms=1.0, p99_ms=1.5, p50_over_exact=0.5)])
  result = dict(blocks=40, steps=dict(release=dict(generator_fingerprint="abc"),
                                      scann_recall=recall),
                targets=[dict(what=f"{released_scale.RECALL_TARGET} >= 0.95 (10 questions)",
                              measured="0.900", met=False),
                         dict(what="disk <= 70.0 GB", measured="1 GB", met=True)])
  monkeypatch.setattr(se.harness, "RESULTS_DIR", str(tmp_path))
  se.harness.write_json(str(tmp_path / "synthetic_embeddings.json"), trusted)
  text = released_scale.markdown(result)
  assert "Generator validated out of sample" in text and "not validated" not in text
  se.harness.write_json(str(tmp_path / "synthetic_embeddings.json"),
                        dict(trusted, verdict="not trusted"))
  text = released_scale.markdown(result)
  assert "**Generator not validated: the out-of-sample validation's verdict is" in text
  assert "| 0.900 (generator not validated) | **no** |" in text
  assert "| 1 GB | yes |" in text
