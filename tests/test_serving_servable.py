"""serving.servable: what releasing a retired version gives back to the OS; XLA-compiled
signatures with and without --xla_cpu_compilation_enabled, as tensorflow_model_server
runs them."""
import sys

import grpc
import numpy as np
import pytest

from serving.server import parse_flags
from serving.servable import (XLA_DISABLED_MESSAGE, serve_meta_graph, release_free_memory,
                              resident_bytes, xla_compiled_signatures)
from tests import serving_models
from tests.serving_harness import (AVAILABLE, model_status, outputs_of, prediction_stub,
                                   predict_request, rpc_error, running, server_config)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_trim")
def test_memory_freed_after_a_retirement_goes_back_to_the_os():
  """What release() adds to dropping the model: freed heap pages leave the process.

  Interleaved small blocks (below glibc's mmap threshold) with every 16th kept pin the
  heap, so freeing the rest does not lower RSS until the pages are trimmed.
  """
  chunks = [bytearray(96 * 1024) for _ in range(2000)]
  for chunk in chunks:
    chunk[::4096] = b"x" * len(chunk[::4096])  # touch every page: resident
  kept = chunks[::16]
  del chunks
  before = resident_bytes()
  freed = release_free_memory()
  assert freed > 60 * 2**20, (before, freed)
  assert resident_bytes() < before - 60 * 2**20
  del kept


@pytest.fixture(scope="module")
def xla_model(tmp_path_factory):
  return serving_models.save_xla_compiled(str(tmp_path_factory.mktemp("xla") / "model"))


def test_signatures_reaching_an_xla_compiled_function_are_found(xla_model, tmp_path):
  """Through the signature's call, a tf.cond branch and the jit_compile'd call; the
  signature without XLA is not named, nor is any of a model without it."""
  assert xla_compiled_signatures(serve_meta_graph(xla_model)) == {"serving_default"}
  numeric = serving_models.save_numeric(str(tmp_path / "numeric"))
  assert xla_compiled_signatures(serve_meta_graph(numeric)) == set()


def test_xla_compiled_signature_without_the_flag_fails_as_in_the_binary(xla_model, tmp_path):
  """Without --xla_cpu_compilation_enabled (the binary's default) the version loads, its
  XLA-compiled signature answers INTERNAL 'XLA compilation disabled' and its other
  signature answers; a version whose warm-up reaches the XLA-compiled signature fails to
  load, as the binary's warm-up fails; with the flag, both signatures answer."""
  assert not parse_flags(["s", "--model_base_path=/m"]).xla_cpu_compilation_enabled
  assert parse_flags(["s", "--model_base_path=/m",
                      "--xla_cpu_compilation_enabled=true"]).xla_cpu_compilation_enabled
  base = str(tmp_path / "m")
  serving_models.publish(xla_model, base, 1)
  x = np.array([1.0, 2.5], np.float32)
  with running(server_config(m=base)) as (server, channel):
    stub = prediction_stub(channel)
    error = rpc_error(stub.Predict, predict_request("m", x=x))
    assert error.code() == grpc.StatusCode.INTERNAL
    assert XLA_DISABLED_MESSAGE in error.details()
    plain = outputs_of(stub.Predict(predict_request("m", "plain", x=x), timeout=60))
    np.testing.assert_allclose(plain["y"], 2 * x + 1)
  with running(server_config(m=base), xla_cpu_compilation_enabled=True) as (server, channel):
    out = outputs_of(prediction_stub(channel).Predict(predict_request("m", x=x), timeout=60))
    np.testing.assert_allclose(out["y"], 2 * x + 1)
  warmed = str(tmp_path / "warmed")
  version = serving_models.publish(xla_model, warmed, 1)
  serving_models.write_raw_warmup(version, {"x": x})
  with running(server_config(w=warmed)) as (server, channel):
    state, message = model_status(channel, "w")[1]
    assert state != AVAILABLE and XLA_DISABLED_MESSAGE in message, (state, message)
  with running(server_config(w=warmed), xla_cpu_compilation_enabled=True) as (server,
                                                                               channel):
    assert model_status(channel, "w") == {1: (AVAILABLE, "")}
