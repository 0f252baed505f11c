"""What every benchmark does, in one place: write its result, run arms that survive being
cut, and the measurements several of them take.

A benchmark module reads parse → run → write, and has `markdown(result) -> str` (and, when
it draws curves, `plot(result, path)`):

    def main(argv=None):
      args = parse_args(argv)
      result = run(args)
      harness.Output("name", markdown).write(result)

Output. benchmarks/results/<name>.json (indented, keys sorted, replaced whole through a
temporary name), then <name>.md rendered *from that JSON as written* and <name>_curves.png
when the benchmark plots: a result's Markdown is a function of its JSON alone, so
`Output.render()` redraws it, byte for byte, without re-running the benchmark (each
module's `markdown` must read a result that has been through JSON: string keys, sorted).

Arms. A benchmark of several arms (pretrain's ablations, openqa's rows) that runs for
hours writes its result after every arm (`partial` until the last), keeps the finished arms
of an earlier run written with the same settings (`kept_result`), and skips the arms that
would end after its time budget, naming them:

    output = harness.Output("pretrain", markdown, plot)
    earlier = harness.kept_result(output, settings, fresh=args.fresh)
    arms = harness.Arms(lambda partial: output.write(payload(partial)), args.budget_minutes)
    for arm in arms.due(names, kept=earlier.get("arms", {})):
      results[arm] = run_arm(arm)   # saved as partial once the body returns
    arms.finish()                   # partial only if the budget skipped an arm

Measurements: `logger` (timestamped progress lines), `percentiles` (latencies),
`recall` (top-k against a reference top-k), `rss_bytes` / `peak_rss_bytes` /
`PeakSampler` (a process's resident memory), `publish_copy` (a new version of a served
model, as TF Serving expects it), `machine` (what ran it, and how loaded it was).

Free of TensorFlow at import on purpose: a benchmark that starts a server first
(benchmarks/server_process.py) imports TensorFlow while the server starts up.
"""
import json
import math
import os
import platform
import shutil
import threading
import time
import uuid

import numpy as np

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SHARED_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           os.pardir, "shared", "data")


# ------------------------------------------------------------------------------ outputs


def write_text(path: str, text: str) -> str:
  """`text` into `path` through a temporary name: a reader never sees half a file."""
  tmp = f"{path}.tmp-{uuid.uuid4().hex}"
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)
  return path


def write_json(path: str, payload: dict, merge: bool = False) -> str:
  """`payload` as indented JSON with sorted keys into `path`, replaced whole (merge: over
  the top-level keys of the JSON already there). Keys are made strings before they are
  sorted, so the file is what reading and writing it again gives (a number key 10 sorts
  before 2, as "10" does)."""
  if merge and os.path.exists(path):
    payload = dict(read_json(path), **payload)
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  return write_text(path, json.dumps(json.loads(json.dumps(payload)), indent=2,
                                     sort_keys=True))


def read_json(path: str) -> dict:
  with open(path) as f:
    return json.load(f)


class Output:
  """A benchmark's result files: <directory>/<name>.json, .md and, with `plot`,
  <name>_curves.png.

  Args:
    name: the files' stem.
    markdown: markdown(result) -> str, the .md's text from the JSON as written.
    plot: plot(result, path) -> None, the figure from the JSON as written.
    directory: default benchmarks/results (read when writing, so a test can move it).
  """

  def __init__(self, name: str, markdown=None, plot=None, directory: str = ""):
    self.name, self.markdown, self.plot = name, markdown, plot
    self._directory = directory

  @property
  def directory(self) -> str:
    return self._directory or RESULTS_DIR

  @property
  def json_path(self) -> str:
    return os.path.join(self.directory, f"{self.name}.json")

  @property
  def markdown_path(self) -> str:
    return os.path.join(self.directory, f"{self.name}.md")

  @property
  def figure_path(self) -> str:
    return os.path.join(self.directory, f"{self.name}_curves.png")

  def read(self) -> dict:
    """The result written so far ({} if none)."""
    return read_json(self.json_path) if os.path.exists(self.json_path) else {}

  def write(self, payload: dict, merge: bool = False) -> str:
    """The JSON (merge: over the top-level keys already there), then the Markdown and the
    figure rendered from it; returns the JSON's path."""
    write_json(self.json_path, payload, merge)
    self.render()
    return self.json_path

  def render(self) -> str:
    """The Markdown (and figure) redrawn from the JSON; returns the Markdown's path."""
    result = read_json(self.json_path)
    if self.markdown is not None:
      write_text(self.markdown_path, self.markdown(result))
    if self.plot is not None:
      self.plot(result, self.figure_path)
    return self.markdown_path


def output_at(json_path: str, markdown=None, plot=None) -> Output:
  """The Output whose JSON is `json_path`."""
  directory, file_name = os.path.split(os.path.abspath(json_path))
  return Output(file_name[:-len(".json")], markdown, plot, directory)


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


# ---------------------------------------------------------------------------- arms


def kept_result(output: Output, settings: dict, fresh: bool = False, log=print) -> dict:
  """The result already written to `output` when it was written with `settings` (a rerun
  keeps its finished arms), else {}: other settings, or `fresh`, start over."""
  earlier = {} if fresh else output.read()
  if not earlier:
    return {}
  if earlier.get("settings") != settings:
    log(f"{output.json_path} holds other settings: starting over")
    return {}
  log(f"{output.json_path} was written with these settings: its finished arms are kept")
  return earlier


class Arms:
  """Named arms run in order, each saved as it finishes, within a time budget.

  Args:
    save: save(partial) writes the result as it stands; called after every arm (partial)
      and by finish().
    budget_minutes: an arm that would end after this, counted from `started`, is skipped.
    started: time.time() the budget counts from (default: now).
  """

  def __init__(self, save, budget_minutes: float = math.inf, started: float = 0.0):
    self.save = save
    self.budget_minutes = budget_minutes
    self.started = started or time.time()
    self.seconds = {}  # arm → wall seconds, for the arms run here, in run order
    self.skipped = []  # labels of the arms the budget left out
    self._arm_began = 0.0

  def due(self, names, kept=(), expected=None, label=str):
    """Yields the arms of `names` to run, in order: not in `kept`, and expected to end within
    the budget (expected(arm, seconds) → seconds the arm should take, given the seconds of
    the arms run so far; default: as long as the last one). A skipped arm's label(arm) is
    added to `skipped`. Once the loop's body has run an arm, the result is saved (partial):
    a run cut later keeps it."""
    for name in names:
      if name in kept:
        continue
      guess = (expected(name, self.seconds) if expected is not None
               else next(reversed(self.seconds.values()), 0.0))
      if (time.time() - self.started + guess) / 60 > self.budget_minutes:
        self.skipped.append(label(name))
        continue
      self._arm_began = time.time()
      yield name
      self.seconds[name] = time.time() - self._arm_began
      self.save(partial=True)

  def arm_seconds(self) -> float:
    """Wall seconds since the arm being run began."""
    return time.time() - self._arm_began

  def finish(self):
    """The last save: partial when the budget skipped an arm. Returns what save returns."""
    return self.save(partial=bool(self.skipped))


# ------------------------------------------------------------------------ measurements


def logger(tag: str):
  """log(message): a progress line `[tag HH:MM:SS] message`, flushed at once (a benchmark's
  output is often a file followed while it runs)."""
  def log(message: str):
    print(f"[{tag} {time.strftime('%H:%M:%S')}] {message}", flush=True)
  return log


def machine() -> dict:
  """What ran the benchmark. The load average says whether other work shared the CPU while
  measuring."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return dict(platform=platform.platform(), processor=platform.processor(),
              cpu_count=os.cpu_count(), python=platform.python_version(),
              tensorflow=tf.__version__, when=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              load_average_1_5_15=[round(x, 2) for x in os.getloadavg()])


def percentiles(latencies_s) -> dict:
  """p50, p99 and mean of latencies in seconds, in milliseconds, and how many there were
  (requests=0 alone for none)."""
  if not len(latencies_s):
    return dict(requests=0)
  ms = np.asarray(latencies_s) * 1000.0
  return dict(p50_ms=round(float(np.percentile(ms, 50)), 2),
              p99_ms=round(float(np.percentile(ms, 99)), 2),
              mean_ms=round(float(ms.mean()), 2), requests=int(len(ms)))


def recall(got, want) -> float:
  """Mean over queries of the fraction of the reference top-k (`want`, a row per query)
  found in the returned top-k (`got`)."""
  return float(np.mean([len(set(g) & set(w)) / len(w) for g, w in zip(got, want)]))


def _status_field(pid: int, field: str) -> int:
  with open(f"/proc/{pid or 'self'}/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1]) * 1024
  return 0


def rss_bytes(pid: int = 0) -> int:
  """VmRSS of a process (default: this one)."""
  return _status_field(pid, "VmRSS")


def peak_rss_bytes(pid: int = 0) -> int:
  """VmHWM: the process's peak resident memory so far."""
  return _status_field(pid, "VmHWM")


class PeakSampler:
  """Samples a process's RSS on a thread while in its `with`; `peak` is the largest sample
  (VmHWM cannot be reset, so a peak within one stretch of a long process is sampled)."""

  def __init__(self, pid: int, every: float = 0.05):
    self.pid, self.every, self.peak = pid, every, 0
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)

  def _run(self):
    while not self._stop.is_set():
      try:
        self.peak = max(self.peak, rss_bytes(self.pid))
      except OSError:
        return
      self._stop.wait(self.every)

  def __enter__(self):
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join()


def versions(base_path: str) -> list[int]:
  """The version directories of a served model's base path, oldest first."""
  return sorted(int(n) for n in os.listdir(base_path) if n.isdigit())


def publish_copy(base_path: str, version: int = 0, hard_links: bool = False) -> int:
  """A copy of `version` (default: the newest) published as the next version after the
  newest, renamed into place at once (TF Serving's convention, as realm_tf's exporter
  does): a new version for a server to load. hard_links: the copy's files are links (no
  disk used; the files are never written in place). Returns the new version."""
  newest = versions(base_path)[-1]
  source = os.path.join(base_path, str(version or newest))
  tmp = os.path.join(base_path, f".tmp-{newest + 1}")
  shutil.copytree(source, tmp, **(dict(copy_function=os.link) if hard_links else {}))
  os.rename(tmp, os.path.join(base_path, str(newest + 1)))
  return newest + 1
