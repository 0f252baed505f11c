"""Open-domain QA: answers, span location, BM25, inputs, the model and its evaluation.

Fine-tuning (`python -m realm_tf.train --mode finetune`) and evaluation
(`python -m realm_tf.evaluate`) are built from these pieces.
"""
