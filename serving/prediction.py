"""Predict, shared by the gRPC and REST front ends so both answer a request the same way.

  admit (concurrency slot) → pick the version (held until the computation ends) →
  decode + validate against the signature → run (batched or direct, off the RPC thread,
  so the deadline can be enforced) → filter outputs.
"""
import concurrent.futures
import dataclasses
from typing import Callable, Optional, Sequence

from serving import errors
from serving import tensors
from serving.batching import BatchScheduler
from serving.limits import ConcurrencyLimiter, Deadline
from serving.model_manager import ModelManager
from serving.servable import ServableVersion, Signature


@dataclasses.dataclass
class PredictResult:
  model_name: str
  version: int
  signature_name: str
  outputs: dict  # name → ndarray


class Predictor:
  """Runs Predict requests against the manager's models within the server's limits."""

  def __init__(self, manager: ModelManager, max_batch_size: int,
               request_timeout_seconds: float, max_concurrent_requests: int,
               batcher: Optional[BatchScheduler] = None):
    self.manager = manager
    self.max_batch_size = max_batch_size
    self.request_timeout_seconds = request_timeout_seconds
    self.batcher = batcher
    self._limiter = ConcurrencyLimiter(max_concurrent_requests)
    # Never queues: the limiter admits at most max_concurrent_requests computations.
    self._executor = concurrent.futures.ThreadPoolExecutor(
        max_workers=max_concurrent_requests, thread_name_prefix="predict")

  def stop(self) -> None:
    self._executor.shutdown(wait=True)

  def predict(self, model_name: str, version: Optional[int], version_label: Optional[str],
              signature_name: str,
              decode_inputs: Callable[[Signature], dict],
              output_filter: Sequence[str] = (),
              client_timeout: Optional[float] = None,
              client_timeout_source: str = "the client's deadline",
              on_reached: Optional[Callable[[int, str], None]] = None) -> PredictResult:
    """`decode_inputs(signature)` turns the request's payload into {name: ndarray};
    `on_reached(version, signature_name)` is told which version, then which signature, the
    request reached, before its inputs are checked (so a refused or failed request is
    accounted to them too)."""
    deadline = Deadline(self.request_timeout_seconds, client_timeout, client_timeout_source)
    self._limiter.acquire()
    handed_off = servable = None
    try:
      servable = self.manager.acquire(model_name, version, version_label)
      if on_reached is not None:
        on_reached(servable.version, "")  # the signature is named once it is known to exist
      signature = servable.signature(signature_name)
      if on_reached is not None:
        on_reached(servable.version, signature.name)
      inputs = decode_inputs(signature)
      batch_size = tensors.validate_inputs(
          signature.input_specs, inputs, self.max_batch_size,
          what=f"signature {signature.name!r} of model {model_name!r}")
      unknown = [name for name in output_filter if name not in signature.output_specs]
      if unknown:
        raise errors.invalid_argument(
            f"output_filter names {unknown[0]!r}, which is not an output of signature "
            f"{signature.name!r}; outputs are {sorted(signature.output_specs)}")
      if deadline.expired():
        raise deadline.error()
      future = self._submit(servable, signature, inputs, batch_size, deadline)
      handed_off = future
      future.add_done_callback(lambda _: self._finish(servable))
    finally:
      if handed_off is None:
        self._finish(servable)
    try:
      outputs = future.result(timeout=max(deadline.remaining(), 0.0))
    except concurrent.futures.TimeoutError:
      future.cancel()  # dropped if still queued; a running model finishes, then frees its slot
      raise deadline.error() from None
    except errors.ServingError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      raise errors.from_tf_error(e) from None
    if output_filter:
      outputs = {name: outputs[name] for name in output_filter}
    return PredictResult(model_name, servable.version, signature.name, outputs)

  def _submit(self, servable: ServableVersion, signature: Signature, inputs: dict,
              batch_size: int, deadline: Deadline) -> concurrent.futures.Future:
    if self.batcher is not None and signature.batchable:
      return self.batcher.submit(servable, signature, inputs, batch_size, deadline)
    return self._executor.submit(signature.run, inputs)

  def _finish(self, servable: Optional[ServableVersion]) -> None:
    if servable is not None:
      servable.exit()
    self._limiter.release()
