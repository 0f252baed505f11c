"""Publishing the tagger: a committed version of `export_dir` (realm_tf.io.versioned).

  <export_dir>/<version>.manifest.json   the commit: training manifest + files, CRC32C
  <export_dir>/<version>.<writer id>/    the SavedModel

Readers (SavedTagger, the Beam tagging step, TF Serving via a copy) pass `export_dir` and
get its newest committed version through `resolve_tagger_dir`, so a half-written export is
never loaded, on local disk or GCS alike. The version is the export time in seconds, so a
retrained tagger published to the same directory supersedes the previous one.
"""
import logging
import time

import tensorflow as tf

from realm_tf.io import versioned
from realm_tf.tagger import signature
from realm_tf.tagger.serving import SpanTagger

KEEP_VERSIONS = 2


def export_tagger(tagger: SpanTagger, export_dir: str, manifest: dict) -> str:
  """Saves `tagger` with its serving signature as a new committed version of export_dir;
  returns the committed SavedModel directory."""
  with versioned.VersionWriter(export_dir, int(time.time())) as writer:
    tf.saved_model.save(tagger, writer.path, signatures={
        signature.SIGNATURE_KEY: tagger.serve.get_concrete_function()})
    committed = writer.commit(manifest)
  deleted = versioned.garbage_collect(export_dir, keep=KEEP_VERSIONS)
  if deleted:
    logging.info("Deleted older tagger exports %s", deleted)
  return committed.path


def resolve_tagger_dir(tagger_dir: str) -> versioned.Version:
  """The newest committed tagger export under `tagger_dir` (or that export itself)."""
  try:
    return versioned.read_version(tagger_dir)
  except versioned.VersionError:
    pass
  latest = versioned.latest_version(tagger_dir)
  if latest is None:
    raise FileNotFoundError(f"{tagger_dir}: no committed tagger export (no "
                            f"*{versioned.MANIFEST_SUFFIX}; is it a tagger export?)")
  return latest


def read_manifest(tagger_dir: str) -> dict:
  return resolve_tagger_dir(tagger_dir).manifest
