"""Admission control shared by the gRPC and REST front ends.

A slot is taken when a request arrives and given back when its computation ends, not when
its RPC returns: a request that timed out still holds its slot while the model finishes,
so deadlines cannot be used to pile up unbounded work. Past the limit a request is refused
at once (RESOURCE_EXHAUSTED) instead of queueing behind the others.
"""
import threading
import time
from typing import Optional

from serving import errors


class ConcurrencyLimiter:

  def __init__(self, limit: int):
    if limit < 1:
      raise ValueError(f"max_concurrent_requests must be >= 1, got {limit}")
    self.limit = limit
    self._slots = threading.BoundedSemaphore(limit)

  def acquire(self) -> None:
    if not self._slots.acquire(blocking=False):
      raise errors.resource_exhausted(
          f"too many concurrent requests: the server's limit is {self.limit} "
          f"(--max_concurrent_requests)")

  def release(self) -> None:
    self._slots.release()


class Deadline:
  """The earlier of the server's per-request timeout and the client's own deadline."""

  def __init__(self, server_timeout: float, client_remaining: Optional[float] = None,
               client_source: str = "the client's deadline"):
    self.timeout = server_timeout
    self.source = "the server's --request_timeout_seconds"
    if client_remaining is not None and client_remaining < server_timeout:
      self.timeout, self.source = max(client_remaining, 0.0), client_source
    self.expires = time.monotonic() + self.timeout

  def remaining(self) -> float:
    return self.expires - time.monotonic()

  def expired(self) -> bool:
    return self.remaining() <= 0

  def error(self) -> errors.ServingError:
    return errors.deadline_exceeded(
        f"the request exceeded {self.source} of {self.timeout:.3f} s")
