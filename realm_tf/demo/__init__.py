"""`python -m realm_tf.demo`: REALM end to end on a small, self-contained default.

Passages and questions here were written for this demo; nothing is downloaded.
"""
