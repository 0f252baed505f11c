"""Blocks → pre-training queries and ICT examples (as schema feature dicts).

Pre-training x is taken from the blocks themselves, so every x knows the block it came
from and the trainer can exclude that block from retrieval (REALM's "no trivial
retrievals"). ICT (Lee et al., 2019) pairs a sentence with its block and removes the
sentence from the block most of the time, so the retriever learns more than word overlap.
"""
from typing import Dict, List, Optional, Sequence

from realm_tf.corpus import ids, packing
from realm_tf.corpus.records import Block
from realm_tf.corpus.wordpieces import Wordpieces


def query_budget(query_length: int) -> int:
  """Wordpieces left for x in `[CLS] x [SEP]`."""
  if query_length < 3:
    raise ValueError(f"query_length must be at least 3, got {query_length}")
  return query_length - 2


def long_sentences(block: Block, budget: int) -> List[str]:
  """The sentences of `block` that need wordpiece offsets to be cut for queries."""
  return [s for s, n in zip(block.sentences, block.sentence_lengths) if n > budget]


def pretraining_queries(block: Block, budget: int,
                        long_wordpieces: Sequence[Wordpieces]) -> List[Dict]:
  """Consecutive sentences of the block packed into queries of ≤ `budget` wordpieces.

  `long_wordpieces` are the wordpieces of `long_sentences(block, budget)`, in order; the
  counts of the others are known from the block already.
  """
  pieces: List[packing.Piece] = []
  long_iter = iter(long_wordpieces)
  for sentence, length in zip(block.sentences, block.sentence_lengths):
    if length <= budget:
      pieces.append((sentence, length))
    else:
      pieces.extend(packing.split_to_fit(sentence, next(long_iter), budget))
  return [{"text": " ".join(text for text, _ in group), "block_id": block.block_id,
           "doc_uid": block.doc_uid}
          for group in packing.pack_greedy(pieces, budget)]


def ict_example(block: Block, keep_query_prob: float, seed: int) -> Optional[Dict]:
  """One pseudo-query per block, drawn with a per-block generator; None below 2 sentences.

  A block of one sentence has no evidence left once the query is removed, so it gives no
  ICT example.
  """
  if len(block.sentences) < 2:
    return None
  rng = ids.record_rng(seed, block.block_id)
  position = rng.randrange(len(block.sentences))
  removed = rng.random() >= keep_query_prob
  evidence = [s for i, s in enumerate(block.sentences) if not (removed and i == position)]
  return {"query": block.sentences[position], "query_removed": int(removed),
          "block_id": block.block_id, "doc_uid": block.doc_uid, "title": block.title,
          "text": " ".join(evidence)}


def char_to_byte_offsets(text: str, offsets: Sequence[int]) -> List[int]:
  """Python string (code point) offsets → UTF-8 byte offsets into the same text."""
  if text.isascii():
    return [int(o) for o in offsets]
  return [len(text[:o].encode("utf-8")) for o in offsets]


def pretraining_example(tagged: Dict) -> Dict:
  """A tagged query (TagSalientSpans output) → PRETRAINING features, spans in bytes."""
  text = tagged["text"]
  spans = sorted(tagged["salient_spans"], key=lambda s: (s["start"], s["end"]))
  return {"text": text, "block_id": tagged["block_id"], "doc_uid": tagged["doc_uid"],
          "salient_span_starts": char_to_byte_offsets(text, [s["start"] for s in spans]),
          "salient_span_ends": char_to_byte_offsets(text, [s["end"] for s in spans]),
          "salient_span_labels": [s["label"] for s in spans]}
