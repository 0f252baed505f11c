"""Typed experiment configs, loaded from YAML and overridable from the command line."""
from realm_tf.configs.experiment import (
    DataConfig,
    IctConfig,
    EncoderConfig,
    ExperimentConfig,
    FinetuneConfig,
    IndexConfig,
    PretrainConfig,
    ReaderConfig,
    RetrieverConfig,
    TokenizerConfig,
    TrainerConfig,
    WarmStartConfig,
)
from realm_tf.configs.loading import ConfigError, load_config, parse_overrides

__all__ = [
    "ConfigError", "DataConfig", "IctConfig", "EncoderConfig", "ExperimentConfig", "FinetuneConfig", "IndexConfig",
    "PretrainConfig", "ReaderConfig", "RetrieverConfig", "TokenizerConfig", "TrainerConfig",
    "WarmStartConfig", "load_config", "parse_overrides",
]
