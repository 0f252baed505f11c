"""The REALM authors' released models as a realm_tf run: `python -m realm_tf.import_released`
(__main__.py: the command line) over `importer` (the library)."""
