"""The demo's reads and writes of corpus records: blocks and pre-training sentences from a
`beam.preprocess` output, and the files the later stages read (pre-training sentences,
held-out masked sentences, question files)."""
import json
import os
import re
from typing import Dict, Iterable, List, Sequence, Set

import tensorflow as tf

from realm_tf.corpus import examples, published, schema
from realm_tf.data.files import BLOCKS, PRETRAINING, corpus_files, files
from realm_tf.demo.questions import Block, Cloze, Sentence
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


def write_sentences(directory: str, sentences: Iterable[Sentence]) -> str:
  """PRETRAINING records published in `directory` (manifest last, as beam.preprocess
  publishes a corpus; a re-run replaces it); returns their file pattern."""
  rows = [dict(
      text=s.text, block_id=s.block_id, doc_uid=s.doc_uid,
      salient_span_starts=examples.char_to_byte_offsets(s.text, [a for a, _, _ in s.spans]),
      salient_span_ends=examples.char_to_byte_offsets(s.text, [b for _, b, _ in s.spans]),
      salient_span_labels=[label for _, _, label in s.spans]) for s in sentences]
  published.publish_records(directory, {PRETRAINING: (rows, schema.PRETRAINING)},
                            dict(kind="demo_sentences"), overwrite=True)
  return os.path.join(directory, f"{PRETRAINING}-*")


def masked_sentences(clozes: Sequence[Cloze]) -> List[Sentence]:
  """Each held-out sentence with only its chosen span, so salient-span masking masks
  exactly the span the cloze blanked."""
  return [Sentence(c.sentence.text, c.sentence.block_id, c.sentence.doc_uid, (c.span,))
          for c in clozes]


def write_json_lines(path: str, rows: Iterable[dict]) -> int:
  count = 0
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    for row in rows:
      f.write(json.dumps(row, ensure_ascii=False) + "\n")
      count += 1
  os.replace(tmp, path)
  return count


def read_json_lines(path: str) -> List[dict]:
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def titles_of(blocks: Sequence[Block]) -> Dict[int, str]:
  return {b.block_id: b.title for b in blocks}


def write_blocks_without(corpus_dir: str, output_dir: str, block_ids: Set[int]) -> int:
  """The corpus's blocks-* records except `block_ids`, published as a corpus in
  `output_dir` (manifest last); returns how many were kept."""
  kept = [r for r in _parsed(corpus_files(corpus_dir, BLOCKS), schema.BLOCK)
          if int(r["block_id"]) not in block_ids]
  published.publish_records(output_dir, {BLOCKS: (kept, schema.BLOCK)},
                            dict(kind="demo_blocks", source=corpus_dir), overwrite=True)
  return len(kept)


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
