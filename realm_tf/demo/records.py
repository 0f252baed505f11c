"""The demo's reads of corpus records: blocks and pre-training sentences (a `beam.preprocess`
output, a knowledge world), question files, a run's last evaluation."""
import json
import os
import re
from typing import List

import tensorflow as tf

from realm_tf.corpus import schema
from realm_tf.data.files import BLOCKS, PRETRAINING, corpus_files, files
from realm_tf.demo.sentences import Block, Sentence
from realm_tf.io import layout
from realm_tf.tagger.spans import spans_from_byte_offsets


def _parsed(pattern: str, record_schema: schema.RecordSchema, batch: int = 512):
  dataset = tf.data.TFRecordDataset(files(pattern)).batch(batch)
  for serialized in dataset:
    parsed = record_schema.parse(serialized)
    columns = {k: (v.to_list() if isinstance(v, tf.RaggedTensor) else v.numpy().tolist())
               for k, v in parsed.items()}
    for i in range(len(columns[record_schema.names[0]])):
      yield {k: v[i] for k, v in columns.items()}


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else value


def read_blocks(corpus_dir: str) -> List[Block]:
  return [Block(int(r["block_id"]), _text(r["title"]), _text(r["text"]))
          for r in _parsed(corpus_files(corpus_dir, BLOCKS), schema.BLOCK)]


def read_sentences(pattern: str) -> List[Sentence]:
  """Pre-training examples (a corpus dir or a file pattern), spans in characters."""
  out = []
  for r in _parsed(corpus_files(pattern, PRETRAINING), schema.PRETRAINING):
    text = _text(r["text"])
    spans = spans_from_byte_offsets(text, r["salient_span_starts"], r["salient_span_ends"],
                                    r["salient_span_labels"])
    out.append(Sentence(text, int(r["block_id"]), _text(r["doc_uid"]),
                        tuple((s["start"], s["end"], s["label"]) for s in spans)))
  return out


def read_json_lines(path: str) -> List[dict]:
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def last_evaluation(model_dir: str) -> dict:
  """The newest eval/validation-<step>.json of a training run ({} when there is none)."""
  directory = layout.eval_dir(model_dir)
  steps = {}
  for name in os.listdir(directory) if os.path.isdir(directory) else ():
    match = re.search(r"(\d+)\.json$", name)
    if match:
      steps[int(match.group(1))] = name
  if not steps:
    return {}
  with open(os.path.join(directory, steps[max(steps)]), encoding="utf-8") as f:
    return json.load(f)
