"""The REALM authors' released checkpoints, tensor by tensor (google-research/language).

Three layouts, all TF1 checkpoints read by name (`tf.train.list_variables`):
  embedder hub module   cc_news_pretrained/embedder/variables/variables: BERT → pooled
                        [CLS] → `dense` (hidden → 128) → LayerNorm, the retriever's tower
  bert hub module       cc_news_pretrained/bert/variables/variables: the knowledge-augmented
                        encoder's BERT and its MLM head (`cls/predictions/...`)
  Open-QA checkpoint    orqa_{nq,wq}_model_from_realm/export/best_default/checkpoint/
                        model.ckpt-300000: the fine-tuned query tower (the embedder module
                        under an extra `module/` scope) and the reader under `reader/`: its
                        BERT (`reader/module/bert/...`), `reader/dense` ([hidden, 2 x span
                        hidden]: start and end projections side by side), `reader/
                        layer_normalization` and `reader/dense_1` ([span hidden, 1])
BERT tensors keep Google's names below a scope that depends on how hub modules nested, so
each tower is found by the suffix `bert/embeddings/word_embeddings`; the embedder's
LayerNorm is `LayerNorm/` (BERT's own, epsilon 1e-12, the names HuggingFace's converter
expects) or `layer_normalization/` (Keras', epsilon 1e-3, what the authors' ICT module
code writes): the names decide the epsilon.

Every tensor of a checkpoint is either loaded into a realm_tf variable or skipped by a rule
with its reason (optimizer slots, the step counter, heads REALM does not use); anything
else, or a tensor of another shape than the layout implies, stops the import with one line
naming the tensor, before any variable is assigned.
"""
import dataclasses
import re
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from realm_tf.pretrained.encoder_weights import WeightLoadingError
from realm_tf.pretrained.name_maps import bert_encoder_map, masked_lm_map

BERT_ANCHOR = "bert/embeddings/word_embeddings"
READER_SCOPE = "reader/"
# The embedder's LayerNorm after the projection: scope name → epsilon of the code that
# names it so (BERT's modeling.layer_norm; tf.keras.layers.LayerNormalization's default).
EMBEDDER_LAYER_NORMS = {"LayerNorm": 1e-12, "layer_normalization": 1e-3}
# The reader's span head in the Open-QA checkpoint (orqa_model.read): Keras' LayerNorm.
SPAN_LAYER_NORM_EPSILON = 1e-3
# Google's BERT checkpoints all use 64-wide attention heads; shapes cannot tell heads apart.
BERT_HEAD_SIZE = 64

# Tensors that are not weights of any realm_tf model, with why they are skipped.
SKIP_RULES: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"^global_step$"), "training step counter (the run's step is read from it)"),
    (re.compile(r"/adam_[mv]$"), "Adam slot of BERT's AdamWeightDecayOptimizer"),
    (re.compile(r"/Adam(_1)?$"), "Adam slot of tf.train.AdamOptimizer"),
    (re.compile(r"^beta[12]_power$"), "Adam's bias-correction accumulator"),
    # The TF2 form of BERT's optimizer names its slots by optimizer (HF's converter skips
    # these names too).
    (re.compile(r"(^|/)AdamWeightDecayOptimizer(_1)?(/|$)"), "Adam slot (TF2 naming)"),
    (re.compile(r"(^|/)cls/seq_relationship/"), "next-sentence head, unused by REALM"),
)


class ReleasedFormatError(WeightLoadingError):
  """A released checkpoint that does not hold exactly the layout described above."""
  is_usage_error = True  # a wrong or damaged download: the command reports it in one line


def skip_reason(name: str) -> Optional[str]:
  """Why a released tensor is not loaded.

  Args:
    name: a tensor name of a released checkpoint.
  Returns:
    The reason of the first SKIP_RULES pattern it matches, or None when it must be loaded.
  """
  for pattern, reason in SKIP_RULES:
    if pattern.search(name):
      return reason
  return None


@dataclasses.dataclass(frozen=True)
class BertDims:
  """A BERT's sizes, as read from its tensors' shapes."""
  vocab_size: int
  hidden_size: int
  num_layers: int
  intermediate_size: int
  max_position_embeddings: int
  type_vocab_size: int

  def as_map_args(self) -> dict:
    """The keyword arguments of name_maps.bert_encoder_map."""
    return dataclasses.asdict(self)


@dataclasses.dataclass
class ReleasedCheckpoint:
  """Names and shapes of one checkpoint, read lazily (a 13M-row tensor is never read)."""
  prefix: str
  shapes: dict[str, tuple[int, ...]]
  _reader: object = None

  @classmethod
  def load(cls, prefix: str) -> "ReleasedCheckpoint":
    """Lists a checkpoint's tensors (tf.train.list_variables: names and shapes only).

    Args:
      prefix: a checkpoint prefix, local or gs:// (a hub module's variables/variables).
    Returns:
      The checkpoint, its tensors not read yet.
    Raises:
      ReleasedFormatError: `prefix` is not a readable TF checkpoint.
    """
    try:
      shapes = {name: tuple(shape) for name, shape in tf.train.list_variables(prefix)}
    except (tf.errors.OpError, ValueError) as e:
      raise ReleasedFormatError(f"{prefix}: not a readable TF checkpoint "
                                f"({str(e).splitlines()[0]})") from e
    return cls(prefix, shapes)

  def read(self, name: str) -> np.ndarray:
    """The value of tensor `name` (read whole: for weights, not block_emb)."""
    if self._reader is None:
      self._reader = tf.train.load_checkpoint(self.prefix)
    return np.asarray(self._reader.get_tensor(name))

  def bert_prefixes(self, scope: str = "", exclude: str = "") -> list[str]:
    """Where the checkpoint's BERTs are.

    Args:
      scope: only names starting with it (e.g. 'reader/').
      exclude: no names starting with it.
    Returns:
      Every prefix `p` such that `p + bert/embeddings/word_embeddings` is a tensor, sorted.
    """
    return sorted(name[:-len(BERT_ANCHOR)] for name in self.shapes
                  if name.endswith(BERT_ANCHOR) and name.startswith(scope)
                  and not (exclude and name.startswith(exclude)))

  def one_bert(self, scope: str = "", exclude: str = "") -> str:
    """The prefix of the one BERT within `scope` and outside `exclude` (bert_prefixes).

    Raises:
      ReleasedFormatError: none or several, naming the embedding tensors found there.
    """
    prefixes = self.bert_prefixes(scope, exclude)
    if len(prefixes) != 1:
      where = f" under '{scope}'" if scope else ""
      # A renamed embedding table is the likely cause: name the embedding tensors there.
      near = sorted(n for n in self.shapes if "embeddings/" in n and n.startswith(scope)
                    and not (exclude and n.startswith(exclude)) and skip_reason(n) is None)
      raise ReleasedFormatError(
          f"{self.prefix}: expected one BERT{where} (a tensor ending in '{BERT_ANCHOR}'), "
          f"found {len(prefixes)}: {prefixes}; embedding tensors there: {near}")
    return prefixes[0]

  def bert_dims(self, prefix: str) -> BertDims:
    """The sizes of the BERT at `prefix + bert/`, read from its tensors' shapes.

    Args:
      prefix: a prefix of bert_prefixes.
    Returns:
      Its BertDims (the number of layers is the highest layer_<i> plus one).
    Raises:
      ReleasedFormatError: a tensor the sizes are read from is missing.
    """
    def shape(suffix):
      name = prefix + suffix
      if name not in self.shapes:
        raise ReleasedFormatError(f"{self.prefix}: missing tensor '{name}'")
      return self.shapes[name]

    vocab, hidden = shape(BERT_ANCHOR)
    layers = {int(m.group(1)) for name in self.shapes
              if (m := re.match(re.escape(prefix) + r"bert/encoder/layer_(\d+)/", name))}
    return BertDims(
        vocab_size=vocab, hidden_size=hidden, num_layers=max(layers) + 1 if layers else 0,
        intermediate_size=shape("bert/encoder/layer_0/intermediate/dense/bias")[0],
        max_position_embeddings=shape("bert/embeddings/position_embeddings")[0],
        type_vocab_size=shape("bert/embeddings/token_type_embeddings")[0])


@dataclasses.dataclass(frozen=True)
class Assignment:
  """Fill `variable` from tensor `source` (of `source_shape`) through `convert`."""
  variable: tf.Variable
  source: str
  source_shape: tuple[int, ...]
  convert: Callable[[np.ndarray], np.ndarray] = lambda value: value


@dataclasses.dataclass
class LoadPlan:
  """Assignments and skips for one checkpoint; `apply` checks the whole plan first."""
  checkpoint: ReleasedCheckpoint
  assignments: list[Assignment] = dataclasses.field(default_factory=list)
  skipped: dict[str, str] = dataclasses.field(default_factory=dict)

  def add(self, variable: tf.Variable, source: str, source_shape, convert=None):
    """Plans `variable` = convert(tensor `source`), the tensor expected of `source_shape`."""
    self.assignments.append(Assignment(variable, source, tuple(int(d) for d in source_shape),
                                       convert or (lambda value: value)))

  def skip_where(self, predicate: Callable[[str], bool], reason: str):
    """Skips every tensor whose name satisfies `predicate`, for `reason`."""
    for name in self.checkpoint.shapes:
      if predicate(name):
        self.skipped.setdefault(name, reason)

  def check(self):
    """Checks that every tensor is loaded or skipped, and every source exists in its shape.

    Raises:
      ReleasedFormatError: one line naming the first unknown, missing or mis-shaped tensor
        (unknown ones first: a renamed tensor is reported by its new name).
    """
    ckpt = self.checkpoint
    used = {a.source for a in self.assignments}
    unknown = sorted(name for name in ckpt.shapes
                     if name not in used and name not in self.skipped
                     and skip_reason(name) is None)
    if unknown:
      more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
      raise ReleasedFormatError(
          f"{ckpt.prefix}: tensor '{unknown[0]}' {list(ckpt.shapes[unknown[0]])} is not part "
          f"of the released REALM layout: nothing loads it and no rule skips it{more}")
    for a in self.assignments:
      if a.source not in ckpt.shapes:
        raise ReleasedFormatError(f"{ckpt.prefix}: missing tensor '{a.source}' "
                                  f"(for {a.variable.name})")
      if ckpt.shapes[a.source] != a.source_shape:
        raise ReleasedFormatError(
            f"{ckpt.prefix}: tensor '{a.source}' has shape {list(ckpt.shapes[a.source])}, "
            f"expected {list(a.source_shape)} (for {a.variable.name})")

  def apply(self) -> dict:
    """Checks the plan (`check`), then assigns every variable.

    Returns:
      {'loaded': tensors read, 'skipped': tensors skipped by a rule}; together, every
      tensor of the checkpoint.
    """
    self.check()
    for a in self.assignments:
      value = a.convert(self.checkpoint.read(a.source))
      if tuple(value.shape) != tuple(a.variable.shape):
        value = np.reshape(value, a.variable.shape)
      a.variable.assign(value.astype(a.variable.dtype.as_numpy_dtype))
    skipped = {name: self.skipped.get(name) or skip_reason(name)
               for name in self.checkpoint.shapes
               if name not in {a.source for a in self.assignments}}
    return dict(loaded=len({a.source for a in self.assignments}), skipped=len(skipped))


def _own_variables(layer) -> dict[str, tf.Variable]:
  """A layer's variables by path below its name (as name_maps' targets are written)."""
  out = {}
  for v in layer.variables:
    parts = v.name.split(":")[0].split("/")
    if layer.name in parts:
      out["/".join(parts[parts.index(layer.name) + 1:])] = v
  return out


def plan_bert(plan: LoadPlan, encoder, prefix: str, dims: BertDims, masked_lm=None):
  """Plans a BertEncoderV2 (and its MaskedLM head) from the BERT at `prefix + bert/`.

  Google's names (name_maps.bert_encoder_map, 'google') under the scope prefix the hub
  modules' nesting gave them.

  Args:
    plan: the checkpoint's LoadPlan.
    encoder: a built BertEncoderV2 of `dims`.
    prefix: where the BERT is (ReleasedCheckpoint.one_bert).
    dims: the BERT's sizes.
    masked_lm: a built MaskedLM to fill from `prefix + cls/predictions/`; None skips
      those tensors (the retriever and the Open-QA reader use no MLM head).
  Raises:
    ReleasedFormatError: the encoder has a variable the map does not fill.
  """
  variables = _own_variables(encoder)
  mappings = bert_encoder_map("google", **dims.as_map_args())
  missing = sorted(set(variables) - {m.target for m in mappings})
  if missing:
    raise ReleasedFormatError(f"{encoder.name}: variables with no released tensor: {missing}")
  for m in mappings:
    target = tuple(variables[m.target].shape)
    plan.add(variables[m.target], prefix + m.source, m.source_shape,
             lambda value, m=m, target=target: m.convert(value, target))
  if masked_lm is None:
    plan.skip_where(lambda name: name.startswith(prefix + "cls/predictions/"),
                    "MLM head of a BERT module, unused by this model")
    return
  head_variables = _own_variables(masked_lm)
  for m in masked_lm_map("google", vocab_size=dims.vocab_size, hidden_size=dims.hidden_size):
    plan.add(head_variables[m.target], prefix + m.source, m.source_shape)


def _outside_berts(name: str, bert_prefixes: list[str]) -> bool:
  return not any(name.startswith(p + "bert/") or name.startswith(p + "cls/")
                 for p in bert_prefixes)


def find_embedder_head(ckpt: ReleasedCheckpoint, exclude: str = "") -> tuple[str, Optional[str]]:
  """Finds the one embedder's projection and LayerNorm: `<s>dense/kernel` and
  `<s>LayerNorm/gamma` or `<s>layer_normalization/gamma` outside any BERT.

  Args:
    ckpt: the checkpoint.
    exclude: a scope to leave out (the reader's, in an Open-QA checkpoint).
  Returns:
    (projection scope, LayerNorm scope or None), each ending in '/'.
  Raises:
    ReleasedFormatError: not exactly one projection, or several LayerNorms.
  """
  berts = ckpt.bert_prefixes()
  candidates = [n for n in ckpt.shapes if _outside_berts(n, berts)
                and not (exclude and n.startswith(exclude)) and skip_reason(n) is None]
  projections = sorted(n[:-len("kernel")] for n in candidates if n.endswith("dense/kernel"))
  norms = sorted(n[:-len("gamma")] for n in candidates
                 if any(n.endswith(f"{s}/gamma") for s in EMBEDDER_LAYER_NORMS))
  if len(projections) != 1 or len(norms) > 1:
    scopes = tuple(projections) + tuple(norms)
    others = sorted(n for n in candidates if not n.startswith(scopes))
    raise ReleasedFormatError(
        f"{ckpt.prefix}: expected one retriever projection '.../dense/kernel' and at most "
        f"one LayerNorm after it, found {projections} and {norms}; other tensors outside "
        f"the BERTs: {others}")
  return projections[0], (norms[0] if norms else None)


def layer_norm_epsilon(scope: Optional[str]) -> Optional[float]:
  """The epsilon of the code that names a LayerNorm so.

  Args:
    scope: a LayerNorm scope of find_embedder_head, or None.
  Returns:
    1e-12 for `LayerNorm/` (BERT's), 1e-3 for `layer_normalization/` (Keras'), None for
    None.
  """
  if scope is None:
    return None
  return EMBEDDER_LAYER_NORMS[scope.rstrip("/").rsplit("/", 1)[-1]]


def plan_embedder(plan: LoadPlan, embedder, dims: BertDims, exclude: str = ""):
  """Plans a realm_tf Embedder (BERT, projection, LayerNorm) from the checkpoint's one
  embedder outside `exclude`.

  Args:
    plan: the checkpoint's LoadPlan.
    embedder: a built Embedder of the released sizes.
    dims: the BERT's sizes.
    exclude: a scope to leave out (the reader's, in an Open-QA checkpoint).
  Raises:
    ReleasedFormatError: the checkpoint has a LayerNorm after the projection and the
      embedder none, or the reverse.
  """
  ckpt = plan.checkpoint
  prefix = ckpt.one_bert(exclude=exclude)
  plan_bert(plan, embedder.encoder, prefix, dims)
  projection, norm = find_embedder_head(ckpt, exclude)
  size = embedder.output_size
  plan.add(embedder.projection.kernel, projection + "kernel", (dims.hidden_size, size))
  plan.add(embedder.projection.bias, projection + "bias", (size,))
  if (norm is None) != (embedder.projection_layer_norm is None):
    raise ReleasedFormatError(
        f"{ckpt.prefix}: the embedder {'has no' if norm is None else 'has a'} LayerNorm "
        f"after its projection; the model was built {'with' if norm is None else 'without'}")
  if norm is not None:
    plan.add(embedder.projection_layer_norm.gamma, norm + "gamma", (size,))
    plan.add(embedder.projection_layer_norm.beta, norm + "beta", (size,))


def span_hidden_size(ckpt: ReleasedCheckpoint) -> int:
  """The reader's span hidden size (orqa_model.read's span_hidden_size).

  Args:
    ckpt: an Open-QA checkpoint.
  Returns:
    The width of `reader/layer_normalization/gamma`.
  Raises:
    ReleasedFormatError: the checkpoint has no reader span head.
  """
  name = READER_SCOPE + "layer_normalization/gamma"
  if name not in ckpt.shapes:
    raise ReleasedFormatError(f"{ckpt.prefix}: missing tensor '{name}' (the reader's span "
                              f"head; is this an Open-QA checkpoint?)")
  return ckpt.shapes[name][0]


def plan_reader(plan: LoadPlan, reader, dims: BertDims):
  """A realm_tf Reader from `reader/` of an Open-QA checkpoint (orqa_model.read).

  `reader/dense` projects every position to [start half; end half]; a span's hidden layer
  is relu(start[s] + end[e]) → LayerNorm → `reader/dense_1`. realm_tf's SpanScorer keeps
  the halves as start_projection and end_projection (the latter without a bias: both
  biases are added to every span, so their sum in start_projection's bias is the same
  function with one redundant parameter fewer).

  Args:
    plan: the Open-QA checkpoint's LoadPlan.
    reader: a built realm_tf Reader of the released sizes.
    dims: the BERT's sizes.
  """
  ckpt = plan.checkpoint
  plan_bert(plan, reader.encoder, ckpt.one_bert(scope=READER_SCOPE), dims)
  scorer = reader.span_scorer
  s, h = scorer.hidden_size, dims.hidden_size
  dense = READER_SCOPE + "dense/"
  plan.add(scorer.start_projection.kernel, dense + "kernel", (h, 2 * s),
           lambda k: k[:, :s])
  plan.add(scorer.end_projection.kernel, dense + "kernel", (h, 2 * s), lambda k: k[:, s:])
  plan.add(scorer.start_projection.bias, dense + "bias", (2 * s,), lambda b: b[:s] + b[s:])
  norm = READER_SCOPE + "layer_normalization/"
  plan.add(scorer.layer_norm.gamma, norm + "gamma", (s,))
  plan.add(scorer.layer_norm.beta, norm + "beta", (s,))
  plan.add(scorer.output_projection.kernel, READER_SCOPE + "dense_1/kernel", (s, 1))
  plan.add(scorer.output_projection.bias, READER_SCOPE + "dense_1/bias", (1,))


def read_step(ckpt: ReleasedCheckpoint) -> int:
  """The checkpoint's global_step.

  Args:
    ckpt: a released checkpoint.
  Returns:
    Its global_step, or 0 for hub modules, which carry none.
  """
  return int(ckpt.read("global_step")) if "global_step" in ckpt.shapes else 0


def read_rows(prefix: str, name: str, shape: tuple[int, int], start: int,
              count: int) -> np.ndarray:
  """Reads rows of a 2-D float32 tensor as a slice (RestoreV2's slice spec), so a 13M-row
  tensor (6.8 GB) is never held whole.

  Args:
    prefix: the checkpoint prefix (local or gs://).
    name: the tensor, e.g. 'block_emb'.
    shape: its full shape [N, P].
    start: the first row.
    count: how many rows.
  Returns:
    float32 [count, P].
  """
  spec = f"{shape[0]} {shape[1]} {start},{count}:-"
  (rows,) = tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[name], shape_and_slices=[spec],
                                 dtypes=[tf.float32])
  return rows.numpy()
