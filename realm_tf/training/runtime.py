"""The distribution strategy: which one, handed what, run where.

`plan_runtime` makes the whole decision as a pure function of the command line's `--tpu`,
the config's runtime section, the environment and the GPU count, so that it can be tested
for every documented command line without a TPU or a cluster; `make_strategy` hands
the result to tf-models' `distribute_utils.get_distribution_strategy`, which builds the
strategy (and, for TPUs, the `TPUClusterResolver`). The cases, following Google's way of
running TensorFlow 2 on Cloud TPU VMs (docs/tpu.md links the pages and the code this
follows):

- A single-host TPU VM (one VM, e.g. v3-8 or v4-8; TPU software `tpu-vm-tf-X.Y.Z-pjrt`):
  `--tpu=local` gives TPUStrategy over `TPUClusterResolver(tpu="local")`, the chips attached
  to this VM; there is no cluster to connect to (tf-models skips
  `experimental_connect_to_cluster` for "local"). One process, which writes.
- A TPU pod slice (several hosts; software `tpu-vm-tf-X.Y.Z-pod-pjrt`): every host runs the
  TPU runtime as a TensorFlow server, and ONE Python program, on worker 0, drives them all:
  `--tpu=$TPU_NAME` (the TPU's name) gives `TPUClusterResolver(tpu=name)`, which finds the
  hosts through the Cloud TPU API, and tf-models connects to them. That program must not
  load libtpu itself (`TPU_LOAD_LIBRARY=0`: the chips belong to the hosts' servers). Being
  the only process, it is the one that writes; a copy started on another host (say by
  `gcloud ... ssh --worker=all`) is refused with the command to use instead.
- `TF_CONFIG` naming a cluster: MultiWorkerMirroredStrategy; every task runs the program
  and the chief (worker 0 when the cluster has no chief, as TensorFlow decides) writes.
- GPUs: MirroredStrategy over them; none: the default strategy. `runtime.distribution_strategy`
  names one outright; `tpu` there needs a TPU address (`--tpu`, `runtime.tpu`, or the
  `TPU_NAME` environment variable, as Google's own TF-on-TPU tests run tf-models).

A lost or stalled peer, multi-worker: realm_tf.training.peer_failures and
realm_tf.training.watchdog (docs/scale_out.md says what the operator sees).
"""
import dataclasses
import json
import logging
import os
import urllib.request
from typing import Mapping, Optional, Sequence

import tensorflow as tf
from official.common import distribute_utils
# Internal modules, for what TensorFlow 2.20 offers no public API: the coordination
# service's heartbeat timeout (MultiWorkerMirroredStrategy configures the service itself
# unless it is configured first) and a peer's health check.
from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
from tensorflow.python.eager import context

from realm_tf.configs.experiment import STRATEGIES, ExperimentConfig, RuntimeConfig

# Where the program runs (`RuntimePlan.launch`).
ONE_PROCESS = "one process on this machine"
TPU_SLICE_WORKER_0 = "one process on worker 0 of the TPU slice, driving every host"
EVERY_TF_CONFIG_TASK = "every task named in TF_CONFIG"

# The Cloud TPU VM metadata entry that numbers the hosts of a slice (0 on a single host); JAX
# reads the same entry to find its process index on a TPU VM.
_WORKER_NUMBER_PATH = "computeMetadata/v1/instance/attributes/agent-worker-number"


class RuntimePlanError(ValueError):
  """A command line, config and environment that cannot run; the message names the fix."""


@dataclasses.dataclass(frozen=True)
class RuntimePlan:
  """What `make_strategy` builds, with what, and where the program runs: decided before
  TensorFlow touches a device, so each documented command line has a testable answer.

  strategy: a tf-models `distribution_strategy` name. tpu_address: the `tpu` argument of
  `TPUClusterResolver` ("local", or a TPU's name), None off TPU. launch: where the program is
  meant to run (ONE_PROCESS, TPU_SLICE_WORKER_0, EVERY_TF_CONFIG_TASK); which of the
  processes writes host-side files is realm_tf.io.roles.HostRole's answer, from the strategy.
  num_gpus: what tf-models is told (0 for the default strategy, which takes no device list).
  """
  strategy: str
  tpu_address: Optional[str] = None
  launch: str = ONE_PROCESS
  num_gpus: int = 0


def _tf_config(env: Mapping[str, str]) -> dict:
  try:
    return json.loads(env.get("TF_CONFIG") or "{}")
  except json.JSONDecodeError as e:
    raise RuntimePlanError(f"TF_CONFIG is not JSON: {e}") from e


def plan_runtime(runtime: RuntimeConfig, tpu: str = "",
                 env: Optional[Mapping[str, str]] = None, num_gpus: int = 0) -> RuntimePlan:
  """The strategy for `--tpu=tpu`, the config's `runtime` section, the environment `env`
  (default os.environ) and `num_gpus` visible GPUs; see the module docstring. Raises
  RuntimePlanError, naming the fix, for a combination that cannot work (no TPU address for
  `distribution_strategy: tpu`, `--tpu` against another named strategy, `TPU_LOAD_LIBRARY`
  set the wrong way for the kind of TPU)."""
  env = os.environ if env is None else env
  configured = runtime.distribution_strategy or ""
  if configured not in STRATEGIES:
    raise RuntimePlanError(f"runtime.distribution_strategy must be one of {STRATEGIES}, "
                     f"got {configured!r}")
  address = tpu or runtime.tpu or ""
  if not address and configured == "tpu":
    address = env.get("TPU_NAME", "")
  if address:
    return _tpu_plan(address, configured, env)
  if configured == "tpu":
    raise RuntimePlanError(
        "runtime.distribution_strategy is 'tpu' but no TPU is named: give --tpu=local on a "
        "single-host TPU VM, or --tpu=$TPU_NAME (the TPU's name) on worker 0 of a pod slice")
  if configured:
    name = configured
  elif _tf_config(env).get("cluster"):
    name = "multi_worker_mirrored"
  else:
    name = "mirrored" if num_gpus else "off"
  if name == "multi_worker_mirrored":
    return RuntimePlan(name, None, EVERY_TF_CONFIG_TASK, num_gpus)
  return RuntimePlan(name, None, ONE_PROCESS, 0 if name == "off" else num_gpus)


def _tpu_plan(address: str, configured: str, env: Mapping[str, str]) -> RuntimePlan:
  if configured not in ("", "tpu"):
    raise RuntimePlanError(f"--tpu={address} (runtime.tpu) asks for TPUStrategy but "
                     f"runtime.distribution_strategy is {configured!r}: drop one of them")
  load_library = env.get("TPU_LOAD_LIBRARY")
  if address == "local":
    if load_library == "0":
      raise RuntimePlanError(
          "TPU_LOAD_LIBRARY=0 stops this process from loading libtpu, which --tpu=local "
          "needs: it is for pod slices only; unset it on a single-host TPU VM")
    return RuntimePlan("tpu", "local", ONE_PROCESS)
  # A TPU's name: a slice whose hosts run the TPU runtime; this program only drives them.
  # (A grpc:// address, an older setup not documented here, is passed through unchecked.)
  if not address.startswith("grpc://") and load_library != "0":
    raise RuntimePlanError(
        f"--tpu={address} names a TPU slice whose hosts run the TPU runtime: this process "
        "must not load libtpu itself. Set TPU_LOAD_LIBRARY=0 before starting python "
        "(or use --tpu=local on a single-host TPU VM)")
  return RuntimePlan("tpu", address, TPU_SLICE_WORKER_0)


def tpu_vm_worker_number(timeout: float = 2.0) -> Optional[int]:
  """This host's worker number in its TPU slice, from the TPU VM's metadata server; None
  where there is none (not a TPU VM, or unreachable)."""
  host = os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")
  request = urllib.request.Request(f"http://{host}/{_WORKER_NUMBER_PATH}",
                                   headers={"Metadata-Flavor": "Google"})
  try:
    with urllib.request.urlopen(request, timeout=timeout) as response:
      return int(response.read().decode().strip())
  except (OSError, ValueError):
    return None


def check_tpu_worker(plan: RuntimePlan, worker_number: Optional[int]) -> None:
  """Refuses a pod-slice run on any host but worker 0: the program there drives every host,
  and a second copy (e.g. from `ssh --worker=all`) would initialise the same TPUs again."""
  if plan.launch == TPU_SLICE_WORKER_0 and worker_number not in (None, 0):
    raise RuntimePlanError(
        f"this is worker {worker_number} of TPU slice {plan.tpu_address}; on a pod slice the "
        "training program runs on worker 0 only (it drives every host): start it with "
        "`gcloud compute tpus tpu-vm ssh $TPU_NAME --zone=$ZONE --worker=0`, not --worker=all")


def visible_gpus() -> int:
  return len(tf.config.list_physical_devices("GPU"))


def make_strategy(config: ExperimentConfig, tpu: str = "",
                  env: Optional[Mapping[str, str]] = None) -> tf.distribute.Strategy:
  """The strategy `plan_runtime` chooses, built by tf-models (which, for a TPU, creates the
  `TPUClusterResolver`, connects to a slice's hosts and initialises the TPU system)."""
  plan = plan_runtime(config.runtime, tpu, env, num_gpus=visible_gpus())
  if plan.launch == TPU_SLICE_WORKER_0:
    check_tpu_worker(plan, tpu_vm_worker_number())
  logging.info("Runtime: %s", plan)
  if plan.strategy == "multi_worker_mirrored":
    # Built here, not by tf-models, which passes no CommunicationOptions (no timeout).
    strategy = multi_worker_strategy(config.runtime)
  else:
    strategy = distribute_utils.get_distribution_strategy(
        distribution_strategy=plan.strategy, num_gpus=plan.num_gpus,
        tpu_address=plan.tpu_address)
  strategy = strategy or tf.distribute.get_strategy()
  logging.info("Strategy %s with %d replicas", type(strategy).__name__,
               strategy.num_replicas_in_sync)
  return strategy


# ------------------------------------------------------------------------ multi-worker peers


def communication_options(runtime: RuntimeConfig
                          ) -> tf.distribute.experimental.CommunicationOptions:
  """Every collective of the strategy gives up after runtime.collective_timeout_seconds."""
  return tf.distribute.experimental.CommunicationOptions(
      timeout_seconds=float(runtime.collective_timeout_seconds))


def coordination_service_settings(cluster: Mapping[str, Sequence[str]],
                                  heartbeat_timeout_seconds: float) -> Optional[dict]:
  """The arguments of `configure_coordination_service` for a multi-worker cluster ({job:
  [address, ...]}), as MultiWorkerMirroredStrategy would set them, with the heartbeat
  timeout; None for TensorFlow's own settings (heartbeat_timeout_seconds 0)."""
  if not heartbeat_timeout_seconds:
    return None
  jobs = [job for job in ("chief", "worker") if cluster.get(job)]
  return dict(
      service_type="standalone",
      # The chief if there is one, else worker 0: MultiWorkerMirroredStrategy's leader.
      service_leader=f"/job:{jobs[0]}/replica:0/task:0",
      heartbeat_timeout_in_ms=int(heartbeat_timeout_seconds * 1000),
      coordinated_jobs=[coordination_config_pb2.CoordinatedJob(name=job,
                                                               num_tasks=len(cluster[job]))
                        for job in jobs])


def multi_worker_strategy(runtime: RuntimeConfig) -> tf.distribute.MultiWorkerMirroredStrategy:
  """MultiWorkerMirroredStrategy from TF_CONFIG, its collectives bounded by
  runtime.collective_timeout_seconds and, when runtime.heartbeat_timeout_seconds is set, the
  coordination service's heartbeats too."""
  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  settings = coordination_service_settings(resolver.cluster_spec().as_dict(),
                                           runtime.heartbeat_timeout_seconds)
  if settings is not None:
    context.context().configure_coordination_service(**settings)
  logging.info("Multi-worker collectives time out after %.0fs; heartbeats after %s",
               runtime.collective_timeout_seconds,
               f"{runtime.heartbeat_timeout_seconds:.0f}s" if settings else
               "TensorFlow's default")
  return tf.distribute.MultiWorkerMirroredStrategy(
      cluster_resolver=resolver, communication_options=communication_options(runtime))
