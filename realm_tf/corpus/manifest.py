"""manifest.json: what a corpus output holds and how it was made.

Readers trust an output only through its manifest: it is written last, after every data
file, and it carries the counts, the config, the vocabulary hash (blocks are only valid
for the tokenizer that measured them) and a fingerprint of the input files.
"""
import datetime
import hashlib
from typing import Any, BinaryIO, Dict, Iterable, Mapping

import tensorflow as tf

from realm_tf.corpus import records, schema

FORMAT_VERSION = 1
# Stats keys the pipeline writes (see beam/transforms/stats.py).
COUNT_PREFIX = "count/"
SET_ASIDE_PREFIX = "set_aside/"
INPUT_PREFIX = "input/"
# Output name → (file pattern inside the output directory, schema or None for JSON lines).
OUTPUTS = {
    "blocks": ("blocks-*.tfrecord", schema.BLOCK),
    "pretraining": ("pretraining-*.tfrecord", schema.PRETRAINING),
    "ict": ("ict-*.tfrecord", schema.ICT),
    "dead_letter": ("dead_letter-*.jsonl", None),
}


def sha256_of_stream(stream: BinaryIO, chunk_bytes: int = 1 << 22) -> str:
  digest = hashlib.sha256()
  while chunk := stream.read(chunk_bytes):
    digest.update(chunk)
  return digest.hexdigest()


def sha256_of_file(path: str) -> str:
  with tf.io.gfile.GFile(path, "rb") as f:
    return sha256_of_stream(f)


def input_fingerprint(file_hashes: Iterable[str]) -> str:
  """Content-only: the same files give the same fingerprint wherever they are stored."""
  return hashlib.sha256("\n".join(sorted(file_hashes)).encode("ascii")).hexdigest()


def counts_from_stats(stats: Mapping[str, Any]) -> Dict[str, Any]:
  """Flat pipeline stats → the manifest's counts, set-aside records split by kind."""
  found = {key[len(COUNT_PREFIX):]: int(value) for key, value in stats.items()
           if key.startswith(COUNT_PREFIX)}
  by_rule: Dict[str, int] = {}
  bad_input: Dict[str, int] = {}
  for key, value in sorted(stats.items()):
    if key.startswith(SET_ASIDE_PREFIX):
      reason = key[len(SET_ASIDE_PREFIX):]
      (bad_input if reason in records.BAD_INPUT else by_rule)[reason] = int(value)
  counts: Dict[str, Any] = {"records_in": found.pop("records_in"),
                            "accepted": found.pop("accepted"),
                            "set_aside": {"by_rule": by_rule, "bad_input": bad_input}}
  counts.update(found)
  return counts


def check_accounting(counts: Mapping[str, Any]) -> None:
  """Every record read is accepted or set aside with a reason: nothing vanishes."""
  set_aside = sum(counts["set_aside"]["by_rule"].values()) + sum(
      counts["set_aside"]["bad_input"].values())
  if counts["records_in"] != counts["accepted"] + set_aside:
    raise RuntimeError(
        f"record accounting broken: records_in={counts['records_in']} != accepted="
        f"{counts['accepted']} + set aside={set_aside}: {counts['set_aside']}")


def build_manifest(stats: Mapping[str, Any], config: Mapping[str, Any], vocab_file: str,
                   salient_spans: str) -> Dict[str, Any]:
  counts = counts_from_stats(stats)
  check_accounting(counts)
  files = sorted((value for key, value in stats.items() if key.startswith(INPUT_PREFIX)),
                 key=lambda f: f["path"])
  return {
      "format_version": FORMAT_VERSION,
      "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "input": {"format": config["input_format"], "pattern": config["input"], "files": files,
                "fingerprint": input_fingerprint(f["sha256"] for f in files)},
      "vocab": {"file": vocab_file, "sha256": sha256_of_file(vocab_file)},
      "salient_spans": salient_spans,
      "config": dict(config),
      "counts": counts,
      "outputs": {name: {"files": pattern,
                         "features": spec.describe() if spec else "JSON lines: reason, "
                         "detail, path, index, line, excerpt"}
                  for name, (pattern, spec) in OUTPUTS.items()},
  }
