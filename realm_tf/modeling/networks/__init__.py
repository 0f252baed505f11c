"""Encoders without task heads."""
from realm_tf.modeling.networks.embedder import Embedder, flatten_bert_inputs
from realm_tf.modeling.networks.encoder import build_encoder, dummy_bert_inputs

__all__ = ["Embedder", "build_encoder", "dummy_bert_inputs", "flatten_bert_inputs"]
