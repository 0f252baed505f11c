"""Stable identifiers and per-record randomness.

They are content hashes, never counters or Python's `hash()` (salted per process), so the
same input gives the same ids on every run, worker count and runner: a block id in the
index can be traced back, and a masked sentence's own block can be excluded at retrieval
time (REALM's "no trivial retrievals").
"""
import hashlib
import random


def doc_uid(title: str, text: str) -> str:
  """128-bit hex hash of a document's title and plain text."""
  digest = hashlib.sha256(title.encode("utf-8") + b"\x00" + text.encode("utf-8"))
  return digest.hexdigest()[:32]


def block_id(uid: str, block_index: int) -> int:
  """A non-negative int64 (63-bit) from the document uid and the block's position in it."""
  digest = hashlib.sha256(f"{uid}/{block_index}".encode("ascii")).digest()
  return int.from_bytes(digest[:8], "big") >> 1


def record_rng(seed: int, key) -> random.Random:
  """A generator seeded by (seed, key): the same draws for a record on every run."""
  digest = hashlib.sha256(f"{seed}/{key}".encode("utf-8")).digest()
  return random.Random(int.from_bytes(digest[:8], "big"))
