"""The demo's real data path: Wikipedia leads embedded by a pre-trained retriever, and a few
questions answered with the leads they retrieve.

The leads' retriever is configs/demo.yaml's at step 0: all-MiniLM-L6-v2's sentence
embeddings (mean pooling, cosine), which find related leads without any training. Its two
towers are exported the way a training run exports them (a committed SavedModel each,
realm_tf.retrieval.encoders), so `python -m beam.embed_corpus --encoder` embeds the corpus
exactly as it does after ICT or pre-training. Nothing is trained on Wikipedia here: a few
CPU minutes of ICT, MLM warm-up and REALM pre-training on it showed a user nothing
(benchmarks/results/demo_runs.md), and act 1 shows REALM learning where it can.
"""
from typing import List, Sequence

import numpy as np
import tensorflow as tf

from realm_tf.configs import load_config
from realm_tf.demo import records
from realm_tf.io import layout, versioned
from realm_tf.modeling import factory
from realm_tf.retrieval.encoders import BlockEncoder, QueryEncoder, export_encoder
from realm_tf.retrieval.knowledge_index import row_ordered_embeddings
from realm_tf.text import Tokenizer


def retriever_config(config_path: str):
  """The retriever section of the leads' config (its sequence lengths size the blocks)."""
  return load_config(config_path).model.retriever


def export_towers(config_path: str, directory: str) -> dict:
  """The config's retriever at step 0 (its warm start), both towers exported as version 0
  under `directory` (layout.block_encoder_dir / query_encoder_dir of it).

  Returns:
    {block_encoder, query_encoder: the committed export directories, encoder: what the
    weights are (the warm start's source)}.
  """
  config = load_config(config_path)
  retriever = factory.build_retriever(config)
  t = config.model.tokenizer
  tokenizer = Tokenizer(t.vocab_file or None, t.lower_case)
  r = config.model.retriever
  extra = dict(config=r.as_dict())
  return dict(
      block_encoder=export_encoder(
          BlockEncoder(retriever.document_embedder, tokenizer, r.block_seq_length),
          layout.block_encoder_dir(directory), 0, extra),
      query_encoder=export_encoder(
          QueryEncoder(retriever.query_embedder, tokenizer, r.query_seq_length),
          layout.query_encoder_dir(directory), 0, extra),
      encoder=config.model.warm_start.source or "random init")


def search(query_encoder: str, index_dir: str, corpus_dir: str, questions: Sequence[str],
           top: int = 3) -> List[dict]:
  """Each question's `top` leads by inner product over the newest committed index.

  Args:
    query_encoder: a committed query-encoder export (export_towers's).
    index_dir: the corpus's index (python -m beam.embed_corpus's --output_dir).
    corpus_dir: the blocks the index was built from.
    questions: the questions.
    top: leads per question.

  Returns:
    [{question, leads: [{title, text, score}]}], in `questions` order.

  Raises:
    FileNotFoundError: naming `index_dir`, when it holds no committed index.
  """
  if not questions:
    return []
  export = versioned.latest_version(index_dir)
  if export is None:
    raise FileNotFoundError(f"{index_dir}: no committed index")
  blocks = sorted(records.read_blocks(corpus_dir), key=lambda b: b.block_id)
  ids = np.array([b.block_id for b in blocks], np.int64)
  documents = row_ordered_embeddings(export, ids)  # [N, P]
  encoder = tf.saved_model.load(query_encoder)
  queries = encoder.signatures["serving_default"](
      text=tf.constant(list(questions)))["embeddings"].numpy()  # [Q, P]
  scores = queries @ documents.T  # [Q, N]
  out = []
  for question, row in zip(questions, scores):
    best = np.argsort(-row)[:top]
    out.append(dict(question=question, leads=[
        dict(title=blocks[i].title, text=blocks[i].text, score=float(row[i])) for i in best]))
  return out


def format_leads(found: Sequence[dict], width: int = 100) -> str:
  """search()'s answers as the demo prints them: each question, then its leads."""
  lines = []
  for q in found:
    lines.append(f"Q: {q['question']}")
    for rank, lead in enumerate(q["leads"], 1):
      text = lead["text"] if len(lead["text"]) <= width else lead["text"][:width - 3] + "..."
      lines.append(f"   [{rank}] {lead['score']:.2f}  [{lead['title']}] {text}")
  return "\n".join(lines)
