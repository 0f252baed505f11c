"""realm_tf: REALM (Retrieval-Augmented Language Model Pre-Training) in TensorFlow 2."""

__version__ = "0.1.0"
