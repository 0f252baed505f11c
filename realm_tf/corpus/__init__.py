"""Corpus preparation: turning raw text into REALM blocks, examples and salient spans."""
