"""Building blocks."""
from realm_tf.modeling.layers.span_scorer import SpanScorer

__all__ = ["SpanScorer"]
