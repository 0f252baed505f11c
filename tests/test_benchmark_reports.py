"""The pre-training benchmark's report: a start rebuilt between invocations is compared with
the kept one and said so in the table (benchmarks/pretrain.py); the compute limits every
performance benchmark records (benchmarks/common.py)."""
import json
import os

import pytest
import tensorflow as tf

from benchmarks import pretrain
from benchmarks.common import RESULTS_DIR

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
  say (a flag added to the parser but not to RUN_FLAGS used to start every arm over)."""
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
  # 13M blocks over 64 shards: bfloat16 128-d embeddings, a bool, three int32 tables of
  # 288, an int32 length; block ids (int64) on every core.
  rows = -(-13_000_000 // 64)
  assert base["index_memory_per_core_total_bytes"] == rows * (256 + 1 + 3 * 4 * 288 + 4) \
      + 8 * 13_000_000
  assert base["step_flops_total"] == pytest.approx(sum(base["step_flops"].values()))
  assert "TFLOP" in paper_scale.report(base)


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
