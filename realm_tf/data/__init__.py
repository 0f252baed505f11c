"""Training input pipelines (tf.data): masking and example parsing for pre-training."""
