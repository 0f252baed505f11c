"""Block embeddings on one device as variables of consecutive rows, searched exactly.

Why not one [N, P] variable: at REALM's 13,353,718 blocks it is 6.8 GB of float32, and
TensorFlow can fill a variable without a second full copy only with its sparse update
ops (scatter, strided-slice assign), which switch the variable to copy-on-read for good:
from then on every read in a step copies all 6.8 GB (the exact search reads it once a
batch). A full `assign` keeps plain reads but needs the whole value as a tensor beside
the variable while it runs (13.7 GB at the peak). Row blocks of ROWS_PER_BLOCK rows are
each created or assigned whole from one block-sized array: one copy of the embeddings,
one block in flight, no copy-on-read, and no variable larger than a block in a
SavedModel (its checkpoint shards naturally).

Search is exact_top_k per block, then one top-k over the blocks' candidates; rows are
global (a block's offset added), so callers see one [N, P] table.
"""
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from realm_tf.retrieval.exact import exact_top_k

# 2^20 rows: 512 MiB of float32 at P = 128 (13 blocks at 13.35M). Large enough that the
# per-block top-k merge is negligible, small enough that one block in flight is cheap.
ROWS_PER_BLOCK = 1 << 20


def block_bounds(num_rows: int, rows_per_block: int = 0) -> list[tuple[int, int]]:
  """[(start, end)] of the row blocks of `num_rows` rows (0: ROWS_PER_BLOCK rows a block)."""
  rows_per_block = rows_per_block or ROWS_PER_BLOCK
  if num_rows < 1:
    raise ValueError(f"an embedding table needs at least one row, got {num_rows}")
  return [(s, min(num_rows, s + rows_per_block)) for s in range(0, num_rows, rows_per_block)]


class RowBlocks(tf.Module):
  """[N, P] embeddings as variables of consecutive rows; see the module docstring.

  Args:
    variables: the blocks' variables, rows in order ([n_i, P] each, same P and dtype).
    name: the tf.Module's name.
  """

  def __init__(self, variables: Sequence[tf.Variable], name: str = "row_blocks"):
    super().__init__(name=name)
    if not variables:
      raise ValueError("RowBlocks needs at least one variable")
    dims = {int(v.shape[1]) for v in variables}
    if len(dims) != 1 or any(v.shape.rank != 2 for v in variables):
      raise ValueError(f"row blocks must be [n, P] with one P, got "
                       f"{[v.shape.as_list() for v in variables]}")
    self.blocks = list(variables)
    self.offsets = np.cumsum([0] + [int(v.shape[0]) for v in variables]).tolist()
    self.num_rows = self.offsets[-1]
    self.dimension = dims.pop()
    self.dtype = variables[0].dtype

  @classmethod
  def unfilled(cls, num_rows: int, dimension: int, dtype=tf.float32,
               rows_per_block: int = 0, name: str = "embeddings") -> "RowBlocks":
    """Blocks that hold no values until `assign_blocks` fills them.

    Why uninitialised variables rather than zeros: a zero-filled table is resident before
    any embedding arrives (6.4 GiB at 13.35M blocks), and assigning into it left about a
    block more resident than assigning into nothing (measured: 4 blocks of 2^20 rows ended
    at 2.51 GiB from zeros, 1.98 GiB from nothing; peaks 3.47 and 2.93). Uninitialised, a
    block takes memory when its values are assigned. tf.Variable has no public way to make
    one without an initial value; UninitializedVariable is what TensorFlow's own SavedModel
    loader uses for it. Reading before the first assign returns an empty tensor, so a
    search before an index is loaded fails on its shape rather than ranking zeros.
    """
    return cls([resource_variable_ops.UninitializedVariable(
                    shape=[end - start, dimension], dtype=dtype, trainable=False,
                    name=f"{name}_{i}")
                for i, (start, end) in enumerate(block_bounds(num_rows, rows_per_block))])

  @classmethod
  def from_array(cls, values: np.ndarray, dtype=None, rows_per_block: int = 0,
                 name: str = "embeddings") -> "RowBlocks":
    """Blocks holding `values` [N, P] (in `dtype`, default the array's)."""
    dtype = tf.as_dtype(dtype or values.dtype)
    return cls([tf.Variable(np.asarray(values[start:end], dtype.as_numpy_dtype),
                            trainable=False, name=f"{name}_{i}")
                for i, (start, end) in enumerate(block_bounds(len(values), rows_per_block))])

  def cast(self, dtype, name: str = "embeddings", release: bool = False) -> "RowBlocks":
    """A copy of these rows in `dtype`, made one block at a time.

    Why not from_array(self.numpy()): that holds a float32 copy of the whole table and
    its cast beside the blocks, 10 GiB more at 13.35M blocks (the ScaNN export's float16
    copy ran a 24 GiB machine out of memory that way); a block in flight is 512 MiB.

    Args:
      dtype: the copy's dtype.
      name: its variables' name stem.
      release: empty each block of these rows once its copy is made (`release`): the
        table is never held twice, for a caller whose last use of it this is.
    """
    dtype = tf.as_dtype(dtype)
    copies = []
    for i in range(len(self.blocks)):
      copies.append(tf.Variable(tf.cast(tf.convert_to_tensor(self.blocks[i]), dtype),
                                trainable=False, name=f"{name}_{i}"))
      if release:
        self._release_block(i)
    return RowBlocks(copies, name=self.name)

  def release(self) -> None:
    """Empties every block (unfilled again: `assign_blocks` refills them), so their memory
    goes back once nothing else holds the old variables. Why: a process whose last use of
    the table is behind it (the ScaNN export, once its own copy is made: 6.4 GiB of its
    peak at 13.35M blocks) need not hold it to the end."""
    for i in range(len(self.blocks)):
      self._release_block(i)

  def _release_block(self, i: int) -> None:
    blocks = list(self.blocks)
    old = blocks[i]
    blocks[i] = resource_variable_ops.UninitializedVariable(
        shape=old.shape, dtype=old.dtype, trainable=False, name=old.name.split(":")[0])
    # A new list, not an item assigned: a tf.Module's tracked list keeps every variable an
    # assignment replaces (for its checkpoint), which would hold the memory released here.
    self.blocks = blocks

  @property
  def shape(self) -> tuple[int, int]:
    """(N, P)."""
    return (self.num_rows, self.dimension)

  @property
  def bounds(self) -> list[tuple[int, int]]:
    """[(start, end)] rows of each block."""
    return list(zip(self.offsets[:-1], self.offsets[1:]))

  def assign_blocks(self, block_values: Callable[[int, int], np.ndarray]) -> None:
    """Assigns every block whole from `block_values(start, end)` ([end - start, P]), one
    block at a time (a full assign: reads stay plain)."""
    for variable, (start, end) in zip(self.blocks, self.bounds):
      values = block_values(start, end)
      if values.shape != (end - start, self.dimension):
        raise ValueError(f"rows [{start}, {end}) got values of shape {values.shape}")
      variable.assign(np.asarray(values, variable.dtype.as_numpy_dtype))
      del values  # not held beside the next block's values while they are made

  def assign(self, values: np.ndarray) -> None:
    """Assigns all rows from `values` [N, P]."""
    if tuple(values.shape) != self.shape:
      raise ValueError(f"embeddings of shape {tuple(values.shape)} do not fit {self.shape}")
    self.assign_blocks(lambda start, end: values[start:end])

  def numpy(self) -> np.ndarray:
    """[N, P] in the blocks' dtype (a copy)."""
    return np.concatenate([v.numpy() for v in self.blocks])

  def top_k(self, queries: tf.Tensor, k: int) -> tuple[tf.Tensor, tf.Tensor]:
    """(scores [Q, k] float32, rows [Q, k] int32) of the k best rows over every block."""
    scores, rows = [], []
    for variable, start in zip(self.blocks, self.offsets):
      block_k = min(k, int(variable.shape[0]))
      block_scores, block_rows = exact_top_k(queries, variable, block_k)  # [Q, k'] each
      scores.append(block_scores)
      rows.append(block_rows + start)
    if len(self.blocks) == 1:
      return scores[0], rows[0]
    scores, rows = tf.concat(scores, axis=1), tf.concat(rows, axis=1)  # [Q, sum k']
    # Equal scores keep ascending rows, as exact_top_k orders them within a block.
    top = tf.math.top_k(scores, k=k)  # [Q, k]
    return top.values, tf.gather(rows, top.indices, batch_dims=1)

  def take(self, rows: tf.Tensor) -> tf.Tensor:
    """The embeddings of global `rows` (any shape [...]) → [..., P], in the blocks' dtype.

    Each block is read once as a tensor: a gather from the variable itself would switch
    it to copy-on-read (see realm_tf.retrieval.exact)."""
    if len(self.blocks) == 1:
      return tf.gather(tf.convert_to_tensor(self.blocks[0]), rows)
    rows = tf.cast(rows, tf.int32)
    result = None
    for variable, (start, end) in zip(self.blocks, self.bounds):
      local = tf.clip_by_value(rows - start, 0, end - start - 1)
      owned = (rows >= start) & (rows < end)
      values = tf.gather(tf.convert_to_tensor(variable), local)  # [..., P]
      values = tf.where(owned[..., None], values, tf.zeros_like(values))
      result = values if result is None else result + values
    return result


def gather_rows(embeddings, rows: np.ndarray) -> np.ndarray:
  """[len(rows), P] float32: rows of `embeddings` (a RowBlocks, or an [N, P] array or
  memmap), read block by block without a copy of the whole table.

  Args:
    embeddings: a RowBlocks, or an [N, P] array or memmap.
    rows: [R] int64 global row numbers.

  Returns:
    [R, P] float32, in the order of `rows`.
  """
  rows = np.asarray(rows, np.int64)
  if not isinstance(embeddings, RowBlocks):
    return np.asarray(embeddings[rows], np.float32)
  parts = np.empty([len(rows), embeddings.dimension], np.float32)
  for variable, (start, end) in zip(embeddings.blocks, embeddings.bounds):
    mine = np.flatnonzero((rows >= start) & (rows < end))
    if len(mine):
      # From the read value: a gather from the variable would make it copy-on-read.
      parts[mine] = tf.gather(tf.convert_to_tensor(variable), rows[mine] - start).numpy()
  return parts
