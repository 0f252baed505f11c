"""Loading pretrained BERT weights into tf-models-official's BertEncoder by name.

Loading is all-or-nothing and loud: every target variable must be mapped, every source
tensor must be used or be on the explicit ignore list, every shape must match, and the
MiniLM file's SHA-256 must match the pinned one. A silent partial load would train a model
that looks fine and is not.
"""
import dataclasses
import hashlib
import logging
import os
from typing import Mapping, Optional

import numpy as np
import tensorflow as tf
import tf_keras
from safetensors.numpy import load_file

from realm_tf.pretrained import minilm
from realm_tf.pretrained.name_maps import (
    IGNORABLE,
    IGNORABLE_SUFFIXES,
    TensorMapping,
    bert_encoder_map,
    masked_lm_map,
)


class WeightLoadingError(ValueError):
  """The source does not hold exactly the weights the model needs."""


@dataclasses.dataclass
class LoadReport:
  source: str
  loaded: int
  skipped: dict[str, str]


def sha256_of(path: str) -> str:
  digest = hashlib.sha256()
  with tf.io.gfile.GFile(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      digest.update(chunk)
  return digest.hexdigest()


class _TensorSource:
  """Read-only access to named numpy tensors of one file or checkpoint."""

  def __init__(self, description: str, shapes: Mapping[str, tuple], read):
    self.description = description
    self.shapes = dict(shapes)
    self._read = read

  def read(self, name: str) -> np.ndarray:
    return np.asarray(self._read(name))


def safetensors_source(path: str, sha256: Optional[str] = None) -> _TensorSource:
  """A safetensors file read with `safetensors.numpy` (no torch)."""
  if not os.path.exists(path):
    raise WeightLoadingError(f"{path}: weights file not found")
  if sha256 is not None:
    actual = sha256_of(path)
    if actual != sha256:
      raise WeightLoadingError(
          f"{path}: SHA-256 {actual} does not match the pinned {sha256}; refusing to load")
  tensors = load_file(path)
  return _TensorSource(path, {k: v.shape for k, v in tensors.items()}, tensors.__getitem__)


def checkpoint_source(prefix: str) -> _TensorSource:
  """A TF checkpoint (e.g. Google's `bert_model.ckpt` prefix), read lazily by name."""
  try:
    reader = tf.train.load_checkpoint(prefix)
  except (tf.errors.NotFoundError, ValueError) as e:
    raise WeightLoadingError(f"{prefix}: not a readable TF checkpoint: {e}") from e
  shapes = {k: tuple(v) for k, v in reader.get_variable_to_shape_map().items()}
  return _TensorSource(prefix, shapes, reader.get_tensor)


def _relative_variables(layer: tf_keras.layers.Layer) -> dict[str, tf.Variable]:
  """The layer's own variables by path below the layer's name (tied ones from elsewhere
  are left out: they belong to the layer that created them)."""
  if not layer.built or not layer.variables:
    raise WeightLoadingError(f"layer '{layer.name}' has no variables yet; build it first")
  out = {}
  for v in layer.variables:
    parts = v.name.split(":")[0].split("/")
    if layer.name not in parts:
      continue
    rel = "/".join(parts[parts.index(layer.name) + 1:])
    out[rel] = v
  return out


def load_weights(layer: tf_keras.layers.Layer, source: _TensorSource,
                 mappings: list[TensorMapping]) -> set[str]:
  """Assigns `mappings` from `source` into `layer`; returns the source names used.

  Raises WeightLoadingError naming every unmapped variable, missing or misshaped tensor.
  """
  variables = _relative_variables(layer)
  by_target = {m.target: m for m in mappings}
  problems = []
  unmapped = sorted(set(variables) - set(by_target))
  if unmapped:
    problems.append(f"variables of '{layer.name}' with no mapping: {unmapped}")
  extra = sorted(set(by_target) - set(variables))
  if extra:
    problems.append(f"mapped targets that '{layer.name}' does not have: {extra}")
  pending = []
  for target, mapping in sorted(by_target.items()):
    if target not in variables:
      continue
    if mapping.source not in source.shapes:
      problems.append(f"missing tensor '{mapping.source}' (for {target})")
      continue
    shape = tuple(source.shapes[mapping.source])
    if shape != tuple(mapping.source_shape):
      problems.append(f"tensor '{mapping.source}' has shape {shape}, expected "
                      f"{tuple(mapping.source_shape)} (for {target})")
      continue
    target_shape = tuple(variables[target].shape)
    if int(np.prod(shape)) != int(np.prod(target_shape)):
      problems.append(f"tensor '{mapping.source}' {shape} cannot fill {target} {target_shape}")
      continue
    pending.append((variables[target], mapping))
  if problems:
    raise WeightLoadingError(f"{source.description}: " + "; ".join(problems))
  # Only assign once everything checks out, so a failed load leaves the model untouched.
  for variable, mapping in pending:
    value = mapping.convert(source.read(mapping.source), tuple(variable.shape))
    variable.assign(value.astype(variable.dtype.as_numpy_dtype))
  return {m.source for _, m in pending}


def _check_leftovers(source: _TensorSource, used: set[str], convention: str,
                     skip_reasons: dict[str, str]) -> dict[str, str]:
  skipped, leftover = {}, []
  for name in sorted(set(source.shapes) - used):
    reason = IGNORABLE[convention].get(name) or skip_reasons.get(name)
    if reason is None and name.endswith(IGNORABLE_SUFFIXES):
      reason = "optimizer slot"
    if reason is None:
      leftover.append(name)
    else:
      skipped[name] = reason
  if leftover:
    raise WeightLoadingError(
        f"{source.description}: tensors that nothing was mapped from: {leftover}")
  return skipped


def _encoder_dims(encoder) -> dict[str, int]:
  cfg = encoder.get_config()
  word = encoder.get_embedding_table()
  position = _relative_variables(encoder)["position_embedding/embeddings"]
  return dict(vocab_size=int(word.shape[0]), hidden_size=cfg["hidden_size"],
              num_layers=cfg["num_layers"], intermediate_size=cfg["inner_dim"],
              max_position_embeddings=int(position.shape[0]),
              type_vocab_size=cfg["type_vocab_size"])


def _load_bert(source: _TensorSource, convention: str, encoder, masked_lm=None) -> LoadReport:
  dims = _encoder_dims(encoder)
  used = load_weights(encoder, source, bert_encoder_map(convention, **dims))
  skip_reasons = {}
  head_map = masked_lm_map(convention, vocab_size=dims["vocab_size"],
                           hidden_size=dims["hidden_size"])
  if masked_lm is not None and head_map is not None:
    used |= load_weights(masked_lm, source, head_map)
  elif head_map is not None:
    skip_reasons = {m.source: "MLM head not requested" for m in head_map}
  skipped = _check_leftovers(source, used, convention, skip_reasons)
  report = LoadReport(source.description, loaded=len(used), skipped=skipped)
  logging.info("Loaded %d tensors from %s (skipped: %s)", report.loaded, report.source,
               report.skipped)
  return report


def load_minilm(encoder, path: Optional[str] = None,
                sha256: Optional[str] = minilm.SAFETENSORS_SHA256) -> LoadReport:
  """all-MiniLM-L6-v2 (HuggingFace safetensors) into a built BertEncoderV2.

  The file carries no MLM head: a knowledge-augmented encoder's head starts from random.
  """
  path = path or minilm.minilm_safetensors_file()
  return _load_bert(safetensors_source(path, sha256=sha256), "huggingface", encoder)


def load_google_bert_checkpoint(encoder, checkpoint_prefix: str, masked_lm=None) -> LoadReport:
  """A Google BERT TF checkpoint (`bert/...` and `cls/predictions/...` names)."""
  return _load_bert(checkpoint_source(checkpoint_prefix), "google", encoder, masked_lm)
