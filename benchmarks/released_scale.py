"""REALM's released path at its real size on one machine: import, evaluate, export, serve and
hand over 13,353,718 blocks.

    python -m benchmarks.released_scale [--blocks 13353718] [--work_dir DIR]
        [--questions 200] [--requests 30] [--check_rows 64] [--name released_scale]

A release is written in the authors' layout at the real sizes (benchmarks/released_files.py's
names, docs/released_models.md's folders): BERT-base-shaped random weights under the
released names (the embedder module with its MLM head, the knowledge-augmented encoder's
module, an Open-QA checkpoint with Adam's slots, global_step, params.json and no checkpoint
state file, as the authors' exporter leaves it), --blocks real-length records in
blocks.tfr / titles.tfr (benchmarks.scale.LeadWords: `[CLS] title [SEP] text [SEP]` of 288
wordpieces from the Wikipedia leads the demo ships), and block_emb [N, 128] float32 in
encoded.ckpt: seeded clustered rows (benchmarks.scale.seeded_embeddings), or with
--embedding_generator rows of a generator fitted to real embeddings
(benchmarks.synthetic_embeddings), except the --check_rows rows the import re-embeds, which an independent NumPy BERT-base
(benchmarks/bert_reference.py) computes from those blocks, so the release's own check runs at
full size against an independent implementation.

Then the documented commands run, each as its own process, as a user runs them:
  import     python -m realm_tf.import_released ... --noblock_records
  evaluate   python -m realm_tf.evaluate --max_questions Q (NQ-Open questions from
             ../shared/data when present; the weights are random, so exact match is not
             the point: memory and time are)
  export     python -m realm_tf.export --kinds realm_qa
  serve      python -m serving.server on the export: load time, memory (the load's
             sampled peak, after load, the hand-over's sampled peak, after it), p50/p99
             of --requests questions at one gRPC client (the official stubs), the served
             blocks' texts; with --embedding_generator, the recall questions' top-K read
             over gRPC from the export's `retrieve_embedding` (serving.client.retrieve) and
             kept as the reference of every recall below
  handover   a second version (hard links of the first) published while one client keeps
             asking, under availability_preserving and then resource_preserving: peak
             memory, time, and every request's outcome (0 failed is the target under
             availability_preserving; resource_preserving unloads first, by design)
  scann      (with --embedding_generator; the questions: --recall_questions of the
             generator's, drawn once into <work_dir>/recall_questions.npy)
             scann_recall: the import's ScaNN shards as the trainer searches them (int8
             reordering), in process, against exact search over the same index, at their
             own settings and other leaf fractions and reorder counts, with search alone
             one question at a time (traced);
             export_scann: python -m realm_tf.export --kinds realm_qa_scann;
             serve_scann: served and handed over as above, its recall@5 read over gRPC from
             its `retrieve_embedding` against the exact export's served top-K (the target:
             >= 0.95 at the default leaves), and retrieval alone one request at a time;
             scann_authors: the REALM authors' configuration (scann_index.AUTHORS_PARAMS)
             built over the same block_emb, one searcher over all blocks as they built it
             (--authors_searcher per_shard: one a shard, merged), its recall@5 against the
             same served reference
  profile    (measurement only, after scann) where the ScaNN export's peak and its served
             retrieval's time go: export_scann_memory runs the export again (into a
             scratch dir, deleted after) with its RSS sampled every 0.5 s and placed
             against its log's lines; retrieval_profile loads the published
             realm_qa_scann in process and times its `retrieve_embedding`, one question a
             call, with TensorFlow's profiler's op breakdown (benchmarks.serving), then the
             same questions over gRPC from serving.server
Per step: its provenance (commit, start, wall seconds: harness.recorded), peak RSS of the
step's process (its own rusage; the server's sampled), disk under --work_dir sampled
every --disk_sample_seconds while the step runs (its peak) and read after it. The
release's inputs are deleted once the import has committed (a disk budget of ~70 GB).
The results file is rewritten after every step, so a late failure keeps the earlier rows;
a failed step is recorded with its error. Targets (TARGETS) are stated with the margin
they are met by or the amount they are missed by.

Two full shards: the same command at --blocks 2054418 --index_shards 2 --name
released_scale_two_shards (2 x 1,027,209 rows, the 13-shard run's shard size), in its own
work dir.

Results: benchmarks/results/<name>.json and .md. Run it alone on an idle machine: the
steps need up to ~16 GiB and both cores.
"""
import argparse
import functools
import gc
import json
import os
import re
import shutil
import sys
import time

import numpy as np

from benchmarks import harness
from benchmarks.harness import du_bytes, gib
from benchmarks.server_process import ServerProcess

WIKIPEDIA_BLOCKS = 13_353_718
BERT_BASE = dict(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072,
                 max_position_embeddings=512, type_vocab_size=2, projection_size=128,
                 span_hidden_size=256)
# What a 24 GiB machine with ~70 GB of free disk must hold (GiB, GB, seconds).
TARGETS = dict(peak_gib=22.0, evaluate_peak_gib=12.0, export_peak_gib=14.0, disk_gb=70.0,
               wall_seconds=7200.0, scann_export_peak_gib=16.0, scann_served_gib=8.0,
               scann_handover_gib=20.0, scann_recall_at_5=0.95, search_p50_over_exact=0.05,
               end_to_end_p50_over_exact=0.3)
SEED = 43
# The recall target's row starts so; its measured figure is marked when the generator the
# rows were drawn from is not validated (generator_validation).
RECALL_TARGET = "ScaNN recall@5 against exact"
log = harness.logger("released_scale")


def parse_args(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks.released_scale",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--blocks", type=int, default=WIKIPEDIA_BLOCKS)
  parser.add_argument("--work_dir", default="/work/released_scale",
                      help="tens of GB at full size; deleted at the end unless --keep")
  parser.add_argument("--keep", action="store_true", help="keep --work_dir")
  parser.add_argument("--questions", type=int, default=200, help="questions evaluated")
  parser.add_argument("--requests", type=int, default=20,
                      help="questions asked one at a time for p50/p99")
  parser.add_argument("--check_rows", type=int, default=16,
                      help="rows the import re-embeds and compares with block_emb (each "
                      "also computed by the NumPy reference when the release is written: "
                      "about 10 s a row here)")
  parser.add_argument("--embedding_generator", default="",
                      help="a fitted generator (generator.npz of benchmarks."
                      "synthetic_embeddings' work dir) to draw block_emb from; default: "
                      "seeded clustered rows")
  parser.add_argument("--steps", default="import,evaluate,export,serve,scann",
                      help="steps to run (the release is always written first); scann: "
                      "the trainer's ScaNN shards against exact search in process "
                      "(scann_recall), the realm_qa_scann export, served (its recall read "
                      "over gRPC against the exact export's, which serve reads) and handed "
                      "over, and the authors' configuration (scann_authors; both need "
                      "--embedding_generator); scann_recall, scann_authors, export_scann: that step "
                      "alone; profile: where the ScaNN export's memory and served "
                      "retrieval's time go (measurement only)")
  parser.add_argument("--profile_steps", type=int, default=50,
                      help="profile: calls the retrieval's op breakdown is taken over")
  parser.add_argument("--index_shards", type=int, default=13,
                      help="index shards of the import, each with its ScaNN searcher (13: "
                      "about 1.03M rows a shard, the size synthetic_embeddings' curves "
                      "chose the searched fraction at)")
  parser.add_argument("--recall_questions", type=int, default=1000,
                      help="generated questions ScaNN's recall@5 against exact is measured on")
  parser.add_argument("--latency_questions", type=int, default=50,
                      help="questions searched one at a time for search-alone p50")
  parser.add_argument("--authors_searcher", choices=("one", "per_shard"), default="one",
                      help="the authors' configuration as one searcher over all blocks (as "
                      "they built it) or one per index shard, merged (if one does not fit)")
  parser.add_argument("--disk_sample_seconds", type=float, default=5.0,
                      help="how often the work dir's disk use is sampled while a step runs")
  parser.add_argument("--name", default="released_scale", help="results file stem")
  parser.add_argument("--timeout", type=float, default=3600.0,
                      help="seconds a version may take to load")
  args = PHASES.parse(parser, argv)
  if args.blocks < 100:
    parser.error("--blocks must be at least 100")
  return args


# ---------------------------------------------------------------------------- measuring


def run_step(command: list, log_path: str) -> dict:
  """Runs one documented command as its own process (harness.run_process): its wall time,
  peak RSS, the command, and the tail of its output.

  Raises:
    RuntimeError: the command failed (its output's tail in the message).
  """
  done = harness.run_process(command, log_path)
  return dict(seconds=round(done["seconds"], 1), peak_rss_gib=gib(done["peak_rss_bytes"], 2),
              command=" ".join(command), output_tail=done["output"][-1500:])


def last_json(text: str) -> dict:
  """The last JSON object a command printed (its summary)."""
  start = text.rfind("\n{")
  start = 0 if start < 0 and text.startswith("{") else start + 1
  return json.loads(text[start:])


# ------------------------------------------------------------------------------ release


def write_release(args, work: str) -> dict:
  """The release at --blocks blocks in the authors' layout (module docstring), in
  <work>/release. Its weights and its records, each written whole once, are kept by a
  rerun (harness.cached)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from benchmarks import scale  # pylint: disable=g-import-not-at-top
  from realm_tf.import_released import tower_check  # pylint: disable=g-import-not-at-top
  from realm_tf.pretrained import minilm_vocab_file  # pylint: disable=g-import-not-at-top
  from realm_tf.text.tokenization import Tokenizer  # pylint: disable=g-import-not-at-top
  from benchmarks import released_files as rf  # pylint: disable=g-import-not-at-top
  root = os.path.join(work, "release")
  start = time.time()
  rng = np.random.default_rng(SEED)
  vocab_path = minilm_vocab_file()
  with open(vocab_path, encoding="utf-8") as f:
    vocab = [w for w in f.read().split("\n") if w]
  embedder_dir = os.path.join(root, "cc_news_pretrained", "embedder")
  os.makedirs(os.path.join(embedder_dir, "assets"), exist_ok=True)
  shutil.copy(vocab_path, os.path.join(embedder_dir, "assets", "vocab.txt"))
  scopes = rf.NESTINGS["release"]
  # BERT's initializer scale: random BERT-base weights that keep activations finite.
  embedder = rf.bert_tensors(rng, scopes["embedder_bert"], len(vocab), mlm_head=True,
                             sizes=BERT_BASE, scale=0.02)
  embedder.update(rf.head_tensors(rng, scopes["embedder_head"], "LayerNorm", sizes=BERT_BASE))
  harness.cached(os.path.join(root, "weights.json"),
                 functools.partial(write_weights, rng, root, embedder, vocab, embedder_dir,
                                   scopes, args.blocks),
                 keep=lambda weights: weights["blocks"] == args.blocks, log=log)
  weights_seconds = time.time() - start

  tokenizer = Tokenizer()
  leads = scale.LeadWords(tokenizer, os.path.join(root, "leads.npz"))
  corpus = os.path.join(root, "enwiki-20181220")
  os.makedirs(corpus, exist_ok=True)
  checked = tower_check.sample_rows(args.blocks, args.check_rows)
  records = harness.cached(
      os.path.join(root, "records.json"),
      functools.partial(write_records, leads, corpus, args.blocks, checked),
      keep=lambda kept: (kept["blocks"] == args.blocks
                         and kept["checked_rows"] == [int(r) for r in checked]), log=log)
  checked_blocks, text_bytes = records["checked_blocks"], records["text_bytes"]
  records_seconds = time.time() - start - weights_seconds

  # block_emb: clustered seeded rows (or the generator's), the checked ones from the NumPy
  # reference, written straight into the variable the Saver writes: a NumPy array of it
  # beside the variable held it about three times at the peak (20.8 GiB), which the
  # generator's transient memory pushed past this machine's 23 GiB.
  reference = rf.Reference(embedder, {}, vocab, 1e-12, "LayerNorm", "release", BERT_BASE)
  articles = leads.block_articles(args.blocks, 288, seed=SEED)
  num_titles = len(leads.titles)
  del leads
  # Filled by scatter updates: a sliced assign copied the whole variable (measured: 2.8x
  # its size at the peak, against 1.8x this way, and the Saver adds nothing to it).
  shape = [args.blocks, BERT_BASE["projection_size"]]
  variable = tf.Variable(lambda: tf.zeros(shape, tf.float32), shape=shape, dtype=tf.float32,
                         name="block_emb")
  row = 0
  for part in embedding_rows(articles, num_titles, args.embedding_generator):
    variable.scatter_update(tf.IndexedSlices(part, tf.range(row, row + len(part))))
    row += len(part)
    del part
  del articles
  gc.collect()

  def ids(text):
    return [int(i) for i in tokenizer.tokenize(tf.constant([text])).merge_dims(1, -1)[0]]

  reference_start = time.time()
  for i, (title, text) in enumerate(checked_blocks):
    title_ids = ids(title)
    body = ids(text)[:288 - 3 - len(title_ids)]
    variable.scatter_update(tf.IndexedSlices(
        reference.document_embedding(title_ids, body)[None].astype(np.float32),
        tf.constant([int(checked[i])])))
  reference_seconds = time.time() - reference_start
  del embedder, reference
  tf.compat.v1.train.Saver(var_list={"block_emb": variable}).save(
      None, os.path.join(embedder_dir, "encoded", "encoded.ckpt"), write_meta_graph=False,
      write_state=False)
  del variable
  questions = os.path.join(root, "resplit", "NaturalQuestions.resplit.test.jsonl")
  os.makedirs(os.path.dirname(questions), exist_ok=True)
  with open(questions, "w") as f:
    for question, answers in read_questions(args.questions):
      f.write(json.dumps(dict(question=question, answer=answers)) + "\n")
  return dict(seconds=round(time.time() - start, 1), weights_seconds=round(weights_seconds, 1),
              records_seconds=round(records_seconds, 1),
              reference_seconds=round(reference_seconds, 1), blocks=args.blocks,
              text_bytes=text_bytes, checked_rows=len(checked),
              embeddings=args.embedding_generator or "seeded clustered rows",
              generator_fingerprint=generator_fingerprint(args.embedding_generator),
              bytes=du_bytes(root, on_disk=True),
              peak_rss_gib=gib(harness.peak_rss_bytes(), 2), finished=time.time())


def embedding_rows(articles: np.ndarray, num_articles: int, generator_path: str = "",
                   rows_per_part: int = 1 << 20):
  """block_emb's rows in order, `rows_per_part` at a time (so the full size is never made
  twice): part i of the fitted generator at `generator_path` drawn with seed SEED + i, or
  without one scale.seeded_embeddings' clustered rows (one per entry of `articles`).

  Yields:
    [n, 128] float32 arrays, len(articles) rows in all.
  """
  from benchmarks import scale  # pylint: disable=g-import-not-at-top
  if not generator_path:
    yield from scale.seeded_embeddings(articles, num_articles, seed=SEED)
    return
  for _, rows, _ in generator_parts(generator_path, len(articles), rows_per_part):
    yield rows


def generator_fingerprint(generator_path: str):
  """The fingerprint of the generator at `generator_path` (EmbeddingGenerator.fingerprint),
  None without one: what generator_validation compares with the validated one's."""
  if not generator_path:
    return None
  from benchmarks.synthetic_embeddings import EmbeddingGenerator  # pylint: disable=g-import-not-at-top
  return EmbeddingGenerator.load(generator_path).fingerprint()


def generator_validation(result: dict, validation: dict | None = None) -> str:
  """'' when the run's block_emb was drawn from the generator that benchmarks/results/
  synthetic_embeddings.json validated out of sample and trusts; else why its recall rows
  are not validated. Why: a recall on generated vectors stands for a real one only as far
  as the generator was shown to give real recalls on embeddings it was not fitted to.

  Args:
    result: this benchmark's result (its release step records the generator drawn from).
    validation: synthetic_embeddings' result (default: the committed one).

  Returns:
    '' or 'generator not validated: <why>'.
  """
  if validation is None:
    validation = harness.Output("synthetic_embeddings").read()
  drawn = result.get("steps", {}).get("release", {}).get("generator_fingerprint")
  validated = validation.get("generator", {}).get("fingerprint")
  if not validated:
    why = "benchmarks/results/synthetic_embeddings.json holds no out-of-sample validation"
  elif validation.get("verdict") != "trusted":
    why = (f"the out-of-sample validation's verdict is '{validation.get('verdict')}' "
           "(benchmarks/results/synthetic_embeddings.md)")
  elif drawn is None:
    why = ("this run's block_emb records no generator fingerprint (drawn before the "
           f"out-of-sample validation); the validated one is {validated}")
  elif drawn != validated:
    why = f"this run drew from generator {drawn}, the validated one is {validated}"
  else:
    return ""
  return f"generator not validated: {why}"


def generator_parts(generator_path: str, blocks: int, rows_per_part: int):
  """The generator's rows of block_emb, part by part: part i is `rows_per_part` rows (the
  last fewer) drawn with seed SEED + i, the one mapping of parts to seeds, shared by the
  release (embedding_rows) and the questions about its rows (generator_questions).

  Yields:
    (generator, rows [n, 128] float32, their clusters [n]).

  Raises:
    ValueError: the generator's rows are not block_emb's width.
  """
  from benchmarks.synthetic_embeddings import EmbeddingGenerator  # pylint: disable=g-import-not-at-top
  generator = EmbeddingGenerator.load(generator_path)
  if generator.means.shape[1] != BERT_BASE["projection_size"]:
    raise ValueError(f"{generator_path}: {generator.means.shape[1]}-d rows, the released "
                     f"block_emb is {BERT_BASE['projection_size']}-d")
  for part, start in enumerate(range(0, blocks, rows_per_part)):
    rows, clusters = generator.blocks(min(rows_per_part, blocks - start), seed=SEED + part)
    yield generator, rows, clusters


def write_records(leads, corpus: str, blocks: int, checked) -> dict:
  """blocks.tfr and titles.tfr of `blocks` blocks into `corpus`; the (title, text) of the
  `checked` rows, which the reference embeds."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  checked_set = {int(r): i for i, r in enumerate(checked)}
  checked_blocks = [None] * len(checked)
  text_bytes = 0
  with tf.io.TFRecordWriter(os.path.join(corpus, "blocks.tfr")) as blocks_out, \
      tf.io.TFRecordWriter(os.path.join(corpus, "titles.tfr")) as titles_out:
    for row, (title, text) in enumerate(leads.blocks(blocks, 288, seed=SEED)):
      encoded = text.encode("utf-8")
      text_bytes += len(encoded)
      blocks_out.write(encoded)
      titles_out.write(title.encode("utf-8"))
      if row in checked_set:
        checked_blocks[checked_set[row]] = (title, text)
      if row % 1_000_000 == 0:
        log(f"release: {row} / {blocks} records")
  return dict(blocks=blocks, text_bytes=text_bytes, checked_rows=[int(r) for r in checked],
              checked_blocks=checked_blocks)


def write_weights(rng, root, embedder, vocab, embedder_dir, scopes, blocks) -> dict:
  """The modules' and the Open-QA model's checkpoints (the embedder's drawn by the caller,
  who also needs it for the reference); what was written."""
  from benchmarks import released_files as rf  # pylint: disable=g-import-not-at-top
  rf.save_checkpoint(os.path.join(embedder_dir, "variables", "variables"), embedder)
  bert = rf.bert_tensors(rng, "", len(vocab), mlm_head=True, sizes=BERT_BASE, scale=0.02)
  rf.save_checkpoint(os.path.join(root, "cc_news_pretrained", "bert", "variables",
                                  "variables"), bert)
  del bert
  orqa = rf.bert_tensors(rng, scopes["query_bert"], len(vocab), mlm_head=False,
                         sizes=BERT_BASE, scale=0.02)
  orqa.update(rf.head_tensors(rng, scopes["query_head"], "LayerNorm", sizes=BERT_BASE))
  orqa.update(rf.bert_tensors(rng, rf.READER_BERT, len(vocab), mlm_head=True,
                              sizes=BERT_BASE, scale=0.02))
  orqa.update(rf.reader_head_tensors(rng, sizes=BERT_BASE))
  orqa_dir = os.path.join(root, "orqa_nq_model_from_realm")
  rf.save_checkpoint(os.path.join(orqa_dir, "export", "best_default", "checkpoint",
                                  f"model.ckpt-{rf.STEP}"), orqa, step=rf.STEP,
                     adam_slots=True)
  rf.write_params_json(orqa_dir, num_block_records=blocks,
                       span_hidden_size=BERT_BASE["span_hidden_size"])
  del orqa
  return dict(blocks=blocks, embedder=embedder_dir, orqa_model=orqa_dir)


def read_questions(count: int) -> list:
  """(question, answers) pairs: NQ-Open's from ../shared/data when present, else made up."""
  path = os.path.join(harness.SHARED_DATA, "openqa", "nq_open", "train_subset.jsonl")
  pairs = []
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      for line in f:
        record = json.loads(line)
        pairs.append((record["question"], record["answer"]))
        if len(pairs) == count:
          break
  while len(pairs) < count:
    pairs.append((f"who wrote the iliad {len(pairs)}?", ["Homer"]))
  return pairs


# -------------------------------------------------------------------------- ScaNN recall

# (leaves fraction, reorder count) searched beside the shards' own defaults (None, None).
SEARCH_SETTINGS = ((None, None), (0.1, 100), (0.2, 100), (0.2, 250))
K = 5


def generator_questions(generator_path: str, blocks: int, count: int,
                        rows_per_part: int = 1 << 20) -> np.ndarray:
  """`count` (at least) questions of the fitted generator about block_emb's generated rows:
  each part of embedding_rows drawn again (generator_parts: the same rows and clusters)
  and an equal share of the questions made from its rows (seed SEED + 1000 + part).

  Returns:
    [ceil(count / parts) x parts, 128] float32.
  """
  each = -(-count // len(range(0, blocks, rows_per_part)))
  return np.concatenate([
      generator.queries(rows, clusters, each, seed=SEED + 1000 + part)[0]
      for part, (generator, rows, clusters) in enumerate(
          generator_parts(generator_path, blocks, rows_per_part))])


def without(found: np.ndarray, excluded, k: int) -> np.ndarray:
  """The first k of each row of `found` [Q, m] block ids that are not in `excluded` (rows
  short of k padded with -1).

  Why: the --check_rows rows of block_emb are the NumPy reference's embeddings under random
  BERT-base weights, norm ~12 against the generator's ~0.9, so they top the inner products
  of a quarter of the questions in their shard alone (measured at 13.35M blocks: recall
  0.673 with them, 0.927 without, in one shard). They check the import, not the search:
  both searches fetch k + len(excluded) and drop them."""
  excluded = set(int(b) for b in excluded)
  out = np.full([len(found), k], -1, np.int64)
  for i, row in enumerate(found):
    kept = [int(b) for b in row if int(b) not in excluded][:k]
    out[i, :len(kept)] = kept
  return out


def scann_recall(args, work: str) -> dict:
  """ScaNN's recall@5 against exact search over the imported index, on generated
  questions, and search alone, one question at a time, against exact: the index's own
  shards as the trainer's host search uses them (int8 reordering, ScaNN's scores) at their
  own settings and SEARCH_SETTINGS. Not what a realm_qa_scann export serves: that recall
  is read over gRPC from the published export (serve's served_recall)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from realm_tf.import_released import tower_check  # pylint: disable=g-import-not-at-top
  from realm_tf.io import layout  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval import load_searcher, scann_index  # pylint: disable=g-import-not-at-top
  if not args.embedding_generator:
    raise ValueError("the ScaNN recall needs --embedding_generator: its questions are the "
                     "generator's")
  run_dir = os.path.join(work, "run")
  index = layout.index_dir(run_dir)
  checked = tower_check.sample_rows(args.blocks, args.check_rows)  # the block ids, 0-based
  questions = generator_questions(args.embedding_generator, args.blocks,
                                  args.recall_questions)
  start = time.time()
  exact = load_searcher(index, backend="exact")
  exact_load_seconds = time.time() - start

  def top(searcher, fetch: int = K + len(checked)) -> np.ndarray:
    """[Q, K] block ids, the checked rows left out."""
    return without(np.concatenate([
        searcher.search(tf.constant(questions[i:i + 50]), fetch).block_ids.numpy()
        for i in range(0, len(questions), 50)]), checked, K)

  truth = top(exact)
  single = questions[:args.latency_questions]

  def one_at_a_time(searcher) -> dict:
    # Traced, as a served graph runs it: eagerly, every shard's few ops cost a Python
    # dispatch each (at 250,000 blocks in 2 shards, served ScaNN took 12.2 ms eagerly and
    # 1.1 ms traced, exact search 31 and 9 ms). Traced inside the caller's searching_with.
    search = tf.function(lambda q: searcher.search(q, K).block_ids)
    search(tf.constant(single[:1])).numpy()  # trace and warm
    seconds = []
    for q in single:
      begin = time.perf_counter()
      search(tf.constant(q[None])).numpy()
      seconds.append(time.perf_counter() - begin)
    return harness.percentiles(seconds)

  exact_latency = one_at_a_time(exact)
  del exact  # 6.8 GiB at 13.35M blocks: not held beside the ScaNN shards
  gc.collect()
  start = time.time()
  scann = load_searcher(index, backend="scann")
  scann_load_seconds = time.time() - start
  layouts = [shard.layout for shard in scann.shards]

  def row(found, latency, **how) -> dict:
    return dict(how, recall_at_5=harness.recall(found, truth), p50_ms=latency["p50_ms"],
                p99_ms=latency["p99_ms"],
                p50_over_exact=latency["p50_ms"] / exact_latency["p50_ms"])

  rows = []
  for fraction, reorder in SEARCH_SETTINGS:
    with scann_index.searching_with(scann_index.SearchOptions(fraction, reorder)):
      rows.append(row(top(scann), one_at_a_time(scann), leaves_fraction=fraction,
                      reorder_num_neighbors=reorder))
  return dict(questions=len(questions), shards=len(layouts), rows_left_out=len(checked),
              leaves=[l.num_leaves for l in layouts],
              leaves_searched=[l.num_leaves_to_search for l in layouts],
              exact_p50_ms=exact_latency["p50_ms"], exact_p99_ms=exact_latency["p99_ms"],
              latency_questions=len(single), settings=rows,
              exact_load_seconds=round(exact_load_seconds, 1),
              scann_load_seconds=round(scann_load_seconds, 1),
              peak_rss_gib=gib(harness.peak_rss_bytes(), 2))


def recall_queries(args, work: str) -> np.ndarray:
  """The generated questions every recall of this run is read on (generator_questions),
  drawn once and kept in <work>/recall_questions.npy, so the exact and the ScaNN servers
  and the authors' searcher are asked the same ones in whichever invocation runs them.

  Returns:
    [Q, 128] float32, Q >= --recall_questions.

  Raises:
    ValueError: no --embedding_generator (the questions are the generator's).
  """
  if not args.embedding_generator:
    raise ValueError("the recall rows need --embedding_generator: their questions are the "
                     "generator's")
  path = os.path.join(work, "recall_questions.npy")
  if os.path.exists(path):
    kept = np.load(path)
    if len(kept) >= args.recall_questions:
      return kept
  questions = generator_questions(args.embedding_generator, args.blocks,
                                  args.recall_questions).astype(np.float32)
  np.save(path + ".tmp.npy", questions)
  os.replace(path + ".tmp.npy", path)  # whole or absent
  return questions


def recall_without(found: np.ndarray, truth: np.ndarray, excluded) -> float:
  """recall of `truth` [Q, K] block ids in `found` [Q, K'], the `excluded` ids left out of
  both: mean over questions of |found ∩ truth| / |truth|, questions whose truth is all
  excluded passed over. Why: the served retrieve returns K blocks, not K plus the
  --check_rows rows the in-process searches fetch (`without`); those rows (the NumPy
  reference's embeddings, norms far above the generator's) check the import, not the
  search, and where one tops exact's K it is counted in neither list."""
  excluded = set(int(b) for b in excluded)
  shares = []
  for got, want in zip(found, truth):
    want = set(int(b) for b in want) - excluded
    if want:
      shares.append(len(want & (set(int(b) for b in got) - excluded)) / len(want))
  return float(np.mean(shares))


def served_exact_top_path(work: str) -> str:
  """Where the exact export's served top-K of the recall questions is kept: the reference
  of the ScaNN export's and the authors' recall."""
  return os.path.join(work, "served_exact_top.npy")


def read_served_exact_top(work: str) -> np.ndarray:
  """The exact export's served top-K ([Q, K] block ids) the serve step of realm_qa kept.

  Raises:
    FileNotFoundError: naming the file and the step that writes it.
  """
  path = served_exact_top_path(work)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: the exact export's served top-K, written by the "
                            "serve step (realm_qa, availability_preserving); run it first")
  return np.load(path)


def served_retrieval(address: str, model: str, queries: np.ndarray, latency_questions: int,
                     batch: int = 50) -> tuple:
  """The served model's `retrieve_embedding` over gRPC (serving.client.retrieve, the
  official stubs): every row of `queries` [Q, P] in requests of `batch`, then the first
  `latency_questions` one request each, timed.

  Returns:
    (found [Q, K] int64 block ids, percentiles of the single-question requests).
  """
  import grpc  # pylint: disable=g-import-not-at-top
  from tensorflow_serving.apis import prediction_service_pb2_grpc  # pylint: disable=g-import-not-at-top
  from serving import client  # pylint: disable=g-import-not-at-top
  with grpc.insecure_channel(address, options=[
      ("grpc.max_receive_message_length", client.MAX_MESSAGE_BYTES)]) as channel:
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    found = np.concatenate([
        client.retrieve(stub, model, query_embeddings=queries[i:i + batch],
                        timeout=300)["block_ids"] for i in range(0, len(queries), batch)])
    seconds = []
    for q in queries[:latency_questions]:
      begin = time.perf_counter()
      client.retrieve(stub, model, query_embeddings=q[None], timeout=300)
      seconds.append(time.perf_counter() - begin)
  return found, harness.percentiles(seconds)


# An absl log line: level, month and day, time, thread, source, message.
ABSL_LINE = re.compile(r"^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d\.\d+) +\d+ (\S+)\] (.*)")


def memory_timeline(done: dict, log_text: str, min_rise_gib: float = 0.2) -> dict:
  """Where a process's memory went: its RSS samples (harness.run_process's, with
  rss_every) placed between the timestamped lines of its absl log.

  Args:
    done: run_process's result (rss_samples, started).
    log_text: the process's output.
    min_rise_gib: an interval is listed when RSS rose by at least this much in it, or it
      holds the peak.

  Returns:
    dict(peak_gib, peak_at_s, intervals: [dict(after, before: the log lines bounding it
    (source and message, trimmed), from_s, to_s, rss_at_start_gib, max_gib,
    rss_at_end_gib)], the listed ones in order).
  """
  start = time.localtime(done["started"])
  events = [(0.0, "process start")]
  for line in log_text.splitlines():
    match = ABSL_LINE.match(line)
    if not match:
      continue
    month, day, hour, minute, second, source, message = match.groups()
    when = time.mktime((start.tm_year, int(month), int(day), int(hour), int(minute), 0, 0,
                        0, -1)) + float(second)
    events.append((round(when - done["started"], 2), f"{source}] {message[:90]}"))
  samples = done["rss_samples"]
  events.append((max(s for s, _ in samples) + 1.0 if samples else 0.0, "process end"))
  peak_at, peak = max(samples, key=lambda sample: sample[1]) if samples else (0.0, 0)

  def rss_at(t: float) -> int:
    before = [rss for s, rss in samples if s <= t]
    return before[-1] if before else 0

  intervals = []
  for (began, after), (ended, before) in zip(events, events[1:]):
    inside = [rss for s, rss in samples if began <= s < ended]
    if not inside:
      continue
    first = rss_at(began)
    if max(inside) - first >= min_rise_gib * 2**30 or began <= peak_at < ended:
      intervals.append(dict(after=after, before=before, from_s=began, to_s=ended,
                            rss_at_start_gib=gib(first, 2), max_gib=gib(max(inside), 2),
                            rss_at_end_gib=gib(rss_at(ended), 2)))
  return dict(peak_gib=gib(peak, 2), peak_at_s=peak_at, samples=len(samples),
              intervals=intervals)


def retrieval_profile(args, work: str) -> dict:
  """The published realm_qa_scann's `retrieve_embedding` in this process (no gRPC): one
  question a call over --latency_questions of the recall questions, and TensorFlow's
  profiler's op breakdown (benchmarks.serving.op_breakdown) over --profile_steps calls:
  where served retrieval's time goes beside the search alone (scann_recall)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from benchmarks.serving import op_breakdown  # pylint: disable=g-import-not-at-top
  from realm_tf.export import qa  # pylint: disable=g-import-not-at-top
  base = os.path.join(work, "models", "realm_qa_scann")
  version = os.path.join(base, str(max(harness.versions(base))))
  queries = recall_queries(args, work)[:args.latency_questions]
  start = time.time()
  retrieve = tf.saved_model.load(version).signatures[qa.RETRIEVE_EMBEDDING_SIGNATURE]
  load_seconds = time.time() - start

  def call(q):
    return retrieve(**{qa.QUERY_EMBEDDING: tf.constant(q[None])})["block_ids"].numpy()

  call(queries[0])  # the first call's one-off costs
  seconds = []
  for q in queries:
    begin = time.perf_counter()
    call(q)
    seconds.append(time.perf_counter() - begin)
  return dict(version=version, load_seconds=round(load_seconds, 1),
              questions=len(queries), **harness.percentiles(seconds),
              op_breakdown=op_breakdown(lambda: call(queries[0]), args.profile_steps,
                                        top=30),
              profile_steps=args.profile_steps,
              peak_rss_gib=gib(harness.peak_rss_bytes(), 2))


def authors_rows(work: str, version, infos, shard) -> tuple:
  """block_emb [N, P] float32 as one memory-mapped file (written once under `work` from the
  index version's shards, a shard at a time, and published by rename), and its [N] ids.

  Args:
    work: the work dir.
    version: the committed index version (its path names the file's source).
    infos: the version manifest's shard entries.
    shard: i -> (embeddings [n_i, P], block_ids [n_i]) of shard i.

  Returns:
    (the read-only memmap, the block ids in its row order).
  """
  path = os.path.join(work, f"authors_block_emb_v{version.version}.npy")
  ids_path = path.replace(".npy", "_ids.npy")
  if not (os.path.exists(path) and os.path.exists(ids_path)):
    sizes = [int(info["num_blocks"]) for info in infos]
    out = np.lib.format.open_memmap(path + ".tmp.npy", mode="w+", dtype=np.float32,
                                    shape=(sum(sizes), BERT_BASE["projection_size"]))
    ids = np.empty([sum(sizes)], np.int64)
    row = 0
    for i in range(len(infos)):
      embeddings, block_ids = shard(i)
      out[row:row + len(block_ids)], ids[row:row + len(block_ids)] = embeddings, block_ids
      row += len(block_ids)
      del embeddings, block_ids
    out.flush()
    del out
    np.save(ids_path + ".tmp.npy", ids)
    os.replace(ids_path + ".tmp.npy", ids_path)
    os.replace(path + ".tmp.npy", path)  # last: whole or absent
  return np.load(path, mmap_mode="r"), np.load(ids_path)


def authors_recall(args, work: str) -> dict:
  """The REALM authors' ScaNN configuration (scann_index.AUTHORS_PARAMS, ORQA's builder
  settings) built over this run's block_emb and read on the recall questions against the
  exact export's served top-K (read_served_exact_top), in this same run as the shipped
  export's served recall.

  --authors_searcher one: one searcher over all blocks, as the authors built theirs (their
  index is one searcher over the whole of block_emb); per_shard: one per index shard,
  merged (a ShardedSearcher), for when one does not fit in memory. The step says which.
  The checked rows are left out of both lists as in the served recall (recall_without).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from realm_tf.import_released import tower_check  # pylint: disable=g-import-not-at-top
  from realm_tf.io import layout, versioned  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval import ScannSearcher, ShardedSearcher  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval.index_export import load_shard_array  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval import scann_index  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval.scann_index import AUTHORS_PARAMS  # pylint: disable=g-import-not-at-top
  from scann.scann_ops.py import scann_ops_pybind  # pylint: disable=g-import-not-at-top
  truth = read_served_exact_top(work)
  queries = recall_queries(args, work)[:len(truth)]
  checked = tower_check.sample_rows(args.blocks, args.check_rows)
  version = versioned.latest_version(layout.index_dir(os.path.join(work, "run")))
  infos = version.manifest["shards"]

  def shard(i):
    return (load_shard_array(version, infos[i]["shard"], len(infos), "embeddings.npy"),
            load_shard_array(version, infos[i]["shard"], len(infos), "block_ids.npy"))

  start = time.time()
  if args.authors_searcher == "one":
    # One searcher over all of block_emb, as the authors built theirs. ScaNN's TensorFlow
    # builder holds its dataset as a tensor beside the NumPy rows and copies it again
    # inside (this step was killed at 23.8 GB of the machine's 24 that way). The measure
    # needs only the searcher's answers, not a SavedModel state, so the pybind builder
    # (the same C++ searcher, the same builder options: scann_index.build_scann) reads the
    # rows from a file memory-mapped in place, and only ScaNN's own copy is resident.
    vectors, ids = authors_rows(work, version, infos, shard)
    built = scann_index.build_scann(vectors, AUTHORS_PARAMS,
                                    builder=scann_ops_pybind.builder)
    del vectors

    def search(queries):
      rows, _ = built.search_batched(np.asarray(queries, np.float32),
                                     final_num_neighbors=K + len(checked))
      return ids[rows]
  else:
    sharded = ShardedSearcher([ScannSearcher.build(*shard(i), params=AUTHORS_PARAMS)
                               for i in range(len(infos))])

    def search(queries):
      return sharded.search(tf.constant(queries), K + len(checked)).block_ids.numpy()
  gc.collect()
  build_seconds = time.time() - start
  # k + the checked rows fetched and those dropped, as the in-process searches (`without`).
  found = without(np.concatenate([search(queries[i:i + 50])
                                  for i in range(0, len(queries), 50)]), checked, K)
  return dict(searcher=args.authors_searcher, searchers=1 if args.authors_searcher == "one"
              else len(infos), params=dict(AUTHORS_PARAMS.to_dict(),
                                           anisotropic_quantization_threshold="none"),
              questions=len(queries), rows_left_out=len(checked),
              recall_at_5=recall_without(found, truth[:, :K], checked),
              reference="realm_qa's retrieve_embedding over gRPC (served_exact_top.npy)",
              build_seconds=round(build_seconds, 1),
              peak_rss_gib=gib(harness.peak_rss_bytes(), 2))


# ------------------------------------------------------------------------------- serving


class AskingClient(harness.BackgroundLoop):
  """One client asking questions one at a time on its own thread until stopped; every
  request's outcome and the versions that answered are kept."""

  def __init__(self, address: str, model: str, questions: list):
    super().__init__()
    self.address, self.model, self.questions = address, model, questions
    self.ok, self.failed, self.errors, self.versions = 0, 0, [], {}

  def _run(self):
    import grpc  # pylint: disable=g-import-not-at-top
    from tensorflow_serving.apis import prediction_service_pb2_grpc  # pylint: disable=g-import-not-at-top
    from serving import client  # pylint: disable=g-import-not-at-top
    with grpc.insecure_channel(self.address, options=[
        ("grpc.max_receive_message_length", 64 << 20)]) as channel:
      stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
      i = 0
      while not self._stop.is_set():
        try:
          answer = client.ask(stub, [self.questions[i % len(self.questions)]],
                              model=self.model, timeout=300)[0]
          self.ok += 1
          version = answer["model"]["version"]
          self.versions[version] = self.versions.get(version, 0) + 1
        except Exception as e:  # pylint: disable=broad-except
          self.failed += 1
          self.errors.append(str(e)[:300])
        i += 1


def serve(args, work: str, policy: str, latency: bool, model: str = "realm_qa",
          recall: bool = False) -> dict:
  """serving.server on the export `model` (realm_qa or realm_qa_scann) under `policy`:
  load, (recall) the recall questions' top-K read over gRPC from its `retrieve_embedding`
  (served_retrieval; realm_qa's is kept as the reference, realm_qa_scann's recall@5
  against it), (latency) p50/p99 at one client, then a hand-over to a hard-linked copy
  while a client keeps asking. Memory: the load's sampled peak, RSS after load and after
  the hand-over, and the hand-over's sampled peak."""
  import grpc  # pylint: disable=g-import-not-at-top
  from tensorflow_serving.apis import prediction_service_pb2_grpc  # pylint: disable=g-import-not-at-top
  from benchmarks import scale  # pylint: disable=g-import-not-at-top
  from serving import client  # pylint: disable=g-import-not-at-top
  source_base = os.path.join(work, "models", model)
  first = harness.versions(source_base)[-1]
  base = os.path.join(work, "serve", model, policy)
  shutil.rmtree(base, ignore_errors=True)
  os.makedirs(base)
  shutil.copytree(os.path.join(source_base, str(first)), os.path.join(base, str(first)),
                  copy_function=os.link)
  server = ServerProcess(base, model, os.path.join(work, f"server-{model}-{policy}.log"),
                         flags=[f"--aspired_version_policy={policy}"])
  questions = [q for q, _ in read_questions(max(args.requests, 20))]
  result = dict(policy=policy, model=model)
  try:
    with harness.PeakSampler(server.process.pid) as load_peak:
      address = server.wait_listening(args.timeout)
      with grpc.insecure_channel(address) as channel:
        server.wait_serving(channel, first, args.timeout)
    result.update(load_seconds=round(time.monotonic() - server.started, 1),
                  load_peak_rss_gib=gib(load_peak.peak, 2))
    time.sleep(1.0)
    result["rss_after_load_gib"] = gib(harness.rss_bytes(server.process.pid), 2)
    if recall:
      from realm_tf.import_released import tower_check  # pylint: disable=g-import-not-at-top
      queries = recall_queries(args, work)
      found, retrieve_latency = served_retrieval(address, model, queries,
                                                 args.latency_questions)
      served = dict(questions=len(queries), k=int(found.shape[1]),
                    signature="retrieve_embedding",
                    retrieve_p50_ms=retrieve_latency["p50_ms"],
                    retrieve_p99_ms=retrieve_latency["p99_ms"],
                    latency_questions=min(len(queries), args.latency_questions))
      if model == "realm_qa":
        np.save(served_exact_top_path(work) + ".tmp.npy", found)
        os.replace(served_exact_top_path(work) + ".tmp.npy", served_exact_top_path(work))
      else:
        checked = tower_check.sample_rows(args.blocks, args.check_rows)
        served.update(recall_at_5=recall_without(found[:, :K], read_served_exact_top(work)[:, :K],
                                                 checked),
                      rows_left_out=len(checked),
                      reference="realm_qa's retrieve_embedding over gRPC")
      result["served_recall"] = served
    with grpc.insecure_channel(address, options=[
        ("grpc.max_receive_message_length", 64 << 20)]) as channel:
      stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
      if latency:
        latencies = []
        for question in questions[:args.requests]:
          begin = time.monotonic()
          client.ask(stub, [question], model=model, timeout=300)
          latencies.append(time.monotonic() - begin)
        result.update(harness.percentiles(latencies))
        result["sample_answer"] = scale.describe_answer(
            client.ask(stub, [questions[0]], model=model, timeout=300)[0])
      before = harness.rss_bytes(server.process.pid)
      with AskingClient(address, model, questions) as asking, \
          harness.PeakSampler(server.process.pid) as handover_peak:
        begin = time.monotonic()
        second = harness.publish_copy(base, first, hard_links=True)
        server.wait_serving(channel, second, args.timeout)
        result["handover_seconds"] = round(time.monotonic() - begin, 1)
        time.sleep(5.0)  # requests answered by the new version alone
      time.sleep(3.0)
      result.update(
          rss_before_handover_gib=gib(before, 2),
          handover_peak_rss_gib=gib(handover_peak.peak, 2),
          rss_after_handover_gib=gib(harness.rss_bytes(server.process.pid), 2),
          server_peak_rss_gib=gib(harness.peak_rss_bytes(server.process.pid), 2),
          requests_during_handover=asking.ok + asking.failed,
          failed_requests=asking.failed, errors=asking.errors[:5],
          versions_answering={str(k): v for k, v in sorted(asking.versions.items())})
  finally:
    server.stop()
    shutil.rmtree(base, ignore_errors=True)
  return result


# ------------------------------------------------------------------------------- driver


# Steps that compare searches in process rather than run the released path.
MEASUREMENT_ONLY = ("scann_recall", "scann_authors", "export_scann_memory",
                    "retrieval_profile")
STEP_ORDER = ("release", "import", "evaluate", "export", "serve_availability_preserving",
              "serve_resource_preserving", "scann_recall", "export_scann",
              "serve_scann_availability_preserving", "scann_authors", "export_scann_memory",
              "retrieval_profile")


def verdict(target: dict) -> str:
  """'yes' with the margin, or '**no**' with by how much the target was missed, from the
  target row's value and limit (rows without them: yes or no alone)."""
  if target.get("value") is None or target.get("limit") is None:
    return "yes" if target["met"] else "**no**"
  gap = abs(target["value"] - target["limit"])
  unit = target.get("unit", "")
  if target["met"] and not gap:  # met exactly (0 failed of a 0 target): no margin to state
    return "yes"
  if target["met"]:
    return f"yes ({gap:.{target.get('digits', 2)}f}{unit} to spare)"
  return f"**no**: missed by {gap:.{target.get('digits', 2)}f}{unit}"


def markdown(result: dict) -> str:
  steps = result.get("steps", {})
  lines = [f"# REALM's released path at {result.get('blocks', 0):,} blocks", "",
           "`python -m benchmarks.released_scale` (module docstring: what is written and run). "
           "Machine: " + json.dumps(result.get("machine", {}), sort_keys=True), "",
           "Each step's start (UTC), the commit it ran at and its wall come from the step "
           "itself; disk is sampled under the work dir while the step runs (its peak) and "
           "read after it.", "",
           "| step | started | commit | wall | peak RSS | disk peak while running | "
           "disk after | notes |", "|---|---|---|---:|---:|---:|---:|---|"]
  for name in STEP_ORDER:
    step = steps.get(name)
    if step is None:
      continue
    made = step.get("provenance", {})
    when, commit = made.get("started", "not recorded"), made.get("commit", "not recorded")[:12]
    if "error" in step:
      lines.append(f"| {name} | {when} | {commit} | {step.get('seconds', '')} s | | "
                   f"{step.get('disk_peak_gb', '')} GB | | **failed**: "
                   f"{step['error'][:200]} |")
      continue
    peak = step.get("peak_rss_gib", step.get("server_peak_rss_gib"))
    disk_peak = (f"{step['disk_peak_gb']} GB" if "disk_peak_gb" in step
                 else "not sampled (an earlier version of this benchmark)")
    lines.append(f"| {name} | {when} | {commit} | "
                 f"{step.get('seconds', step.get('load_seconds', ''))} s | {peak} GiB | "
                 f"{disk_peak} | {step.get('disk_gb', '')} GB "
                 f"| {step.get('notes', '')} |")
  servers = [(n, steps[n]) for n in STEP_ORDER
             if n.startswith("serve") and "load_peak_rss_gib" in steps.get(n, {})]
  if servers:
    lines += ["", "## Memory per server (GiB)", "",
              "| server | load peak | after load | hand-over peak | after hand-over |",
              "|---|---:|---:|---:|---:|"]
    for name, step in servers:
      lines.append(f"| {name} | {step['load_peak_rss_gib']} | {step['rss_after_load_gib']} | "
                   f"{step['handover_peak_rss_gib']} | {step['rss_after_handover_gib']} |")
  exact_served = steps.get("serve_availability_preserving", {}).get("served_recall")
  scann_served = steps.get("serve_scann_availability_preserving", {}).get("served_recall")
  authors = steps.get("scann_authors", {})
  recall = steps.get("scann_recall", {})
  unvalidated = (generator_validation(result) if (scann_served or "recall_at_5" in authors
                                                  or "settings" in recall) else "")
  # Every recall row below is drawn from the generator: each section says whether it was
  # validated out of sample.
  validation = (f"**{unvalidated[0].upper() + unvalidated[1:]}.**" if unvalidated else
                "Generator validated out of sample (benchmarks/results/synthetic_embeddings.md).")
  if scann_served and "recall_at_5" in scann_served:
    lines += ["", f"## Served recall over gRPC ({scann_served['questions']:,} generated "
              "questions)", "",
              validation, "",
              "Both exports are published by `python -m realm_tf.export` and served by "
              "`python -m serving.server`; each question's top "
              f"{scann_served['k']} is read from the export's `retrieve_embedding` signature "
              "(serving.client.retrieve, the official stubs): the same search `answer` "
              "runs, from the query embedding. The reference is the exact export's "
              "(realm_qa) served top-K of the same questions: exact inner-product search over "
              "the same block_emb, what a user of the exact export gets. The "
              f"{scann_served['rows_left_out']} reference-checked rows are left out of both "
              "lists.", "",
              "| export | recall@5 against exact | retrieve p50 ms | retrieve p99 ms |",
              "|---|---:|---:|---:|"]
    if exact_served:
      lines.append(f"| realm_qa (exact: the reference) | 1 | {exact_served['retrieve_p50_ms']:.1f}"
                   f" | {exact_served['retrieve_p99_ms']:.1f} |")
    lines.append(f"| realm_qa_scann (default: each shard's own leaves, float16 re-scoring) | "
                 f"{scann_served['recall_at_5']:.3f} | {scann_served['retrieve_p50_ms']:.1f} | "
                 f"{scann_served['retrieve_p99_ms']:.1f} |")
  if "recall_at_5" in authors:
    one = authors["searcher"] == "one"
    how = ("one searcher over all blocks, as they built it (ScaNN's pybind builder, "
           "block_emb memory-mapped)" if one
           else f"one searcher per index shard ({authors['searchers']}), merged")
    mapped = (f", of which {gib(result['blocks'] * BERT_BASE['projection_size'] * 4, 1)} "
              "GiB is the memory-mapped block_emb's page cache" if one else "")
    lines += ["", "## The authors' ScaNN configuration, same run", "", validation, "",
              f"`{json.dumps(authors['params'], sort_keys=True)}`, built in process over the "
              f"run's block_emb: {how}; {authors['build_seconds']} s to build, peak RSS "
              f"{authors['peak_rss_gib']} GiB{mapped}. recall@5 against the exact export's "
              f"served top-K, the same {authors['questions']:,} questions: "
              f"**{authors['recall_at_5']:.3f}**"
              + (f" (the shipped export, served: {scann_served['recall_at_5']:.3f})"
                 if scann_served and "recall_at_5" in scann_served else "") + "."]
  if "settings" in recall:
    lines += ["", f"## The trainer's ScaNN shards against exact search, in process "
              f"({recall['questions']:,} generated questions; {recall['shards']} shards of "
              f"{min(recall['leaves'])}-{max(recall['leaves'])} leaves, "
              f"{min(recall['leaves_searched'])}-{max(recall['leaves_searched'])} searched by "
              f"default; int8 reordering, ScaNN's scores; the "
              f"{recall.get('rows_left_out', 0)} reference-checked rows left out of both "
              "searches: `without`). Not what the export serves (above).", "",
              validation, "",
              f"Search alone, one question at a time (traced, every shard, merged): exact p50 "
              f"{recall['exact_p50_ms']:.1f} ms.", "",
              "| leaves searched | reordered | recall@5 | p50 ms | p99 ms | p50 / exact |",
              "|---|---|---:|---:|---:|---:|"]
    for row in recall["settings"]:
      fraction = ("each shard's own" if row["leaves_fraction"] is None
                  else f"{row['leaves_fraction']:.2f} of each shard's")
      reorder = row["reorder_num_neighbors"] or "each shard's own"
      lines.append(f"| {fraction} | {reorder} | {row['recall_at_5']:.3f} | "
                   f"{row['p50_ms']:.1f} | {row['p99_ms']:.1f} | "
                   f"{row['p50_over_exact']:.3f} |")
  lines += profile_markdown(steps)
  lines += ["", "## Targets", "", "| target | measured | met |", "|---|---|---|"]
  for target in result.get("targets", []):
    measured = target["measured"]
    if unvalidated and target["what"].startswith(RECALL_TARGET):
      measured += f" ({unvalidated.split(':')[0]})"
    lines.append(f"| {target['what']} | {measured} | {verdict(target)} |")
  lines += ["", "## Details", "", "```json",
            json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=2,
                       sort_keys=True), "```", ""]
  return "\n".join(lines)


def profile_markdown(steps: dict) -> list:
  """The profile step's sections (none when it has not run)."""
  lines = []
  memory = steps.get("export_scann_memory", {}).get("timeline")
  if memory:
    lines += ["", "## Where the ScaNN export's memory goes", "",
              f"`{steps['export_scann_memory']['command']}` again (into a scratch dir), its "
              f"RSS sampled every 0.5 s ({memory['samples']} samples; peak "
              f"{memory['peak_gib']} GiB at {memory['peak_at_s']:.0f} s, rusage "
              f"{steps['export_scann_memory']['peak_rss_gib']} GiB) and placed between its "
              "log's lines: every stretch in which it rose by 0.2 GiB or more, and the "
              "peak's.", "",
              "| from (s) | to (s) | after the line | before the line | RSS at start | max | "
              "RSS at end |", "|---:|---:|---|---|---:|---:|---:|"]
    for row in memory["intervals"]:
      lines.append(f"| {row['from_s']:.0f} | {row['to_s']:.0f} | `{row['after']}` | "
                   f"`{row['before']}` | {row['rss_at_start_gib']} | {row['max_gib']} | "
                   f"{row['rss_at_end_gib']} |")
  profile = steps.get("retrieval_profile", {})
  if "op_breakdown" in profile:
    served = steps.get("serve_scann_availability_preserving", {}).get("served_recall", {})
    grpc_p50 = (f"; the same questions over gRPC (`python -m serving.server`, this step) "
                f"p50 {profile['grpc']['p50_ms']:.1f} ms, p99 {profile['grpc']['p99_ms']:.1f}"
                if "grpc" in profile else "")
    grpc_p50 += (f"; over gRPC in serve_scann p50 {served['retrieve_p50_ms']:.1f} ms"
                 if "retrieve_p50_ms" in served else "")
    alone = steps.get("scann_recall", {}).get("settings") or [{}]
    search_p50 = (f"; the trainer's shards' search alone p50 {alone[0]['p50_ms']:.1f} ms "
                  "(scann_recall)" if "p50_ms" in alone[0] else "")
    lines += ["", "## Where served retrieval's time goes", "",
              f"The published realm_qa_scann loaded in process ({profile['load_seconds']} s), "
              f"its `retrieve_embedding` one question a call: p50 {profile['p50_ms']:.1f} ms, "
              f"p99 {profile['p99_ms']:.1f} ms over {profile['questions']} questions"
              f"{grpc_p50}{search_p50}. TensorFlow's profiler over "
              f"{profile['profile_steps']} calls, self time by op type:", "",
              "| op | ms a call | share |", "|---|---:|---:|"]
    for row in profile["op_breakdown"]:
      lines.append(f"| {row['op']} | {row['ms_per_call']} | {row['fraction']:.3f} |")
  return lines


def targets(result: dict) -> list:
  """Each target's row: what, the measured figure, met, and (where it is a number against
  a limit) value, limit and unit, from which the Markdown says by how much it was met or
  missed."""
  steps = result["steps"]
  rows = []

  def add(what, measured, met, value=None, limit=None, unit="", digits=2):
    rows.append(dict(what=what, measured=measured, met=bool(met), value=value, limit=limit,
                     unit=unit, digits=digits))

  def at_most(what, value, limit, unit=" GiB", digits=2, measured=None):
    add(what, measured or f"{value}{unit}", value <= limit, value, limit, unit, digits)

  def peak_of(step):
    return max((step.get(k) or 0.0) for k in ("peak_rss_gib", "server_peak_rss_gib",
                                              "load_peak_rss_gib", "handover_peak_rss_gib"))

  peaks = {n: peak_of(s) for n, s in steps.items()
           if "error" not in s and n not in ("release", "finished")}
  if peaks:
    worst = max(peaks.items(), key=lambda kv: kv[1])
    at_most(f"every step's peak RSS <= {TARGETS['peak_gib']} GiB", worst[1],
            TARGETS["peak_gib"], measured=f"{worst[1]} GiB ({worst[0]})")
  for name, key in (("evaluate", "evaluate_peak_gib"), ("export", "export_peak_gib"),
                    ("export_scann", "scann_export_peak_gib")):
    if "peak_rss_gib" in steps.get(name, {}):
      at_most(f"{name} peak <= {TARGETS[key]} GiB", steps[name]["peak_rss_gib"],
              TARGETS[key])
  # Three readings per server against its target: a ScaNN version as served (its load's
  # peak, after load, after the hand-over) <= scann_served_gib and its hand-over's peak <=
  # scann_handover_gib; the exact export's, every reading <= the machine's peak_gib.
  for name in ("serve_availability_preserving", "serve_resource_preserving",
               "serve_scann_availability_preserving"):
    step = steps.get(name, {})
    if "load_peak_rss_gib" not in step:
      continue
    scann = step.get("model") == "realm_qa_scann"
    served = TARGETS["scann_served_gib"] if scann else TARGETS["peak_gib"]
    handover = TARGETS["scann_handover_gib"] if scann else TARGETS["peak_gib"]
    for reading, key, limit in (("load peak", "load_peak_rss_gib", served),
                                ("after load", "rss_after_load_gib", served),
                                ("after hand-over", "rss_after_handover_gib", served),
                                ("hand-over peak", "handover_peak_rss_gib", handover)):
      at_most(f"{name}: {reading} <= {limit} GiB", step[key], limit)
  # resource_preserving unloads the old version before loading the new one, as TF Serving's
  # policy of that name does: its failures are the policy's gap, measured, not a target.
  for name in ("serve_availability_preserving", "serve_scann_availability_preserving"):
    step = steps.get(name, {})
    if "failed_requests" in step:
      add(f"0 failed requests through the {step.get('model', 'realm_qa')} hand-over "
          "(availability_preserving)",
          f"{step['failed_requests']} of {step['requests_during_handover']}",
          step["failed_requests"] == 0, step["failed_requests"], 0, " requests", 0)
  served = steps.get("serve_scann_availability_preserving", {})
  exact_served = steps.get("serve_availability_preserving", {})
  scann_recall = served.get("served_recall", {})
  exact_recall = exact_served.get("served_recall", {})
  if "p50_ms" in served and "p50_ms" in exact_served:
    ratio = served["p50_ms"] / exact_served["p50_ms"]
    measured = f"{ratio:.2f} ({served['p50_ms']:.0f} / {exact_served['p50_ms']:.0f} ms)"
    if "retrieve_p50_ms" in scann_recall and "retrieve_p50_ms" in exact_recall:
      # What no index can shorten: each export's p50 less its served retrieval (the reader,
      # tokenising, the block texts). With no search at all, the ScaNN export's request
      # would still take rest[0] of the exact export's p50.
      rest = (served["p50_ms"] - scann_recall["retrieve_p50_ms"],
              exact_served["p50_ms"] - exact_recall["retrieve_p50_ms"])
      measured += (f"; not retrieval {rest[0]:.0f} / {rest[1]:.0f} ms: with no search at "
                   f"all {rest[0] / exact_served['p50_ms']:.2f}")
    at_most(f"end-to-end p50, ScaNN export / exact export <= "
            f"{TARGETS['end_to_end_p50_over_exact']}", round(ratio, 3),
            TARGETS["end_to_end_p50_over_exact"], unit="", measured=measured)
  if "recall_at_5" in scann_recall:
    target = TARGETS["scann_recall_at_5"]
    add(f"{RECALL_TARGET} >= {target} ({scann_recall['questions']} generated questions, "
        "read over gRPC from the served realm_qa_scann's retrieve_embedding against the "
        "served realm_qa's; default leaves, float16 re-scoring)",
        f"{scann_recall['recall_at_5']:.3f}", scann_recall["recall_at_5"] >= target,
        round(scann_recall["recall_at_5"], 4), target, "", 3)
  if "retrieve_p50_ms" in scann_recall and "retrieve_p50_ms" in exact_recall:
    ratio = scann_recall["retrieve_p50_ms"] / exact_recall["retrieve_p50_ms"]
    at_most(f"retrieval as served p50, ScaNN / exact <= {TARGETS['search_p50_over_exact']} "
            "(retrieve_embedding over gRPC, one question a request)", round(ratio, 4),
            TARGETS["search_p50_over_exact"], unit="", digits=3,
            measured=f"{ratio:.3f} ({scann_recall['retrieve_p50_ms']:.1f} / "
                     f"{exact_recall['retrieve_p50_ms']:.1f} ms)")
  if "max_disk_gb" in result:
    sampled = any("disk_peak_gb" in step for step in steps.values())
    at_most(f"disk <= {TARGETS['disk_gb']} GB ("
            + ("sampled while each step ran)" if sampled else "read after each step only)"),
            result["max_disk_gb"], TARGETS["disk_gb"], unit=" GB", digits=1)
  # The released path a user runs; the in-process comparisons (MEASUREMENT_ONLY) are this
  # benchmark's own questions, not part of deploying. Judged from the steps recorded, not
  # from an invocation having ended: the full size runs in several invocations, and a sum
  # over some of the path's steps would pass the target for the steps not yet run.
  what = (f"the released path (its steps' walls, not {', '.join(MEASUREMENT_ONLY)}) <= "
          f"{TARGETS['wall_seconds'] / 3600:.0f} h")
  path_steps = [n for n in STEP_ORDER if n not in MEASUREMENT_ONLY]
  missing = [n for n in path_steps if n not in steps or "error" in steps[n]]
  if missing:
    add(what, f"not judged: {', '.join(missing)} not measured yet", False)
  else:
    path = sum(steps[n].get("seconds", 0.0) for n in path_steps)
    at_most(what, round(path / 60, 1), TARGETS["wall_seconds"] / 60, unit=" min", digits=1)
  return rows


def run(args) -> dict:
  work = args.work_dir
  os.makedirs(work, exist_ok=True)
  output = harness.Output(args.name, markdown)
  release = os.path.join(work, "release")
  run_dir = os.path.join(work, "run")
  result = dict(blocks=args.blocks, machine=harness.machine(), steps={}, done=False)
  begin = time.time()
  wanted = set(args.steps.split(","))
  reused = os.path.exists(os.path.join(run_dir, "params.yaml"))
  if reused:  # a run imported by an earlier invocation: its rows are kept
    earlier = output.read()
    # Every row an earlier invocation measured on this run stays until a step run now
    # rewrites it (the full size runs in several invocations).
    result["steps"] = {k: v for k, v in earlier.get("steps", {}).items() if k != "finished"}
    result["max_disk_gb"] = earlier.get("max_disk_gb", 0.0)
    log(f"reusing the run in {run_dir}")

  def record(name: str, step: dict):
    step["disk_gb"] = round(du_bytes(work, on_disk=True) / 1e9, 1)
    # The run's disk figure is the largest sampled while any step ran (attempt), or read
    # after one.
    result["max_disk_gb"] = max(result.get("max_disk_gb", 0.0), step["disk_gb"],
                                step.get("disk_peak_gb", 0.0))
    result["steps"][name] = step
    # The whole run: its steps' walls, whichever invocation ran each (the full size runs
    # in several; an invocation's own time is its 'finished' row).
    result["seconds"] = round(sum(s.get("seconds", 0.0) for k, s in result["steps"].items()
                                  if k != "finished"), 1)
    result["targets"] = targets(result)
    output.write(result)
    log(f"{name}: {json.dumps({k: v for k, v in step.items() if k != 'output_tail'})[:400]}")

  def attempt(name: str, body):
    """Runs one step with the work dir's disk sampled while it runs (its peak recorded)
    and its provenance (harness.recorded: commit, start, wall seconds); records it, or its
    error with the same provenance."""
    failed = {}

    def guarded():
      try:
        return body()
      except Exception as e:  # pylint: disable=broad-except
        failed["error"] = f"{type(e).__name__}: {e}"[-3000:]
        return {}

    with harness.DiskPeakSampler(work, every=args.disk_sample_seconds) as disk:
      step = harness.recorded(guarded)()
    step["disk_peak_gb"] = round(disk.peak / 1e9, 1)
    step["disk_samples"] = disk.samples
    if failed:
      step = dict(error=failed["error"], provenance=step["provenance"],
                  disk_peak_gb=step["disk_peak_gb"], disk_samples=disk.samples)
    # A step's own wall: a step that timed itself (a reused release) keeps its figure.
    step.setdefault("seconds", step["provenance"]["seconds"])
    record(name, step)
    return not failed

  python = sys.executable
  def do_release():
    step = PHASES.run(args, work, "release", keep=lambda summary: os.path.isdir(release)
                      and summary.get("blocks") == args.blocks)
    if step["finished"] < begin:
      step["written_by_an_earlier_invocation"] = True
    return step

  if not reused and not attempt("release", do_release):
    return result

  def do_import():
    step = run_step(
        [python, "-m", "realm_tf.import_released", f"--output_dir={run_dir}",
         f"--embedder={release}/cc_news_pretrained/embedder",
         f"--orqa_model={release}/orqa_nq_model_from_realm",
         f"--blocks={release}/enwiki-20181220/blocks.tfr",
         f"--titles={release}/enwiki-20181220/titles.tfr", "--noblock_records",
         f"--index_shards={args.index_shards}", "--build_scann",
         f"--check_block_emb_rows={args.check_rows}"], os.path.join(work, "import.log"))
    summary = last_json(step.pop("output_tail"))
    step.update(block_emb_check=summary.get("block_emb_check"),
                num_blocks=summary.get("num_blocks"))
    # The release is no longer needed: the run holds everything (disk budget).
    questions = os.path.join(work, "questions.jsonl")
    shutil.copy(os.path.join(release, "resplit", "NaturalQuestions.resplit.test.jsonl"),
                questions)
    shutil.rmtree(release, ignore_errors=True)
    return step

  if not reused and "import" in wanted and not attempt("import", do_import):
    return result

  def do_evaluate():
    output_path = os.path.join(work, "predictions.jsonl")
    step = run_step(
        [python, "-m", "realm_tf.evaluate", f"--model_dir={run_dir}",
         f"--questions={os.path.join(work, 'questions.jsonl')}",
         f"--max_questions={args.questions}", f"--output={output_path}",
         "--override=runtime.enable_xla=false"], os.path.join(work, "evaluate.log"))
    summary = last_json(step.pop("output_tail"))
    with open(output_path, encoding="utf-8") as f:
      predictions = [json.loads(line) for line in f]
    first = predictions[0]
    step.update(questions=len(predictions),
                metrics={k: summary[k] for k in ("exact_match", "recall@5", "eval_seconds")
                         if k in summary},
                sample=dict(question=first.get("question"),
                            prediction=first.get("prediction"),
                            retrieved_titles=[b.get("title") for b in
                                              first.get("retrieved", [])[:5]]))
    return step


  def export_command(output_dir: str, kind: str) -> list:
    return [python, "-m", "realm_tf.export", f"--model_dir={run_dir}",
            f"--output_dir={output_dir}", f"--kinds={kind}"]

  def do_export(kind: str):
    shutil.rmtree(os.path.join(work, "models", kind), ignore_errors=True)
    step = run_step(export_command(os.path.join(work, "models"), kind),
                    os.path.join(work, f"export-{kind}.log"))
    step.pop("output_tail")
    export = harness.inode_sizes(os.path.join(work, "models", kind), on_disk=True)
    linked = harness.inode_sizes(run_dir)  # files the export hard-links from the run
    step["export_bytes"] = sum(export.values())
    step["export_bytes_not_shared_with_the_run"] = sum(
        size for inode, size in export.items() if inode not in linked)
    return step

  if "export" in wanted and not attempt("export", lambda: do_export("realm_qa")):
    wanted.discard("serve")
  recall = bool(args.embedding_generator)  # the served recall rows need the generator
  if "serve" in wanted:
    attempt("serve_availability_preserving",
            lambda: serve(args, work, "availability_preserving", latency=True,
                          recall=recall))
    attempt("serve_resource_preserving",
            lambda: serve(args, work, "resource_preserving", latency=False))
  if wanted & {"scann", "scann_recall"}:  # scann_recall alone: the recall step only
    attempt("scann_recall", lambda: PHASES.run(args, work, "scann_recall"))
  if wanted & {"scann", "export_scann"}:  # export_scann alone: the export only
    if attempt("export_scann", lambda: do_export("realm_qa_scann")) and "scann" in wanted:
      attempt("serve_scann_availability_preserving",
              lambda: serve(args, work, "availability_preserving", latency=True,
                            model="realm_qa_scann", recall=recall))
  if wanted & {"scann", "scann_authors"}:
    # After the exact server kept its served top-K (the reference); its own process, so
    # its memory is its own.
    attempt("scann_authors", lambda: PHASES.run(args, work, "scann_authors"))
  def export_memory():
    # Into a scratch dir: the published export stays what the serve rows served.
    out = os.path.join(work, "profile_models")
    shutil.rmtree(out, ignore_errors=True)
    command = export_command(out, "realm_qa_scann")
    try:
      done = harness.run_process(command, os.path.join(work, "export_scann_memory.log"),
                                 rss_every=0.5)
    finally:
      shutil.rmtree(out, ignore_errors=True)
    return dict(seconds=round(done["seconds"], 1), command=" ".join(command),
                peak_rss_gib=gib(done["peak_rss_bytes"], 2),
                timeline=memory_timeline(done, done["output"]))

  def profile_retrieval():
    step = PHASES.run(args, work, "retrieval_profile")
    # The same questions over gRPC, the in-process model gone: what the request adds.
    base = os.path.join(work, "models", "realm_qa_scann")
    server = ServerProcess(base, "realm_qa_scann",
                           os.path.join(work, "server-retrieval_profile.log"))
    try:
      import grpc  # pylint: disable=g-import-not-at-top
      address = server.wait_listening(args.timeout)
      with grpc.insecure_channel(address) as channel:
        server.wait_serving(channel, max(harness.versions(base)), args.timeout)
      queries = recall_queries(args, work)[:args.latency_questions]
      _, latency = served_retrieval(address, "realm_qa_scann", queries, len(queries))
    finally:
      server.stop()
    step["grpc"] = latency
    return step

  if "profile" in wanted:
    attempt("export_scann_memory", export_memory)
    attempt("retrieval_profile", profile_retrieval)
  # Last: at BERT-base on a 2-core CPU it is the longest step (a question is five reader
  # passes of 320 wordpieces), and its memory peaks as soon as the index is loaded.
  if "evaluate" in wanted:
    attempt("evaluate", do_evaluate)
  result["done"] = True
  record("finished", dict(seconds=round(time.time() - begin, 1)))
  return result


PHASES = harness.Phases("benchmarks.released_scale",
                        dict(release=write_release, scann_recall=scann_recall,
                             scann_authors=authors_recall,
                             retrieval_profile=retrieval_profile), log=log)


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.phase:
    return PHASES.child(args)
  try:
    run(args)
  finally:
    if not args.keep:
      shutil.rmtree(args.work_dir, ignore_errors=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
