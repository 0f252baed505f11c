"""Retriever towers exported as SavedModels that take raw strings.

Tokenization is inside the graph, so a Beam worker, the trainer's input pipeline and TF
Serving all embed text exactly as training did. Exports are committed versions
(realm_tf.io.versioned) named by training step:

  <root>/000000001200.manifest.json   the commit (files, sizes, CRC32C, step, fingerprint)
  <root>/000000001200.<writer id>/    SavedModel (serving_default)
"""
import time
from typing import Optional

import tensorflow as tf

from realm_tf.io import versioned
from realm_tf.modeling.networks.embedder import Embedder
from realm_tf.text.tokenization import Tokenizer

BLOCK = "block_encoder"
QUERY = "query_encoder"


class _Untracked:
  """Holds the Keras embedder out of SavedModel's object graph.

  Saving a tracked Keras model makes tf.saved_model trace every layer's call functions
  (tens of seconds for BERT); only the signatures are needed, and they capture the
  variables, which the module tracks directly.
  """

  def __init__(self, embedder: Embedder):
    self.embedder = embedder


class _Encoder(tf.Module):
  """A retriever tower with its tokenizer, saved by signatures only (see _Untracked).

  Args:
    embedder: the tower (a trained Embedder).
    tokenizer: the run's Tokenizer (saved in the graph).
    seq_length: the tower's input length (query or block).
  """

  kind = ""

  def __init__(self, embedder: Embedder, tokenizer: Tokenizer, seq_length: int):
    super().__init__(name=self.kind)
    self._held = _Untracked(embedder)
    self.encoder_variables = list(embedder.variables)
    self.tokenizer = tokenizer
    self.seq_length = seq_length
    self.dimension = int(embedder.output_size)

  @property
  def embedder(self) -> Embedder:
    """The tower (not tracked by the SavedModel)."""
    return self._held.embedder

  def signatures(self) -> dict:
    """serving_default: the `embed` function."""
    return {"serving_default": self.embed}


class BlockEncoder(_Encoder):
  """(title [B], text [B]) strings → [B, P] embeddings of `[CLS] title [SEP] body [SEP]`."""

  kind = BLOCK

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="title"),
                                tf.TensorSpec([None], tf.string, name="text")])
  def embed(self, title, text):
    """(title [B], text [B]) → {'embeddings': [B, P] float32}."""
    inputs = self.tokenizer.encode(title, self.seq_length, pair_texts=text)
    return {"embeddings": self.embedder(inputs.as_dict(), training=False)}


class QueryEncoder(_Encoder):
  """text [B] strings → [B, P] embeddings of `[CLS] text [SEP]`."""

  kind = QUERY

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
  def embed(self, text):
    """text [B] → {'embeddings': [B, P] float32}."""
    inputs = self.tokenizer.encode(text, self.seq_length)
    # query=True: the relevance scale rides on the query side (Embedder's docstring).
    return {"embeddings": self.embedder(inputs.as_dict(), training=False, query=True)}

  @tf.function(input_signature=[
      tf.TensorSpec([None, None], tf.int32, name="input_word_ids"),
      tf.TensorSpec([None, None], tf.int32, name="input_mask"),
      tf.TensorSpec([None, None], tf.int32, name="input_type_ids")])
  def embed_tokens(self, input_word_ids, input_mask, input_type_ids):
    """Already-packed queries: pre-training embeds masked queries ([MASK] is no text)."""
    inputs = dict(input_word_ids=input_word_ids, input_mask=input_mask,
                  input_type_ids=input_type_ids)
    return {"embeddings": self.embedder(inputs, training=False, query=True)}

  def signatures(self) -> dict:
    """serving_default (`embed`, strings) and embed_tokens (packed inputs)."""
    return {"serving_default": self.embed, "embed_tokens": self.embed_tokens}


def export_encoder(module, root: str, step: int, extra: Optional[dict] = None) -> str:
  """Saves `module` as version `step` under `root` and commits it.

  Two saves of the same weights and graphs are the same version (the SavedModel
  fingerprint's hashes are the commit's identity), so concurrent exporters agree.

  Args:
    module: a BlockEncoder or QueryEncoder.
    root: the versioned encoder directory (layout.block_encoder_dir / query_encoder_dir).
    step: the training step, the version.
    extra: further manifest fields (e.g. the retriever config).

  Returns:
    The committed data directory.

  Raises:
    versioned.VersionConflictError: a different version `step` is committed there.
  """
  start = time.time()
  with versioned.VersionWriter(root, step) as writer:
    tf.saved_model.save(module, writer.path, signatures=module.signatures())
    fingerprint = tf.saved_model.experimental.read_fingerprint(writer.path)
    manifest = dict(extra or {}, kind=module.kind, step=int(step),
                    seq_length=int(module.seq_length),
                    dimension=module.dimension,
                    fingerprint=str(fingerprint.saved_model_checksum),
                    export_seconds=round(time.time() - start, 3))
    # Equal weights and graphs give equal hashes; saved_model_checksum also covers random
    # ids that differ between two saves of the same module, so it is left out.
    identity = ":".join(str(h) for h in (
        fingerprint.graph_def_program_hash, fingerprint.signature_def_hash,
        fingerprint.saved_object_graph_hash, fingerprint.checkpoint_hash))
    return writer.commit(manifest, identity=identity).path


def latest_encoder_export(root: str) -> Optional[versioned.Version]:
  """The newest committed encoder export under `root`, or None."""
  return versioned.latest_version(root)


def load_encoder(path: str, signature_name: str = "serving_default",
                 verify_checksums: bool = False):
  """One signature of a committed encoder export (embed_tokens: packed query inputs).

  The files are checked against the manifest's sizes first (and CRC32C with
  `verify_checksums`), so a truncated or corrupted export is refused with the file's
  name rather than failing deep inside SavedModel loading.

  Args:
    path: the export's data directory, manifest, or `<root>/<version>`.
    signature_name: 'serving_default' (strings) or 'embed_tokens' (queries only).
    verify_checksums: also compare CRC32C (sizes are always compared).

  Returns:
    The concrete function, with `loaded_model` (kept alive) and `version` attached.

  Raises:
    versioned.VersionError: `path` is not a committed version.
    versioned.VerificationError: a file is missing, truncated or corrupted.
  """
  version = versioned.verify_version(versioned.read_version(path), checksums=verify_checksums)
  loaded = tf.saved_model.load(version.path)
  signature = loaded.signatures[signature_name]
  signature.loaded_model = loaded  # keep the variables alive with the function
  signature.version = version
  return signature
