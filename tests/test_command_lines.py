"""User mistakes on every command line: one line naming the path, exit code 2, no
traceback (the traceback with --verbosity debug / absl's --verbosity 1)."""
import subprocess
import sys

import pytest

from realm_tf.io import command_line


CASES = {
    "realm_tf.train": ["--experiment", "realm/ict", "--config", "configs/tiny.yaml",
                       "--model_dir", "{tmp}/run",
                       "--override", "task.ict.train_data.input_path={tmp}/nothing-*"],
    "realm_tf.evaluate": ["--model_dir", "{tmp}/run", "--questions", "{tmp}/q.jsonl"],
    "realm_tf.export": ["--model_dir", "{tmp}/run", "--output_dir", "{tmp}/exports"],
    "beam.embed_corpus": ["--blocks", "{tmp}/corpus", "--encoder", "{tmp}/encoder",
                          "--output_dir", "{tmp}/index"],
    "beam.preprocess": ["--input", "{tmp}/wiki/*.xml", "--output_dir", "{tmp}/out"],
    "realm_tf.training.own_block_reader": ["--config", "configs/tiny.yaml", "--world_dir",
                                           "{tmp}/world", "--output_dir", "{tmp}/reader"],
}


def _run(repo_dir, module, args, tmp_path):
  return subprocess.run([sys.executable, "-m", module,
                         *[a.format(tmp=tmp_path) for a in args]],
                        cwd=repo_dir, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("module", sorted(CASES))
def test_a_path_that_names_nothing_is_one_line_and_exit_2(repo_dir, tmp_path, module):
  result = _run(repo_dir, module, CASES[module], tmp_path)
  assert result.returncode == command_line.USAGE_EXIT, result.stderr[-2000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(f"{module}: error: ") and str(tmp_path) in last, last
  assert "Traceback" not in result.stderr


@pytest.mark.parametrize("module", ["realm_tf.train", "realm_tf.evaluate", "realm_tf.export",
                                    "realm_tf.import_released"])
def test_help_answers_before_tensorflow_loads(repo_dir, module):
  """The absl command lines share command_line.run_absl; their module tops (and it) load
  no TensorFlow, so --help answers at once and train's watchdog parent stays without it."""
  result = subprocess.run([sys.executable, "-X", "importtime", "-m", module, "--help"],
                          cwd=repo_dir, capture_output=True, text=True, timeout=300)
  assert "Try --helpfull" in result.stdout + result.stderr, result.stderr[-2000:]
  imported = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()]
  assert not [name for name in imported if name.split(".")[0] == "tensorflow"]


def test_debug_verbosity_keeps_the_traceback(repo_dir, tmp_path):
  args = CASES["beam.preprocess"] + ["--verbosity", "debug"]
  result = _run(repo_dir, "beam.preprocess", args, tmp_path)
  assert result.returncode == 1 and "Traceback" in result.stderr
  assert "FileNotFoundError" in result.stderr


def test_errors_reported_classifies():
  assert command_line.is_usage_error(FileNotFoundError("x"))
  assert command_line.is_usage_error(command_line.UsageError("x"))
  from realm_tf.configs import ConfigError  # noqa: PLC0415
  assert command_line.is_usage_error(ConfigError("x"))
  assert not command_line.is_usage_error(RuntimeError("a bug"))
  with pytest.raises(RuntimeError):  # a bug keeps its traceback
    with command_line.errors_reported("prog"):
      raise RuntimeError("a bug")
  assert command_line.debug_requested("debug") and command_line.debug_requested(1)
  assert not command_line.debug_requested("info") and not command_line.debug_requested(0)
