"""Experiment configs: YAML files, command-line overrides, errors that name key and file."""
import pytest
from official.core import exp_factory

from realm_tf import tasks
from realm_tf.configs import EXPERIMENTS, ConfigError, load_config, parse_overrides
from realm_tf.configs.experiment import TASK_TYPES


PAPER = ("realm_paper/bert_base.yaml",)
PAPER_STAGES = {"realm/ict": "realm_paper/ict.yaml", "realm/pretrain": "realm_paper/pretrain.yaml",
                "realm/openqa": "realm_paper/openqa.yaml"}


def _paper(repo_dir, experiment):
  files = [str(repo_dir / "configs" / f) for f in PAPER + (PAPER_STAGES[experiment],)]
  return load_config(files, experiment=experiment)


def test_paper_configs_have_the_paper_settings_per_stage(repo_dir):
  c = _paper(repo_dir, "realm/pretrain")
  m = c.model
  assert c.task.type == "pretrain"
  assert (m.encoder.hidden_size, m.encoder.num_layers, m.encoder.num_attention_heads) == (
      768, 12, 12)
  assert m.retriever.block_seq_length == 288
  assert m.retriever.query_seq_length == 96
  assert m.retriever.projection_size == 128
  assert c.task.pretrain.num_candidates == 8 and c.task.pretrain.include_null_document
  assert c.trainer.learning_rate == pytest.approx(3e-5)
  assert c.task.pretrain.train_data.global_batch_size == 512
  assert c.trainer.train_steps == 200_000
  assert c.task.pretrain.refresh_every_steps == 500
  assert c.runtime.distribution_strategy == "tpu"
  assert m.warm_start.source == "google_bert"
  ict = _paper(repo_dir, "realm/ict")
  assert ict.task.type == "ict" and ict.task.ict.train_data.global_batch_size == 4096
  assert ict.trainer.learning_rate == pytest.approx(1e-4)  # its own schedule, not REALM's
  assert ict.trainer.train_steps == 100_000
  openqa = _paper(repo_dir, "realm/openqa")
  assert openqa.task.type == "openqa" and openqa.task.openqa.num_candidates == 5
  assert openqa.trainer.learning_rate == pytest.approx(1e-5)
  assert openqa.model.encoder.num_layers == 12


def test_every_stage_is_a_registered_experiment():
  configs = {name: exp_factory.get_exp_config(name) for name in EXPERIMENTS}
  assert {n: c.task.type for n, c in configs.items()} == {
      "realm/ict": "ict", "realm/mlm_warmup": "pretrain", "realm/pretrain": "pretrain",
      "realm/openqa": "openqa"}
  warmup = configs["realm/mlm_warmup"].task.pretrain
  assert not warmup.retrieval and warmup.trainable == "mlm_head"
  assert len({c.trainer.learning_rate for c in configs.values()}) > 1


def test_every_registered_task_has_its_settings_field():
  """A task type is a TaskSelection field and a registered RealmTask, the two one-to-one;
  a type without settings is refused when it is registered."""
  assert {t: tasks.task_class(t).__name__ for t in TASK_TYPES} == dict(
      ict="IctTask", pretrain="PretrainTask", openqa="OpenQATask")
  with pytest.raises(ValueError, match="add a field qa2 to TaskSelection"):
    tasks.register("qa2", tasks.OpenQATask)


def test_files_and_overrides_apply_over_the_experiment(repo_dir):
  c = load_config(str(repo_dir / "configs" / "tiny.yaml"), ["trainer.train_steps=7"],
                  experiment="realm/ict")
  assert c.task.type == "ict" and c.trainer.train_steps == 7
  assert c.model.encoder.num_layers == 2  # from tiny.yaml


def test_a_config_naming_another_stage_is_refused(repo_dir, tmp_path):
  path = tmp_path / "stage.yaml"
  path.write_text("task:\n  type: pretrain\n")
  with pytest.raises(ConfigError, match=r"stage.yaml: task.type=pretrain, but --experiment "
                     r"realm/ict trains task.type=ict"):
    load_config(str(path), experiment="realm/ict")
  with pytest.raises(ConfigError, match="command-line override: task.type=openqa"):
    load_config(None, ["task.type=openqa"], experiment="realm/pretrain")
  with pytest.raises(ConfigError, match="unknown experiment 'realm/bert'; registered: "
                     "realm/ict"):
    load_config(None, experiment="realm/bert")


@pytest.mark.parametrize("name", ["tiny", "demo"])
def test_every_shipped_config_loads(repo_dir, name):
  c = load_config(str(repo_dir / "configs" / f"{name}.yaml"))
  m = c.model
  assert m.encoder.hidden_size % m.encoder.num_attention_heads == 0
  assert m.reader.seq_length <= m.encoder.max_position_embeddings


def test_demo_config_is_minilm(repo_dir):
  from realm_tf.pretrained import minilm  # pylint: disable=g-import-not-at-top
  c = load_config(str(repo_dir / "configs" / "demo.yaml"))
  assert c.model.warm_start.source == "minilm"
  for key, value in minilm.ARCHITECTURE.items():
    assert getattr(c.model.encoder, key) == value, key


def test_command_line_overrides_win(repo_dir):
  c = load_config(str(repo_dir / "configs" / "tiny.yaml"),
                  ["task.pretrain.train_data.global_batch_size=2,model.encoder.num_layers=1",
                   "trainer.learning_rate=3e-5"])
  assert c.task.pretrain.train_data.global_batch_size == 2 and c.model.encoder.num_layers == 1
  assert c.trainer.learning_rate == pytest.approx(3e-5)


def test_unknown_key_in_file_names_key_and_file(tmp_path):
  path = tmp_path / "bad.yaml"
  path.write_text("model:\n  encoder:\n    hidden_size: 8\n    num_layer: 2\n")
  with pytest.raises(ConfigError) as err:
    load_config(str(path))
  assert str(path) in str(err.value)
  assert "'model.encoder.num_layer'" in str(err.value)


def test_wrong_type_names_key_and_file(tmp_path):
  path = tmp_path / "bad.yaml"
  path.write_text("trainer:\n  train_steps: lots\n")
  with pytest.raises(ConfigError, match=r"bad\.yaml: key 'trainer\.train_steps' expects int"):
    load_config(str(path))


def test_bad_override_names_the_flag():
  with pytest.raises(ConfigError, match="command-line override: unknown key 'trainer.steps'"):
    load_config(overrides=["trainer.steps=3"])
  with pytest.raises(ConfigError, match="expected key=value"):
    load_config(overrides=["trainer.train_steps"])


def test_missing_file_and_bad_yaml(tmp_path):
  with pytest.raises(ConfigError, match="not found"):
    load_config(str(tmp_path / "nope.yaml"))
  broken = tmp_path / "broken.yaml"
  broken.write_text("model: [unclosed\n")
  with pytest.raises(ConfigError, match="broken.yaml: not valid YAML"):
    load_config(str(broken))


def test_parse_overrides_types_and_nesting():
  tree = parse_overrides(["a.b=1,a.c=x", "d=true", "e=1e-4"])
  assert tree == {"a": {"b": 1, "c": "x"}, "d": True, "e": 1e-4}


def test_tf_models_optimizer_config_is_used_as_written(repo_dir):
  from realm_tf.modeling.optimization import build_optimizer  # pylint: disable=g-import-not-at-top
  c = load_config(str(repo_dir / "configs" / "tiny.yaml"), [
      "trainer.optimizer_config.optimizer.type=sgd",
      "trainer.optimizer_config.learning_rate.type=constant",
      "trainer.optimizer_config.learning_rate.constant.learning_rate=0.25"],
      experiment="realm/ict")
  optimizer = build_optimizer(c.trainer)
  assert "SGD" in type(optimizer).__name__
  assert float(optimizer.learning_rate.numpy()) == pytest.approx(0.25)
  shorthand = build_optimizer(load_config(str(repo_dir / "configs" / "tiny.yaml")).trainer)
  assert "AdamWeightDecay" in type(shorthand).__name__


def test_an_optimizer_config_without_an_optimizer_type_is_refused(repo_dir):
  with pytest.raises(ValueError, match="trainer.optimizer_config needs optimizer.type"):
    load_config(str(repo_dir / "configs" / "tiny.yaml"),
                ["trainer.optimizer_config.learning_rate.type=constant"])


def test_params_yaml_survives_concurrent_writers(repo_dir, tmp_path):
  """Every worker of a multi-worker job saves params.yaml (a shared temporary name made
  one worker's rename find nothing)."""
  import threading  # pylint: disable=g-import-not-at-top
  from realm_tf.training.train_lib import save_params  # pylint: disable=g-import-not-at-top
  config = load_config(str(repo_dir / "configs" / "tiny.yaml"))
  errors = []

  def worker():
    try:
      for _ in range(40):
        save_params(config, str(tmp_path))
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  threads = [threading.Thread(target=worker) for _ in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors, errors[:2]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]
  assert load_config(str(tmp_path / "params.yaml")).as_dict() == config.as_dict()
