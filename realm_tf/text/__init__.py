"""In-graph tokenization for retriever and reader inputs."""
from realm_tf.text.tokenization import BertInputs, Tokenizer, span_text

__all__ = ["BertInputs", "Tokenizer", "span_text"]
