"""Shared benchmark plumbing: machine description and atomic JSON results."""
import json
import os
import platform
import time
import uuid

import tensorflow as tf

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SHARED_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           os.pardir, "shared", "data")


def machine() -> dict:
  # The load average says whether other work shared the CPU while measuring.
  return dict(platform=platform.platform(), processor=platform.processor(),
              cpu_count=os.cpu_count(), python=platform.python_version(),
              tensorflow=tf.__version__, when=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              load_average_1_5_15=[round(x, 2) for x in os.getloadavg()])


def write_result(name: str, payload: dict, merge: bool = False) -> str:
  """Writes benchmarks/results/<name>.json atomically (optionally merging top-level keys)."""
  os.makedirs(RESULTS_DIR, exist_ok=True)
  path = os.path.join(RESULTS_DIR, f"{name}.json")
  if merge and os.path.exists(path):
    with open(path) as f:
      payload = dict(json.load(f), **payload)
  tmp = f"{path}.tmp-{uuid.uuid4().hex}"
  with open(tmp, "w") as f:
    json.dump(payload, f, indent=2, sort_keys=True)
  os.replace(tmp, path)
  return path


def plot_arm_curves(arms: dict, panels, path: str, title: str, grid=(1, 4),
                    figsize=(18, 4.5), dpi: int = 80, point_curves=(), decorate=None):
  """One panel per (curve, key, panel title) in `panels`: each arm's points (step, value)
  from arms[arm][curve], one colour per arm in every panel, the legend below; written to
  `path` through a temporary name. point_curves: curves drawn with markers (evaluations);
  decorate(ax, curve, key): extra lines on a panel (chance, say)."""
  import matplotlib  # noqa: PLC0415  only where a plot is drawn
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415  only where a plot is drawn
  fig, axes = plt.subplots(*grid, figsize=figsize)
  for ax, (curve, key, panel_title) in zip(axes.flat, panels):
    for n, (arm, result) in enumerate(arms.items()):
      points = [(p["step"], p[key]) for p in result.get(curve) or []
                if p.get(key) is not None]
      if points:
        ax.plot(*zip(*points), marker="." if curve in point_curves else None,
                color=f"C{n}", label=f"{arm}: {result['description']}")
    if decorate:
      decorate(ax, curve, key)
    ax.set_title(panel_title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  handles, labels = axes.flat[0].get_legend_handles_labels()
  fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8)
  fig.suptitle(title)
  fig.tight_layout(rect=(0, 0.1 if grid[0] == 1 else 0.07, 1, 0.94 if grid[0] == 1 else 0.96))
  fig.savefig(path + ".tmp.png", dpi=dpi)
  os.replace(path + ".tmp.png", path)
  plt.close(fig)
