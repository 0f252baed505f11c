"""The exported tagger's serving signature: names, layout, and decoding its outputs.

One module owns the contract so the exporter and its clients (the Beam step, benchmarks,
TF Serving users) cannot drift apart. A signature cannot return ragged tensors, so spans
come back padded to the most spans of any text in the batch:

  inputs   text         string [batch]            raw text, any case, UTF-8
  outputs  span_starts  int64  [batch, max_spans]  UTF-8 *byte* offsets, -1 past num_spans
           span_ends    int64  [batch, max_spans]  byte offsets, end exclusive, -1 padding
           span_labels  string [batch, max_spans]  'PER', 'LOC', 'ORG', 'MISC'; '' padding
           num_spans    int64  [batch]

Byte offsets are what tensorflow_text reports; `decode_spans` turns them into character
offsets on the Python side, where the text is a `str`.
"""
from typing import Mapping, Sequence

import numpy as np

from realm_tf.tagger.spans import spans_from_byte_offsets

SIGNATURE_KEY = "serving_default"
INPUT_KEY = "text"
OUTPUT_KEYS = ("span_starts", "span_ends", "span_labels", "num_spans")
MANIFEST_FILE = "manifest.json"


def decode_spans(texts: Sequence[str], outputs: Mapping[str, object]) -> list[list[dict]]:
  """Signature outputs for `texts` → per text, character-offset span dicts in text order."""
  arrays = {key: np.asarray(outputs[key]) for key in OUTPUT_KEYS}
  if len(arrays["num_spans"]) != len(texts):
    raise ValueError(f"tagger returned {len(arrays['num_spans'])} rows for {len(texts)} texts")
  decoded = []
  for row, text in enumerate(texts):
    n = int(arrays["num_spans"][row])
    decoded.append(spans_from_byte_offsets(
        text, arrays["span_starts"][row, :n], arrays["span_ends"][row, :n],
        arrays["span_labels"][row, :n]))
  return decoded
