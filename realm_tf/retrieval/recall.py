"""Zero-shot retrieval recall of a retriever over a corpus: the paper's Table 2 measure.

recall@k = the share of questions with an answer string (or, for CuratedTREC, a pattern)
in at least one of the top-k blocks, as ORQA and REALM count it. The corpus is embedded in
memory by the retriever's document tower and searched through a KnowledgeIndex, the same
retrieval path as training, fine-tuning and the exports.
"""
from typing import Sequence

import numpy as np
import tensorflow as tf

from realm_tf.text import answers
from realm_tf.retrieval.knowledge_index import KnowledgeIndex, tokenize_blocks, type_ids_of


def embed_corpus(retriever, index: KnowledgeIndex, tokenizer, block_seq_length: int,
                 batch_size: int = 128) -> np.ndarray:
  """[N, P] document-tower embeddings of the index's blocks, in row order."""
  tables = tokenize_blocks(index.store, tokenizer, block_seq_length, body_length=1)
  word_ids = tables["word_ids"]
  sep_id = tokenizer.sep_id

  @tf.function(reduce_retracing=True)
  def embed(ids):
    ids = tf.cast(ids, tf.int32)  # the table's ids are narrow (token_dtype)
    return retriever.embed_documents(dict(
        input_word_ids=ids, input_mask=tf.cast(ids != 0, tf.int32),
        input_type_ids=type_ids_of(ids, sep_id)), training=False)

  out = []
  for start in range(0, len(word_ids), batch_size):
    out.append(embed(word_ids[start:start + batch_size]).numpy())
  return np.concatenate(out).astype(np.float32)


def recall_at(retriever, index: KnowledgeIndex, tokenizer, questions: Sequence,
              query_seq_length: int, ks: Sequence[int] = (1, 5, 20), regex: bool = False,
              batch_size: int = 64) -> dict[str, float]:
  """{'recall@k': ...} of `questions` (QAExample: question, answers) over the index's
  current embeddings."""
  if not questions:
    raise ValueError("recall needs at least one question")
  k = min(max(ks), index.num_blocks)
  texts, found = index.store.text_strings, []
  for start in range(0, len(questions), batch_size):
    batch = [q.question for q in questions[start:start + batch_size]]
    query = retriever.embed_queries(
        tokenizer.encode(tf.constant(batch), query_seq_length).as_dict(), training=False)
    found.extend(index.search(query, k).rows.numpy().tolist())
  hits = [[answers.contains_answer(texts[r], q.answers, regex) for r in rows]
          for q, rows in zip(questions, found)]
  return {f"recall@{n}": float(np.mean([any(h[:n]) for h in hits])) for n in ks}
