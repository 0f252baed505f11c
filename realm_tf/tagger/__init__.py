"""Salient-span tagger: a BERT token classifier fine-tuned on CoNLL-2003, exported as a
SavedModel that maps raw strings to entity spans (`python -m realm_tf.tagger train|evaluate`).

Submodules are imported directly (e.g. `realm_tf.tagger.spans`), so that light users such as
the Beam workers do not pay for importing the training code.
"""
