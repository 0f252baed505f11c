"""Retrieval with the warm-started REALM retriever over the demo passages.

Embeds every passage with the document tower ([CLS] title [SEP] body [SEP]), every question
with the query tower, and ranks by inner product: p(z|x) = softmax over the corpus.
"""
import json
import os
import sys
import time

from absl import app, flags, logging

flags.DEFINE_string("config", "configs/demo.yaml", "Experiment config (YAML).")
flags.DEFINE_multi_string("override", [],
                          "Config overrides, e.g. model.retriever.pooling=cls.")
flags.DEFINE_integer("top_k", 3, "Passages to show per question.")
FLAGS = flags.FLAGS

_HERE = os.path.dirname(__file__)


def _read_jsonl(name):
  with open(os.path.join(_HERE, name), encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def main(argv):
  del argv
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from realm_tf.configs import load_config  # pylint: disable=g-import-not-at-top
  from realm_tf.modeling import factory  # pylint: disable=g-import-not-at-top
  from realm_tf.text import Tokenizer  # pylint: disable=g-import-not-at-top

  config = load_config(FLAGS.config, FLAGS.override)
  passages, questions = _read_jsonl("passages.jsonl"), _read_jsonl("questions.jsonl")
  start = time.time()
  m = config.model
  tokenizer = Tokenizer(m.tokenizer.vocab_file or None, m.tokenizer.lower_case)
  retriever = factory.build_retriever(config)
  print(f"Retriever: {factory.count_parameters(retriever):,} parameters, warm start "
        f"'{m.warm_start.source or 'random'}', pooling '{m.retriever.pooling}', "
        f"{m.retriever.projection_size}-d ({time.time() - start:.1f}s to build)")

  blocks = tokenizer.encode([p["title"] for p in passages], m.retriever.block_seq_length,
                            pair_texts=[p["text"] for p in passages])
  queries = tokenizer.encode([q["question"] for q in questions], m.retriever.query_seq_length)
  doc_emb = retriever.embed_documents(blocks.as_dict())  # [N, P]
  query_emb = retriever.embed_queries(queries.as_dict())  # [Q, P]
  log_pz = tf.nn.log_softmax(tf.matmul(query_emb, doc_emb, transpose_b=True), axis=-1)
  top = tf.math.top_k(log_pz, k=min(FLAGS.top_k, len(passages)))

  hits = 0
  for i, q in enumerate(questions):
    ranked = [passages[j]["title"] for j in top.indices[i].numpy()]
    hits += ranked[0] == q["title"]
    print(f"\nQ: {q['question']}")
    for rank, (j, lp) in enumerate(zip(top.indices[i].numpy(), top.values[i].numpy()), 1):
      mark = "*" if passages[j]["title"] == q["title"] else " "
      print(f"  {rank}.{mark} p(z|x)={tf.exp(lp).numpy():.3f}  {passages[j]['title']}: "
            f"{passages[j]['text'][:70]}...")
  print(f"\nTop-1 retrieval accuracy: {hits}/{len(questions)} "
        f"(* marks the passage written for the question). Total {time.time() - start:.1f}s.")
  return 0


if __name__ == "__main__":
  logging.set_verbosity(logging.WARNING)
  sys.exit(app.run(main))
