"""Serving exports: the QA SavedModels (retriever + reader with in-graph tokenization),
their warm-up records and the `python -m realm_tf.export` command.

The retriever's own encoder SavedModels, which the trainer hands to the index builder,
live beside the retriever in realm_tf.retrieval.encoders.
"""
