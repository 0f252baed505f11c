"""Publishing the tagger: SavedModel plus manifest, written under a temporary name and
renamed into place, so a reader (a Beam job, TF Serving) never sees half an export."""
import json
import os
import shutil
import uuid

import tensorflow as tf

from realm_tf.tagger import signature
from realm_tf.tagger.serving import SpanTagger


def publish_directory(staging_dir: str, export_dir: str) -> None:
  """Renames a finished staging directory to export_dir, replacing an older export.

  A rename is atomic on one file system. Replacing is two renames (old aside, new in), so
  at no moment does export_dir hold a mixture of two exports.
  """
  previous = None
  if os.path.exists(export_dir):
    previous = f"{export_dir}.old-{uuid.uuid4().hex[:8]}"
    os.rename(export_dir, previous)
  os.rename(staging_dir, export_dir)
  if previous:
    shutil.rmtree(previous)


def export_tagger(tagger: SpanTagger, export_dir: str, manifest: dict) -> str:
  """Saves `tagger` with its serving signature and `manifest.json` at export_dir."""
  export_dir = os.path.abspath(export_dir)
  os.makedirs(os.path.dirname(export_dir), exist_ok=True)
  staging = f"{export_dir}.tmp-{uuid.uuid4().hex[:8]}"
  try:
    tf.saved_model.save(tagger, staging, signatures={
        signature.SIGNATURE_KEY: tagger.serve.get_concrete_function()})
    with open(os.path.join(staging, signature.MANIFEST_FILE), "w", encoding="utf-8") as f:
      json.dump(manifest, f, indent=2, sort_keys=True)
      f.write("\n")
    publish_directory(staging, export_dir)
  finally:
    if os.path.exists(staging):
      shutil.rmtree(staging)
  return export_dir


def read_manifest(tagger_dir: str) -> dict:
  path = os.path.join(tagger_dir, signature.MANIFEST_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: no tagger manifest (is {tagger_dir} a tagger export?)")
  with open(path, encoding="utf-8") as f:
    return json.load(f)
