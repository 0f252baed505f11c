"""Tagging raw strings with an exported tagger (or the in-memory module before export)."""
from typing import Callable, Mapping, Sequence

import tensorflow as tf
import tensorflow_text  # noqa: F401  pylint: disable=unused-import  # registers its ops

from realm_tf.io import versioned
from realm_tf.tagger import signature
from realm_tf.tagger.export import resolve_tagger_dir

# texts → per text, character-offset spans {'start', 'end', 'label'} in text order.
TagFn = Callable[[Sequence[str]], list[list[dict]]]
# [batch] string tensor → the signature's output tensors.
ServeFn = Callable[[tf.Tensor], Mapping[str, tf.Tensor]]

# Texts per model call. A call is padded to its longest text, and one long text among
# short ones wastes most of the compute: sorting a batch by length and tagging it in
# groups of 16 measured 2.6x the sentences/s of one padded call of 64 on a 2-core CPU.
DEFAULT_GROUP_SIZE = 16


def tag_in_groups(serve: ServeFn, texts: Sequence[str],
                  group_size: int = DEFAULT_GROUP_SIZE) -> list[list[dict]]:
  """Spans per text, in the order given; texts of similar length are tagged together."""
  if group_size < 1:
    raise ValueError(f"group_size must be positive, got {group_size}")
  texts = list(texts)
  by_length = sorted(range(len(texts)), key=lambda i: len(texts[i]))
  spans: list[list[dict]] = [[] for _ in texts]
  for begin in range(0, len(by_length), group_size):
    group = by_length[begin:begin + group_size]
    group_texts = [texts[i] for i in group]
    outputs = serve(tf.constant(group_texts, dtype=tf.string))
    decoded = signature.decode_spans(group_texts, {k: v.numpy() for k, v in outputs.items()})
    for i, text_spans in zip(group, decoded):
      spans[i] = text_spans
  return spans


class SavedTagger:
  """An exported tagger directory, called through its serving signature."""

  def __init__(self, tagger_dir: str, group_size: int = DEFAULT_GROUP_SIZE):
    self.tagger_dir = tagger_dir
    self.group_size = group_size
    # The newest committed export, its files checked against the manifest's sizes.
    self.version = versioned.verify_version(resolve_tagger_dir(tagger_dir))
    try:
      # Keep the loaded object: its signature function does not own the variables.
      self._loaded = tf.saved_model.load(self.version.path)
    except (OSError, ValueError, tf.errors.OpError) as e:
      raise ValueError(f"{tagger_dir}: not a loadable tagger SavedModel: {e}") from e
    if signature.SIGNATURE_KEY not in self._loaded.signatures:
      raise ValueError(f"{tagger_dir}: SavedModel has no '{signature.SIGNATURE_KEY}' "
                       f"signature (found {sorted(self._loaded.signatures)})")
    serving = self._loaded.signatures[signature.SIGNATURE_KEY]
    self._serve = lambda text: serving(**{signature.INPUT_KEY: text})

  def __call__(self, texts: Sequence[str]) -> list[list[dict]]:
    return tag_in_groups(self._serve, texts, self.group_size)


def module_tag_fn(tagger, group_size: int = DEFAULT_GROUP_SIZE) -> TagFn:
  """The same contract for an in-memory SpanTagger (used to evaluate before exporting)."""
  return lambda texts: tag_in_groups(tagger.serve, texts, group_size)
