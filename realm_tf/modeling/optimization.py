"""The optimizer of every realm_tf task: tf-models' AdamW with BERT's schedule, and
per-variable learning rates (fresh heads, a retriever trained under a reader).

As tf-models keeps its optimizers below its tasks (official.modeling.optimization): a task
builds its optimizer here from the trainer section (`build_optimizer`) and applies
gradients through `apply_gradients`.
"""
from typing import Optional, Sequence

import tensorflow as tf
from official.modeling import optimization, performance
from official.modeling.optimization import legacy_adamw

from realm_tf.configs.experiment import TrainerConfig


# Variables of freshly initialised heads (trained at head_learning_rate_multiplier x the
# learning rate): the Open-QA reader's span scorer sits on a pre-trained encoder.
HEAD_VARIABLE_PATTERNS = ("span_scorer/",)


class AdamWeightDecayWithVariableRates(legacy_adamw.AdamWeightDecay):
  """tf-models' AdamW with the learning rate multiplied for some variables: fresh heads
  (matched by name, head_patterns) and a group given by identity (the retriever under a
  reader, `set_group_multiplier`).

  Why not scale those gradients: Adam divides by the root of the second moment, so a
  gradient scaled by c gives the same update (up to epsilon): it changes nothing but the
  global clip norm. Here the per-variable learning rate itself (the schedule's value, and
  with it the decoupled weight decay) is multiplied, which is exact; 0 freezes. One
  optimizer and one set of slots, so checkpoints keep their layout.
  """

  def __init__(self, *args, head_multiplier: float = 1.0,
               head_patterns: Sequence[str] = HEAD_VARIABLE_PATTERNS, **kwargs):
    super().__init__(*args, **kwargs)
    self.head_multiplier = float(head_multiplier)
    self.head_patterns = tuple(head_patterns)
    self.group_multiplier = 1.0
    self.group_frozen_steps = 0
    self._group: set = set()  # refs of the variables group_multiplier applies to

  def set_group_multiplier(self, variables, multiplier: float, frozen_steps: int = 0):
    """Multiplies the learning rate of `variables` by `multiplier`.

    The group is given by identity: Keras names do not say which tower a projection
    belongs to. Replaces any group set before.

    Args:
      variables: the variables of the group (e.g. a retriever's trainable variables).
      multiplier: their learning-rate factor; 0 freezes them.
      frozen_steps: their factor is 0 while the optimizer's step counter is below this.
    """
    self._group = {v.ref() for v in variables}
    self.group_multiplier = float(multiplier)
    self.group_frozen_steps = int(frozen_steps)

  def is_head(self, var) -> bool:
    """Whether `var` is a fresh head's (its name contains one of head_patterns)."""
    return any(p in var.name for p in self.head_patterns)

  def multiplier(self, var) -> float:
    """The learning-rate factor of `var`: the group's, else the head's, else 1 (before
    the group's frozen steps, which `_scaled_state` applies in the step)."""
    if var.ref() in self._group:
      return self.group_multiplier
    return self.head_multiplier if self.is_head(var) else 1.0

  def _scaled_state(self, var, apply_state):
    """apply_state with lr_t and lr (bias-corrected) multiplied for `var`."""
    multiplier = self.multiplier(var)
    held = self.group_frozen_steps > 0 and var.ref() in self._group
    if multiplier == 1.0 and not held:
      return apply_state
    if held:  # a tensor: the step counter decides inside the compiled step
      multiplier = tf.where(self.iterations < self.group_frozen_steps, 0.0, multiplier)
    key = (var.device, var.dtype.base_dtype)
    apply_state = dict(apply_state or {})
    coefficients = dict(apply_state.get(key) or self._fallback_apply_state(*key))
    for name in ("lr_t", "lr"):
      if name in coefficients:
        coefficients[name] = coefficients[name] * tf.cast(multiplier, coefficients[name].dtype)
    apply_state[key] = coefficients
    return apply_state

  def _resource_apply_dense(self, grad, var, apply_state=None):
    return super()._resource_apply_dense(grad, var, self._scaled_state(var, apply_state))

  def _resource_apply_sparse(self, grad, var, indices, apply_state=None):
    return super()._resource_apply_sparse(grad, var, indices,
                                          self._scaled_state(var, apply_state))

  def get_config(self):
    """tf-models' AdamW config plus head_multiplier and head_patterns (the group is not
    serialised: it is set again from the model by `set_group_multiplier`)."""
    return dict(super().get_config(), head_multiplier=self.head_multiplier,
                head_patterns=list(self.head_patterns))

  def frozen_for_good(self, var) -> bool:
    """Whether `var` never moves (its group's multiplier is 0): no gradient is needed."""
    return self.group_multiplier == 0.0 and var.ref() in self._group

  @property
  def holds_group(self) -> bool:
    """Whether a group is configured to be held for some first steps."""
    return self.group_frozen_steps > 0 and bool(self._group)

  def clip_by_moving_norm(self, grads_and_vars, clip_norm: float):
    """Clips every gradient by the global norm of the gradients of the variables that move
    at this step: a held variable's gradient (the group's, while the step counter is below
    group_frozen_steps) is left out of the norm, then scaled like the others.

    Why: a held variable moves nothing (its learning rate is 0), but counted in the norm
    its gradient would shrink every other variable's step. Its gradient still reaches
    Adam's moments: zeroed instead, the moments would start from zero at its release and,
    with the bias correction of the global step count, its first steps there would be
    several times the learning rate.

    Args:
      grads_and_vars: (gradient or None, variable) pairs.
      clip_norm: the global norm the moving gradients are clipped to.

    Returns:
      The pairs with every gradient multiplied by clip_norm / max(norm, clip_norm).
    """
    grads_and_vars = list(grads_and_vars)
    held = self.iterations < self.group_frozen_steps  # a tensor: decided in the step
    squares = []
    for g, v in grads_and_vars:
      if g is None:
        continue
      values = g.values if isinstance(g, tf.IndexedSlices) else g
      square = tf.reduce_sum(tf.square(tf.cast(values, tf.float32)))
      squares.append(tf.where(held, 0.0, square) if v.ref() in self._group else square)
    if not squares:
      return grads_and_vars
    norm = tf.sqrt(tf.add_n(squares))
    scale = clip_norm / tf.maximum(norm, clip_norm)

    def scaled(g):
      if isinstance(g, tf.IndexedSlices):  # an embedding lookup's gradient
        return tf.IndexedSlices(g.values * tf.cast(scale, g.values.dtype), g.indices,
                                g.dense_shape)
      return g * tf.cast(scale, g.dtype)

    return [(None if g is None else scaled(g), v) for g, v in grads_and_vars]

  def apply_gradients(self, grads_and_vars, name=None, experimental_aggregate_gradients=True):
    """tf-models' AdamWeightDecay.apply_gradients, whose clip by global norm leaves held
    variables out of the norm while a group is held (clip_by_moving_norm)."""
    if not self.holds_group:
      return super().apply_gradients(grads_and_vars, name, experimental_aggregate_gradients)
    grads_and_vars = list(grads_and_vars)
    if experimental_aggregate_gradients and self.gradient_clip_norm > 0.0:
      grads_and_vars = self.clip_by_moving_norm(grads_and_vars, self.gradient_clip_norm)
    # Past AdamWeightDecay's own clip (done above) to Keras' Adam.
    return super(legacy_adamw.AdamWeightDecay, self).apply_gradients(
        grads_and_vars, name=name,
        experimental_aggregate_gradients=experimental_aggregate_gradients)

  def _transform_gradients(self, grads_and_vars):
    """Keras' clipping after aggregation, with its global clip norm taken as in
    clip_by_moving_norm while a group is held (clipvalue, clipnorm and the gradient
    transformers as Keras applies them)."""
    # pylint: disable=protected-access
    if not self.holds_group or self._global_clipnorm is None:
      return super()._transform_gradients(grads_and_vars)
    if self._clipvalue is not None:
      grads_and_vars = self._clipvalue_fn(grads_and_vars)
    if self._clipnorm is not None:
      grads_and_vars = self._clipnorm_fn(grads_and_vars)
    grads_and_vars = self.clip_by_moving_norm(grads_and_vars, self._global_clipnorm)
    for transform in self.gradient_transformers:
      grads_and_vars = transform(grads_and_vars)
    return grads_and_vars
    # pylint: enable=protected-access


def build_optimizer(trainer: TrainerConfig, runtime=None, retriever_variables: Sequence = ()):
  """AdamW with linear warm-up and linear decay to zero at train_steps (BERT's schedule),
  through tf-models' OptimizerFactory; loss scaling for float16 as tf-models configures it.
  A trainer.optimizer_config with an optimizer type (tf-models' section: optimizer,
  learning_rate, warmup) replaces that schedule and learning_rate / warmup_steps /
  weight_decay are then unused.
  With trainer.head_learning_rate_multiplier != 1 (the span head's) or
  trainer.retriever_learning_rate_multiplier != 1 or trainer.retriever_frozen_steps > 0
  (`retriever_variables`', a retriever trained under a reader), the same AdamW with those
  learning rates multiplied (AdamWeightDecayWithVariableRates)."""
  steps = trainer.train_steps
  if trainer.optimizer_config.optimizer.type:
    # tf-models' own optimizer section, as written (its schedule's decay_steps included).
    config = trainer.optimizer_config
  else:
    config = optimization.OptimizationConfig({
        "optimizer": {"type": "adamw", "adamw": {
            "weight_decay_rate": trainer.weight_decay,
            "exclude_from_weight_decay": ["LayerNorm", "layer_norm", "bias"],
            "global_clipnorm": 1.0}},
        "learning_rate": {"type": "polynomial", "polynomial": {
            "initial_learning_rate": trainer.learning_rate, "decay_steps": steps,
            "end_learning_rate": 0.0}},
        "warmup": {"type": "linear", "linear": {
            "warmup_steps": min(trainer.warmup_steps, max(1, steps // 2))}},
    })
  factory = optimization.OptimizerFactory(config)
  learning_rate = factory.build_learning_rate()
  optimizer = factory.build_optimizer(learning_rate)
  multiplier = trainer.head_learning_rate_multiplier
  retriever_multiplier = trainer.retriever_learning_rate_multiplier
  frozen_steps = trainer.retriever_frozen_steps
  if not retriever_variables:  # nothing to apply them to (ICT: the retriever is the model)
    retriever_multiplier, frozen_steps = 1.0, 0
  if multiplier != 1.0 or retriever_multiplier != 1.0 or frozen_steps:
    if not isinstance(optimizer, legacy_adamw.AdamWeightDecay):
      raise TypeError(f"per-variable learning-rate multipliers need tf-models' "
                      f"AdamWeightDecay, got {type(optimizer).__name__}")
    settings = {k: v for k, v in optimizer.get_config().items()
                if k not in ("learning_rate", "name", "decay")}
    # pylint: disable=protected-access
    optimizer = AdamWeightDecayWithVariableRates(
        learning_rate=learning_rate, head_multiplier=multiplier,
        exclude_from_weight_decay=optimizer._exclude_from_weight_decay,
        include_in_weight_decay=optimizer._include_in_weight_decay, **settings)
    # pylint: enable=protected-access
    optimizer.set_group_multiplier(retriever_variables, retriever_multiplier, frozen_steps)
  if runtime is not None:
    optimizer = performance.configure_optimizer(
        optimizer, use_float16=runtime.mixed_precision_dtype == "float16",
        loss_scale=runtime.loss_scale)
  return optimizer


def variable_rates(optimizer) -> Optional[AdamWeightDecayWithVariableRates]:
  """The AdamWeightDecayWithVariableRates inside `optimizer` (a LossScaleOptimizer wraps
  it under float16), or None when the run uses no per-variable rates."""
  inner = getattr(optimizer, "inner_optimizer", optimizer)
  return inner if isinstance(inner, AdamWeightDecayWithVariableRates) else None


def apply_gradients(optimizer, grads_and_vars):
  """`optimizer.apply_gradients` without the variables a step does not use. (Held
  variables stay out of the clip norm inside the optimizer: clip_by_moving_norm.)

  Args:
    optimizer: a tf_keras optimizer.
    grads_and_vars: (gradient, variable) pairs; pairs whose gradient is None (e.g. BERT's
      pooler under 'cls' pooling) are dropped.
  """
  optimizer.apply_gradients([(g, v) for g, v in grads_and_vars if g is not None])
