"""The machine's compute limits a performance benchmark records beside its figures: its
CPU's theoretical peak and the dense matmul throughput TensorFlow measures on it, and the
FLOPs of a BERT encoder. Writing results and the other shared measurements are in
benchmarks/harness.py."""
import os
import platform
import time

import tensorflow as tf


# Single-precision FLOPs one FMA instruction does per vector register, by widest ISA flag.
_VECTOR_LANES = (("avx512f", 16), ("avx2", 8), ("avx", 8), ("sse2", 4))


def cpu_peak(cpuinfo: str = "", cores: int = 0, fma_units_per_core: int = 2) -> dict:
  """The CPU's theoretical float32 peak, as far as /proc/cpuinfo tells it: cores x FMA units
  x vector lanes x 2 FLOPs (multiply and add) x clock.

  Read: the clock (the current 'cpu MHz' of the first core, or the model name's "@ x GHz"),
  the widest vector flag (lanes) and whether FMA exists; cores are the ones this process
  may run on. Not readable there, hence an argument (reported as assumed): the number of
  FMA units per core (2 on Intel Skylake-SP and later server parts and on AMD Zen 2 and
  later; 1 on some client parts). Without FMA, one multiply and one add per cycle."""
  if not cpuinfo:
    try:
      with open("/proc/cpuinfo") as f:
        cpuinfo = f.read()
    except OSError:
      cpuinfo = ""
  fields = {}
  for line in cpuinfo.splitlines():
    key, _, value = line.partition(":")
    fields.setdefault(key.strip(), value.strip())
  flags = set(fields.get("flags", "").split())
  mhz = float(fields["cpu MHz"]) if fields.get("cpu MHz") else 0.0
  model = fields.get("model name", platform.processor())
  if not mhz and "GHz" in model:
    mhz = 1000 * float(model.rsplit("@", 1)[-1].replace("GHz", "").strip())
  lanes = next((n for flag, n in _VECTOR_LANES if flag in flags), 1)
  cores = cores or len(os.sched_getaffinity(0))
  per_cycle = 2 * lanes * (fma_units_per_core if "fma" in flags else 1)
  return dict(model=model, clock_mhz=mhz, cores=cores, vector_lanes_fp32=lanes,
              fma="fma" in flags, fma_units_per_core_assumed=fma_units_per_core,
              peak_flops=cores * per_cycle * mhz * 1e6)


def matmul_limit(n: int = 1024, repeats: int = 8, trials: int = 5) -> dict:
  """The dense float32 matmul throughput TensorFlow reaches here (FLOP/s): best of `trials`
  timings of `repeats` n x n products in one tf.function. The practical limit the
  benchmarks divide their achieved FLOP/s by; measured in the benchmark's own process
  and run, so a loaded machine lowers both sides alike."""
  a = tf.random.stateless_normal([n, n], seed=[0, 1])
  b = tf.random.stateless_normal([n, n], seed=[2, 3])

  @tf.function
  def products(a, b):
    total = tf.constant(0.0)
    for _ in range(repeats):  # unrolled: `repeats` independent matmuls
      a = tf.linalg.matmul(a, b) * (1.0 / n)  # rescaled so values stay finite
      total += a[0, 0]
    return total

  products(a, b).numpy()  # trace and warm up
  best = float("inf")
  for _ in range(trials):
    start = time.perf_counter()
    products(a, b).numpy()
    best = min(best, time.perf_counter() - start)
  flops = 2.0 * n ** 3 * repeats
  return dict(n=n, repeats=repeats, seconds=best, flops_per_second=flops / best)


def thread_pools() -> list:
  """threadpoolctl's view of the BLAS/OpenMP pools loaded in this process (library,
  version, internal API, threads, architecture): which kernels a NumPy or FAISS number
  came from."""
  try:
    import threadpoolctl  # noqa: PLC0415  optional: recorded when installed
  except ImportError:
    return []
  return [{k: v for k, v in pool.items() if k in (
      "internal_api", "prefix", "version", "num_threads", "architecture", "threading_layer")}
          for pool in threadpoolctl.threadpool_info()]


def encoder_flops(num_layers: int, hidden: int, intermediate: int, batch: int, seq: int,
                  training: bool = True) -> float:
  """FLOPs of a BERT encoder's matmuls over [batch, seq] tokens: per layer and token,
  2 x (4 H^2 for Q, K, V and the output projection + 2 H F for the feed-forward) and
  2 x 2 S H for the attention scores and the weighted sum. Training: x 3 (the backward pass
  computes two products per forward one). Not counted: embeddings, layer norms, softmaxes,
  biases (each O(S H), a few percent at these sizes)."""
  per_token = 2 * (4 * hidden ** 2 + 2 * hidden * intermediate) + 4 * seq * hidden
  return float(num_layers * per_token * batch * seq * (3 if training else 1))


def encoder_gemm_limit(hidden: int, intermediate: int, heads: int, batch: int, seq: int,
                       jit_compile: bool = False, repeats: int = 8, trials: int = 5) -> dict:
  """The throughput TensorFlow reaches (FLOP/s) on one encoder layer's matmuls alone, at
  the shapes a pass of `batch` sequences of `seq` tokens multiplies: Q, K, V and the
  output projection ([batch x seq, H] x [H, H]), the feed-forward pair ([.., H] x [H, F],
  [.., F] x [F, H]) and the attention products per head ([seq, H/heads] x [H/heads, seq]
  and back), `repeats` layers' worth in one tf.function (XLA-compiled with
  `jit_compile`), best of `trials`. Why beside matmul_limit: small products cannot reach
  a 1024-cube product's rate; this is the ceiling an encoder of these shapes could reach
  with every other op free, the same FLOPs as encoder_flops counts."""
  rows, head = batch * seq, hidden // heads
  x = tf.random.stateless_normal([rows, hidden], seed=[0, 1])
  w = tf.random.stateless_normal([hidden, hidden], seed=[2, 3]) * hidden ** -0.5
  w_in = tf.random.stateless_normal([hidden, intermediate], seed=[4, 5]) * hidden ** -0.5
  w_out = tf.random.stateless_normal([intermediate, hidden], seed=[6, 7]) * intermediate ** -0.5

  @tf.function(jit_compile=jit_compile)
  def layers(x):
    total = tf.constant(0.0)
    for _ in range(repeats):  # unrolled: one layer's products after another
      q, k, v = (tf.linalg.matmul(x, w) for _ in range(3))
      split = lambda t: tf.transpose(tf.reshape(t, [batch, seq, heads, head]), [0, 2, 1, 3])
      scores = tf.linalg.matmul(split(q), split(k), transpose_b=True) * head ** -0.5
      context = tf.linalg.matmul(scores, split(v))  # [batch, heads, seq, head]
      x = tf.linalg.matmul(tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [rows, hidden]), w)
      x = tf.linalg.matmul(tf.linalg.matmul(x, w_in), w_out) * 0.5
      total += x[0, 0]
    return total

  layers(x).numpy()  # trace (compile) and warm up
  best = float("inf")
  for _ in range(trials):
    start = time.perf_counter()
    layers(x).numpy()
    best = min(best, time.perf_counter() - start)
  flops = encoder_flops(repeats, hidden, intermediate, batch, seq, training=False)
  return dict(batch=batch, seq=seq, jit_compile=jit_compile, seconds=best,
              flops_per_second=flops / best)


def compute_limits(matmul_n: int = 1024) -> dict:
  """What a performance benchmark records beside its figures: the CPU's theoretical peak,
  the measured TensorFlow matmul limit, their ratio, and the thread pools."""
  peak = cpu_peak()
  measured = matmul_limit(matmul_n)
  return dict(cpu=peak, matmul=measured, thread_pools=thread_pools(),
              matmul_fraction_of_peak=(measured["flops_per_second"] / peak["peak_flops"]
                                       if peak["peak_flops"] else None))
