"""File-system helpers that behave the same on local disk, GCS and other object stores.

Everything in realm_tf reads and writes user-supplied paths through `tf.io.gfile`, which
speaks local paths, gs://, ram:// (in-memory; tests) and the other TF file systems. Most
calls need nothing more; the few that differ on object stores are here:

- A "directory" on an object store is only a name prefix: it exists when any object has
  that prefix, its stat has mtime 0, and listing may not show prefixes that were never
  created with `makedirs`. `is_dir_like`, `newest_mtime` and `delete_prefix` handle that.
- Objects cannot be renamed atomically or appended to. `write_text_atomic` relies on an
  object upload being all-or-nothing (GCS: an object appears only when its upload is
  complete); `open_for_append` writes one new object per writer session instead of
  appending; `create_if_absent` is the only race-free commit primitive (see there).
- Some libraries insist on a local path: `ensure_local_copy` copies into a temp dir.

`Storage` is the small interface the commit protocol (realm_tf.io.versioned) writes and
reads through. `GFILE` implements it with tf.io.gfile (trainer, exporters, readers); the
pipeline side (Beam launchers and workers) implements it over Beam's `FileSystems`
(realm_tf.pipelines.filesystems.BEAM), so one protocol serves both.
"""
import abc
import contextlib
import io
import logging
import os
import re
import tempfile
import time
import uuid
from typing import BinaryIO, Dict, Iterator, List, Optional

import tensorflow as tf

_SCHEME_RE = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


def scheme(path: str) -> str:
  """'gs', 'ram', 's3', ... or '' for a local path (also for file://)."""
  match = _SCHEME_RE.match(path)
  if not match or match.group(1) == "file":
    return ""
  return match.group(1)


def is_local(path: str) -> bool:
  """True for a local path (no scheme, or file://)."""
  return not scheme(path)


def _local_path(path: str) -> str:
  return path[len("file://"):] if path.startswith("file://") else path


def join(path: str, *parts: str) -> str:
  """os.path.join that keeps `gs://bucket/` intact (it does; named for readability)."""
  return os.path.join(path, *parts)


def is_dir_like(path: str) -> bool:
  """True for a directory, or for a prefix that at least one object lives under.

  Only "not found" means False. Any other failure (no permission, no network, a bucket
  that does not exist, a 5xx after TF's retries) raises tf.errors.OpError: a poller that
  took an outage for "nothing published yet" would wait, rebuild or serve nothing.
  tf.io.gfile.isdir cannot be used for that reason (it returns False on every error);
  stat answers for directories and GCS prefixes, and the listing covers file systems
  whose stat only knows directories created with makedirs. On gs:// a listing answers
  NotFound only when the bucket does not exist (an empty prefix lists nothing), which TF
  reports as it reports a missing object: that raises FileNotFoundError naming the bucket,
  or a poller would wait forever for versions in a bucket that is not there.

  Args:
    path: a local path or URL (a trailing '/' is ignored).

  Returns:
    Whether `path` is a directory or a non-empty prefix.

  Raises:
    FileNotFoundError: `path` is on gs:// and its bucket does not exist.
    tf.errors.OpError: the store could not be asked.
  """
  path = path.rstrip("/")
  try:
    if tf.io.gfile.stat(path).is_directory:
      return True
  except tf.errors.NotFoundError:
    pass
  try:
    return bool(tf.io.gfile.glob(path + "/*"))
  except tf.errors.NotFoundError:
    if scheme(path) == "gs":
      bucket = path[len("gs://"):].partition("/")[0]
      raise FileNotFoundError(f"{path}: bucket gs://{bucket} does not exist") from None
    return False


def exists(path: str) -> bool:
  """A file, a directory, or a prefix holding objects."""
  return tf.io.gfile.exists(path) or is_dir_like(path)


def list_files(root: str) -> List[str]:
  """Every file under `root`, as sorted paths relative to it ('a/b.txt')."""
  root = root.rstrip("/")
  if not is_dir_like(root):
    return []
  files = []
  for directory, _, names in tf.io.gfile.walk(root):
    relative = os.path.relpath(directory.rstrip("/"), root) if directory.rstrip("/") != root else ""
    for name in names:
      files.append(os.path.join(relative, name) if relative else name)
  return sorted(files)


def newest_mtime(path: str) -> float:
  """Newest modification time (seconds) of any object at or under `path`; 0 if unknown.

  A GCS "directory" stat reports mtime 0 whatever its content, so a prefix's age is the
  age of its newest object. File systems that keep no times (ram://) also give 0: callers
  must treat 0 as "unknown", never as "old".
  """
  newest = 0.0
  candidates = [path] if tf.io.gfile.exists(path) and not is_dir_like(path) else [
      os.path.join(path, name) for name in list_files(path)]
  for candidate in candidates:
    try:
      newest = max(newest, tf.io.gfile.stat(candidate).mtime_nsec / 1e9)
    except tf.errors.NotFoundError:
      continue  # deleted while we looked
  return newest


def delete_prefix(path: str) -> int:
  """Deletes a file, or a directory / every object under a prefix.

  rmtree alone is not enough on object stores: it can miss objects under prefixes that
  were never created as directories (ram://, GCS objects written by other tools), so
  every listed file is deleted first.

  Args:
    path: a file, directory or prefix; nothing there is no error.

  Returns:
    The number of files deleted.
  """
  path = path.rstrip("/")
  if tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path):
    tf.io.gfile.remove(path)
    return 1
  deleted = 0
  for name in list_files(path):
    try:
      tf.io.gfile.remove(os.path.join(path, name))
      deleted += 1
    except tf.errors.NotFoundError:
      pass
  try:
    if tf.io.gfile.isdir(path):
      tf.io.gfile.rmtree(path)
  except tf.errors.NotFoundError:
    pass
  return deleted


class _GFileRaw(io.RawIOBase):
  """A GFile as a raw stream, so io.BufferedReader can give it a bounded readline."""

  def __init__(self, gfile):
    super().__init__()
    self._gfile = gfile

  def readable(self) -> bool:
    return True

  def readinto(self, buffer) -> int:
    data = self._gfile.read(len(buffer))
    buffer[:len(data)] = data
    return len(data)

  def close(self) -> None:
    self._gfile.close()
    super().close()


def open_buffered(path: str) -> BinaryIO:
  """A binary stream on any file system whose `readline(limit)` honours the limit.

  GFile.readline takes no limit and reads a whole line into memory however long it is;
  readers of untrusted line-oriented files (realm_tf.corpus.readers.bounded_lines) need the
  bound.
  """
  return io.BufferedReader(_GFileRaw(tf.io.gfile.GFile(path, "rb")), buffer_size=1 << 20)


def read_bytes(path: str) -> bytes:
  """The whole file (tf.io.gfile; a missing file raises tf.errors.NotFoundError)."""
  with tf.io.gfile.GFile(path, "rb") as f:
    return f.read()


def read_text(path: str) -> str:
  """The file's text; a clear FileNotFoundError naming the path if it is missing."""
  try:
    return read_bytes(path).decode("utf-8")
  except tf.errors.NotFoundError:
    raise FileNotFoundError(f"{path}: no such file") from None


def write_bytes_atomic(path: str, data: bytes) -> None:
  """Readers see the old content or the new, never part of it.

  Local disk: a temporary sibling renamed over the target (rename is atomic there).
  Object stores: one upload, which becomes visible only once complete; a rename there
  would be a copy plus delete and add nothing.

  Args:
    path: the file to write or replace (its parent is created).
    data: its new content.
  """
  parent = os.path.dirname(path.rstrip("/"))
  if parent:
    tf.io.gfile.makedirs(parent)
  if not is_local(path):
    if scheme(path) == "ram" and tf.io.gfile.exists(path):
      # TF's ram:// file system appends when a file is reopened for writing (GCS and
      # local disk replace it), so the old object goes first there.
      tf.io.gfile.remove(path)
    with tf.io.gfile.GFile(path, "wb") as f:
      f.write(data)
    return
  tmp = f"{path}.tmp-{uuid.uuid4().hex}"
  with tf.io.gfile.GFile(tmp, "wb") as f:
    f.write(data)
  tf.io.gfile.rename(tmp, path, overwrite=True)


def write_text_atomic(path: str, text: str) -> None:
  """write_bytes_atomic of `text` encoded as UTF-8."""
  write_bytes_atomic(path, text.encode("utf-8"))


def create_if_absent(path: str, data: bytes) -> bool:
  """Writes `data` to `path` only if nothing is there; True if this call created it.

  The one primitive a commit needs to be race-free, implemented per file system:
  - local disk: the data goes to a temporary file that is hard-linked to `path`; link(2)
    fails if `path` exists, so exactly one of any number of racing writers wins, and the
    file is complete from the moment it appears.
  - gs://: an upload with the precondition ifGenerationMatch=0 (google-cloud-storage,
    installed with apache-beam[gcp]); GCS refuses it if the object exists.
  - others (ram://, ...): tf.io.gfile has no create-if-absent, so this checks, writes and
    reads back. Two writers that both check before either writes can both believe they
    won; the last write stays. Callers re-read what was committed (see realm_tf.io.versioned).

  Args:
    path: the object to create (its parent is created where that means anything).
    data: its content.

  Returns:
    True if this call created `path` with `data`; False if something was there.
  """
  if scheme(path) == "gs":  # GCS needs no parent "directory" object
    created = gcs_create_if_absent(path, data)
    if created is not None:
      return created
  parent = os.path.dirname(path.rstrip("/"))
  if parent:
    tf.io.gfile.makedirs(parent)
  if is_local(path):
    local = _local_path(path)
    tmp = f"{local}.tmp-{uuid.uuid4().hex}"
    with tf.io.gfile.GFile(tmp, "wb") as f:
      f.write(data)
    try:
      os.link(tmp, local)  # atomic create-if-absent with complete content
      return True
    except FileExistsError:
      return False
    finally:
      os.remove(tmp)
  if tf.io.gfile.exists(path):
    return False
  with tf.io.gfile.GFile(path, "wb") as f:
    f.write(data)
  return read_bytes(path) == data


def gcs_create_if_absent(path: str, data: bytes) -> Optional[bool]:
  """create_if_absent on gs:// through google-cloud-storage (ifGenerationMatch=0).

  Args:
    path: a gs:// object path.
    data: its content.

  Returns:
    True if created, False if the object exists; None when google-cloud-storage is not
    installed (the caller then takes the generic path).
  """
  try:
    # Optional: google-cloud-storage comes with apache-beam[gcp], which a trainer that
    # never touches gs:// does not need.
    from google.api_core import exceptions  # noqa: PLC0415  optional (above)
    from google.cloud import storage as gcs  # noqa: PLC0415  optional (above)
  except ImportError:
    logging.warning("google-cloud-storage is not installed: %s is committed without a "
                    "create-if-absent precondition (pip install 'apache-beam[gcp]')", path)
    return None
  bucket, _, name = path[len("gs://"):].partition("/")
  blob = gcs.Client().bucket(bucket).blob(name)
  try:
    blob.upload_from_string(data, if_generation_match=0)
    return True
  except exceptions.PreconditionFailed:
    return False


def why_nothing_matches(pattern: str) -> str:
  """For an error message about a path or pattern that matched nothing: " (bucket gs://b
  does not exist)" when that is the reason, else "". Asked through google-cloud-storage
  (which honours STORAGE_EMULATOR_HOST); "" when it is not installed or cannot answer."""
  if scheme(pattern) != "gs":
    return ""
  bucket = pattern[len("gs://"):].partition("/")[0]
  try:
    from google.cloud import storage as gcs  # noqa: PLC0415  optional, as gcs_create_if_absent
    exists = gcs.Client().lookup_bucket(bucket) is not None
  except Exception:  # pylint: disable=broad-except  # no library, no credentials: no hint
    return ""
  return "" if exists else f" (bucket gs://{bucket} does not exist)"


class _RotatedObjectWriter:
  """A text log "appended" to on an object store: each session is its own object."""

  def __init__(self, path: str):
    now_ns = time.time_ns()  # sortable to the microsecond: sessions read back in order
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now_ns / 1e9))
    self.path = f"{path}.{stamp}.{now_ns // 1000 % 1_000_000:06d}-{uuid.uuid4().hex[:8]}"
    self._file = tf.io.gfile.GFile(self.path, "w")

  def write(self, text: str) -> None:
    self._file.write(text)

  def flush(self) -> None:
    self._file.flush()

  def close(self) -> None:
    self._file.close()


@contextlib.contextmanager
def open_for_append(path: str) -> Iterator:
  """A text file to append log lines to.

  Local disk appends to `path`. Object stores have no append (TF's GCS "append" downloads
  and re-uploads the whole object on every flush), so each session writes a new object
  `<path>.<UTC time>-<id>`; `read_log(path)` reads them back in order.

  Args:
    path: the log's path.

  Yields:
    A text file object with write and flush (closed when the block exits).
  """
  if is_local(path):
    parent = os.path.dirname(path)
    if parent:
      tf.io.gfile.makedirs(parent)
    with tf.io.gfile.GFile(path, "a") as f:
      yield f
    return
  writer = _RotatedObjectWriter(path)
  try:
    yield writer
  finally:
    writer.close()


def read_log(path: str) -> str:
  """A log written with `open_for_append`: the file itself, then its rotated sessions."""
  parts = []
  try:
    parts.append(read_text(path))
  except FileNotFoundError:
    pass  # only rotated sessions (object stores)
  for rotated in sorted(tf.io.gfile.glob(path + ".*")):
    parts.append(read_text(rotated))
  return "".join(parts)


def ensure_local_copy(path: str, local_dir: Optional[str] = None) -> str:
  """`path` itself if local, else a local copy (a file, or a directory tree).

  For libraries that open files with Python's `open` (they cannot read gs://).

  Args:
    path: a file or directory, local or on any TF file system.
    local_dir: where to copy to (default: a fresh temporary directory).

  Returns:
    A local path holding the same content.
  """
  if is_local(path):
    return _local_path(path)
  local_dir = local_dir or tempfile.mkdtemp(prefix="realm_tf_copy_")
  target = os.path.join(local_dir, os.path.basename(path.rstrip("/")))
  if not is_dir_like(path):
    tf.io.gfile.copy(path, target, overwrite=True)
    return target
  for name in list_files(path):
    tf.io.gfile.makedirs(os.path.dirname(os.path.join(target, name)))
    tf.io.gfile.copy(os.path.join(path, name), os.path.join(target, name), overwrite=True)
  return target


# --------------------------------------------------------------- the commit's storage

class Storage(abc.ABC):
  """What the commit protocol (realm_tf.io.versioned) needs from a file system.

  Paths are URLs or local paths. A missing file is a FileNotFoundError; other failures
  are OSError. Implementations: `GFILE` (tf.io.gfile) here, and Beam's FileSystems in
  realm_tf.pipelines.filesystems.
  """

  @abc.abstractmethod
  def exists(self, path: str) -> bool:
    """A file (object) at `path`, or a local directory."""

  @abc.abstractmethod
  def is_dir_like(self, path: str) -> bool:
    """A directory, or a prefix with at least one object under it."""

  @abc.abstractmethod
  def list_files(self, root: str) -> List[str]:
    """Every file under `root`, as sorted paths relative to it ('a/b.txt')."""

  def listdir(self, root: str) -> List[str]:
    """Names directly under `root` (files and directories), sorted."""
    return sorted({name.split("/", 1)[0] for name in self.list_files(root)})

  @abc.abstractmethod
  def size(self, path: str) -> int:
    """Bytes in the file at `path`."""

  def file_sizes(self, root: str) -> Dict[str, int]:
    """{relative name: bytes} of every file under `root`."""
    return {name: self.size(os.path.join(root, name)) for name in self.list_files(root)}

  @abc.abstractmethod
  def match_files(self, pattern: str) -> List[str]:
    """Paths matching a file pattern, sorted ([] if none; StorageError if the store
    failed)."""

  @abc.abstractmethod
  def open_read(self, path: str) -> BinaryIO:
    """A binary stream of the file (a context manager)."""

  def read_bytes(self, path: str) -> bytes:
    """The whole file at `path` (FileNotFoundError if missing)."""
    with self.open_read(path) as f:
      return f.read()

  @abc.abstractmethod
  def write_bytes_atomic(self, path: str, data: bytes) -> None:
    """Readers see the old content or the new, never part of it."""

  @abc.abstractmethod
  def create_if_absent(self, path: str, data: bytes) -> bool:
    """Writes `data` only if nothing is at `path`; True if this call created it."""

  @abc.abstractmethod
  def makedirs(self, path: str) -> None:
    """Makes a directory where the file system has them (nothing on object stores)."""

  @abc.abstractmethod
  def delete_prefix(self, path: str) -> int:
    """Deletes a file or everything under a prefix; returns the number of files."""

  @abc.abstractmethod
  def newest_mtime(self, path: str) -> float:
    """Newest modification time of anything at or under `path`; 0 if unknown."""

  @abc.abstractmethod
  def copy(self, source: str, target: str) -> None:
    """Copies one file, replacing `target`."""

  def link_or_copy(self, source: str, target: str) -> None:
    """`target` as a hard link of `source` where both are on one local file system (no
    bytes written: a 7 GB export is handed over in a moment), else a copy. Only for
    files never written in place afterwards, which committed versions are."""
    if is_local(source) and is_local(target):
      self.makedirs(os.path.dirname(target) or ".")
      try:
        if os.path.lexists(target):
          os.remove(target)
        os.link(source, target)
        return
      except OSError:  # another device, or a file system without hard links
        pass
    self.copy(source, target)


class StorageError(OSError):
  """The store could not be asked (permission, network, unknown bucket, a server error
  after retries): never to be read as "nothing there"."""
  is_storage_error = True  # how realm_tf.io.command_line tells it (exit 1)


@contextlib.contextmanager
def _translated_errors(path: str) -> Iterator[None]:
  try:
    yield
  except tf.errors.NotFoundError:
    raise FileNotFoundError(f"{path}: no such file") from None
  except tf.errors.OpError as e:
    raise StorageError(f"{path}: storage failed ({type(e).__name__}: "
                       f"{e.message.strip().splitlines()[0] if e.message else e})") from e


class GFileStorage(Storage):
  """Storage over tf.io.gfile: local disk, gs://, ram:// and TF's other file systems.

  Each method keeps Storage's contract: TF's NotFoundError becomes FileNotFoundError and
  every other TF error a StorageError naming the path.
  """

  def exists(self, path: str) -> bool:
    """tf.io.gfile.exists (a file, or a local directory)."""
    with _translated_errors(path):
      return tf.io.gfile.exists(path)

  def is_dir_like(self, path: str) -> bool:
    """storage.is_dir_like (a directory or a non-empty prefix)."""
    with _translated_errors(path):
      return is_dir_like(path)

  def list_files(self, root: str) -> List[str]:
    """storage.list_files (sorted relative paths)."""
    with _translated_errors(root):
      return list_files(root)

  def listdir(self, root: str) -> List[str]:
    """tf.io.gfile.listdir, names without a trailing '/', sorted."""
    with _translated_errors(root):
      return sorted(name.rstrip("/") for name in tf.io.gfile.listdir(root))

  def match_files(self, pattern: str) -> List[str]:
    """tf.io.gfile.glob, sorted."""
    with _translated_errors(pattern):
      return sorted(tf.io.gfile.glob(pattern))

  def size(self, path: str) -> int:
    """The file's length from tf.io.gfile.stat."""
    with _translated_errors(path):
      return int(tf.io.gfile.stat(path).length)

  @contextlib.contextmanager
  def open_read(self, path: str) -> Iterator[BinaryIO]:
    """A tf.io.gfile.GFile opened 'rb', closed when the block exits."""
    with _translated_errors(path):
      with tf.io.gfile.GFile(path, "rb") as f:
        yield f

  def write_bytes_atomic(self, path: str, data: bytes) -> None:
    """storage.write_bytes_atomic (rename locally, one upload on stores)."""
    with _translated_errors(path):
      write_bytes_atomic(path, data)

  def create_if_absent(self, path: str, data: bytes) -> bool:
    """storage.create_if_absent (link(2) locally, ifGenerationMatch=0 on GCS)."""
    with _translated_errors(path):
      return create_if_absent(path, data)

  def makedirs(self, path: str) -> None:
    """tf.io.gfile.makedirs."""
    with _translated_errors(path):
      tf.io.gfile.makedirs(path)

  def delete_prefix(self, path: str) -> int:
    """storage.delete_prefix (returns the number of files deleted)."""
    with _translated_errors(path):
      return delete_prefix(path)

  def newest_mtime(self, path: str) -> float:
    """storage.newest_mtime (0: unknown)."""
    with _translated_errors(path):
      return newest_mtime(path)

  def copy(self, source: str, target: str) -> None:
    """tf.io.gfile.copy with overwrite (the old target removed first on ram://)."""
    with _translated_errors(target):
      parent = os.path.dirname(target.rstrip("/"))
      if parent:
        tf.io.gfile.makedirs(parent)
      if scheme(target) == "ram" and tf.io.gfile.exists(target):
        tf.io.gfile.remove(target)  # ram:// appends on overwrite (see write_bytes_atomic)
      tf.io.gfile.copy(source, target, overwrite=True)


GFILE = GFileStorage()
