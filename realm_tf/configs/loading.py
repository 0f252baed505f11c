"""Loading experiment configs from YAML plus command-line overrides.

tf-models-official's `Config.override` rejects unknown keys but names only the leaf key and
checks no types, so a typo deep in a YAML file surfaces as a bare KeyError. We validate the
override tree against the dataclass fields first, so every error names the dotted key and
the file (or command-line flag) it came from, then hand the checked dict to `override`.
"""
import dataclasses
from typing import Any, Iterable, Mapping, Sequence, Type, Union

import tensorflow as tf
import yaml

from official.modeling.hyperparams import base_config

from realm_tf.configs import experiments
from realm_tf.configs.experiment import ExperimentConfig


class ConfigError(ValueError):
  """A config file or override that does not fit the experiment config."""
  is_usage_error = True  # command lines report it in one line, exit 2 (io.command_line)


_SCALARS = (bool, int, float, str)


def _field_types(config_cls: Type[base_config.Config]) -> dict[str, Any]:
  hints = {}
  for field in dataclasses.fields(config_cls):
    if field.name in ("default_params", "restrictions"):
      continue
    hints[field.name] = field.type
  return hints


def _resolve(annotation: Any) -> Any:
  """Turns a possibly-string annotation into a class."""
  if isinstance(annotation, str):
    return {"int": int, "float": float, "str": str, "bool": bool}.get(annotation, annotation)
  return annotation


def _check(config_cls: Type[base_config.Config], tree: Mapping[str, Any], prefix: str,
           source: str) -> dict[str, Any]:
  """Checks keys and scalar types of `tree` against `config_cls`; returns a clean copy."""
  if not isinstance(tree, Mapping):
    raise ConfigError(f"{source}: '{prefix.rstrip('.') or '<root>'}' must be a mapping, "
                      f"got {type(tree).__name__}")
  types = _field_types(config_cls)
  clean = {}
  for key, value in tree.items():
    dotted = f"{prefix}{key}"
    if key not in types:
      known = ", ".join(sorted(types))
      raise ConfigError(f"{source}: unknown key '{dotted}' (known here: {known})")
    expected = _resolve(types[key])
    if isinstance(expected, type) and issubclass(expected, base_config.Config):
      clean[key] = _check(expected, value, dotted + ".", source)
    elif expected in _SCALARS:
      clean[key] = _coerce(value, expected, dotted, source)
    else:
      clean[key] = value
  return clean


def _coerce(value: Any, expected: type, dotted: str, source: str) -> Any:
  ok = isinstance(value, expected) and not (expected is not bool and isinstance(value, bool))
  if expected is float and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  if not ok:
    raise ConfigError(f"{source}: key '{dotted}' expects {expected.__name__}, "
                      f"got {value!r} ({type(value).__name__})")
  return value


def parse_overrides(overrides: Iterable[str]) -> dict[str, Any]:
  """Turns ['trainer.batch_size=8', 'encoder.num_layers=2'] into a nested dict.

  Values are parsed as YAML scalars, so `8` is an int, `3e-5` a float, `true` a bool.
  Comma-joined strings ('a.b=1,c.d=2', tf-models' --params_override form) are accepted too.
  """
  tree: dict[str, Any] = {}
  for item in overrides:
    for assignment in _split_assignments(item):
      if "=" not in assignment:
        raise ConfigError(f"command-line override '{assignment}': expected key=value")
      key, raw = assignment.split("=", 1)
      value = yaml.safe_load(raw) if raw.strip() else ""
      if isinstance(value, str) and _looks_like_float(raw):
        value = float(raw)
      node = tree
      parts = key.strip().split(".")
      for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
          raise ConfigError(f"command-line override '{assignment}': '{part}' is a value")
      node[parts[-1]] = value
  return tree


def _looks_like_float(raw: str) -> bool:
  # YAML 1.1 reads '3e-5' as a string; users mean a float.
  try:
    float(raw)
    return True
  except ValueError:
    return False


def _split_assignments(item: str) -> list[str]:
  parts, current = [], ""
  for piece in item.split(","):
    if "=" in piece or not current:
      if current:
        parts.append(current)
      current = piece
    else:  # a comma inside a value such as a list
      current += "," + piece
  if current:
    parts.append(current)
  return [p.strip() for p in parts if p.strip()]


def load_config(path: Union[str, Sequence[str], None] = None, overrides: Iterable[str] = (),
                config_cls: Type[base_config.Config] = ExperimentConfig,
                experiment: str = "") -> base_config.Config:
  """The registered `experiment`'s defaults (else the dataclass defaults), then each YAML
  file in `path` in order, then `overrides`; validated; raises ConfigError.

  A file may leave task.type out; with an experiment it may not name another type (a
  pre-training file run as realm/ict would silently train the wrong stage).
  """
  if experiment:
    if config_cls is not ExperimentConfig:
      raise ConfigError("--experiment applies to experiment configs only")
    try:
      config = experiments.experiment_config(experiment)
    except ValueError as e:
      raise ConfigError(str(e)) from e
  else:
    config = config_cls()
  paths = [path] if isinstance(path, str) else list(path or ())
  for one in paths:
    # tf.io.gfile: a run's params.yaml is read from gs:// model dirs too.
    if not tf.io.gfile.exists(one):
      raise ConfigError(f"{one}: config file not found")
    with tf.io.gfile.GFile(one, "r") as f:
      try:
        tree = yaml.safe_load(f.read()) or {}
      except yaml.YAMLError as e:
        raise ConfigError(f"{one}: not valid YAML: {e}") from e
    tree = _check(config_cls, tree, "", one)
    _same_task_type(experiment, config, tree, one)
    config.override(tree, is_strict=True)
  override_tree = parse_overrides(overrides)
  if override_tree:
    override_tree = _check(config_cls, override_tree, "", "command-line override")
    _same_task_type(experiment, config, override_tree, "command-line override")
    config.override(override_tree, is_strict=True)
  config.validate()
  return config


def _same_task_type(experiment: str, config, tree: Mapping[str, Any], source: str) -> None:
  chosen = tree.get("task", {}).get("type")  # _check made `task` a mapping
  if experiment and chosen is not None and chosen != config.task.type:
    raise ConfigError(f"{source}: task.type={chosen}, but --experiment {experiment} trains "
                      f"task.type={config.task.type}")
