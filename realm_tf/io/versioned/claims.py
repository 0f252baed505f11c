"""Claims: "writer <host:pid> is producing version N until <time>", so that writers sharing
a root on several machines do not all do the same work (see `Claim`)."""
import logging
import os
import re
import socket
import threading
import time
import uuid
from typing import List, Optional

from realm_tf.io.storage import GFILE, Storage
from realm_tf.io.versioned.leases import KeepAlive
from realm_tf.io.versioned.manifest import (
  VersionError,
  json_bytes,
  read_json,
  version_name,
  write_json_atomic,
)

CLAIMS = "_claims"
_CLAIM_RE = re.compile(r"^(\d{12})\.(\d{6})\.json$")


def claim_path(root: str, version: int, generation: int) -> str:
  """`<root>/_claims/<12-digit version>.<6-digit generation>.json`."""
  return os.path.join(root, CLAIMS, f"{version_name(version)}.{int(generation):06d}.json")


def list_claims(root: str, version: Optional[int] = None,
                store: Storage = GFILE) -> List[dict]:
  """Every claim object under `root` (of `version` only, if given), by version then
  generation. Each is the stored record plus `version`, `generation` and `path` from its
  name; one that cannot be read is {"unreadable": True} with those three.

  Args:
    root: the versioned output's root.
    version: only this version's claims (None: all).
    store: the Storage to read through.

  Returns:
    The claim records, sorted by (version, generation).
  """
  claims_dir = os.path.join(root, CLAIMS)
  if not store.is_dir_like(claims_dir):
    return []
  claims = []
  for name in store.listdir(claims_dir):
    match = _CLAIM_RE.match(name)
    if not match or (version is not None and int(match.group(1)) != int(version)):
      continue
    path = os.path.join(claims_dir, name)
    try:
      record = read_json(path, store)
    except FileNotFoundError:
      continue  # collected while we listed
    except VersionError:
      record = dict(unreadable=True)
    claims.append(dict(record, version=int(match.group(1)),
                       generation=int(match.group(2)), path=path))
  return sorted(claims, key=lambda c: (c["version"], c["generation"]))


def current_claim(root: str, version: int, store: Storage = GFILE) -> Optional[dict]:
  """The claim that counts for `version`: its highest generation (None if never claimed)."""
  claims = list_claims(root, version, store)
  return claims[-1] if claims else None


def claim_is_live(claim: Optional[dict], now: Optional[float] = None) -> bool:
  """Whether `claim` is held: no new generation may supersede it (see superseded_because).

  Args:
    claim: a claim record (list_claims), or None (never claimed: not live).
    now: the time to judge expiry at (default: the clock).
  """
  return claim is not None and superseded_because(claim, now) is None


def superseded_because(claim: dict, now: Optional[float] = None) -> Optional[str]:
  """Why the next generation may supersede `claim`, or None while it is held:
  'released'; 'expired' (its holder stopped refreshing it); 'holder gone' (it was made on
  this host by a process that no longer exists: a builder restarted after a crash need
  not wait out the TTL); 'unreadable' (it cannot say who holds it or until when).

  Args:
    claim: a claim record (list_claims).
    now: the time to judge expiry at (default: the clock).
  """
  now = time.time() if now is None else now
  if claim.get("unreadable"):
    return "unreadable"
  if "released_at" in claim:
    return "released"
  if float(claim.get("expires_at", 0)) <= now:
    return "expired"
  if _holder_gone(claim):
    return "holder gone"
  return None


def _holder_gone(claim: dict) -> bool:
  """The claim's process ran on this host and exists no more. Only ever judged on the
  holder's own host; a reused pid makes a dead holder look alive (its claim then
  expires as usual), never the other way round."""
  if claim.get("host") != socket.gethostname():
    return False
  try:
    pid = int(claim.get("pid"))
  except (TypeError, ValueError):
    return False
  if pid <= 0 or pid == os.getpid():
    return False
  try:
    os.kill(pid, 0)  # signal 0: only asks whether the process exists
  except ProcessLookupError:
    return True
  except OSError:  # exists, owned by someone else
    return False
  return False


def describe_claim(claim: Optional[dict]) -> str:
  """'<holder> (<host> pid <pid>, generation <g>)' for log lines."""
  if claim is None:
    return "nobody"
  if claim.get("unreadable"):
    return f"an unreadable claim (generation {claim['generation']})"
  return (f"{claim.get('holder') or 'a writer'} ({claim.get('host')} pid {claim.get('pid')}, "
          f"generation {claim['generation']})")


class Claim:
  """"I am producing version `version` of `root`, until <time>": one writer at a time.

  A lease says a version is being read; a claim says one is being written, so that
  writers sharing `root` on several machines (index builders) do not all do the same
  work. It never decides what is published: the manifest's create-if-absent does, so a
  failed claim (clock skew, a holder wrongly presumed dead, ram://) costs duplicate work,
  never a duplicate or corrupt version.

      claim = Claim(index_dir, 1200, holder="index builder")
      if claim.acquire():
        try:
          ...write and commit version 1200...
        finally:
          claim.release(index=path)
      else:
        describe_claim(claim.current)  # who holds it, and until when (claim.current)

  A claim is a series of generations, `<root>/_claims/<version>.<generation>.json`, each
  created once with `Storage.create_if_absent`; only the highest generation counts.
  `acquire` creates generation 0 if there is none, else generation g+1 if generation g
  has expired (its holder stopped refreshing it: it died), was released, or was made on
  this host by a process that is gone (superseded_because); otherwise it loses.
  Claimers that judged generation g stale at the same time race on creating the one
  object g+1, so exactly one of them wins. The holder's daemon thread rewrites its
  `expires_at` every ttl/3 seconds; if it finds a higher generation, the holder was
  presumed dead and taken over: `taken_over` then names the new holder and refreshing
  stops. `release` marks the generation released (with what came of it), which lets the
  next claimer create the next generation; claims are deleted by garbage_collect once
  their version is older than every committed version it keeps. Expiry compares wall
  clocks of different machines, as leases do: keep the TTL far above clock skew.

  Args:
    root: the versioned output's root.
    version: the version to be produced.
    holder: who claims it (recorded, for log lines and people).
    ttl_seconds: how long a claim outlives its last refresh.
    store: the Storage to write through.

  Raises:
    ValueError: ttl_seconds is not positive.
  """

  def __init__(self, root: str, version: int, holder: str = "",
               ttl_seconds: float = 600.0, store: Storage = GFILE):
    if ttl_seconds <= 0:
      raise ValueError(f"ttl_seconds must be positive, got {ttl_seconds}")
    self.root, self.version, self.holder = root, int(version), holder
    self.ttl_seconds = ttl_seconds
    self.store = store
    self.claimer = uuid.uuid4().hex
    self.generation: Optional[int] = None  # held generation, once acquired
    self.record: Optional[dict] = None
    self.current: Optional[dict] = None  # the claim that beat this one, when lost
    self.taken_over: Optional[dict] = None  # the claim that superseded this one
    self._lock = threading.Lock()
    self._keep_alive: Optional[KeepAlive] = None

  @property
  def path(self) -> Optional[str]:
    """The held generation's object, or None before acquire wins."""
    if self.generation is None:
      return None
    return claim_path(self.root, self.version, self.generation)

  def acquire(self) -> bool:
    """Tries to create the next generation of the claim.

    Returns:
      True if this claimer now holds the claim (it is then refreshed every ttl/3 seconds);
      False, with `current` set, if a live claim of another holder stands.
    """
    for _ in range(3):  # a generation won by another may be released at once; look again
      current = current_claim(self.root, self.version, self.store)
      now = time.time()
      if claim_is_live(current, now):
        self.current = current
        return False
      generation = 0 if current is None else current["generation"] + 1
      record = dict(version=self.version, generation=generation, holder=self.holder,
                    host=socket.gethostname(), pid=os.getpid(), claimer=self.claimer,
                    claimed_at=now, expires_at=now + self.ttl_seconds)
      if current is not None:
        record["after"] = dict(generation=current["generation"],
                               why=superseded_because(current, now),
                               holder=describe_claim(current))
      if self.store.create_if_absent(claim_path(self.root, self.version, generation),
                                     json_bytes(record)):
        self.generation, self.record = generation, record
        if current is not None and record["after"]["why"] != "released":
          logging.warning("Took over the claim on version %d of %s from %s (%s)",
                          self.version, self.root, record["after"]["holder"],
                          record["after"]["why"])
        self._keep_alive = KeepAlive(self.ttl_seconds / 3, self.refresh,
                                      f"claim-{self.version}").start()
        return True
    self.current = current_claim(self.root, self.version, self.store)
    return False

  def refresh(self) -> bool:
    """Extends the claim by ttl_seconds (the keep-alive thread calls this).

    Returns:
      True if extended; False if released, never held, or superseded by a higher
      generation (`taken_over` is then set).
    """
    with self._lock:
      if self.record is None or "released_at" in self.record:
        return False
      current = current_claim(self.root, self.version, self.store)
      if current is not None and current["generation"] > self.generation:
        self.taken_over = current
        logging.warning("The claim on version %d of %s was taken over by %s: this holder "
                        "was presumed dead (refresh it more often than ttl_seconds=%.0f)",
                        self.version, self.root, describe_claim(current), self.ttl_seconds)
        return False
      self.record = dict(self.record, expires_at=time.time() + self.ttl_seconds)
      write_json_atomic(self.path, self.record, self.store)
      return True

  def release(self, **outcome) -> None:
    """Stops refreshing and marks the claim released; the next claimer may then claim.

    Nothing is written if the claim was never held, is released already, or was taken
    over.

    Args:
      **outcome: JSON-serialisable fields recorded in the released claim (e.g. the
        committed path, or the error).
    """
    if self._keep_alive is not None:
      self._keep_alive.stop()
      self._keep_alive = None
    with self._lock:
      if self.record is None or "released_at" in self.record or self.taken_over:
        return
      self.record = dict(self.record, released_at=time.time(), **outcome)
      write_json_atomic(self.path, self.record, self.store)
