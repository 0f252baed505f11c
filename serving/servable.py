"""One loaded version of a model: its signatures, its state, and who is still using it.

A request holds the version it started on (`try_enter` … `exit`) until its computation
ends, so the manager can retire a version (UNLOADING) without failing that request and
mark it END only once the last one is done.
"""
import ctypes
import ctypes.util
import dataclasses
import enum
import gc
import logging
import os
import sys
import threading
from typing import Mapping, Optional

import numpy as np
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import get_model_status_pb2

from serving import errors

log = logging.getLogger(__name__)

def register_op_libraries() -> list[str]:
  """Registers the op libraries a SavedModel may use beyond core TensorFlow.

  tensorflow_model_server links tf.text's ops (its SUPPORTED_TENSORFLOW_OPS), so this
  server does too: the exports tokenize in graph with them. ScaNN's ops exist only in a
  ScaNN-enabled build; here they are registered when the scann package is installed, and
  a model that needs them fails to load (leaving the serving version) when it is not.
  Returns the libraries registered.
  """
  registered = []
  import tensorflow_text  # noqa: F401,PLC0415  registers the ops when a model is loaded, as the real server does
  registered.append("tensorflow_text")
  try:
    from scann.scann_ops.py import scann_ops  # noqa: F401,PLC0415  optional: ScaNN exports need it, others load without
    registered.append("scann")
  except ImportError:
    pass
  return registered


OP_LIBRARIES = register_op_libraries()


def resident_bytes() -> int:
  """This process's resident memory (VmRSS), 0 where /proc is not available."""
  try:
    with open("/proc/self/status", encoding="ascii") as f:
      for line in f:
        if line.startswith("VmRSS:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return 0


def _load_libc():
  if not sys.platform.startswith("linux"):
    return None
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    return libc if hasattr(libc, "malloc_trim") else None  # musl has none
  except OSError:
    return None


_LIBC = _load_libc()


def release_free_memory() -> int:
  """Returns memory freed by an unloaded version to the OS; the bytes of RSS given back.

  Why by hand: TF Serving's SimpleLoader calls MallocExtension_ReleaseToSystem after a
  servable unloads (its binary links tcmalloc). TensorFlow's pip wheels allocate host
  memory with glibc malloc, which keeps freed pages in its arenas, and no library exposes
  glibc's malloc_trim, hence ctypes. First a garbage collection, so reference cycles in
  the unloaded object graph (functions <-> captured variables) are freed before the trim.
  What stays: oneDNN's CPU allocator (on by default in TensorFlow's x86 wheels) keeps the
  large tensors it served in a BFC arena that only grows; later versions reuse it, so RSS
  plateaus at about two versions' weights (the old and the new are both resident during
  a hand-over). TF_ENABLE_ONEDNN_OPTS=0 removes that arena at a cost in latency, and is
  the default of `python -m serving.server` (see its docstring).
  """
  before = resident_bytes()
  gc.collect()
  if _LIBC is not None:
    _LIBC.malloc_trim(0)
  return max(0, before - resident_bytes())

SERVE_TAG = tf.saved_model.SERVING
DEFAULT_SIGNATURE = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
_INIT_OP_SIGNATURE = "__saved_model_init_op"

State = enum.IntEnum("State", {name: value for name, value in
                               get_model_status_pb2.ModelVersionStatus.State.items()})


def _spec_from_tensor_info(info: meta_graph_pb2.TensorInfo) -> tf.TensorSpec:
  shape = (None if info.tensor_shape.unknown_rank else
           [d.size if d.size >= 0 else None for d in info.tensor_shape.dim])
  return tf.TensorSpec(shape, tf.dtypes.as_dtype(info.dtype))


# What tensorflow_model_server answers when XLA compilation is off and a model asks for it:
# main.cc calls tensorflow::DisableXlaCompilation() unless --xla_cpu_compilation_enabled,
# and XLA's compilation cache then fails every compilation with
# errors::Internal("XLA compilation disabled") (tensorflow/compiler/jit/flags.h,
# FailOnXlaCompilation). TensorFlow's Python API exposes neither call, so this server
# decides it from the graph (xla_compiled_signatures).
XLA_DISABLED_MESSAGE = "XLA compilation disabled"
_XLA_MUST_COMPILE = "_XlaMustCompile"


@dataclasses.dataclass
class Signature:
  """A signature's callable and its specs (inputs from structured_input_signature).

  xla_disabled: the signature reaches an XLA-compiled function (xla_compiled_signatures)
  and the server runs without --xla_cpu_compilation_enabled: every call fails as
  tensorflow_model_server's does (INTERNAL, XLA_DISABLED_MESSAGE), nothing computed.
  """
  name: str
  function: object  # a ConcreteFunction taking keyword tensors, returning a dict
  input_specs: dict  # name → tf.TensorSpec
  output_specs: dict  # name → tf.TensorSpec
  xla_disabled: bool = False

  @property
  def batchable(self) -> bool:
    """Requests can be merged along dimension 0 only if every input and output has it."""
    specs = list(self.input_specs.values()) + list(self.output_specs.values())
    return bool(self.input_specs) and all(
        spec.shape.rank is not None and spec.shape.rank >= 1 and spec.shape[0] is None
        for spec in specs)

  def run(self, inputs: Mapping[str, np.ndarray]) -> dict:
    """Calls the model on already validated inputs; {name: ndarray}.

    Raises:
      errors.ServingError: INTERNAL, the signature needs XLA and the server has it off.
    """
    if self.xla_disabled:
      raise errors.internal(XLA_DISABLED_MESSAGE)
    tensors = {name: tf.constant(array, dtype=self.input_specs[name].dtype)
               for name, array in inputs.items()}
    outputs = self.function(**tensors)
    return {name: value.numpy() for name, value in outputs.items()}


def read_signature_defs(path: str) -> dict:
  """The `serve` MetaGraph's SignatureDefs, read from saved_model.pb(txt) as TF Serving does."""
  return {key: value for key, value in serve_meta_graph(path).signature_def.items()
          if key != _INIT_OP_SIGNATURE}


def _called_functions(node, functions) -> set:
  """The library functions a NodeDef calls: its op when that is a function's name, and
  every function named in its attrs (a call's `f`, a branch's `then_branch`, a case's
  `branches`, a loop's `cond` and `body`...)."""
  called = {node.op} & functions
  for value in node.attr.values():
    if value.HasField("func"):
      called.add(value.func.name)
    called.update(f.name for f in value.list.func)
  return called


def xla_compiled_signatures(meta_graph: meta_graph_pb2.MetaGraphDef) -> set:
  """The signatures that reach an XLA-compiled function: one saved with `_XlaMustCompile`
  (a `tf.function(jit_compile=True)`), or called by a node carrying that attr, directly or
  through any depth of calls, branches and loops. A branch not taken still counts: which
  one runs is the request's, and an export's branches are read alike.

  Args:
    meta_graph: the `serve` MetaGraphDef.

  Returns:
    Signature names (the init op's left out).
  """
  library = {f.signature.name: f for f in meta_graph.graph_def.library.function}
  names = set(library)
  must_compile = {name for name, f in library.items()
                  if _XLA_MUST_COMPILE in f.attr and f.attr[_XLA_MUST_COMPILE].b}
  edges = {}  # function → the functions it calls
  for name, function in library.items():
    edges[name] = set()
    for node in function.node_def:
      called = _called_functions(node, names)
      edges[name] |= called
      if _XLA_MUST_COMPILE in node.attr and node.attr[_XLA_MUST_COMPILE].b:
        must_compile |= called
  reaching = set(must_compile)
  changed = True
  while changed:  # the functions that call a reaching one reach too
    grown = {name for name, callees in edges.items() if callees & reaching}
    changed = not grown <= reaching
    reaching |= grown
  nodes = {node.name: node for node in meta_graph.graph_def.node}
  compiled = set()
  for key, signature_def in meta_graph.signature_def.items():
    if key == _INIT_OP_SIGNATURE:
      continue
    for info in signature_def.outputs.values():
      node = nodes.get(info.name.split(":")[0].lstrip("^"))
      if node is not None and (_called_functions(node, names) & reaching or (
          _XLA_MUST_COMPILE in node.attr and node.attr[_XLA_MUST_COMPILE].b)):
        compiled.add(key)
  return compiled


def serve_meta_graph(path: str) -> meta_graph_pb2.MetaGraphDef:
  """The `serve` MetaGraph of saved_model.pb(txt) in `path`."""
  proto = saved_model_pb2.SavedModel()
  pb, pbtxt = os.path.join(path, "saved_model.pb"), os.path.join(path, "saved_model.pbtxt")
  if tf.io.gfile.exists(pb):
    with tf.io.gfile.GFile(pb, "rb") as f:
      proto.ParseFromString(f.read())
  else:
    with tf.io.gfile.GFile(pbtxt) as f:
      text_format.Parse(f.read(), proto)
  for meta_graph in proto.meta_graphs:
    if SERVE_TAG in meta_graph.meta_info_def.tags:
      return meta_graph
  raise ValueError(f"{path}: no MetaGraph tagged {SERVE_TAG!r}")


class ServableVersion:
  """A model version: loaded SavedModel, signatures, lifecycle state and in-flight count."""

  def __init__(self, model_name: str, version: int, path: str,
               xla_cpu_compilation_enabled: bool = False):
    """xla_cpu_compilation_enabled: tensorflow_model_server's flag (see Signature's
    xla_disabled); off, as in the binary, unless the server was started with it."""
    self.model_name = model_name
    self.xla_cpu_compilation_enabled = xla_cpu_compilation_enabled
    self.version = version
    self.path = path
    self.signature_defs = {}  # name → SignatureDef proto (for GetModelMetadata)
    self.signatures = {}  # name → Signature
    self._loaded = None
    self._cond = threading.Condition()
    self._in_flight = 0
    self.state = State.START
    self.error: Optional[errors.ServingError] = None

  def __repr__(self) -> str:
    return f"ServableVersion({self.model_name!r}, {self.version}, {self.state.name})"

  def load(self):
    """Loads the SavedModel and its signatures (runs on the loader thread, not a request's)."""
    meta_graph = serve_meta_graph(self.path)
    self.signature_defs = {key: value for key, value in meta_graph.signature_def.items()
                           if key != _INIT_OP_SIGNATURE}
    xla = xla_compiled_signatures(meta_graph)
    if xla and not self.xla_cpu_compilation_enabled:
      log.warning("%s: signatures %s are XLA-compiled and --xla_cpu_compilation_enabled "
                  "is off: they answer INTERNAL %r, as in tensorflow_model_server",
                  self.path, sorted(xla), XLA_DISABLED_MESSAGE)
    self._loaded = tf.saved_model.load(self.path, tags=[SERVE_TAG])
    for name, signature_def in self.signature_defs.items():
      if name not in self._loaded.signatures:
        raise ValueError(f"{self.path}: signature {name!r} is in saved_model.pb but did not load")
      function = self._loaded.signatures[name]
      args, kwargs = function.structured_input_signature
      if args:
        raise ValueError(f"{self.path}: signature {name!r} takes positional inputs")
      self.signatures[name] = Signature(
          name=name, function=function, input_specs=dict(kwargs),
          output_specs={key: _spec_from_tensor_info(info)
                        for key, info in signature_def.outputs.items()},
          xla_disabled=name in xla and not self.xla_cpu_compilation_enabled)

  def signature(self, name: str) -> Signature:
    name = name or DEFAULT_SIGNATURE
    if name not in self.signatures:
      # TF Serving answers FAILED_PRECONDITION for an unknown signature key.
      raise errors.failed_precondition(
          f"serving signature key {name!r} not found in model {self.model_name!r} version "
          f"{self.version}; it has {sorted(self.signatures)}")
    return self.signatures[name]

  # Lifecycle: the manager changes `state` under its own lock; requests enter and exit.

  def try_enter(self) -> bool:
    with self._cond:
      if self.state != State.AVAILABLE:
        return False
      self._in_flight += 1
      return True

  def exit(self):
    with self._cond:
      self._in_flight -= 1
      if self._in_flight == 0:
        self._cond.notify_all()

  @property
  def in_flight(self) -> int:
    with self._cond:
      return self._in_flight

  def begin_unloading(self):
    with self._cond:
      self.state = State.UNLOADING

  def wait_idle(self, timeout: Optional[float] = None) -> bool:
    with self._cond:
      return self._cond.wait_for(lambda: self._in_flight == 0, timeout)

  def release(self) -> int:
    """END: drops the model and returns its freed memory to the OS (bytes of RSS)."""
    with self._cond:
      self.state = State.END
      self._loaded = None
      self.signatures = {}
    # A version that never loaded (a refused one) freed nothing worth a collection.
    return release_free_memory() if self.signature_defs else 0
