"""The stock tensorflow_model_server's op allow-list (realm_tf.export.model_server_ops): the
committed file is what its generator writes for the pinned TensorFlow and tf.text, and the
check refuses what the binary refuses (a py_function, an op outside the list), by name."""
import pathlib

import pytest
import tensorflow as tf
import tensorflow_text as text

from realm_tf.export import model_server_ops


def test_committed_allow_list_is_what_the_generator_writes():
  """Regenerated in a fresh interpreter from the installed (pinned) TensorFlow and tf.text:
  a version bump that adds or drops an op shows here, with the file to rewrite."""
  generated = model_server_ops.generate()
  committed = model_server_ops.ALLOW_LIST.read_text()
  assert generated == committed, (
      f"{model_server_ops.ALLOW_LIST} is stale: python -m realm_tf.export.model_server_ops "
      "--write")


def test_allow_list_has_core_and_tf_text_ops_and_no_python_ops():
  stock = model_server_ops.read_allow_list()
  assert {"MatMul", "TopKV2", "StatefulPartitionedCall", "While"} <= stock
  # The three tf.text ops realm_qa tokenizes with, all from tf.text's ops_lib.
  assert {"FastBertNormalize", "FastWordpieceTokenizeWithOffsets",
          "TFText>RoundRobinTrim"} <= stock
  assert not stock & model_server_ops.PYTHON_ONLY_OPS
  assert not any(op.startswith("Scann") for op in stock)


class _Tokenize(tf.Module):
  """A graph the stock binary runs: core ops and a tf.text op."""

  def __init__(self):
    super().__init__()
    self.tokenizer = text.WhitespaceTokenizer()

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
  def __call__(self, strings):
    # [batch] strings -> [batch] token counts
    return self.tokenizer.tokenize(strings).row_lengths()


class _PythonCallback(_Tokenize):
  """The same graph plus a tf.py_function in a nested tf.function: it loads in Python, and
  the binary refuses it."""

  @tf.function
  def _doubled(self, counts):
    return tf.py_function(lambda c: c * 2, [counts], tf.int64)

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
  def __call__(self, strings):
    return self._doubled(self.tokenizer.tokenize(strings).row_lengths())


def _saved(module: tf.Module, path: pathlib.Path) -> str:
  tf.saved_model.save(module, str(path), signatures={"serving_default": module.__call__})
  return str(path)


def test_check_passes_stock_ops_and_names_a_py_function(tmp_path):
  good = _saved(_Tokenize(), tmp_path / "good")
  ops = model_server_ops.saved_model_ops(good)
  assert "TFText>WhitespaceTokenizeWithOffsetsV2" in ops, ops  # a tf.text op, allowed
  assert model_server_ops.ops_outside(good) == set()
  bad = _saved(_PythonCallback(), tmp_path / "bad")
  # The py_function sits in a library function, not the signature's own body: still found.
  assert model_server_ops.ops_outside(bad) == {"EagerPyFunc"}
  # Any op missing from the list is named, core or tf.text.
  stock = model_server_ops.read_allow_list()
  for dropped in (min(ops - {"TFText>WhitespaceTokenizeWithOffsetsV2"}),
                  "TFText>WhitespaceTokenizeWithOffsetsV2"):
    assert model_server_ops.ops_outside(good, stock - {dropped}) == {dropped}


def test_command_line_check_exits_1_naming_the_op(tmp_path, capsys):
  bad = _saved(_PythonCallback(), tmp_path / "bad")
  assert model_server_ops.main(["--export", bad]) == 1
  assert '"EagerPyFunc"' in capsys.readouterr().out
  good = _saved(_Tokenize(), tmp_path / "good")
  assert model_server_ops.main(["--export", good]) == 0


def test_a_missing_saved_model_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match="saved_model.pb"):
    model_server_ops.saved_model_ops(str(tmp_path))
