"""The strategy each documented command line gets: strategy name, what TPUClusterResolver is
handed, where the program runs and whether this process writes.

The two TPU command lines are read out of README's "TPU VM: one host and pod slices"
section (the shell variables exported on the TPU VM expanded as the shell would), so README
and the code cannot drift apart. No TPU is needed: for the TPU cases tf-models' real
`get_distribution_strategy` runs with `TPUClusterResolver`, `experimental_connect_to_cluster`
and `initialize_tpu_system` replaced by recorders, and stops before building a strategy.
"""
import dataclasses
import json
import re
import shlex

import pytest
import tensorflow as tf

from realm_tf.configs import load_config
from realm_tf.training import runtime

SECTION = "### TPU VM: one host and pod slices"


@dataclasses.dataclass
class CommandLine:
  """One documented `python -m realm_tf.train` invocation and the shell it runs in."""
  argv: list
  env: dict          # the variables exported on the machine that runs the program
  ssh: str = ""      # the `gcloud ... ssh` line that gets there, if any

  def flag(self, name, default=""):
    values = self.flags(name)
    return values[-1] if values else default

  def flags(self, name):
    return [a.split("=", 1)[1] for a in self.argv if a.startswith(f"--{name}=")]

  def config(self, repo_dir):
    """The config train.py builds from these flags (its --tpu becomes runtime.tpu)."""
    overrides = self.flags("override")
    if self.flag("tpu"):
      overrides.append(f"runtime.tpu={self.flag('tpu')}")
    return load_config([str(repo_dir / c) for c in self.flags("config")], overrides,
                       experiment=self.flag("experiment"))


def _flags_joined(argv):
  """`--flag value` → `--flag=value`, so every flag reads the same way."""
  out, i = [], 0
  while i < len(argv):
    a = argv[i]
    if a.startswith("--") and "=" not in a and i + 1 < len(argv):
      out.append(f"{a}={argv[i + 1]}")
      i += 2
    else:
      out.append(a)
      i += 1
  return out


def _readme_tpu_commands(repo_dir) -> dict:
  """{"one host": CommandLine, "pod slice": CommandLine} from README's TPU section."""
  readme = (repo_dir / "README.md").read_text()
  section = readme[readme.index(SECTION) + len(SECTION):]
  section = section[:re.search(r"^#{2,3} ", section, re.M).start()]
  commands = {}
  for intro, block in re.findall(r"^(.*?)\n\n```sh\n(.*?)```", section, re.M | re.S):
    lines = block.replace("\\\n", " ").splitlines()
    train = [i for i, line in enumerate(lines) if "python -m realm_tf.train" in line]
    if not train:
      continue
    ssh = [line for line in lines[:train[0]] if " tpu-vm ssh " in line]
    start = lines.index(ssh[-1]) + 1 if ssh else 0
    env = {}
    for line in lines[start:train[0]]:
      if line.startswith("export "):
        env.update(a.split("=", 1) for a in shlex.split(line)[1:])
    command = re.sub(r"\$(\w+)", lambda m: env.get(m.group(1), ""), lines[train[0]])
    argv = _flags_joined(shlex.split(command)[3:])
    key = "pod slice" if "pod slice" in intro.strip().splitlines()[-1].lower() else "one host"
    commands[key] = CommandLine(argv, env, ssh[-1] if ssh else "")
  return commands


@pytest.fixture(scope="module")
def readme_commands(repo_dir):
  commands = _readme_tpu_commands(repo_dir)
  assert set(commands) == {"one host", "pod slice"}, commands
  return commands


class _Stop(Exception):
  """Raised where a real TPU system would be initialised."""


@pytest.fixture
def tpu_calls(monkeypatch):
  """Records what tf-models hands the TPU machinery; no resolver ever connects."""
  calls = {}

  class Resolver:
    def __init__(self, tpu=None, **kwargs):
      calls["resolver_tpu"] = tpu
      calls["resolver_kwargs"] = kwargs

  def connect(resolver):
    calls["connected"] = True

  def initialize(resolver):
    calls.setdefault("connected", False)
    raise _Stop()

  monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", Resolver)
  monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", connect)
  monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", initialize)
  return calls


@pytest.fixture
def built(monkeypatch):
  """make_strategy with tf-models' factory recorded instead of building a strategy."""
  calls = {}

  class Strategy:
    num_replicas_in_sync = 1

  def factory(**kwargs):
    calls.update(kwargs)
    return Strategy()

  monkeypatch.setattr(runtime.distribute_utils, "get_distribution_strategy", factory)
  return calls


def test_readme_one_host_tpu_vm_gets_the_local_resolver(repo_dir, readme_commands,
                                                          tpu_calls, monkeypatch):
  cmd = readme_commands["one host"]
  assert "--worker" not in cmd.ssh  # a single VM: nothing to choose
  config = cmd.config(repo_dir)
  plan = runtime.plan_runtime(config.runtime, cmd.flag("tpu"), cmd.env)
  assert plan == runtime.RuntimePlan("tpu", "local", runtime.ONE_PROCESS, 0)
  worker_lookups = []
  monkeypatch.setattr(runtime, "tpu_vm_worker_number", lambda: worker_lookups.append(1))
  with pytest.raises(_Stop):
    runtime.make_strategy(config, cmd.flag("tpu"), cmd.env)
  assert tpu_calls == {"resolver_tpu": "local", "resolver_kwargs": {}, "connected": False}
  assert not worker_lookups  # one host: no slice to check
  assert cmd.env["NEXT_PLUGGABLE_DEVICE_USE_C_API"] == "true"  # PJRT, as Google's TF tests
  assert "TPU_LOAD_LIBRARY" not in cmd.env


def test_readme_pod_slice_runs_on_worker_0_with_the_tpu_name(repo_dir, readme_commands,
                                                            tpu_calls, monkeypatch):
  cmd = readme_commands["pod slice"]
  assert cmd.ssh.split()[-1] == "--worker=0"
  assert cmd.env["TPU_LOAD_LIBRARY"] == "0"
  name = cmd.env["TPU_NAME"]
  assert name and cmd.flag("tpu") == name
  config = cmd.config(repo_dir)
  plan = runtime.plan_runtime(config.runtime, cmd.flag("tpu"), cmd.env)
  assert plan == runtime.RuntimePlan("tpu", name, runtime.TPU_SLICE_WORKER_0, 0)
  monkeypatch.setattr(runtime, "tpu_vm_worker_number", lambda: 0)
  with pytest.raises(_Stop):
    runtime.make_strategy(config, cmd.flag("tpu"), cmd.env)
  # tf-models resolves the slice by name and connects to its hosts' TF servers.
  assert tpu_calls == {"resolver_tpu": name, "resolver_kwargs": {}, "connected": True}


def test_readme_pod_command_on_another_worker_stops_before_touching_the_tpu(
    repo_dir, readme_commands, tpu_calls, monkeypatch):
  cmd = readme_commands["pod slice"]
  monkeypatch.setattr(runtime, "tpu_vm_worker_number", lambda: 2)
  with pytest.raises(runtime.RuntimePlanError,
                     match=r"worker 2 .* worker 0 only.*--worker=0"):
    runtime.make_strategy(cmd.config(repo_dir), cmd.flag("tpu"), cmd.env)
  assert tpu_calls == {}
  # Off a TPU VM (no metadata server) the check has nothing to say.
  plan = runtime.plan_runtime(cmd.config(repo_dir).runtime, cmd.flag("tpu"), cmd.env)
  runtime.check_tpu_worker(plan, None)


def test_tpu_environment_mistakes_are_named(repo_dir, readme_commands):
  pod, host = readme_commands["pod slice"], readme_commands["one host"]
  pod_runtime = pod.config(repo_dir).runtime
  with pytest.raises(runtime.RuntimePlanError, match="TPU_LOAD_LIBRARY=0"):
    runtime.plan_runtime(pod_runtime, pod.flag("tpu"),
                         {k: v for k, v in pod.env.items() if k != "TPU_LOAD_LIBRARY"})
  with pytest.raises(runtime.RuntimePlanError, match="unset it on a single-host TPU VM"):
    runtime.plan_runtime(host.config(repo_dir).runtime, "local",
                         dict(host.env, TPU_LOAD_LIBRARY="0"))
  # bert_base.yaml names the tpu strategy: without any TPU named, the two commands to use.
  paper = load_config([str(repo_dir / c) for c in host.flags("config")],
                      experiment="realm/pretrain").runtime
  assert paper.distribution_strategy == "tpu"
  with pytest.raises(runtime.RuntimePlanError, match=r"--tpu=local .* --tpu=\$TPU_NAME"):
    runtime.plan_runtime(paper, "", {})
  # TPU_NAME alone (how Google's tests run tf-models) names it.
  assert runtime.plan_runtime(paper, "", {"TPU_NAME": "local"}).tpu_address == "local"
  assert runtime.plan_runtime(paper, "", {"TPU_NAME": "s", "TPU_LOAD_LIBRARY": "0"}) == (
      runtime.RuntimePlan("tpu", "s", runtime.TPU_SLICE_WORKER_0, 0))
  tiny = load_config(str(repo_dir / "configs" / "tiny.yaml"),
                     ["runtime.distribution_strategy=mirrored"], experiment="realm/ict")
  with pytest.raises(runtime.RuntimePlanError, match="drop one of them"):
    runtime.plan_runtime(tiny.runtime, "local", {})


def _tf_config(task_type, index, chief=False):
  cluster = {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}
  if chief:
    cluster["chief"] = ["10.0.0.9:2222"]
  return {"TF_CONFIG": json.dumps({"cluster": cluster,
                                   "task": {"type": task_type, "index": index}})}


# `TF_CONFIG=... python -m realm_tf.train --experiment realm/ict --config configs/demo.yaml
# --model_dir gs://...` on each GPU machine of a cluster.
@pytest.mark.parametrize("task,chief", [
    (("worker", 0), False), (("worker", 1), False), (("chief", 0), True), (("worker", 0), True)])
def test_multi_worker_gpus_from_tf_config(repo_dir, built, monkeypatch, task, chief):
  """Every TF_CONFIG task runs the program; which one writes is HostRole's answer from the
  strategy (TF's should_checkpoint), proven with real processes in test_multi_worker.py."""
  env = _tf_config(*task, chief=chief)
  config = load_config(str(repo_dir / "configs" / "demo.yaml"), experiment="realm/ict")
  plan = runtime.plan_runtime(config.runtime, "", env, num_gpus=4)
  assert plan == runtime.RuntimePlan("multi_worker_mirrored", None,
                                     runtime.EVERY_TF_CONFIG_TASK, 4)
  monkeypatch.setattr(runtime, "visible_gpus", lambda: 4)
  made = []

  class Strategy:
    num_replicas_in_sync = 8

  monkeypatch.setattr(runtime, "multi_worker_strategy",
                      lambda settings: made.append(settings) or Strategy())
  runtime.make_strategy(config, "", env)
  # Built by realm_tf, with the runtime section's timeouts, not by tf-models' factory.
  assert made == [config.runtime] and built == {}


# `python -m realm_tf.train --experiment realm/ict --config configs/demo.yaml --model_dir ...`
# on one machine, with and without GPUs.
@pytest.mark.parametrize("gpus,strategy", [(2, "mirrored"), (1, "mirrored"), (0, "off")])
def test_one_machine_gpus_or_cpu(repo_dir, built, monkeypatch, gpus, strategy):
  config = load_config(str(repo_dir / "configs" / "demo.yaml"), experiment="realm/ict")
  assert runtime.plan_runtime(config.runtime, "", {}, num_gpus=gpus) == runtime.RuntimePlan(
      strategy, None, runtime.ONE_PROCESS, gpus)
  monkeypatch.setattr(runtime, "visible_gpus", lambda: gpus)
  runtime.make_strategy(config, "", {})
  assert built == {"distribution_strategy": strategy, "num_gpus": gpus, "tpu_address": None}


def test_the_default_strategy_runs_for_real_on_cpu(repo_dir, monkeypatch):
  monkeypatch.setattr(runtime, "visible_gpus", lambda: 0)
  config = load_config(str(repo_dir / "configs" / "tiny.yaml"), experiment="realm/ict")
  strategy = runtime.make_strategy(config, "", {})
  assert strategy is tf.distribute.get_strategy()


def test_worker_number_is_none_off_a_tpu_vm(monkeypatch):
  monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")  # nothing listens on discard
  assert runtime.tpu_vm_worker_number(timeout=0.5) is None


def test_one_process_strategies_are_their_own_chief(mirrored_strategy):
  """HostRole (realm_tf.io.roles) for the strategies of one process: chief, and the
  agreements are plain returns (no collective: nothing else would join it)."""
  from realm_tf.io.roles import HostRole  # noqa: PLC0415
  for strategy in (tf.distribute.get_strategy(), mirrored_strategy):
    role = HostRole(strategy)
    assert role.is_chief and role.num_processes == 1 and not role.multi_process
    assert role.chief_value(7) == 7 and role.any_process(True) and not role.any_process(False)
    assert role.describe() == "the only process"


# ------------------------------------------------------------------- a lost multi-worker peer


def test_collective_and_heartbeat_timeouts_come_from_the_config(repo_dir):
  config = load_config(str(repo_dir / "configs" / "tiny.yaml"), experiment="realm/ict")
  assert runtime.communication_options(config.runtime).timeout_seconds == 1800
  assert runtime.coordination_service_settings({"worker": ["a:1", "b:1"]},
                                               config.runtime.heartbeat_timeout_seconds) is None
  config = load_config(str(repo_dir / "configs" / "tiny.yaml"), [
      "runtime.collective_timeout_seconds=30", "runtime.heartbeat_timeout_seconds=60"],
      experiment="realm/ict")
  assert runtime.communication_options(config.runtime).timeout_seconds == 30
  settings = runtime.coordination_service_settings(
      {"chief": ["c:1"], "worker": ["a:1", "b:1"]}, config.runtime.heartbeat_timeout_seconds)
  assert settings["heartbeat_timeout_in_ms"] == 60_000
  assert settings["service_leader"] == "/job:chief/replica:0/task:0"
  assert [(j.name, j.num_tasks) for j in settings["coordinated_jobs"]] == [
      ("chief", 1), ("worker", 2)]
  assert runtime.coordination_service_settings(
      {"worker": ["a:1", "b:1"]}, 60)["service_leader"] == "/job:worker/replica:0/task:0"


@pytest.mark.parametrize("key,value,message", [
    ("collective_timeout_seconds", "0", "must be positive"),
    ("collective_timeout_seconds", "-5", "must be positive"),
    ("heartbeat_timeout_seconds", "-1", "must be >= 0"),
    ("progress_stall_seconds", "0", "must be positive")])
def test_bad_timeouts_are_refused_by_name(repo_dir, key, value, message):
  with pytest.raises(ValueError, match=f"runtime.{key} {message}"):
    load_config(str(repo_dir / "configs" / "tiny.yaml"), [f"runtime.{key}={value}"],
                experiment="realm/ict")
