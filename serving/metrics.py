"""The server's Prometheus metrics and its access log: what every request, load and batch did.

Metrics are prometheus_client objects in one CollectorRegistry per server (never the
process-wide default, so several servers in one process, as in the tests, keep their own
counts). They are always counted; `--monitoring_config_file` only decides whether the REST
port serves them (serving.rest). Names are tensorflow_model_server's where it has one, so
its dashboards and alerts apply; units are its units (latencies in microseconds) and
buckets its buckets:

  :tensorflow:serving:request_count{model_name, status}                  counter
  :tensorflow:serving:request_latency{model_name, API, entrypoint}       histogram, µs, OK only
  :tensorflow:cc:saved_model:load_attempt_count{model_path, status}      counter (success|fail)
  :tensorflow:cc:saved_model:load_latency{model_path}                    counter, µs, successes
  :tensorflow:serving:model_warmup_latency{model_path, status}           histogram, µs
  :tensorflow:serving:batching_session:queuing_latency{thread_pool_name} histogram, µs
  :tensorflow:serving:batching_session:wrapped_run_count                 counter (batches run)
  :tensorflow:serving:batching_session:input_batch_size                  histogram (per request)
  :tensorflow:serving:batching_session:processed_batch_size              histogram (padded)
  :tensorflow:serving:batching_session:padding_size{execution_batch_size} histogram

and realm_tf's own, where tensorflow_model_server has none:

  realm_tf_serving_requests{model_name, version, signature_name, API, entrypoint, status}
  realm_tf_serving_batching_enqueued_batches                             gauge

Differences from tensorflow_model_server, each on purpose:
- prometheus_client writes a counter as `<name>_total` (the Prometheus and OpenMetrics
  rule), so `:tensorflow:serving:request_count` is scraped as
  `:tensorflow:serving:request_count_total`; a query written for tensorflow_model_server
  adds `_total`.
- Every model API is counted on both front ends (tensorflow_model_server's gRPC counts
  only the inference APIs; its REST counts every route): the API label says which.
- Label values a client chooses are bounded: a model this server does not serve is counted
  under model_name="" (else each made-up name would add a series, growing memory without
  limit), and version and signature_name are those a request reached, else "".

The access log is one INFO line per model API request on the "serving.access" logger (both
front ends call `ServingMetrics.request`, which logs and counts), so operators can route or
silence it apart from the server's own log.
"""
import contextlib
import dataclasses
import logging
import time
from typing import Callable, Optional

import prometheus_client
from prometheus_client import exposition

from serving import errors

access_log = logging.getLogger("serving.access")

GRPC = "GRPC"  # the entrypoint label values tensorflow_model_server uses
REST = "REST"
# An exception that is not a ServingError: gRPC answers it UNKNOWN, REST with a 500.
UNEXPECTED_STATUS = "UNKNOWN"


def _exponential(scale: float, growth: float, count: int) -> list:
  """tensorflow::monitoring::Buckets::Exponential's bounds (+Inf is added by the client)."""
  return [scale * growth**i for i in range(count)]


# tensorflow_model_server's buckets: request and warm-up latency "scale of 10, power of 1.8,
# 33 buckets (~20 minutes)"; queuing "scale of 100, power of 1.2, 52 buckets (~1 second)";
# batch and padding sizes 1, 2, 4, ... 2^13.
_LATENCY_BUCKETS = _exponential(10, 1.8, 33)
_QUEUING_BUCKETS = _exponential(100, 1.2, 52)
_BATCH_SIZE_BUCKETS = _exponential(1, 2, 14)


def _micros(seconds: float) -> float:
  return seconds * 1e6


@dataclasses.dataclass
class RequestCall:
  """One request as its front end learns it; `ServingMetrics.request` records it at the end.

  The front end fills what it knows: the API and model once routed, the version and
  signature once the request reached them (`served_by`); `requested_version` is what the
  client asked for ("3", "label stable", or ""), for the log line only.
  """
  entrypoint: str
  api: str = ""
  model_name: str = ""
  requested_version: str = ""
  version: Optional[int] = None
  signature_name: str = ""
  status: str = "OK"
  latency_seconds: float = 0.0

  def asked_for(self, api: str, model_name: str, version: Optional[int] = None,
                label: Optional[str] = None) -> None:
    """What the client asked for (version or label, at most one)."""
    self.api, self.model_name = api, model_name
    if version is not None:
      self.requested_version = str(version)
    elif label:
      self.requested_version = f"label {label}"

  def served_by(self, version: int, signature_name: str = "") -> None:
    """The version (and signature) the request reached."""
    self.version, self.signature_name = version, signature_name


class ServingMetrics:
  """One server's metrics registry, its request accounting and its access log."""

  def __init__(self, is_served: Callable[[str], bool] = lambda name: True,
               clock: Callable[[], float] = time.monotonic):
    """Args:
      is_served: whether a model name is one this server serves (bounds model_name labels).
      clock: seconds, monotonic; injectable so tests can control latencies.
    """
    self._is_served = is_served
    self._clock = clock
    self.registry = prometheus_client.CollectorRegistry(auto_describe=True)
    metric = dict(registry=self.registry)
    self.request_count = prometheus_client.Counter(
        ":tensorflow:serving:request_count", "The total number of requests.",
        ["model_name", "status"], **metric)
    self.request_latency = prometheus_client.Histogram(
        ":tensorflow:serving:request_latency",
        "Distribution of wall time (in microseconds) for Tensorflow Serving request.",
        ["model_name", "API", "entrypoint"], buckets=_LATENCY_BUCKETS, **metric)
    self.requests = prometheus_client.Counter(
        "realm_tf_serving_requests", "Requests by model, version, signature, API, "
        "entrypoint and status.",
        ["model_name", "version", "signature_name", "API", "entrypoint", "status"], **metric)
    self.load_attempt_count = prometheus_client.Counter(
        ":tensorflow:cc:saved_model:load_attempt_count",
        "The number of times a SavedModel was loaded, by success or fail.",
        ["model_path", "status"], **metric)
    self.load_latency = prometheus_client.Counter(
        ":tensorflow:cc:saved_model:load_latency",
        "Latency in microseconds for SavedModels that were successfully loaded.",
        ["model_path"], **metric)
    self.warmup_latency = prometheus_client.Histogram(
        ":tensorflow:serving:model_warmup_latency",
        "Distribution of wall time (in microseconds) for warming up the model.",
        ["model_path", "status"], buckets=_LATENCY_BUCKETS, **metric)
    self.queuing_latency = prometheus_client.Histogram(
        ":tensorflow:serving:batching_session:queuing_latency",
        "Distribution of wall time spent (in microseconds) in queuing",
        ["thread_pool_name"], buckets=_QUEUING_BUCKETS, **metric)
    self.wrapped_run_count = prometheus_client.Counter(
        ":tensorflow:serving:batching_session:wrapped_run_count",
        "Total count of run calls on the wrapped session", **metric)
    self.input_batch_size = prometheus_client.Histogram(
        ":tensorflow:serving:batching_session:input_batch_size",
        "Tracks the batch size distribution on the inputs.",
        buckets=_BATCH_SIZE_BUCKETS, **metric)
    self.processed_batch_size = prometheus_client.Histogram(
        ":tensorflow:serving:batching_session:processed_batch_size",
        "Tracks the batch size distribution on processing.",
        buckets=_BATCH_SIZE_BUCKETS, **metric)
    self.padding_size = prometheus_client.Histogram(
        ":tensorflow:serving:batching_session:padding_size",
        "Tracks the padding size distribution on batches.",
        ["execution_batch_size"], buckets=_BATCH_SIZE_BUCKETS, **metric)

  # ------------------------------------------------------------------ requests

  @contextlib.contextmanager
  def request(self, entrypoint: str):
    """Times one request and, when it ends, counts it and writes its access-log line.

    Args:
      entrypoint: GRPC or REST.
    Yields:
      The RequestCall the front end fills. A ServingError leaving the block sets the
      status to its code; any other exception to UNKNOWN; both are re-raised.
    """
    call = RequestCall(entrypoint)
    start = self._clock()
    try:
      yield call
    except errors.ServingError as e:
      call.status = e.code.name
      raise
    except BaseException:
      call.status = UNEXPECTED_STATUS
      raise
    finally:
      call.latency_seconds = self._clock() - start
      self.record(call)

  def record(self, call: RequestCall) -> None:
    """Counts one finished request and logs it (the one place both front ends reach)."""
    model = call.model_name if call.model_name and self._is_served(call.model_name) else ""
    self.request_count.labels(model, call.status).inc()
    version = "" if call.version is None else str(call.version)
    self.requests.labels(model, version, call.signature_name, call.api, call.entrypoint,
                         call.status).inc()
    if call.status == "OK":  # as tensorflow_model_server: the latency of answered requests
      self.request_latency.labels(model, call.api, call.entrypoint).observe(
          _micros(call.latency_seconds))
    access_log.info("%s %s model=%r version=%s requested_version=%r signature=%r status=%s "
                    "latency_ms=%.3f", call.entrypoint, call.api or "-", call.model_name,
                    version or "-", call.requested_version, call.signature_name,
                    call.status, call.latency_seconds * 1e3)

  # ------------------------------------------------------------------ model loads

  @contextlib.contextmanager
  def saved_model_load(self, model_path: str):
    """Counts one attempt to load the version at `model_path`, and its latency if it loads."""
    start = self._clock()
    try:
      yield
    except BaseException:
      self.load_attempt_count.labels(model_path, "fail").inc()
      raise
    self.load_attempt_count.labels(model_path, "success").inc()
    self.load_latency.labels(model_path).inc(_micros(self._clock() - start))

  @contextlib.contextmanager
  def warmup(self, model_path: str):
    """Times the warm-up replay of the version at `model_path`, by its outcome."""
    start = self._clock()
    status = "OK"
    try:
      yield
    except errors.ServingError as e:
      status = e.code.name
      raise
    except BaseException:
      status = UNEXPECTED_STATUS
      raise
    finally:
      self.warmup_latency.labels(model_path, status).observe(_micros(self._clock() - start))

  # ------------------------------------------------------------------ batching

  def batch_request_queued(self, size: int) -> None:
    """A request of `size` rows entered a batching queue."""
    self.input_batch_size.observe(size)

  def batch_run(self, thread_pool_name: str, queued_seconds: list, rows: int,
                padded_rows: int) -> None:
    """A batch of `rows` rows (padded to `padded_rows`) started running; `queued_seconds`
    is how long each of its requests waited in the queue."""
    for seconds in queued_seconds:
      self.queuing_latency.labels(thread_pool_name).observe(_micros(seconds))
    self.wrapped_run_count.inc()
    self.processed_batch_size.observe(padded_rows)
    self.padding_size.labels(str(padded_rows)).observe(padded_rows - rows)

  def watch_batching_queue(self, enqueued_batches: Callable[[], int]) -> None:
    """Exposes the batches waiting for a batch thread (read at each scrape)."""
    prometheus_client.Gauge(
        "realm_tf_serving_batching_enqueued_batches",
        "Batches waiting for a batch thread, over every queue.",
        registry=self.registry).set_function(enqueued_batches)

  def batches_run(self) -> int:
    """Batches run so far (the wrapped_run_count counter's value)."""
    return int(self.registry.get_sample_value(
        ":tensorflow:serving:batching_session:wrapped_run_count_total") or 0)

  # ------------------------------------------------------------------ exposition

  def exposition(self, accept_header: Optional[str]) -> tuple:
    """(body bytes, Content-Type) of a scrape, in the format the Accept header asks for
    (Prometheus text, or OpenMetrics when the scraper prefers it)."""
    encoder, content_type = exposition.choose_encoder(accept_header or "")
    return encoder(self.registry), content_type
