"""The pre-training benchmark's report: a start rebuilt between invocations is compared with
the kept one and said so in the table (benchmarks/pretrain.py)."""
import json

from benchmarks import pretrain

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
  assert "Arms c ran from a start rebuilt on 2026-11-23" in table
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
