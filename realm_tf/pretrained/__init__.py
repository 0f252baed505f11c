"""Pretrained BERT weights: all-MiniLM-L6-v2 (safetensors) and Google BERT TF checkpoints;
the REALM authors' released checkpoints, tensor by tensor, in realm_tf.pretrained.released."""
from realm_tf.pretrained.encoder_weights import (
    WeightLoadingError,
    load_google_bert_checkpoint,
    load_minilm,
    load_weights,
)
from realm_tf.pretrained.minilm import minilm_dir, minilm_vocab_file

__all__ = [
    "WeightLoadingError", "load_google_bert_checkpoint", "load_minilm", "load_weights",
    "minilm_dir", "minilm_vocab_file",
]
