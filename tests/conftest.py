"""Shared test set-up.

Two logical CPU devices are configured before TensorFlow initialises anything, so tests can
exercise the multi-replica path (MirroredStrategy) on a one-CPU machine.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pathlib  # noqa: E402

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)

REPO = pathlib.Path(__file__).resolve().parents[1]


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "fault: kills (SIGKILL/SIGTERM) or corrupts processes and files on purpose; "
      "each is bounded by subprocess timeouts. Run them alone with `pytest -m fault`.")
  config.addinivalue_line(
      "markers", "fuzz: hypothesis property tests of every reader of untrusted input "
      "(`pytest -m fuzz`).")
  config.addinivalue_line(
      "markers", "demo: the `make demo` pipeline end to end on the tiny config, every stage "
      "as its own process (`pytest -m demo`; part of the whole suite too).")
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def repo_dir() -> pathlib.Path:
  return REPO


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
  """The real data beside the repo (../shared/data); never copied into the repo."""
  if not SHARED_DATA.is_dir():
    pytest.fail(f"{SHARED_DATA} is missing: the shared data must sit beside the repo")
  return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_config():
  from realm_tf.configs import load_config
  return load_config(str(REPO / "configs" / "tiny.yaml"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """The invented corpus (tests/synthetic_corpus.py) in the corpus pipeline's layout, one
  copy per test module (a module may damage its files)."""
  from tests.synthetic_corpus import write_corpus
  path = str(tmp_path_factory.mktemp("corpus"))
  write_corpus(path)
  return path


@pytest.fixture(scope="session")
def tokenizer():
  from realm_tf.text import Tokenizer
  return Tokenizer()


@pytest.fixture(scope="session")
def mirrored_strategy():
  """One MirroredStrategy over the 2 logical CPUs for the whole session.

  Separate strategy objects in one process hand out the same collective instance keys,
  so a second one's all-reduce can collide with the first one's all-gather; a real
  training process creates one strategy, and so do the tests.
  """
  devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
  return tf.distribute.MirroredStrategy(devices)
