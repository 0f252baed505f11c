"""Which versions of which models serve: polling, loading, warm-up, retirement.

Each model's base path is polled (every --file_system_poll_wait_seconds, on a background
thread, never on a request's). The version policy picks the versions to serve among those
on disk. The aspired-version policy (TF Serving's AspiredVersionPolicy) orders a hand-over:

  availability_preserving (TF Serving's default, and the only one tensorflow_model_server
    offers): the new version is loaded and warmed up while the old one keeps serving, so
    requests never stop, and resident memory peaks at both versions at once.
  resource_preserving: the old version is retired (its running requests finish) before the
    new one loads, so memory peaks at one version, and the model answers NOT_FOUND from
    the old one's retirement until the new one is AVAILABLE (its load and warm-up time).

With availability_preserving the new version becomes AVAILABLE and only then is the old
one retired: new requests stop reaching it at once,
requests already running on it finish, and it is END (and dropped) after the last one.
A version that fails to load or warm up is END with its error and is left out of the
policy until its saved_model file changes, so it never displaces a serving version. A
version exported by realm_tf carries its manifest (assets.extra/realm_manifest.json, every
file with size and CRC32C): its files are checked against it before TensorFlow reads them,
so a truncated or corrupted copy is refused by file name (DATA_LOSS) instead of loading
damaged weights. Versions from other tools have none and load as TF Serving loads them.

States follow TF Serving's ModelVersionStatus: START → LOADING → AVAILABLE → UNLOADING →
END (END with an error status when loading failed).
"""
import dataclasses
import logging
import os
import threading
from typing import Callable, Optional

import grpc

from realm_tf.io import versioned
from serving import errors
from serving import metrics as metrics_lib
from serving import paths
from serving import warmup
from serving.config import ModelSpecConfig
from serving.servable import ServableVersion, State

log = logging.getLogger(__name__)

ASPIRED_VERSION_POLICIES = ("availability_preserving", "resource_preserving")


@dataclasses.dataclass
class VersionStatus:
  version: int
  state: State
  error: Optional[errors.ServingError]


@dataclasses.dataclass
class _Model:
  spec: ModelSpecConfig
  available: dict = dataclasses.field(default_factory=dict)  # version → ServableVersion
  records: dict = dataclasses.field(default_factory=dict)  # version → latest ServableVersion
  failed: dict = dataclasses.field(default_factory=dict)  # version → stamp that failed
  reported_empty: bool = False  # "no versions" is logged once, not at every poll


def _check_files(version_path: str) -> None:
  """The version's files against the manifest its exporter shipped with it, if any."""
  try:
    versioned.verify_copy(version_path, manifest_dir=os.path.dirname(warmup.WARMUP_FILE))
  except versioned.VersionError as e:
    raise errors.ServingError(grpc.StatusCode.DATA_LOSS,
                              f"refused, the files do not match the manifest: {e}") from None


class ModelManager:
  """Serves the models of a config; thread-safe."""

  def __init__(self, max_batch_size: int, max_decoded_bytes: int,
               on_change: Optional[Callable[[str, bool], None]] = None,
               aspired_version_policy: str = "availability_preserving",
               metrics: Optional[metrics_lib.ServingMetrics] = None,
               xla_cpu_compilation_enabled: bool = False):
    if aspired_version_policy not in ASPIRED_VERSION_POLICIES:
      raise ValueError(f"aspired_version_policy must be one of {ASPIRED_VERSION_POLICIES}, "
                       f"got {aspired_version_policy!r}")
    self._resource_preserving = aspired_version_policy == "resource_preserving"
    self._max_batch_size = max_batch_size
    # tensorflow_model_server's --xla_cpu_compilation_enabled (servable.Signature).
    self._xla_cpu_compilation_enabled = xla_cpu_compilation_enabled
    self._max_decoded_bytes = max_decoded_bytes
    self._on_change = on_change or (lambda name, serving: None)
    self.metrics = metrics or metrics_lib.ServingMetrics(self.serves)
    self._lock = threading.Lock()  # guards _models and every _Model's maps
    self._poll_lock = threading.Lock()  # one loading pass at a time
    self._models = {}
    self._stop = threading.Event()
    self._thread = None
    self._retirements = []

  # ------------------------------------------------------------------ configuration

  def set_config(self, specs) -> None:
    """Adopts a new list of ModelSpecConfigs and loads what it asks for before returning."""
    with self._poll_lock:
      with self._lock:
        wanted = {spec.name: spec for spec in specs}
        removed = [self._models.pop(name) for name in list(self._models) if name not in wanted]
        for name, spec in wanted.items():
          model = self._models.get(name)
          if model is None:
            self._models[name] = _Model(spec)
          elif model.spec != spec:
            if model.spec.base_path != spec.base_path:
              model.failed.clear()
            model.spec = spec
      for model in removed:
        for servable in list(model.available.values()):
          self._retire(model, servable)
        self._on_change(model.spec.name, False)
      self._poll_all()

  def serves(self, name: str) -> bool:
    """Whether `name` is a model of the current config (available or not)."""
    with self._lock:
      return name in self._models

  def model_names(self) -> list:
    with self._lock:
      return sorted(self._models)

  # ------------------------------------------------------------------ polling

  def poll(self) -> None:
    """One pass over every model's base path."""
    with self._poll_lock:
      self._poll_all()

  def start_polling(self, interval_seconds: float) -> None:
    if interval_seconds <= 0 or self._thread is not None:
      return  # TF Serving: a poll wait of 0 loads once, at start

    def loop():
      while not self._stop.wait(interval_seconds):
        try:
          self.poll()
        except Exception:  # pylint: disable=broad-except
          log.exception("model poll failed; retrying in %.1f s", interval_seconds)

    self._thread = threading.Thread(target=loop, name="model-poller", daemon=True)
    self._thread.start()

  def stop(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
      self._thread = None

  def _poll_all(self) -> None:
    with self._lock:
      models = list(self._models.values())
    for model in models:
      try:
        self._poll_model(model)
      except Exception:  # pylint: disable=broad-except
        log.exception("model %r: polling %s failed", model.spec.name, model.spec.base_path)

  def _poll_model(self, model: _Model) -> None:
    spec = model.spec
    listing = paths.list_versions(spec.base_path)
    if not listing.versions and not model.available:
      if not model.reported_empty:
        log.warning("model %r: no version directory with a saved model under %s",
                    spec.name, spec.base_path)
      model.reported_empty = True
    else:
      model.reported_empty = False
    for version, reason in listing.refused.items():
      record = model.records.get(version)
      if record is None or record.error is None or record.error.message != reason:
        self._record_failure(model, version, f"{spec.base_path}/{version}",
                             errors.failed_precondition(reason))

    def servable_candidates():
      return {v for v, d in listing.versions.items() if model.failed.get(v) != d.stamp}

    # A version that fails leaves the candidates, so the policy may then pick an older one
    # (a broken newest version at start must not leave the model with nothing to serve
    # until the next poll). Each version is tried at most once per poll.
    attempted = set()
    while True:
      desired = spec.policy.select(servable_candidates())
      missing = sorted(desired - set(model.available) - attempted, reverse=True)
      if not missing:
        break
      if self._resource_preserving:
        # Unload first: only one version's memory is resident at any time.
        with self._lock:
          unwanted = [servable for v, servable in model.available.items() if v not in desired]
        for servable in unwanted:
          self._retire(model, servable, wait=True)
      for version in missing:
        attempted.add(version)
        self._load(model, listing.versions[version])

    with self._lock:
      if self._models.get(spec.name) is not model:
        return  # removed by a reload meanwhile
      replacement_ready = any(v in model.available for v in desired)
      retiring = [servable for v, servable in model.available.items()
                  if v not in desired and (replacement_ready or v not in listing.versions)]
      for version in [v for v, r in model.records.items()
                      if r.state == State.END and v not in listing.versions
                      and v not in listing.refused]:
        del model.records[version]  # forget versions that are gone from disk
    for servable in retiring:
      self._retire(model, servable)

  # ------------------------------------------------------------------ lifecycle

  def _record_failure(self, model: _Model, version: int, path: str,
                      error: errors.ServingError) -> None:
    servable = ServableVersion(model.spec.name, version, path)
    servable.error = error
    servable.release()
    with self._lock:
      model.records.setdefault(version, servable)
      if model.records[version].state == State.END:
        model.records[version] = servable
    log.error("model %r version %d cannot be served: %s", model.spec.name, version, error)

  def _load(self, model: _Model, version_dir: paths.VersionDir) -> None:
    name, version = model.spec.name, version_dir.version
    servable = ServableVersion(name, version, version_dir.path,
                               self._xla_cpu_compilation_enabled)
    servable.state = State.LOADING
    with self._lock:
      model.records[version] = servable
    log.info("model %r: loading version %d from %s", name, version, version_dir.path)
    try:
      with self.metrics.saved_model_load(version_dir.path):
        paths.check_tree_inside(version_dir.path, model.spec.base_path)
        _check_files(version_dir.path)
        servable.load()
      with self.metrics.warmup(version_dir.path):
        replayed = warmup.replay(servable, self._max_batch_size, self._max_decoded_bytes)
    except Exception as e:  # pylint: disable=broad-except
      error = e if isinstance(e, errors.ServingError) else errors.ServingError(
          grpc.StatusCode.INVALID_ARGUMENT, f"{version_dir.path}: {type(e).__name__}: {e}")
      servable.error = error
      servable.release()
      model.failed[version] = version_dir.stamp
      log.error("model %r version %d failed to load; the serving versions stay: %s",
                name, version, error.message)
      return
    with self._lock:
      if self._models.get(name) is not model:
        servable.release()
        return
      servable.state = State.AVAILABLE
      model.available[version] = servable
    log.info("model %r version %d is AVAILABLE (%d warm-up requests replayed)",
             name, version, replayed)
    self._on_change(name, True)

  def _retire(self, model: _Model, servable: ServableVersion, wait: bool = False) -> None:
    """Stops new requests reaching `servable`; it is END once the running ones finish
    (wait: returns only then, its memory given back)."""
    with self._lock:
      if model.available.get(servable.version) is servable:
        del model.available[servable.version]
      servable.begin_unloading()
      still_serving = bool(model.available)
    log.info("model %r: retiring version %d (%d requests in flight)", servable.model_name,
             servable.version, servable.in_flight)

    def finish():
      servable.wait_idle()
      freed = servable.release()
      log.info("model %r version %d is END (%.0f MB of resident memory returned to the OS)",
               servable.model_name, servable.version, freed / 2**20)

    thread = threading.Thread(target=finish, daemon=True,
                              name=f"retire-{servable.model_name}-{servable.version}")
    thread.start()
    self._retirements = [t for t in self._retirements if t.is_alive()] + [thread]
    if not still_serving:
      self._on_change(servable.model_name, False)
    if wait:
      thread.join()

  def wait_for_retirements(self, timeout: Optional[float] = None) -> None:
    for thread in list(self._retirements):
      thread.join(timeout)

  # ------------------------------------------------------------------ requests

  def acquire(self, name: str, version: Optional[int] = None,
              label: Optional[str] = None) -> ServableVersion:
    """The servable a request asks for, entered (the caller must call `exit()` on it).

    No version or label: the latest (highest) AVAILABLE version, as in TF Serving.
    """
    if not name:
      raise errors.invalid_argument("model_spec.name is empty")
    with self._lock:
      model = self._models.get(name)
      if model is None:
        raise errors.not_found(f"model {name!r} is not served here")
      if label:
        labels = dict(model.spec.version_labels)
        if label not in labels:
          raise errors.not_found(f"model {name!r} has no version label {label!r}")
        version = labels[label]
      if version is None:
        if not model.available:
          raise errors.not_found(f"model {name!r} has no available version")
        servable = model.available[max(model.available)]
      else:
        servable = model.available.get(version)
        if servable is None:
          raise errors.not_found(
              f"model {name!r} version {version} is not available "
              f"(available: {sorted(model.available)})")
      if not servable.try_enter():
        raise errors.not_found(f"model {name!r} version {servable.version} is unloading")
      return servable

  def status(self, name: str, version: Optional[int] = None) -> list:
    """VersionStatus of every version of `name` the manager knows (or of one)."""
    with self._lock:
      model = self._models.get(name)
      if model is None:
        raise errors.not_found(f"model {name!r} is not served here")
      records = dict(model.records)
    if version is not None:
      if version not in records:
        raise errors.not_found(f"model {name!r} has no version {version}")
      records = {version: records[version]}
    return [VersionStatus(v, records[v].state, records[v].error) for v in sorted(records)]

  def spec(self, name: str) -> ModelSpecConfig:
    with self._lock:
      if name not in self._models:
        raise errors.not_found(f"model {name!r} is not served here")
      return self._models[name].spec
