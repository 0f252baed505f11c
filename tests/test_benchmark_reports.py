"""Every committed result's Markdown is what its benchmark renders from its JSON; the
pre-training benchmark's report: a start rebuilt between invocations is compared with the
kept one and said so in the table (benchmarks/pretrain.py); the compute limits every
performance benchmark records (benchmarks/common.py); the paper-scale estimate's inputs; the
embedding benchmark's arithmetic and a run of it at tiny size (benchmarks/embedding.py)."""
import importlib
import json
import math
import os
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import harness, knowledge, pretrain
from benchmarks.harness import RESULTS_DIR
from realm_tf.io import layout

# Results written under another name than their benchmark's (--name).
RENDERED_BY = {"scale_100k": "scale",
               "scann_scale_20k": "scann_scale",
               "released_scale_two_shards": "released_scale"}


@pytest.mark.parametrize("name", sorted(
    f[:-len(".json")] for f in os.listdir(RESULTS_DIR) if f.endswith(".json")))
def test_committed_markdown_is_rendered_from_its_json(name):
  """A result's Markdown is a function of its JSON (harness.Output.write renders it from
  the JSON as written): each benchmark's `markdown` gives the committed bytes again."""
  module = importlib.import_module(f"benchmarks.{RENDERED_BY.get(name, name)}")
  output = harness.Output(name, module.markdown)
  with open(output.markdown_path) as f:
    assert module.markdown(output.read()) == f.read()

WARMUP = dict(steps=300, seconds=159.4, heldout_span_accuracy=0.025,
              heldout_token_accuracy=0.017, heldout_loss=7.662148952484131)
RECALL = {"nq": {"recall@5": 0.086, "questions": 500}, "wq": {"recall@5": 0.214},
          "trec": {"recall@5": 0.366}, "seconds": 267.6}


def _payload(rebuilt_warmup, rebuilt_recall):
  settings = dict(news_records=800, wiki_x_records=1500, steps=300, batch_size=8,
                  ict_steps=0, warmup_steps=300, num_candidates=5, refresh_every=5,
                  stale_factor=30)
  return dict(
      machine=dict(cpu_count=2, tensorflow="2.20.0", load_average_1_5_15=[1.0, 1.0, 1.0]),
      partial=True, settings=settings, total_minutes=60.0, invocations=[],
      data=dict(z_blocks=12912, train_sentences=13236, heldout_sentences=200,
                heldout_documents=21, salient_spans="CoNLL tagger + dates"),
      warmup=WARMUP, start=dict(recall=RECALL), arms={},
      rebuilt_starts=[dict(started="2026-11-23T23:11:00+0000", arms=["c"],
                           warmup=rebuilt_warmup, recall=rebuilt_recall)])


def test_rebuilt_start_with_other_times_is_the_same_start(tmp_path):
  payload = _payload(dict(WARMUP, seconds=182.1), dict(RECALL, seconds=451.0))
  path = tmp_path / "pretrain.json"
  path.write_text(json.dumps(payload))
  pretrain.render(str(path))
  assert json.loads(path.read_text())["rebuilt_starts"][0]["same_as_kept"] is True
  table = (tmp_path / "pretrain.md").read_text()
  assert "Arm c ran from a start rebuilt on 2026-11-23" in table
  assert "identical to the kept arms' start" in table
  assert (tmp_path / "pretrain_curves.png").stat().st_size > 0


def test_rebuilt_start_that_differs_reports_both(tmp_path):
  payload = _payload(dict(WARMUP, heldout_loss=7.61, heldout_span_accuracy=0.03),
                     dict(RECALL, nq={"recall@5": 0.09}))
  path = tmp_path / "pretrain.json"
  path.write_text(json.dumps(payload))
  pretrain.render(str(path))
  assert json.loads(path.read_text())["rebuilt_starts"][0]["same_as_kept"] is False
  table = (tmp_path / "pretrain.md").read_text()
  assert "identical" not in table
  assert "warm-up held-out span accuracy 0.030 (kept start 0.025)" in table
  assert "step-0 R@5 0.090 / 0.214 / 0.366 (kept start 0.086 / 0.214 / 0.366)" in table


# --- benchmarks/openqa.py ----------------------------------------------------------------

def _openqa_row(key, row, exact_match, **sizes):
  return dict(key=key, row=row, dataset=key, exact_match=exact_match, recall_at_1=0.5,
              recall_at_5=0.8, recall_at_20=0.9, reader_oracle=0.8, finetune_s=1.0,
              eval_s=1.0, index_s=0.0, parameters=22.8e6, gold_block_steps=0, **sizes)


def _openqa_payload(rows, train_steps, batch_size, num_train):
  return dict(
      machine=dict(when="2026-11-24T10:00:00+0000", cpu_count=2, tensorflow="2.20.0"),
      partial=False, total_minutes=10.0, pretrain={}, skipped=[], rows=rows,
      invocations=[dict(datasets="squad", rows="bm25,dense", minutes=10.0)],
      settings=dict(train_steps=train_steps, batch_size=batch_size, block_length=128,
                    retriever_beam=100,
                    finetune={"trainer.learning_rate": 5e-5, "task.openqa.num_candidates": 5,
                              "task.openqa.reader_seq_length": 160}),
      datasets={"squad": dict(name="SQuAD-open", corpus_file="openqa/squad_open/corpus.jsonl",
                              corpus_blocks=3864, num_eval=1864, report_split="dev (all)",
                              num_train=num_train, train_pool=6980)})


def test_merged_openqa_rows_keep_the_sizes_they_ran_with():
  """A row re-run with other sizes (--merge) replaces its old self; the row it did not
  replace keeps the sizes of the invocation that ran it, in the JSON and in the table."""
  from benchmarks import openqa  # pylint: disable=g-import-not-at-top
  previous = _openqa_payload([_openqa_row("squad", "bm25", 0.267),
                              _openqa_row("squad", "dense", 0.277)], 300, 8, 2400)
  new = _openqa_payload([_openqa_row("squad", "bm25", 0.36, train_steps=900, batch_size=8,
                                     train_questions=6980)], 900, 8, 6980)
  merged = openqa._merged(previous, new)  # pylint: disable=protected-access
  rows = {r["row"]: r for r in merged["rows"]}
  assert rows["bm25"]["exact_match"] == 0.36 and rows["bm25"]["train_questions"] == 6980
  assert (rows["dense"]["train_steps"], rows["dense"]["train_questions"]) == (300, 2400)
  table = openqa.markdown(merged)
  assert "| 900 x 8 (6980) |" in table and "| 300 x 8 (2400) |" in table
  assert "SQuAD-open EM with BM25 + reader: 36.0 (target >= 35): met." in table
  assert "SQuAD-open EM with Dense" in table and "27.7 (target >= 30): **missed**" in table


def test_merged_openqa_rows_keep_the_pre_training_that_ran_with_them():
  """REALM rows run by a later invocation (--merge) bring their pre-training's description
  into the merged results; an invocation without one keeps the earlier description."""
  from benchmarks import openqa  # pylint: disable=g-import-not-at-top
  previous = _openqa_payload([_openqa_row("squad", "dense", 0.44)], 300, 8, 2400)
  new = _openqa_payload([_openqa_row("squad", "realm", 0.40)], 300, 8, 2400)
  new["pretrain"] = dict(steps=50, seconds=600.0, first_loss=10.4, last_loss=7.9,
                         index_refreshes=2,
                         overrides={"task.pretrain.train_data.global_batch_size": 4})
  merged = openqa._merged(previous, new)  # pylint: disable=protected-access
  assert merged["pretrain"]["steps"] == 50
  assert "REALM pre-training: 50 steps (batch 4)" in openqa.markdown(merged)
  later = _openqa_payload([_openqa_row("squad", "bm25", 0.30)], 300, 8, 2400)
  merged["skipped"] = ["SQuAD-open / BM25 + reader (time budget)",
                       "SQuAD-open / REALM pre-trained + reader, index refreshed during "
                       "fine-tuning (time budget)"]
  later["rows"][0]["dataset"] = "SQuAD-open"
  # The row that ran leaves the skipped list; the other stays.
  remerged = openqa._merged(merged, later)  # pylint: disable=protected-access
  assert remerged["skipped"] == merged["skipped"][1:]
  assert remerged["pretrain"] == merged["pretrain"]


def test_openqa_schedule_runs_the_squad_reader_before_the_rows_it_starts():
  """dense_squad_reader rows start from the SQuAD-open dense row's reader: that row runs
  first, SQuAD-open gets no dense_squad_reader row of its own, refresh rows on the large
  corpus go last."""
  from benchmarks import openqa  # pylint: disable=g-import-not-at-top
  order = openqa.schedule(["squad", "nq", "trec"], ["dense", "dense_squad_reader",
                                                    "realm_refresh"])
  assert ("squad", "dense_squad_reader") not in order
  assert order.index(("squad", "dense")) < order.index(("nq", "dense_squad_reader"))
  assert order[-2:] == [("nq", "realm_refresh"), ("trec", "realm_refresh")]
  assert len(order) == 8  # 3 sets x 3 rows, less SQuAD-open's own dense_squad_reader


def test_pretrain_arms_are_kept_across_invocations_that_differ_only_in_how_they_run():
  """A rerun with the default sizes keeps the committed arms: its settings equal those the
  committed result was written with, whatever --arms/--budget_minutes/--render/--work_dir
  say (a flag added to the parser but not to RUN_FLAGS would start every arm over)."""
  parse = lambda *argv: pretrain.result_settings(pretrain.flag_parser().parse_args(argv))
  default = parse()
  assert parse("--arms", "e", "--budget_minutes", "10", "--work_dir", "/x", "--render",
               "--fresh", "--quick") == default
  assert parse("--steps", "30") != default
  with open(os.path.join(RESULTS_DIR, "pretrain.json")) as f:
    assert json.load(f)["settings"] == default


def test_cpu_peak_multiplies_cores_fma_units_lanes_and_clock():
  """cpu_peak reads the clock and the widest vector flag from /proc/cpuinfo's text."""
  from benchmarks.common import cpu_peak  # pylint: disable=g-import-not-at-top
  epyc = "model name\t: AMD EPYC\ncpu MHz\t\t: 2445.402\nflags\t\t: sse2 avx fma avx2\n"
  peak = cpu_peak(epyc, cores=2)
  assert (peak["vector_lanes_fp32"], peak["fma"], peak["clock_mhz"]) == (8, True, 2445.402)
  assert peak["peak_flops"] == pytest.approx(2 * 2 * 8 * 2 * 2445.402e6)
  xeon = "model name\t: Intel Xeon @ 2.00GHz\nflags\t\t: sse2 avx avx2 fma avx512f\n"
  assert cpu_peak(xeon, cores=4)["peak_flops"] == pytest.approx(4 * 2 * 16 * 2 * 2.0e9)
  no_fma = "model name\t: old\ncpu MHz\t: 1000\nflags\t: sse2\n"
  assert cpu_peak(no_fma, cores=1)["peak_flops"] == pytest.approx(1 * 1 * 4 * 2 * 1e9)


def test_matmul_limit_times_the_products_it_counts():
  from benchmarks.common import matmul_limit  # pylint: disable=g-import-not-at-top
  small = matmul_limit(n=64, repeats=2, trials=2)
  assert small["flops_per_second"] == pytest.approx(2 * 64 ** 3 * 2 / small["seconds"])
  assert small["seconds"] > 0


def test_encoder_flops_are_the_bulk_of_what_tensorflow_counts():
  """encoder_flops against TensorFlow's own float-op count of the tiny BertEncoderV2's
  forward graph: the matmuls it counts are most of the graph's FLOPs and never more (the
  rest is biases, layer norms, softmaxes, GELUs)."""
  from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2  # pylint: disable=g-import-not-at-top
  from benchmarks.common import encoder_flops  # pylint: disable=g-import-not-at-top
  from realm_tf.configs import load_config  # pylint: disable=g-import-not-at-top
  from realm_tf.modeling.networks import build_encoder  # pylint: disable=g-import-not-at-top
  e = load_config(os.path.join(os.path.dirname(__file__), os.pardir, "configs",
                               "tiny.yaml")).model.encoder
  encoder = build_encoder(e)
  batch, seq = 2, 16

  @tf.function
  def forward(ids):
    return encoder(dict(input_word_ids=ids, input_mask=tf.ones_like(ids),
                        input_type_ids=tf.zeros_like(ids)))["sequence_output"]

  graph = convert_variables_to_constants_v2(
      forward.get_concrete_function(tf.TensorSpec([batch, seq], tf.int32))).graph
  counted = tf.compat.v1.profiler.profile(
      graph, options=tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
  ).total_float_ops
  ours = encoder_flops(e.num_layers, e.hidden_size, e.intermediate_size, batch, seq,
                       training=False)
  assert 0.85 * counted <= ours <= counted
  assert encoder_flops(e.num_layers, e.hidden_size, e.intermediate_size, batch, seq) == 3 * ours


def _paper_scale_inputs(directory, pretrain_flops_per_second, blocks_per_second):
  limits = {"cpu": {"peak_flops": 100e9}, "matmul": {"flops_per_second": 50e9}}
  when = {"when": "2026-11-25T00:00:00+0000", "cpu_count": 2, "load_average_1_5_15": [0, 0, 0]}
  tasks = {"limits": limits, "machine_before": when, "rows": [
      {"task": "pretrain", "xla": False, "achieved_flops_per_second": 1.0,
       "fraction_of_matmul_limit": 0.0},
      {"task": "pretrain", "xla": True, "achieved_flops_per_second": pretrain_flops_per_second,
       "fraction_of_matmul_limit": pretrain_flops_per_second / 50e9}]}
  with open(os.path.join(directory, "train_step.json"), "w") as f:
    json.dump({"tasks": tasks}, f)
  with open(os.path.join(directory, "mips.json"), "w") as f:
    json.dump({"real": {"machine": when, "beam_blocks_per_second": blocks_per_second}}, f)


def test_paper_scale_follows_its_measured_inputs(tmp_path, monkeypatch):
  """The estimate from the paper's configs: TPU time inversely proportional to the
  measured utilisation (XLA-on pre-training row, over the CPU's peak), Dataflow cores
  inversely proportional to the measured embedding rate, the index memory per core an
  independent count of the index's tables."""
  from benchmarks import paper_scale  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(paper_scale, "RESULTS_DIR", str(tmp_path))
  args = paper_scale.parse_args([])
  _paper_scale_inputs(tmp_path, 20e9, 10.0)
  base = paper_scale.estimate(args)
  assert base["measured"]["training"]["fraction_of_cpu_peak"] == pytest.approx(0.2)
  _paper_scale_inputs(tmp_path, 40e9, 10.0)
  faster = paper_scale.estimate(args)
  assert faster["tpu_step_seconds"] == pytest.approx(base["tpu_step_seconds"] / 2)
  # Half the step time is half the staleness window: twice the cores for the same rate.
  assert faster["dataflow_cores_for_500_step_staleness"] == pytest.approx(
      2 * base["dataflow_cores_for_500_step_staleness"])
  _paper_scale_inputs(tmp_path, 20e9, 20.0)
  assert paper_scale.estimate(args)["dataflow_cores_for_500_step_staleness"] == pytest.approx(
      base["dataflow_cores_for_500_step_staleness"] / 2)
  # 13M blocks over 64 shards: bfloat16 128-d embeddings, a bool, int32 word ids of 288
  # and body ids of the reader's 384 - 3 (a TPU holds no uint16), an int32 length; block
  # ids (int64) on every core.
  rows = -(-13_000_000 // 64)
  assert base["index_memory_per_core_total_bytes"] == rows * (256 + 1 + 4 * 288 + 4 * 381
                                                              + 4) + 8 * 13_000_000
  assert base["step_flops_total"] == pytest.approx(sum(base["step_flops"].values()))
  assert "TFLOP" in paper_scale.markdown(base)


def test_serving_latencies_are_read_against_the_arithmetic_floor():
  """with_floor: floor = a question's FLOPs / the measured matmul FLOP/s; the 1.25x target
  is met at 1.2x the floor and missed at 1.3x."""
  from benchmarks import serving  # pylint: disable=g-import-not-at-top

  def result(grpc_p50_ms):
    return dict(flops_per_question=dict(total=2e9), exports=dict(realm_qa=dict(
        in_process=dict(p50_ms=150.0, ms_per_question_at_batch_size={"1": 150.0, "8": 75.0}),
        summary=dict(grpc_p50_ms_1=grpc_p50_ms), targets_met={})))

  limits = dict(matmul=dict(flops_per_second=40e9))  # floor: 2e9 / 40e9 s = 50 ms
  met, missed = result(60.0), result(65.0)
  serving.with_floor(met, limits)
  serving.with_floor(missed, limits)
  assert met["floor_ms"] == 50.0
  s = met["exports"]["realm_qa"]["summary"]
  assert s["in_process_p50_over_floor"] == 3.0 and s["grpc_p50_over_floor"] == 1.2
  assert s["fraction_of_matmul_limit_at_batch_size"] == {"1": 0.333, "8": 0.667}
  assert met["exports"]["realm_qa"]["targets_met"]["p50_within_1.25x_floor"]
  assert not missed["exports"]["realm_qa"]["targets_met"]["p50_within_1.25x_floor"]


def test_serving_load_test_runs_every_client_and_counts_failures():
  """benchmarks.serving.load_test (the gRPC and REST cells alike): each client is made once,
  answers its warm-up, then loops until the time is up; failures are counted and kept, not
  timed; every client is closed."""
  from benchmarks import serving  # pylint: disable=g-import-not-at-top
  made, closed, asked = [], [], []
  lock = threading.Lock()

  def make_asker():
    with lock:
      made.append(1)

    def ask(question):
      time.sleep(0.002)
      with lock:
        asked.append(question)
      if question == "bad":
        raise ValueError("refused")
    return ask, lambda: closed.append(1)

  # Client w warms up on question w, then asks w, w + 3, ...: client 0 meets "bad".
  cell = serving.load_test(make_asker, ["q1", "q2", "q3", "bad"], clients=3, seconds=0.3)
  assert len(made) == len(closed) == 3
  assert cell["clients"] == 3
  assert cell["errors"] == asked.count("bad") > 0
  assert cell["requests"] == len(asked) - 3 - cell["errors"]  # warm-ups not timed
  assert "refused" in cell["first_errors"][0]
  assert cell["queries_per_second"] > 0 and cell["p50_ms"] >= 2.0
  # A warm-up that fails means nothing is served: the cell fails loudly, nothing hangs.
  closed.clear()
  with pytest.raises(RuntimeError, match="warm-up.*refused"):
    serving.load_test(make_asker, ["q1", "bad"], clients=2, seconds=0.3)
  assert len(closed) == 2


def test_paper_scale_prefers_the_embedding_benchmarks_rate(tmp_path, monkeypatch):
  """With benchmarks/results/embedding.json present, paper_scale sizes Dataflow from its
  measured FLOP/s per core (the steady-state pipeline rate), not from mips.json's."""
  from benchmarks import paper_scale  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(paper_scale, "RESULTS_DIR", str(tmp_path))
  args = paper_scale.parse_args([])
  _paper_scale_inputs(tmp_path, 20e9, 10.0)
  from_mips = paper_scale.estimate(args)
  assert "mips.json" in from_mips["measured"]["embedding"]["source"]
  per_core = 4 * from_mips["measured"]["embedding"]["flops_per_second_per_core"]
  sizing = dict(rate_used="beam steady state", blocks_per_second=30.0, cores=2,
                flops_per_second_per_core=per_core,
                measured_model=dict(layers=6, hidden=384, flops_per_block=2e9))
  with open(tmp_path / "embedding.json", "w") as f:
    json.dump(dict(account=dict(sizing=sizing), machine=dict(
        when="2026-11-26T00:00:00+0000", load_average_1_5_15=[0.1, 0.1, 0.1])), f)
  measured = paper_scale.estimate(args)
  embedding = measured["measured"]["embedding"]
  assert "embedding.json" in embedding["source"]
  assert embedding["flops_per_second_per_core"] == per_core
  assert measured["dataflow_cores_for_500_step_staleness"] == pytest.approx(
      from_mips["dataflow_cores_for_500_step_staleness"] / 4)
  assert "30.0 6-layer 384-hidden blocks/s on 2 cores" in paper_scale.markdown(measured)


# --- benchmarks/embedding.py -------------------------------------------------------------

def test_embedding_sizing_by_hand():
  """14.4M blocks at 0.5 blocks/s per core: 28.8M core-seconds = 8,000 core-hours = 500
  hours of a 16-core worker: 5 h on 100 workers, 500 workers for 1 h. 13M at 2 blocks/s:
  1,805.6 core-hours, 112.85 worker-hours: 1.13 h on 100 workers, 113 workers for 1 h."""
  from benchmarks.embedding import dataflow_sizing, steady_state  # pylint: disable=g-import-not-at-top
  x = dataflow_sizing(14_400_000, 0.5, worker_cores=16, workers=100, hours=1.0)
  assert x["core_hours"] == pytest.approx(8000)
  assert x["worker_hours"] == pytest.approx(500)
  assert x["hours_with_workers"] == pytest.approx(5.0)
  assert x["workers_for_hours"] == 500
  y = dataflow_sizing(13_000_000, 2.0, worker_cores=16, workers=100, hours=1.0)
  assert y["core_hours"] == pytest.approx(1805.5556, rel=1e-6)
  assert y["hours_with_workers"] == pytest.approx(1.128472, rel=1e-5)
  assert y["workers_for_hours"] == 113
  assert dataflow_sizing(13_000_000, 2.0, 16, 100, 2.0)["workers_for_hours"] == 57
  # t = fixed + n / rate: 64 blocks in 10 s and 1,064 in 30 s are 50 blocks/s after a
  # fixed 8.72 s; a larger run that is not slower separates nothing.
  s = steady_state(64, 10.0, 1064, 30.0)
  assert s["blocks_per_second"] == pytest.approx(50.0)
  assert s["fixed_seconds"] == pytest.approx(10.0 - 64 / 50)
  assert steady_state(64, 10.0, 1064, 9.5)["blocks_per_second"] is None


def test_embedding_benchmark_on_the_tiny_config(tmp_path, monkeypatch):
  """The whole benchmark on configs/tiny.yaml over a few invented articles (no ../shared):
  both paths embed the same blocks alike, every rate and FLOP figure is finite and
  positive, and the sizing multiplies back to the corpus size. Results go to tmp_path."""
  from benchmarks import common, embedding  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(harness, "RESULTS_DIR", str(tmp_path / "results"))
  topics = ["rivers and lakes", "mountain climbing", "violin music", "bread baking",
            "chess openings", "ocean tides", "honey bees", "volcanic eruptions"]
  articles = tmp_path / "articles.jsonl"
  with open(articles, "w") as f:
    for i in range(16):
      f.write(json.dumps(dict(title=f"Topic {i}", text=f"A passage about {topics[i % 8]}. "
                              f"It is article number {i}, about {topics[(i + 3) % 8]} too."))
              + "\n")
  assert embedding.main([
      "--config", os.path.join(os.path.dirname(__file__), os.pardir, "configs", "tiny.yaml"),
      "--articles_file", str(articles), "--articles", "16", "--min_blocks", "16",
      "--batch_size", "8", "--small_blocks", "4", "--matmul_n", "128",
      "--work_dir", str(tmp_path / "work")]) == 0
  with open(tmp_path / "results" / "embedding.json") as f:
    result = json.load(f)
  a = result["account"]
  assert result["num_blocks"] >= 16 and result["plain"]["blocks"] == result["num_blocks"]
  assert a["embeddings_agree"]["same_block_ids"]
  assert a["embeddings_agree"]["max_abs_diff"] <= 1e-5 * max(
      1.0, a["embeddings_agree"]["max_abs_value"])
  e = common.encoder_flops(2, 32, 64, 1, 48, training=False)  # configs/tiny.yaml
  assert a["flops"]["per_block"] == e

  def finite(x):
    return x is not None and math.isfinite(x) and x > 0

  assert finite(a["ratios"]["whole_over_plain_whole"]) and finite(a["target"]["value"])
  assert a["ratios"]["steady_over_plain_read"] is None or finite(
      a["ratios"]["steady_over_plain_read"])
  rows = {r["name"]: r for r in a["rows"]}
  for name in ("beam, full run, whole", "plain, read + loop",
               "plain, loop only (blocks in memory)"):
    assert finite(rows[name]["flops_per_second"]), name
    assert finite(rows[name]["fraction_of_matmul_limit"]), name
  z = a["sizing"]
  assert z["cores"] == len(os.sched_getaffinity(0))
  assert z["blocks_per_second_per_core"] == pytest.approx(z["blocks_per_second"] / z["cores"])
  for model in ("measured_model", "bert_base"):
    x = z[model]
    assert x["workers"] * x["hours_with_workers"] * 16 * x["blocks_per_second_per_core"] \
        * 3600 == pytest.approx(13_000_000)
    assert x["workers_for_hours"] * 16 * x["blocks_per_second_per_core"] * 3600 >= 13e6
  # BERT-base at 288 wordpieces: the same FLOP/s per core.
  assert z["bert_base"]["blocks_per_second_per_core"] * z["bert_base"]["flops_per_block"] \
      == pytest.approx(z["flops_per_second_per_core"])
  table = (tmp_path / "results" / "embedding.md").read_text()
  assert "Target: beam / plain >= 0.9" in table and "Dataflow sizing" in table


def test_task_rows_of_another_run_are_kept_with_their_own_limit():
  """train_step's tasks part run with XLA off alone keeps the XLA-on rows of the earlier
  run, each stamped with the run (and matmul limit) that measured it; a re-measured row
  replaces its old self."""
  from benchmarks.train_step_tasks import merge_task_runs, tasks_markdown  # pylint: disable=g-import-not-at-top

  def row(task, xla, flops):
    return dict(task=task, xla=xla, batch=8, candidates=0, examples_per_second=1.0,
                step_seconds=1.0, flops_per_example=flops, achieved_flops_per_second=flops,
                fraction_of_matmul_limit=0.5, forward_backward_seconds=1.0,
                encoder_share=0.9, retrieval_gather_share=0.0,
                heads_packing_losses_share=0.1, retrieval_target_met=True)

  def part(when, matmul, rows):
    machine = dict(when=when, load_average_1_5_15=[0.1, 0.1, 0.1], cpu_count=2,
                   tensorflow="2.20")
    return dict(machine_before=machine, machine_after=machine, rows=rows, repeats=3,
                corpus=dict(blocks=10), limits=dict(matmul=dict(flops_per_second=matmul),
                                                   cpu=dict(peak_flops=2e11)))

  old = part("day1", 1.5e11, [row("ict", True, 1.0), row("pretrain", True, 2.0),
                               row("openqa", True, 3.0)])
  new = part("day2", 1.2e11, [row("openqa", False, 4.0), row("ict", True, 5.0)])
  for r in new["rows"]:
    r["run"] = dict(when="day2", load_average=[0.1], matmul_flops_per_second=1.2e11)
  merged = merge_task_runs(old, new)
  assert [(r["task"], r["xla"], r["flops_per_example"]) for r in merged["rows"]] == [
      ("ict", True, 5.0), ("pretrain", True, 2.0), ("openqa", True, 3.0),
      ("openqa", False, 4.0)]
  stamps = {(r["task"], r["xla"]): r["run"]["when"] for r in merged["rows"]}
  assert stamps == {("ict", True): "day2", ("pretrain", True): "day1",
                    ("openqa", True): "day1", ("openqa", False): "day2"}
  assert merged["rows"][1]["run"]["matmul_flops_per_second"] == 1.5e11
  text = "\n".join(tasks_markdown(merged))
  assert "day1, load 0.1 (150.0 GFLOP/s)" in text and "day2, load 0.1 (120.0 GFLOP/s)" in text


def test_staleness_is_the_overlap_of_two_searches_and_the_drift_of_the_documents(tmp_path):
  """benchmarks.knowledge's staleness figures on hand-made embeddings: identical indexes
  overlap fully; an index whose rows are swapped pairwise shares one of each top-2; the
  version searched is the trainer's record's (else the newest committed one at or before)."""
  queries = np.eye(4, dtype=np.float32)  # query i prefers block i, then block i+1
  fresh = np.eye(4, dtype=np.float32) + 0.5 * np.roll(np.eye(4, dtype=np.float32), 1, axis=0)
  assert knowledge.top_k_overlap(queries, fresh, fresh, 2) == 1.0
  swapped = fresh[[1, 0, 3, 2]]  # each query's best block is now its neighbour
  assert knowledge.top_k_overlap(queries, swapped, fresh, 1) == 0.0
  assert knowledge.top_k_overlap(queries, swapped, fresh, 4) == 1.0
  assert knowledge.mean_row_cosine(fresh, fresh) == pytest.approx(1.0)
  assert knowledge.mean_row_cosine(np.eye(2), np.eye(2)[::-1]) == pytest.approx(0.0)
  model_dir = str(tmp_path / "run")
  for step, version in ((5, 0), (10, 0), (15, 10)):
    layout.append_metrics(model_dir, dict(mode="pretrain", step=step, index_version=version))
  assert knowledge.index_version_in_use(model_dir, 12) == 0
  assert knowledge.index_version_in_use(model_dir, 15) == 10


def test_released_scale_end_to_end_row_says_what_search_leaves():
  """The end-to-end target's row: the ratio of the two exports' p50, each p50 less its
  retrieval as served (retrieve_embedding over gRPC), and the ratio the ScaNN export would
  keep with no search at all; by how much it is missed."""
  from benchmarks import released_scale  # noqa: PLC0415  heavy module, this test only
  result = dict(steps=dict(
      serve_availability_preserving=dict(p50_ms=4000.0, peak_rss_gib=1.0, served_recall=dict(
          retrieve_p50_ms=1000.0)),
      serve_scann_availability_preserving=dict(p50_ms=3010.0, peak_rss_gib=1.0,
                                               served_recall=dict(retrieve_p50_ms=10.0))))
  row = next(r for r in released_scale.targets(result) if r["what"].startswith("end-to-end"))
  assert row["measured"] == ("0.75 (3010 / 4000 ms); not retrieval 3000 / 3000 ms: with no "
                             "search at all 0.75")
  assert not row["met"]
  assert released_scale.verdict(row) == "**no**: missed by 0.45"
  for step in result["steps"].values():  # without the served retrieval, the ratio alone
    del step["served_recall"]
  row = next(r for r in released_scale.targets(result) if r["what"].startswith("end-to-end"))
  assert row["measured"] == "0.75 (3010 / 4000 ms)"


def test_released_scale_judges_its_wall_only_when_every_step_of_the_path_has_run():
  """The full size runs in several invocations: the released path's wall target is judged
  from the steps recorded, never on the sum of some of them."""
  from benchmarks import released_scale  # noqa: PLC0415  heavy module, this test only
  path = [n for n in released_scale.STEP_ORDER if n not in released_scale.MEASUREMENT_ONLY]
  result = dict(steps={n: dict(seconds=600.0) for n in path[:-2]}, done=True)

  def wall_row():
    return next(r for r in released_scale.targets(result)
                if r["what"].startswith("the released path"))

  row = wall_row()
  assert not row["met"]
  assert row["measured"] == f"not judged: {path[-2]}, {path[-1]} not measured yet"
  result["steps"][path[-2]] = dict(seconds=600.0)
  result["steps"][path[-1]] = dict(error="MemoryError")
  assert wall_row()["measured"] == f"not judged: {path[-1]} not measured yet"
  result["steps"][path[-1]] = dict(seconds=600.0)
  row = wall_row()
  assert (row["met"], row["value"]) == (True, 10.0 * len(path))
  result["steps"][path[0]]["seconds"] = 7200.0
  assert not wall_row()["met"]


def _server_row(model, load_peak, after_load, handover_peak, after_handover, **more):
  return dict(model=model, load_peak_rss_gib=load_peak, rss_after_load_gib=after_load,
              handover_peak_rss_gib=handover_peak, rss_after_handover_gib=after_handover,
              server_peak_rss_gib=max(load_peak, handover_peak), **more)


def test_released_scale_reads_every_server_memory_reading_against_its_target():
  """The ScaNN server's load peak, after-load and after-hand-over readings each
  against the served 8 GiB and its hand-over peak against 20 GiB; the exact server's
  against the machine's 22 GiB; the served recall against 0.95; each met with its margin
  or missed by how much (the 8.02 GiB load peak that passed unseen on the after-load
  reading before)."""
  from benchmarks import released_scale  # noqa: PLC0415  heavy module, this test only
  result = dict(steps=dict(
      serve_availability_preserving=_server_row("realm_qa", 9.62, 9.49, 17.78, 9.15),
      serve_scann_availability_preserving=_server_row(
          "realm_qa_scann", 8.02, 7.93, 14.75, 8.11,
          served_recall=dict(recall_at_5=0.9412, questions=1001)),
      scann_recall=dict(peak_rss_gib=23.5)), max_disk_gb=71.25)
  rows = {r["what"]: r for r in released_scale.targets(result)}
  scann = "serve_scann_availability_preserving: "
  assert [(rows[scann + w]["met"], released_scale.verdict(rows[scann + w])) for w in (
      "load peak <= 8.0 GiB", "after load <= 8.0 GiB", "after hand-over <= 8.0 GiB",
      "hand-over peak <= 20.0 GiB")] == [
          (False, "**no**: missed by 0.02 GiB"), (True, "yes (0.07 GiB to spare)"),
          (False, "**no**: missed by 0.11 GiB"), (True, "yes (5.25 GiB to spare)")]
  exact = rows["serve_availability_preserving: hand-over peak <= 22.0 GiB"]
  assert exact["met"] and released_scale.verdict(exact) == "yes (4.22 GiB to spare)"
  every = rows["every step's peak RSS <= 22.0 GiB"]
  assert every["measured"] == "23.5 GiB (scann_recall)"
  assert released_scale.verdict(every) == "**no**: missed by 1.50 GiB"
  recall = next(r for w, r in rows.items() if w.startswith(released_scale.RECALL_TARGET))
  assert "over gRPC" in recall["what"] and recall["measured"] == "0.941"
  assert released_scale.verdict(recall) == "**no**: missed by 0.009"
  disk = next(r for w, r in rows.items() if w.startswith("disk"))
  assert released_scale.verdict(disk) == "**no**: missed by 1.2 GB"


def test_released_scale_served_recall_leaves_the_checked_rows_out_of_both_lists():
  """recall_without: |found ∩ truth| / |truth| per question with the excluded ids out of
  both, a question whose truth is all excluded passed over."""
  from benchmarks import released_scale  # noqa: PLC0415  heavy module, this test only
  truth = np.array([[1, 2, 3, 4, 5], [9, 6, 7, 8, 10], [9, 9, 9, 9, 9]])
  found = np.array([[1, 2, 3, 4, 6], [6, 7, 11, 12, 13], [1, 2, 3, 4, 5]])
  # Question 1: 4 of 5; question 2: 9 left out, 2 of 4; question 3: nothing to find.
  assert released_scale.recall_without(found, truth, [9]) == pytest.approx((0.8 + 0.5) / 2)
  assert released_scale.recall_without(found[:1], truth[:1], []) == pytest.approx(0.8)


def test_disk_peak_sampler_sees_a_file_that_came_and_went(tmp_path):
  """harness.DiskPeakSampler keeps the largest disk use sampled while in its `with`: a
  file written and removed inside it counts, though the reading after it is 0."""
  with harness.DiskPeakSampler(str(tmp_path), every=0.01) as disk:
    path = tmp_path / "transient.bin"
    path.write_bytes(os.urandom(1 << 20))
    seen = disk.samples
    while disk.samples < seen + 2:  # two samples taken with the file on disk
      time.sleep(0.01)
    path.unlink()
  assert disk.peak >= 1 << 20
  assert harness.du_bytes(str(tmp_path), on_disk=True) == 0


def _variant(encoder_flops_per_second, in_process_ms, grpc_ms, **flags):
  return dict(cost_per_block={"5": dict(ms_per_block=1.0,
                                        flops_per_second=encoder_flops_per_second)},
              gemm_limit_at_5_blocks=dict(flops_per_second=90e9),
              in_process=dict(p50_ms=in_process_ms), grpc=dict(p50_ms=grpc_ms),
              encoder_profile=[dict(op="MatMul", ms_per_call=5.0, fraction=0.6)],
              question_profile=[dict(op="BatchMatMulV2", ms_per_call=9.0, fraction=0.3)],
              **flags)


def test_serving_variants_are_judged_against_their_targets_and_the_shipped_one_named():
  """variant_verdicts: the encoder's FLOP/s at 5 blocks over the matmul limit (target >=
  0.75), in-process p50 over the floor (<= 1.4), gRPC p50 over the floor (<= 1.6), each
  met exactly at its edge and missed past it; the shipped variant follows READER_XLA, the
  fastest is the lowest gRPC p50; the Markdown names both and profiles only the misses."""
  from benchmarks import serving, serving_variants  # pylint: disable=g-import-not-at-top
  from realm_tf.export import assembly  # pylint: disable=g-import-not-at-top
  result = dict(
      limits=dict(matmul=dict(flops_per_second=100e9)), floor_ms=100.0,
      reader_positions=dict(reader_seq_length=160),
      flops_per_question=dict(reader_seq_length=137.4),
      variants=dict(
          baseline=_variant(50e9, 220.0, 280.0, reader_xla=False, onednn="0",
                            reader_length_step=32),
          xla=_variant(75e9, 140.0, 160.0, reader_xla=True, onednn="0",
                       reader_length_step=32),
          xla_onednn=_variant(74.9e9, 141.0, 161.0, reader_xla=True, onednn="1",
                              reader_length_step=32)))
  serving.variant_verdicts(result)
  v = result["variants"]
  assert v["baseline"]["encoder_fraction_of_matmul_at_5_blocks"] == 0.5
  assert v["baseline"]["in_process_p50_over_floor"] == 2.2
  assert v["baseline"]["grpc_p50_over_floor"] == 2.8
  assert not any(v["baseline"]["targets_met"].values())
  assert all(v["xla"]["targets_met"].values())  # each exactly at its target
  assert v["xla_onednn"]["targets_met"] == dict(
      encoder_fraction_of_matmul_at_5_blocks=False, in_process_p50_over_floor=False,
      grpc_p50_over_floor=False)
  assert result["fastest_variant"] == "xla"
  assert result["shipped_variant"] == serving_variants.shipped().name == (
      "xla" if assembly.READER_XLA else "baseline")
  text = "\n".join(serving.variants_markdown(result))
  assert f"Ships: **{result['shipped_variant']}**" in text
  assert "Fastest over gRPC: **xla**" in text
  # The encoder's own matmuls' limit, where measured: its share of the matmul limit and
  # the encoder's share of it.
  assert v["xla"]["gemm_limit_fraction_of_matmul"] == 0.9
  assert v["xla"]["encoder_fraction_of_gemm_limit_at_5_blocks"] == pytest.approx(0.833)
  assert "| xla | on | off | 32 | 0.75 | 0.9 | 0.833 | 140.0 | 1.4 | 160.0 | 1.6 | all met |" in text
  assert "- baseline: encoder 5-block pass: MatMul 60%" in text
  assert "- xla:" not in text  # met everything: no profile line


def test_serving_variants_are_parsed_by_name():
  from benchmarks import serving_variants  # pylint: disable=g-import-not-at-top
  assert [v.name for v in serving_variants.parse("xla, baseline")] == ["xla", "baseline"]
  assert serving_variants.VARIANTS["xla"].server_flags() == [
      "--xla_cpu_compilation_enabled=true"]
  assert serving_variants.VARIANTS["onednn"].env() == {"TF_ENABLE_ONEDNN_OPTS": "1"}
  assert serving_variants.VARIANTS["full_length"].length_step() == 0
  with pytest.raises(ValueError, match="unknown variants.*'nope'"):
    serving_variants.parse("baseline,nope")
  with pytest.raises(ValueError, match="none given"):
    serving_variants.parse(" , ")


def test_serving_memory_rows_say_whether_a_variant_keeps_the_rss_rule():
  """serving_memory.markdown: a variant row whose total growth is at most +5% keeps the
  rule, one past it does not; results from before the variants render as they did."""
  from benchmarks import serving_memory  # pylint: disable=g-import-not-at-top

  def row(name, rss, xla=False, onednn="0"):
    first, last = rss[0], rss[-1]
    growth = round((last - first) / first, 4)
    return dict(variant=name, reader_xla=xla, onednn=onednn,
                points=[dict(version=i + 1, rss_mb=r, p50_ms=100.0) for i, r in enumerate(rss)],
                mb_returned_at_each_retirement=[100.0] * (len(rss) - 1),
                growth_first_handover=round((rss[1] - first) / first, 4),
                growth_per_later_handover=0.0, growth_total=growth,
                within_rss_rule=growth <= serving_memory.MAX_RSS_GROWTH, p50_ms=100.0)

  kept, grown = row("baseline", [1000.0, 1020.0, 1030.0, 1050.0]), row(
      "xla", [1000.0, 1040.0, 1050.0, 1051.0], xla=True)
  assert kept["within_rss_rule"] and not grown["within_rss_rule"]
  result = dict(machine=dict(cpu_count=2, tensorflow="2.20.0",
                             load_average_1_5_15=[1.0, 1.0, 1.0]),
                args=dict(handovers=3, requests=12), model="m", settings=[kept, grown])
  text = serving_memory.markdown(result)
  assert "| baseline | off | 0 | 1000.0 → 1020.0 → 1030.0 → 1050.0 | +2.0% | +0.0% | +5.0% | yes |" in text
  assert "| xla | on | 0 |" in text and "| +5.1% | NO |" in text


def test_op_breakdown_puts_an_xla_program_outside_tensorflow_ops():
  """op_breakdown: a plain function's matmul is an op of its own; an XLA-compiled one's time
  is in the OUTSIDE_OPS entry, not lost; shares are of the calls' time, at most 1 in all."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from benchmarks import serving  # pylint: disable=g-import-not-at-top
  x = tf.random.normal([384, 384])
  for jit_compile in (False, True):
    f = tf.function(lambda a: tf.matmul(tf.matmul(a, a), a), jit_compile=jit_compile)
    ops = serving.op_breakdown(lambda: f(x).numpy(), steps=3)  # pylint: disable=cell-var-from-loop
    names = [o["op"] for o in ops]
    assert 0 < sum(o["fraction"] for o in ops) <= 1.001, ops
    matmuls = [n for n in names if n.endswith("MatMul")]  # _MklMatMul with oneDNN on
    if jit_compile:
      assert not matmuls and serving.OUTSIDE_OPS in names, ops
    else:
      assert matmuls, ops


def test_the_authors_searchers_rows_are_one_file_written_once_in_shard_order(tmp_path):
  """released_scale's authors' searcher reads block_emb from one memory-mapped file, written
  a shard at a time and published whole; a second call reads it again, not the shards."""
  from types import SimpleNamespace  # noqa: PLC0415  this test only
  from benchmarks import released_scale  # noqa: PLC0415  heavy module, this test only
  width = released_scale.BERT_BASE["projection_size"]
  rng = np.random.default_rng(0)
  parts = [(rng.standard_normal((n, width)).astype(np.float32),
            np.arange(n, dtype=np.int64) + 100 * i) for i, n in enumerate((3, 5, 2))]
  calls = []

  def shard(i):
    calls.append(i)
    return parts[i]

  version = SimpleNamespace(version=7)
  infos = [dict(num_blocks=len(ids)) for _, ids in parts]
  rows, ids = released_scale.authors_rows(str(tmp_path), version, infos, shard)
  assert isinstance(rows, np.memmap) and not rows.flags.writeable
  np.testing.assert_array_equal(rows, np.concatenate([p[0] for p in parts]))
  np.testing.assert_array_equal(ids, np.concatenate([p[1] for p in parts]))
  assert calls == [0, 1, 2]
  assert sorted(os.listdir(tmp_path)) == ["authors_block_emb_v7.npy",
                                          "authors_block_emb_v7_ids.npy"]
  again, _ = released_scale.authors_rows(str(tmp_path), version, infos, shard)
  assert calls == [0, 1, 2]
  np.testing.assert_array_equal(again, rows)


def test_memory_timeline_places_a_rise_between_the_log_lines_around_it():
  """memory_timeline: RSS samples placed between a process's absl log lines; a stretch
  where RSS rose by 0.2 GiB or more (or that holds the peak) is listed with the lines
  bounding it, a flat or falling stretch is not."""
  from benchmarks import released_scale  # noqa: PLC0415  heavy module, this test only
  started = time.mktime((2026, 11, 30, 1, 0, 0, 0, 0, -1))  # 01:00:00 local time
  log = ("I1130 01:00:01.000000 140 export.py:1] before the allocation\n"
         "a line that is not absl's\n"
         "I1130 01:00:03.000000 140 export.py:2] allocated\n"
         "I1130 01:00:05.000000 140 export.py:3] freed\n")
  gib = 2**30
  samples = [(0.5, 1 * gib), (1.5, 1 * gib), (2.0, 1.4 * gib), (2.5, 1.5 * gib),
             (3.5, 1.5 * gib), (4.5, 1.0 * gib), (5.5, 1.0 * gib)]
  timeline = released_scale.memory_timeline(dict(started=started, rss_samples=samples), log)
  assert timeline["peak_gib"] == 1.5 and timeline["peak_at_s"] == 2.5
  assert timeline["samples"] == len(samples)
  # The process's own start (nothing resident before its first sample), then the rise.
  start, row = timeline["intervals"]
  assert (start["after"], start["before"]) == ("process start",
                                               "export.py:1] before the allocation")
  assert row["after"] == "export.py:1] before the allocation"
  assert row["before"] == "export.py:2] allocated"
  assert (row["from_s"], row["to_s"]) == (1.0, 3.0)
  assert (row["rss_at_start_gib"], row["max_gib"], row["rss_at_end_gib"]) == (1.0, 1.5, 1.5)
  markdown = "\n".join(released_scale.profile_markdown(
      {"export_scann_memory": dict(command="x", peak_rss_gib=1.5, timeline=timeline)}))
  assert "before the allocation" in markdown


def test_run_process_samples_the_childs_memory_only_when_asked(tmp_path):
  """harness.run_process(rss_every=) adds the child's RSS samples (PeakSampler's, which
  test_benchmark_harness checks) and its start as a Unix time; without it, neither."""
  before = time.time()
  sampled = harness.run_process([sys.executable, "-c", "pass"], str(tmp_path / "a.log"),
                                rss_every=0.01)
  assert isinstance(sampled["rss_samples"], list)
  assert all(rss > 0 for _, rss in sampled["rss_samples"])
  assert before <= sampled["started"] <= time.time()
  plain = harness.run_process([sys.executable, "-c", "pass"], str(tmp_path / "b.log"))
  assert "rss_samples" not in plain and "started" not in plain
