"""The REALM authors' released models as a realm_tf run: `python -m realm_tf.import_released`
(__main__.py: the command line) over `importer` (the library), which puts together the
topics below, one module each:
  release      where each released file is, the Open-QA checkpoint and its params.json
  run_config   the imported run's config and released.yaml
  weights      the model the released tensors fill, its checkpoint and vocabulary
  corpus       blocks.tfr and titles.tfr as the block text store and block records
  block_emb    the released block_emb published as the run's index
  tower_check  the release's own check: the imported document tower reproduces block_emb
"""
