"""The commit protocol: every published output is committed by one manifest written last.

One manifest format: a JSON object whose `files` lists every file of the output with its
size and CRC32C ({name, size, crc32c}), beside what the publisher says about it. One
verifier (`verify_files`, size always, CRC32C on request). Two layouts:

Versioned outputs (encoder snapshots, index exports, tagger and serving exports):

  <root>/
    000000001200.manifest.json        the commit: names its data directory, lists every
                                      file; written last, once
    000000001200.5f3a…/               the data (a SavedModel, index shards, ...)
    000000001300.9c1e…/               being written, or left by a crashed writer: no
                                      manifest names it, so no reader ever sees it
    _leases/000000001200.<id>.json    "a reader is using version 1200 until <time>"
    _claims/000000001300.000000.json  "writer <host:pid> is producing version 1300 until
                                      <time>" (generation 0; a takeover creates .000001)

A flat output (a corpus, whose readers open its directory directly):

  <output_dir>/
    blocks-00000-of-00008.tfrecord, ...
    manifest.json                     the commit: what the output holds, every file;
                                      written last (OutputWriter)

Why no directory rename: on GCS a rename is a copy and a delete per object, so a crash
in the middle leaves a half-renamed directory. Here every writer writes into its own
fresh directory (`<version>.<writer id>/`) and then creates the manifest object with a
create-if-absent primitive (`Storage.create_if_absent`: link(2) locally, an
ifGenerationMatch=0 upload on GCS). Hence:

- A crash at any point before the manifest leaves only an unreferenced directory; the
  next attempt writes a new one and commits.
- Two writers racing on one version: exactly one manifest is created. The loser reads
  the winner's manifest: identical files (same names, sizes and CRC32C) is success and
  it returns the winner's version; different files is a VersionError ("conflict").
  File systems without create-if-absent (ram://, others): check, write, read back; two
  writers whose check and write interleave exactly can both return success, and the
  last manifest written stands (the other's directory is then unreferenced).
- Readers list manifests only and can `verify_version` the files against them (sizes
  always, CRC32C on request), so truncation and corruption are reported by file name.
- `garbage_collect` deletes versions beyond the newest `keep` unless a reader holds a
  `Lease` on them, and deletes unreferenced directories only once their newest object (or
  their writer's start marker) is older than `stale_seconds`: never one being written.
  Lease expiry compares wall clocks of different machines: keep TTLs far above skew. A
  lease taken on an old version while a GC pass is deleting it can lose that race (the
  lease's holder then finds files missing and fails; verify_version names them); leases
  on versions among the newest `keep` never can.
- Writers sharing `root` on several machines (index builders) avoid doing the same work
  with a `Claim` per version: generations of a claim object, each created with the same
  create-if-absent primitive, the highest one counting; an expired one (its holder died)
  is taken over by creating the next generation, so of several claimers that judged it
  stale together exactly one wins. A claim only prevents duplicate work: what is
  published is still decided by the manifest's create-if-absent alone.

Everything reads and writes through a `storage.Storage`: tf.io.gfile (`storage.GFILE`,
the default) on the trainer side, Beam's FileSystems (realm_tf.pipelines.filesystems.BEAM)
on pipeline launchers and workers.

Public API: VersionWriter, Version, list_versions, latest_version, read_version,
verify_version, delete_version, read_verified (one file, checked as it is read), Lease,
Claim (current_claim, list_claims, claim_is_live, superseded_because), garbage_collect;
OutputWriter, check_output_dir, published_files (what every reader of a flat output
opens) and verify_published for flat outputs; write_json_atomic,
read_json; copy_version and publish_copy (to hand a version to a reader with its own
layout, e.g. TF Serving; the copy carries its manifest, which verify_copy checks).

One module per topic, each importing only those listed before it: `manifest` (the format,
checksums, the verifier), `writing`, `reading` (and verification), `leases`, `claims`,
`collection` (garbage collection), `copies` (the hand-over to another layout).
"""
from realm_tf.io.versioned.claims import (
  CLAIMS,
  Claim,
  claim_is_live,
  claim_path,
  current_claim,
  describe_claim,
  list_claims,
  superseded_because,
)
from realm_tf.io.versioned.collection import delete_version, garbage_collect
from realm_tf.io.versioned.copies import COPIED_MANIFEST, copy_version, publish_copy, verify_copy
from realm_tf.io.versioned.leases import LEASES, Lease, leased_versions
from realm_tf.io.versioned.manifest import (
  MANIFEST,
  MANIFEST_SUFFIX,
  WRITER_MARKER,
  UnpublishedError,
  VerificationError,
  Version,
  VersionConflictError,
  VersionError,
  crc32c_of_bytes,
  crc32c_of_file,
  file_entries,
  file_path,
  manifest_path,
  read_json,
  verify_files,
  version_name,
  write_json_atomic,
)
from realm_tf.io.versioned.reading import (
  GLOB_CHARS,
  latest_version,
  list_versions,
  published_files,
  read_verified,
  read_version,
  verify_published,
  verify_version,
)
from realm_tf.io.versioned.writing import OutputWriter, VersionWriter, check_output_dir

__all__ = [
    # manifests and checksums (manifest)
    "MANIFEST", "MANIFEST_SUFFIX", "WRITER_MARKER", "UnpublishedError", "VerificationError",
    "Version",
    "VersionConflictError", "VersionError", "crc32c_of_bytes", "crc32c_of_file",
    "file_entries", "file_path", "manifest_path", "read_json", "verify_files",
    "version_name", "write_json_atomic",
    # writers (writing)
    "OutputWriter", "VersionWriter", "check_output_dir",
    # readers and verification (reading)
    "GLOB_CHARS", "latest_version", "list_versions", "published_files", "read_verified", "read_version",
    "verify_published", "verify_version",
    # handing a version to another layout (copies)
    "COPIED_MANIFEST", "copy_version", "publish_copy", "verify_copy",
    # leases (leases)
    "LEASES", "Lease", "leased_versions",
    # claims (claims)
    "CLAIMS", "Claim", "claim_is_live", "claim_path", "current_claim", "describe_claim",
    "list_claims", "superseded_because",
    # garbage collection (collection)
    "delete_version", "garbage_collect",
]
