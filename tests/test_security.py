"""Security properties of the code base and the server.

  no pickle      no artifact is deserialized with pickle (or marshal, shelve, dill, joblib,
                 yaml.load): an AST scan of realm_tf/, serving/ and beam/; np.load always
                 with allow_pickle=False
  paths          model base paths from config files and from HandleReloadConfigRequest stay
                 inside the allowed roots ('..', absolute paths, symlinks, URLs); files a
                 version links to outside its base path are refused; file names read from
                 a manifest cannot leave their version (readers and copy_version)
  limits         the server binds to 127.0.0.1 unless told otherwise, and message size,
                 concurrency, request time and batch size are capped (none can be switched
                 off); the limits themselves are exercised in tests/test_serving_server.py
                 (address, message size), test_serving_limits.py (concurrency, request
                 time) and test_serving_tensors.py (batch size, decoded size)
"""
import ast
import json
import os
import pathlib

import grpc
import numpy as np
import pytest
from google.protobuf import text_format
from tensorflow_serving.apis import get_model_status_pb2
from tensorflow_serving.apis import model_management_pb2
from tensorflow_serving.apis import model_service_pb2_grpc
from tensorflow_serving.config import model_server_config_pb2

from realm_tf.io import versioned
from serving import config as config_lib
from serving import paths
from serving.server import ModelServer, ServerOptions, parse_flags
from tests import serving_models

SCANNED = ("realm_tf", "serving", "beam")
# Modules whose loaders run code from the bytes they read.
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "shelve", "marshal",
                  "joblib", "jsonpickle"}
UNSAFE_CALLS = {("yaml", "load"), ("yaml", "unsafe_load"), ("yaml", "full_load"),
                ("pd", "read_pickle"), ("pandas", "read_pickle"), ("torch", "load")}
NUMPY = {"np", "numpy"}


def unsafe_deserialization(source: str, filename: str = "<source>") -> list:
  """Every place in `source` that could read an artifact with pickle; [] if none."""
  found = []
  for node in ast.walk(ast.parse(source, filename)):
    where = f"{filename}:{getattr(node, 'lineno', 0)}"
    if isinstance(node, ast.Import):
      found += [f"{where}: import {a.name}" for a in node.names
                if a.name.split(".")[0] in UNSAFE_MODULES]
    elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UNSAFE_MODULES:
      found.append(f"{where}: from {node.module} import ...")
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
      owner = node.func.value.id if isinstance(node.func.value, ast.Name) else ""
      keywords = {k.arg: k.value for k in node.keywords}
      if (owner, node.func.attr) in UNSAFE_CALLS:
        found.append(f"{where}: {owner}.{node.func.attr}(...)")
      elif owner in NUMPY and node.func.attr == "load":
        flag = keywords.get("allow_pickle")
        if not (isinstance(flag, ast.Constant) and flag.value is False):
          found.append(f"{where}: {owner}.load(...) without allow_pickle=False")
    if isinstance(node, ast.keyword) and node.arg == "allow_pickle" and not (
        isinstance(node.value, ast.Constant) and node.value.value is False):
      found.append(f"{where}: allow_pickle={ast.unparse(node.value)}")
  return found


def test_the_scan_finds_each_unsafe_pattern():
  """The checker itself, on snippets: it must be able to fail."""
  for snippet in ("import pickle", "from cloudpickle import loads", "import joblib.numpy_pickle",
                  "np.load(path)", "numpy.load(f, allow_pickle=True)",
                  "np.save(f, x, allow_pickle=True)", "yaml.load(text)",
                  "x = np.load(f, allow_pickle=flag)"):
    assert unsafe_deserialization(snippet), snippet
  for snippet in ("np.load(f, allow_pickle=False)", "yaml.safe_load(text)",
                  "json.loads(text)", "import numpy as np"):
    assert not unsafe_deserialization(snippet), snippet


def test_no_artifact_is_read_with_pickle(repo_dir):
  found = []
  for package in SCANNED:
    for path in sorted(pathlib.Path(repo_dir, package).rglob("*.py")):
      found += unsafe_deserialization(path.read_text(), str(path.relative_to(repo_dir)))
  assert found == []


# ------------------------------------------------------------------------------ paths


@pytest.fixture
def roots(tmp_path):
  """An allowed root with a model in it, and a model outside it reachable by symlink."""
  root = tmp_path / "models"
  outside = tmp_path / "outside"
  (root / "inside").mkdir(parents=True)
  (outside / "secret").mkdir(parents=True)
  os.symlink(str(outside / "secret"), str(root / "escape"))  # a link inside the root
  os.symlink(str(root / "inside"), str(root / "alias"))  # a link that stays inside
  return root, outside


def test_base_paths_cannot_leave_the_allowed_root(roots):
  root, outside = roots
  allowed = [paths.resolve_root(str(root))]
  assert paths.resolve_base_path(str(root / "inside"), allowed, "x") == str(root / "inside")
  assert paths.resolve_base_path(str(root / "alias"), allowed, "x") == str(root / "inside")
  refused = {
      str(root / ".." / "outside" / "secret"): "contains '..'",
      "../outside/secret": "contains '..'",
      str(root / "inside" / ".." / ".." / "outside"): "contains '..'",
      str(outside / "secret"): "outside the allowed model roots",  # absolute, elsewhere
      "/etc": "outside the allowed model roots",
      str(root / "escape"): "outside the allowed model roots",  # symlink resolved
      str(root) + "-sibling/m": "outside the allowed model roots",  # prefix is not inside
      "gs://other-bucket/models/m": "outside the allowed model roots",
      "": "base_path is empty",
  }
  for base_path, message in refused.items():
    with pytest.raises(ValueError, match=message):
      paths.resolve_base_path(base_path, allowed, "models.config")
  url_root = [paths.resolve_root("gs://bucket/models")]
  assert paths.resolve_base_path("gs://bucket/models/m", url_root, "x") == "gs://bucket/models/m"
  for bad in ("gs://bucket/models-evil/m", "gs://bucket/models/../m"):
    with pytest.raises(ValueError):
      paths.resolve_base_path(bad, url_root, "x")
  with pytest.raises(ValueError, match="contains '..'"):
    paths.resolve_root(str(root / ".." / "x"))


def _config(**models) -> model_server_config_pb2.ModelServerConfig:
  config = model_server_config_pb2.ModelServerConfig()
  for name, base_path in models.items():
    text_format.Parse(f'name: "{name}" base_path: "{base_path}" model_platform: "tensorflow"',
                      config.model_config_list.config.add())
  return config


def test_config_file_and_reload_requests_are_confined_to_the_model_root(roots, tmp_path):
  root, outside = roots
  built = serving_models.save_numeric(str(tmp_path / "built"))
  serving_models.publish(built, str(root / "inside"), 1)
  serving_models.publish(built, str(outside / "secret"), 1)
  config_file = tmp_path / "models.config"
  config_file.write_text(text_format.MessageToString(_config(m=str(root / "escape"))))
  with pytest.raises(config_lib.ConfigError, match=f"{config_file}.*outside the allowed"):
    ModelServer(ServerOptions(model_config_file=str(config_file), model_root=str(root),
                              port=0)).start()
  options = ServerOptions(model_server_config=_config(numeric=str(root / "inside")),
                          model_root=str(root), port=0, file_system_poll_wait_seconds=0)
  with ModelServer(options) as server, grpc.insecure_channel(
      f"127.0.0.1:{server.port}") as channel:
    stub = model_service_pb2_grpc.ModelServiceStub(channel)
    for base_path in (str(root / "escape"), str(outside / "secret"),
                      str(root / "inside" / ".." / ".." / "outside" / "secret")):
      with pytest.raises(grpc.RpcError) as error:
        stub.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(
            config=_config(numeric=str(root / "inside"), evil=base_path)), timeout=10)
      assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, base_path
    assert server.manager.model_names() == ["numeric"]
    stub.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(
        config=_config(numeric=str(root / "inside"), alias=str(root / "alias"))), timeout=10)
    assert server.manager.model_names() == ["alias", "numeric"]


def test_a_version_linking_files_outside_its_base_path_is_refused(tmp_path):
  base = tmp_path / "models" / "numeric"
  built = serving_models.save_numeric(str(tmp_path / "built"))
  serving_models.publish(built, str(base), 1)
  version = serving_models.publish(built, str(tmp_path / "staging"), 2)
  secret = tmp_path / "secret.data"
  secret.write_bytes(b"not for the server")
  os.symlink(str(secret), os.path.join(version, "assets.extra_secret"))
  os.rename(version, str(base / "2"))
  options = ServerOptions(model_name="numeric", model_base_path=str(base), port=0,
                          file_system_poll_wait_seconds=0)
  with ModelServer(options) as server, grpc.insecure_channel(
      f"127.0.0.1:{server.port}") as channel:
    response = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
        get_model_status_pb2.GetModelStatusRequest(model_spec=dict(name="numeric")),
        timeout=10)
    status = {s.version: s for s in response.model_version_status}
    assert status[1].state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
    assert status[2].state == get_model_status_pb2.ModelVersionStatus.END
    assert "is a symlink to" in status[2].status.error_message
    assert "outside the base path" in status[2].status.error_message
    assert server.manager.acquire("numeric").version == 1


@pytest.mark.parametrize("name", ["../escaped.bin", "/etc/passwd", "a/../../b", "gs://x/y",
                                  "a//b", "./a"])
def test_manifest_file_names_cannot_leave_the_version(tmp_path, name):
  root = str(tmp_path / "root")
  with versioned.VersionWriter(root, 1) as writer:
    with open(os.path.join(writer.path, "data.bin"), "wb") as f:
      f.write(b"payload")
    version = writer.commit({})
  manifest = dict(version.manifest, files=[dict(name=name, size=7, crc32c="0")])
  with open(versioned.manifest_path(root, 1), "w") as f:
    json.dump(manifest, f)
  version = versioned.read_version(versioned.manifest_path(root, 1))
  dest = tmp_path / "dest" / "inner"
  for call in (lambda: versioned.verify_version(version, checksums=True),
               lambda: versioned.read_verified(version, name),
               lambda: versioned.copy_version(version, str(dest))):
    with pytest.raises(versioned.VerificationError, match="outside its directory"):
      call()
  assert not (tmp_path / "dest").exists()  # copy_version wrote nothing anywhere


# ------------------------------------------------------------------------------ limits


def test_server_defaults_bind_localhost_and_cap_every_resource():
  for options in (ServerOptions(), parse_flags(["serving.server", "--model_base_path=/m/x"])):
    assert options.host == "127.0.0.1"
    assert options.max_message_bytes == 16 << 20
    assert options.max_concurrent_requests == 64
    assert options.request_timeout_seconds == 30.0
    assert options.max_batch_size == 256
    assert options.rest_api_timeout_in_ms == 30_000
  for name, value in (("max_message_bytes", 0), ("max_concurrent_requests", 0),
                      ("request_timeout_seconds", 0), ("max_batch_size", -1),
                      ("grpc_max_threads", 0), ("rest_api_num_threads", 0)):
    with pytest.raises(config_lib.ConfigError, match=name):
      ServerOptions(**{name: value})


def test_np_load_in_the_index_reader_refuses_pickled_arrays(tmp_path):
  """The index reader's own np.load: an object array (which needs pickle) is refused."""
  from realm_tf.retrieval import index_export  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / "objects.npy")
  np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
  with pytest.raises(ValueError, match="allow_pickle=False"):
    index_export.load_npy(path)
