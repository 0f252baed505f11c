"""Explicit name maps from pretrained BERT tensors to tf-models-official variables.

Two source conventions:
  'huggingface': safetensors of a HuggingFace `BertModel` (all-MiniLM-L6-v2). Linear
      weights are stored [out, in].
  'google': the original Google BERT TF checkpoints (`bert_model.ckpt`). Kernels are
      stored [in, out].
Targets are `BertEncoderV2` variable paths (relative to the encoder) and `MaskedLM` paths
(relative to the head). Attention kernels are split per head in BertEncoderV2, so they are
reshaped from the square matrices of the sources.
"""
import dataclasses
from typing import Callable, Optional

import numpy as np

CONVENTIONS = ("huggingface", "google")


@dataclasses.dataclass(frozen=True)
class TensorMapping:
  """Copy `source` (expected `source_shape`) into the variable at `target`."""
  target: str
  source: str
  source_shape: tuple[int, ...]
  transpose: bool = False  # [out, in] → [in, out] before reshaping

  def convert(self, value: np.ndarray, target_shape: tuple[int, ...]) -> np.ndarray:
    if self.transpose:
      value = value.T
    return np.reshape(value, target_shape)


def _names(convention: str) -> dict[str, Callable[..., str]]:
  if convention == "huggingface":
    layer = "encoder.layer.{i}."
    return dict(
        word="embeddings.word_embeddings.weight",
        position="embeddings.position_embeddings.weight",
        type="embeddings.token_type_embeddings.weight",
        emb_ln_gamma="embeddings.LayerNorm.weight",
        emb_ln_beta="embeddings.LayerNorm.bias",
        q_kernel=layer + "attention.self.query.weight",
        q_bias=layer + "attention.self.query.bias",
        k_kernel=layer + "attention.self.key.weight",
        k_bias=layer + "attention.self.key.bias",
        v_kernel=layer + "attention.self.value.weight",
        v_bias=layer + "attention.self.value.bias",
        o_kernel=layer + "attention.output.dense.weight",
        o_bias=layer + "attention.output.dense.bias",
        att_ln_gamma=layer + "attention.output.LayerNorm.weight",
        att_ln_beta=layer + "attention.output.LayerNorm.bias",
        inter_kernel=layer + "intermediate.dense.weight",
        inter_bias=layer + "intermediate.dense.bias",
        out_kernel=layer + "output.dense.weight",
        out_bias=layer + "output.dense.bias",
        out_ln_gamma=layer + "output.LayerNorm.weight",
        out_ln_beta=layer + "output.LayerNorm.bias",
        pool_kernel="pooler.dense.weight",
        pool_bias="pooler.dense.bias",
    )
  if convention == "google":
    layer = "bert/encoder/layer_{i}/"
    return dict(
        word="bert/embeddings/word_embeddings",
        position="bert/embeddings/position_embeddings",
        type="bert/embeddings/token_type_embeddings",
        emb_ln_gamma="bert/embeddings/LayerNorm/gamma",
        emb_ln_beta="bert/embeddings/LayerNorm/beta",
        q_kernel=layer + "attention/self/query/kernel",
        q_bias=layer + "attention/self/query/bias",
        k_kernel=layer + "attention/self/key/kernel",
        k_bias=layer + "attention/self/key/bias",
        v_kernel=layer + "attention/self/value/kernel",
        v_bias=layer + "attention/self/value/bias",
        o_kernel=layer + "attention/output/dense/kernel",
        o_bias=layer + "attention/output/dense/bias",
        att_ln_gamma=layer + "attention/output/LayerNorm/gamma",
        att_ln_beta=layer + "attention/output/LayerNorm/beta",
        inter_kernel=layer + "intermediate/dense/kernel",
        inter_bias=layer + "intermediate/dense/bias",
        out_kernel=layer + "output/dense/kernel",
        out_bias=layer + "output/dense/bias",
        out_ln_gamma=layer + "output/LayerNorm/gamma",
        out_ln_beta=layer + "output/LayerNorm/beta",
        pool_kernel="bert/pooler/dense/kernel",
        pool_bias="bert/pooler/dense/bias",
    )
  raise ValueError(f"unknown convention {convention!r}; expected one of {CONVENTIONS}")


def bert_encoder_map(convention: str, *, vocab_size: int, hidden_size: int, num_layers: int,
                     intermediate_size: int, max_position_embeddings: int,
                     type_vocab_size: int) -> list[TensorMapping]:
  """Every BertEncoderV2 variable and the source tensor it comes from."""
  n = _names(convention)
  hf = convention == "huggingface"
  h, inter = hidden_size, intermediate_size

  def kernel(target, source, n_in, n_out):
    shape = (n_out, n_in) if hf else (n_in, n_out)
    return TensorMapping(target, source, shape, transpose=hf)

  maps = [
      TensorMapping("word_embeddings/embeddings", n["word"], (vocab_size, h)),
      TensorMapping("position_embedding/embeddings", n["position"],
                    (max_position_embeddings, h)),
      TensorMapping("type_embeddings/embeddings", n["type"], (type_vocab_size, h)),
      TensorMapping("embeddings/layer_norm/gamma", n["emb_ln_gamma"], (h,)),
      TensorMapping("embeddings/layer_norm/beta", n["emb_ln_beta"], (h,)),
  ]
  for i in range(num_layers):
    t = f"transformer/layer_{i}/"

    def src(key, i=i):
      return n[key].format(i=i)

    for proj, short in (("query", "q"), ("key", "k"), ("value", "v")):
      maps.append(kernel(f"{t}self_attention/{proj}/kernel", src(f"{short}_kernel"), h, h))
      maps.append(TensorMapping(f"{t}self_attention/{proj}/bias", src(f"{short}_bias"), (h,)))
    maps += [
        kernel(f"{t}self_attention/attention_output/kernel", src("o_kernel"), h, h),
        TensorMapping(f"{t}self_attention/attention_output/bias", src("o_bias"), (h,)),
        TensorMapping(f"{t}self_attention_layer_norm/gamma", src("att_ln_gamma"), (h,)),
        TensorMapping(f"{t}self_attention_layer_norm/beta", src("att_ln_beta"), (h,)),
        kernel(f"{t}intermediate/kernel", src("inter_kernel"), h, inter),
        TensorMapping(f"{t}intermediate/bias", src("inter_bias"), (inter,)),
        kernel(f"{t}output/kernel", src("out_kernel"), inter, h),
        TensorMapping(f"{t}output/bias", src("out_bias"), (h,)),
        TensorMapping(f"{t}output_layer_norm/gamma", src("out_ln_gamma"), (h,)),
        TensorMapping(f"{t}output_layer_norm/beta", src("out_ln_beta"), (h,)),
    ]
  maps += [
      kernel("pooler_transform/kernel", n["pool_kernel"], h, h),
      TensorMapping("pooler_transform/bias", n["pool_bias"], (h,)),
  ]
  return maps


def masked_lm_map(convention: str, *, vocab_size: int,
                  hidden_size: int) -> Optional[list[TensorMapping]]:
  """The MLM head (tf-models `MaskedLM`); None where the convention ships none."""
  if convention != "google":
    return None  # HuggingFace BertModel files (MiniLM) carry no MLM head.
  h = hidden_size
  return [
      TensorMapping("transform/dense/kernel", "cls/predictions/transform/dense/kernel", (h, h)),
      TensorMapping("transform/dense/bias", "cls/predictions/transform/dense/bias", (h,)),
      TensorMapping("transform/LayerNorm/gamma", "cls/predictions/transform/LayerNorm/gamma",
                    (h,)),
      TensorMapping("transform/LayerNorm/beta", "cls/predictions/transform/LayerNorm/beta",
                    (h,)),
      TensorMapping("output_bias/bias", "cls/predictions/output_bias", (vocab_size,)),
  ]


# Source tensors that are not weights of anything we build, with the reason.
IGNORABLE = {
    "huggingface": {
        "embeddings.position_ids": "index buffer, not a weight",
    },
    "google": {
        "global_step": "optimizer bookkeeping",
        "cls/seq_relationship/output_weights": "next-sentence head, unused by REALM",
        "cls/seq_relationship/output_bias": "next-sentence head, unused by REALM",
    },
}
# Optimizer slot suffixes found in checkpoints saved mid-training.
IGNORABLE_SUFFIXES = ("/adam_m", "/adam_v", "/Adam", "/Adam_1")
