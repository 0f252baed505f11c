"""serving.warmup: a version's warm-up requests are replayed before it serves."""
import os

import numpy as np
import pytest

from realm_tf.export.serving_warmup import write_warmup_requests
from tests import serving_models
from tests.serving_harness import (
    RPC_TIMEOUT, numeric_request, outputs_of, prediction_stub, running, server_config)



def test_warmup_requests_are_replayed_before_a_version_serves(built, tmp_path):
  version_dir = serving_models.publish(built["numeric"], str(tmp_path / "numeric"), 1)
  requests = [{"x": np.ones([n, 3], np.float32)} for n in (1, 2, 3)]
  path = write_warmup_requests(version_dir, requests, model_name="numeric")
  assert path == os.path.join(version_dir, "assets.extra", "tf_serving_warmup_requests")
  with pytest.raises(ValueError, match="'wrong'"):
    write_warmup_requests(version_dir, [{"wrong": np.ones([1, 3], np.float32)}], "numeric")
  with pytest.raises(ValueError, match="float64"):
    write_warmup_requests(version_dir, [{"x": np.ones([1, 3])}], "numeric")
  with running(server_config(numeric=str(tmp_path / "numeric"))) as (_, channel):
    response = prediction_stub(channel).Predict(numeric_request([[1, 2, 3]]), timeout=RPC_TIMEOUT)
    assert outputs_of(response)["calls"].tolist() == [4]  # 3 warm-up calls came first
