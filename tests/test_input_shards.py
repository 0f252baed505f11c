"""Input pipelines of a multi-worker job: disjoint shares of the files, and global batches
(examples and masks) that do not depend on how many pipelines read them."""
import os

import numpy as np
import tensorflow as tf

from realm_tf.data import files, pretraining_inputs


# These tests are about sharding files between pipelines, not about publication: the files
# are written raw, and read as files made by another tool (unpublished=True).
def _write(directory, name, values):
  path = os.path.join(directory, name)
  with tf.io.TFRecordWriter(path) as w:
    for v in values:
      w.write(v.encode())
  return path


def _records(dataset):
  return [r.decode() for r in dataset.as_numpy_iterator()]


def test_each_pipeline_reads_its_own_files(tmp_path):
  a = _write(str(tmp_path), "x-00000-of-00002", ["a0", "a1", "a2"])
  b = _write(str(tmp_path), "x-00001-of-00002", ["b0", "b1", "b2"])
  pattern = str(tmp_path / "x-*")
  # One pipeline: the files interleaved record by record.
  assert (_records(files.pipeline_records(pattern, unpublished=True))
          == ["a0", "b0", "a1", "b1", "a2", "b2"])
  shares = [_records(files.pipeline_records(pattern, tf.distribute.InputContext(2, i, 2),
                                            unpublished=True))
            for i in range(2)]
  assert shares == [["a0", "a1", "a2"], ["b0", "b1", "b2"]]
  # Fewer files than pipelines: every pipeline reads all, keeping every n-th record.
  shares = [_records(files.pipeline_records(a, tf.distribute.InputContext(2, i, 2),
                                            unpublished=True))
            for i in range(2)]
  assert shares == [["a0", "a2"], ["a1"]]
  del b


def test_global_batches_are_the_same_sets_on_one_or_two_pipelines(tmp_path):
  _write(str(tmp_path), "x-00000-of-00002", [f"a{i}" for i in range(8)])
  _write(str(tmp_path), "x-00001-of-00002", [f"b{i}" for i in range(8)])
  pattern = str(tmp_path / "x-*")
  one = _records(files.pipeline_records(pattern, unpublished=True))
  two = [_records(files.pipeline_records(pattern, tf.distribute.InputContext(2, i, 2),
                                            unpublished=True))
         for i in range(2)]
  per_replica = 2
  for step in range(4):
    single = set(one[step * 4:(step + 1) * 4])  # global batch 4, one pipeline
    multi = set(two[0][step * per_replica:(step + 1) * per_replica]
                + two[1][step * per_replica:(step + 1) * per_replica])
    assert single == multi, step


def test_a_records_mask_seed_depends_on_it_and_the_epoch_not_its_position():
  record = tf.constant(b"serialized example")
  same = pretraining_inputs.mask_seed(7, tf.constant(0, tf.int64), record).numpy()
  np.testing.assert_array_equal(
      same, pretraining_inputs.mask_seed(7, tf.constant(0, tf.int64), record).numpy())
  other_epoch = pretraining_inputs.mask_seed(7, tf.constant(1, tf.int64), record).numpy()
  other_record = pretraining_inputs.mask_seed(7, tf.constant(0, tf.int64),
                                              tf.constant(b"another")).numpy()
  assert not np.array_equal(same, other_epoch) and not np.array_equal(same, other_record)
