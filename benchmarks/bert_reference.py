"""An independent NumPy BERT forward pass over source-named weights, for checking loaders.

Shape checks alone cannot catch a transposed square matrix (query/key/value/output are
H×H); comparing whole forward passes can.
"""
import math

import numpy as np


def _layer_norm(x, gamma, beta, eps=1e-12):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * gamma + beta


def _gelu(x, approximate):
  if approximate:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
  from scipy.special import erf  # pylint: disable=g-import-not-at-top
  return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def bert_forward(get, word_ids, type_ids, num_layers, num_heads, convention,
                 approximate_gelu):
  """Sequence output [B, L, H] for all-ones masks. `get(name)` returns a source tensor."""
  hf = convention == "huggingface"

  def dense(x, kernel_name, bias_name):
    w = get(kernel_name).astype(np.float64)
    return x @ (w.T if hf else w) + get(bias_name)

  if hf:
    names = dict(word="embeddings.word_embeddings.weight",
                 pos="embeddings.position_embeddings.weight",
                 type="embeddings.token_type_embeddings.weight",
                 ln="embeddings.LayerNorm.", layer="encoder.layer.{}.")
    g, b, w, bias, sep = "weight", "bias", "weight", "bias", "."
  else:
    names = dict(word="bert/embeddings/word_embeddings",
                 pos="bert/embeddings/position_embeddings",
                 type="bert/embeddings/token_type_embeddings",
                 ln="bert/embeddings/LayerNorm/", layer="bert/encoder/layer_{}/")
    g, b, w, bias, sep = "gamma", "beta", "kernel", "bias", "/"
  seq = word_ids.shape[1]
  x = get(names["word"])[word_ids] + get(names["pos"])[:seq][None] + get(names["type"])[type_ids]
  x = _layer_norm(x.astype(np.float64), get(names["ln"] + g), get(names["ln"] + b))
  hidden = x.shape[-1]
  head = hidden // num_heads
  for i in range(num_layers):
    p = names["layer"].format(i)

    def n(*parts):
      return p + sep.join(parts)

    q = dense(x, n("attention", "self", "query", w), n("attention", "self", "query", bias))
    k = dense(x, n("attention", "self", "key", w), n("attention", "self", "key", bias))
    v = dense(x, n("attention", "self", "value", w), n("attention", "self", "value", bias))
    split = lambda t: t.reshape(t.shape[0], seq, num_heads, head).transpose(0, 2, 1, 3)
    scores = split(q) @ split(k).transpose(0, 1, 3, 2) / math.sqrt(head)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    probs = scores / scores.sum(-1, keepdims=True)
    context = (probs @ split(v)).transpose(0, 2, 1, 3).reshape(x.shape)
    attn = dense(context, n("attention", "output", "dense", w),
                 n("attention", "output", "dense", bias))
    x = _layer_norm(x + attn, get(n("attention", "output", "LayerNorm", g)),
                    get(n("attention", "output", "LayerNorm", b)))
    inter = _gelu(dense(x, n("intermediate", "dense", w), n("intermediate", "dense", bias)),
                  approximate_gelu)
    out = dense(inter, n("output", "dense", w), n("output", "dense", bias))
    x = _layer_norm(x + out, get(n("output", "LayerNorm", g)), get(n("output", "LayerNorm", b)))
  return x
