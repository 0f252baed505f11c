"""Clustered synthetic embeddings for MIPS tests and benchmarks.

Real embedding sets are clustered (topics), which is what partitioning and quantisation
exploit; isotropic Gaussian noise is a needlessly pessimistic stand-in.
"""
import numpy as np


def clustered_vectors(num: int, dim: int, num_clusters: int = 1000, spread: float = 0.35,
                      seed: int = 0) -> np.ndarray:
  """[num, dim] float32: unit cluster centres plus Gaussian noise of norm about `spread`."""
  rng = np.random.default_rng(seed)
  centres = rng.normal(size=(num_clusters, dim)).astype(np.float32)
  centres /= np.linalg.norm(centres, axis=1, keepdims=True)
  out = np.empty((num, dim), np.float32)
  step = 200_000  # bounded temporaries for large `num`
  for start in range(0, num, step):
    n = min(step, num - start)
    assign = rng.integers(0, num_clusters, size=n)
    noise = rng.normal(size=(n, dim)).astype(np.float32) * (spread / np.sqrt(dim))
    out[start:start + n] = centres[assign] + noise
  return out


def queries_near(vectors: np.ndarray, num: int, noise: float = 0.35, seed: int = 1) -> np.ndarray:
  """Queries drawn around random corpus points, as real queries sit near relevant blocks."""
  rng = np.random.default_rng(seed)
  picks = vectors[rng.integers(0, len(vectors), size=num)]
  return (picks + rng.normal(size=picks.shape).astype(np.float32)
          * (noise / np.sqrt(vectors.shape[1]))).astype(np.float32)
