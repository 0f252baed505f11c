"""RunInference over plain TensorFlow SavedModel signatures (string inputs allowed).

Beam's TFModelHandlerTensor loads models with `tf.keras.models.load_model`, which under
Keras 3 refuses a plain `tf.saved_model` export such as ours (a tf.Module whose signature
takes raw strings and tokenizes in-graph). This subclass only changes how the model is
loaded and called; batching, model sharing across threads and metrics stay RunInference's.
"""
from typing import Any, Iterable, Optional, Sequence

import numpy as np
import tensorflow as tf
# The encoders tokenize in-graph with tensorflow_text ops (FastBertNormalize, ...), which
# must be registered in the worker process before the SavedModel is loaded.
import tensorflow_text  # noqa: F401  pylint: disable=unused-import
from apache_beam.ml.inference.base import PredictionResult
from apache_beam.ml.inference.tensorflow_inference import TFModelHandlerTensor


def _call_signature(model, batch: Sequence[Any], inference_args: Optional[dict] = None,
                    model_id: Optional[str] = None) -> Iterable[PredictionResult]:
  """Stacks a batch of elements into the signature's named inputs; one result per row.

  An element is a dict {input name: value}, or a bare value for one-input signatures.
  """
  del inference_args
  names = model.input_names
  rows = [e if isinstance(e, dict) else {names[0]: e} for e in batch]
  inputs = {name: tf.constant([row[name] for row in rows]) for name in names}
  outputs = {k: v.numpy() for k, v in model(**inputs).items()}  # each [B, ...]
  for i, element in enumerate(batch):
    yield PredictionResult(element, {k: v[i] for k, v in outputs.items()}, model_id)


class SavedModelSignatureHandler(TFModelHandlerTensor):
  """A TF model handler for `tf.saved_model` exports, called through one signature."""

  def __init__(self, model_dir: str, signature: str = "serving_default",
               batch_size: int = 64, large_model: bool = False, model_copies: int = 0,
               **kwargs):
    """`large_model`: one copy of the model per worker VM shared by its SDK processes
    (RunInference's multi-process shared model) instead of one per process; then at most
    `model_copies` copies are loaded (0: RunInference's default, one)."""
    super().__init__(model_uri=model_dir, inference_fn=_call_signature, min_batch_size=1,
                     max_batch_size=batch_size, large_model=large_model or model_copies > 0,
                     model_copies=model_copies or None, **kwargs)
    self._signature = signature

  def load_model(self):
    loaded = tf.saved_model.load(self._model_uri)
    function = loaded.signatures[self._signature]
    function.loaded_model = loaded  # the signature needs its variables kept alive
    function.input_names = sorted(function.structured_input_signature[1])
    return function

  def get_num_bytes(self, batch: Sequence[Any]) -> int:
    def size(value):
      if isinstance(value, dict):
        return sum(size(v) for v in value.values())
      if isinstance(value, (bytes, str)):
        return len(value)
      return np.asarray(value).nbytes
    return sum(size(e) for e in batch)

  def get_metrics_namespace(self) -> str:
    return "RealmSavedModelInference"
