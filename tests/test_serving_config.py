"""serving.config: model and batching config files in tensorflow_model_server's formats,
and errors that name the file."""
import pytest
from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from serving import config as config_lib


def test_config_files_are_parsed_with_the_official_formats_and_errors_name_them(tmp_path):
  config_file = tmp_path / "models.config"
  config_file.write_text('model_config_list { config { name: "a" base_path: "/m/a" '
                         'model_platform: "tensorflow" model_version_policy { all {} } } }')
  config = config_lib.read_model_server_config(str(config_file))
  (spec,) = config_lib.validate_model_server_config(config, "x", [])
  assert (spec.name, spec.base_path, spec.policy.kind) == ("a", "/m/a", "all")

  config_file.write_text("model_config_list { config { nam: 'a' } }")
  with pytest.raises(config_lib.ConfigError, match=str(config_file)):
    config_lib.read_model_server_config(str(config_file))
  batching = tmp_path / "batching.config"
  batching.write_text("max_batch_size { value: 4 } allowed_batch_sizes: 2 "
                      "allowed_batch_sizes: 4 num_batch_threads { value: 2 }")
  options = config_lib.read_batching_parameters(str(batching))
  assert (options.max_batch_size, options.allowed_batch_sizes, options.num_batch_threads,
          options.max_enqueued_batches) == (4, (2, 4), 2, 10)
  for text, message in (("max_batch_size: 4", "not a BatchingParameters"),
                        ("pad_variable_length_inputs: true", "pad_variable_length_inputs"),
                        ("max_batch_size { value: 4 } allowed_batch_sizes: 2", "must equal")):
    batching.write_text(text)
    with pytest.raises(config_lib.ConfigError, match=message) as info:
      config_lib.read_batching_parameters(str(batching))
    assert str(batching) in str(info.value)
  for extra, message in (('model_platform: "pytorch"', "model_platform"),
                         ('model_version_policy { specific {} }', "lists no versions"),
                         ('base_path: "/m/../etc"', "'..'")):
    config = text_format.Parse(
        f'model_config_list {{ config {{ name: "a" {extra} }} }}',
        model_server_config_pb2.ModelServerConfig())
    if "base_path" not in extra:
      config.model_config_list.config[0].base_path = "/m/a"
    with pytest.raises(config_lib.ConfigError, match=message):
      config_lib.validate_model_server_config(config, "models.config", [])
