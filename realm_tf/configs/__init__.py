"""Typed experiment configs, loaded from YAML and overridable from the command line."""
from realm_tf.configs.experiment import (
    ConfigValueError,
    DataConfig,
    EncoderConfig,
    ExperimentConfig,
    IctTaskConfig,
    IndexConfig,
    ModelConfig,
    OpenQATaskConfig,
    PretrainTaskConfig,
    ReaderConfig,
    RetrieverConfig,
    RuntimeConfig,
    TaskSelection,
    TokenizerConfig,
    TrainerConfig,
    WarmStartConfig,
)
from realm_tf.configs.experiments import EXPERIMENTS, experiment_config
from realm_tf.configs.loading import ConfigError, load_config, parse_overrides

__all__ = [
    "EXPERIMENTS", "ConfigError", "ConfigValueError", "DataConfig", "EncoderConfig", "ExperimentConfig",
    "IctTaskConfig", "IndexConfig", "ModelConfig", "OpenQATaskConfig", "PretrainTaskConfig",
    "ReaderConfig", "RetrieverConfig", "RuntimeConfig", "TaskSelection", "TokenizerConfig",
    "TrainerConfig", "WarmStartConfig", "experiment_config", "load_config", "parse_overrides",
]
