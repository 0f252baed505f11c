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

Steps. A benchmark whose steps take long keeps each step's result in its work directory
(`cached`: a rerun there reads it back instead of doing the step again; `recorded` adds how
the step ran: its commit, start, seconds and the machine's load), and one that reads
memory runs each step in a process of its own (`Phases`: the child is the benchmark's own
module, called with its flags and --phase):

    PHASES = harness.Phases("benchmarks.scale", dict(corpus=corpus_phase, ...))
    def parse_args(argv=None):
      ...
      args = PHASES.parse(parser, argv)          # adds --phase and --kind (hidden)
    def main(argv=None):
      args = parse_args(argv)
      if args.phase:
        return PHASES.child(args)                # the child: one phase, its result to JSON
      ...
    corpus = PHASES.run(args, work, "corpus")    # the parent: its result, read back

Measurements: `logger` (timestamped progress lines), `percentiles` (latencies),
`recall` (top-k against a reference top-k), `rss_bytes` / `peak_rss_bytes` /
`PeakSampler` (a process's resident memory), `du_bytes` / `inode_sizes` / `gib` (sizes on
disk), `read_questions` (NQ-Open questions to ask), `publish_copy` (a new version of a
served model, as TF Serving expects it), `machine` (what ran it, and how loaded it was).

Free of TensorFlow at import on purpose: a benchmark that starts a server first
(benchmarks/server_process.py) imports TensorFlow while the server starts up.
"""
import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
import uuid

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(REPO, "benchmarks", "results")
SHARED_DATA = os.path.join(REPO, os.pardir, "shared", "data")


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


# ------------------------------------------------------------------------------- steps


def _write_step(path: str, result: dict) -> str:
  """A step's result as JSON in the order it was made (a value JSON has no type for is
  written as its str)."""
  return write_text(path, json.dumps(result, indent=2, default=str))


def cached(path: str, make, keep=lambda result: True, log=print) -> dict:
  """A step that an earlier run in the same work directory may have done: the result it
  wrote to `path`, when that file exists and keep(result) holds; else make()'s, written to
  `path` once make returns (through a temporary name, so a step cut halfway leaves no file
  and is done again).

  Args:
    path: the step's JSON file, which says the step is done.
    make: make() -> dict, does the step.
    keep: keep(result) -> bool, whether the earlier result still holds (the same
      settings, what it made still there); default: it does.
    log: log(message), told when an earlier result is kept.

  Returns:
    The result as read back from its JSON, the same whether made now or kept.
  """
  if os.path.exists(path):
    earlier = read_json(path)
    if keep(earlier):
      log(f"{path}: done by an earlier run, kept")
      return earlier
  _write_step(path, make())
  return read_json(path)


# What cannot change a measurement: edited while a benchmark runs, it leaves the run at
# its commit (git pathspecs).
NOT_MEASURED = (":!tests", ":!docs", ":!*.md", ":!benchmarks/results")


def commit() -> str:
  """The checkout's commit (git rev-parse HEAD), with '+modified' when a tracked file that
  can change a measurement (all but NOT_MEASURED) differs from it: a result says what code
  made it. '' outside a git checkout."""
  try:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.strip()
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                              ".", *NOT_MEASURED],
                             cwd=REPO, capture_output=True, text=True, check=True).stdout
  except (OSError, subprocess.CalledProcessError):
    return ""
  return head + ("+modified" if changed.strip() else "")


def recorded(make):
  """make, recording how it ran: a function that calls make() -> dict and returns it with
  `provenance`: the commit, when it started (ISO 8601), its wall seconds and the load
  average (1, 5, 15 minutes) at its start and end, which say whether other work shared
  the machine. For `cached`: a kept step keeps the provenance of the run that made it."""
  def run() -> dict:
    made_by, start_load = commit(), os.getloadavg()  # the code as it was when it started
    started, start = time.strftime("%Y-%m-%dT%H:%M:%S%z"), time.perf_counter()
    result = make()
    return dict(result, provenance=dict(
        commit=made_by, started=started, seconds=round(time.perf_counter() - start, 1),
        load_average_at_start=[round(x, 2) for x in start_load],
        load_average_at_end=[round(x, 2) for x in os.getloadavg()]))
  return run


def run_process(command: list, log_path: str, env: dict | None = None,
                rss_every: float = 0.0) -> dict:
  """`command` run from the repository as a process of its own, its output (stdout and
  stderr) into `log_path`, with the repository on its PYTHONPATH and TensorFlow's C++ log
  at warnings.

  Args:
    command: the argv.
    log_path: the file its output goes to.
    env: variables set over this process's environment.
    rss_every: > 0: its RSS is sampled this often (seconds), for where a peak falls.

  Returns:
    dict(seconds: its wall time, peak_rss_bytes: its peak resident memory from its own
    rusage (every byte it held, the children it waited for included), output: all it
    printed; with rss_every, rss_samples: [(seconds since start, RSS bytes)] and
    started: its start as a Unix time, to place the samples against its log's lines).

  Raises:
    RuntimeError: it failed (its output's tail in the message).
  """
  env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
  begin, started = time.monotonic(), time.time()
  with open(log_path, "w") as out:
    process = subprocess.Popen(  # pylint: disable=consider-using-with  (reaped by wait4)
        command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    sampler = PeakSampler(process.pid, rss_every) if rss_every else contextlib.nullcontext()
    with sampler:
      _, status, usage = os.wait4(process.pid, 0)
  seconds = time.monotonic() - begin
  code = os.waitstatus_to_exitcode(status)
  with open(log_path, errors="replace") as f:
    output = f.read()
  if code != 0:
    raise RuntimeError(f"{' '.join(command[:6])} exited {code}:\n{output[-4000:]}")
  done = dict(seconds=seconds, peak_rss_bytes=usage.ru_maxrss * 1024, output=output)
  if rss_every:
    done.update(rss_samples=sampler.samples, started=started)
  return done


class Phases:
  """A benchmark's phases, each run in a process of its own: a phase's memory is its own
  and goes back to the system when it ends, so one phase never inflates the next one's
  reading (and a phase that fails leaves the parent standing).

  The parent's `run` starts `python -m <module> <the benchmark's own flags> --phase=<phase>
  --kind=<kind> --work_dir=<work>` (its output in <work>/<phase>[-<kind>].log); the child,
  the same module's `main` seeing --phase, calls `child(args)`, which runs
  functions[phase](args, work) and writes its result to <work>/<phase>[-<kind>].json, where
  the parent reads it.

  Args:
    module: the benchmark's module ("benchmarks.scale").
    functions: phase name → function(args, work) -> dict (JSON).
    env: variables set for every phase's process.
    log: log(message): a line per phase done.
  """

  def __init__(self, module: str, functions: dict, env: dict | None = None, log=print):
    self.module, self.functions, self.env, self.log = module, functions, env or {}, log

  def parse(self, parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """parser's arguments of `argv` (default: the command line), with a child's flags
    (--phase, --kind: hidden from --help) and `argv` itself (args.argv, the flags every
    child is given again)."""
    parser.add_argument("--phase", default="", help=argparse.SUPPRESS)
    parser.add_argument("--kind", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args

  @staticmethod
  def path(work: str, phase: str, kind: str = "", suffix: str = ".json") -> str:
    """<work>/<phase>[-<kind>]<suffix>: where a phase's result (and its log) goes."""
    return os.path.join(work, f"{phase}{'-' + kind if kind else ''}{suffix}")

  def run(self, args, work: str, phase: str, kind: str = "", keep=lambda result: False,
          env: dict | None = None) -> dict:
    """The parent's side: `phase` (for `kind`) in a child process; its result.

    Args:
      args: the benchmark's parsed arguments (their argv is the child's too).
      work: the work directory, the child's --work_dir.
      phase: a name of `functions`.
      kind: the child's --kind ("": none).
      keep: keep(result) -> bool: whether the result of this phase an earlier run left in
        `work` still holds (see `cached`); default: the phase runs again.
      env: variables set for this phase's process alone.

    Raises:
      RuntimeError: the child failed (its log's tail in the message).
    """
    path = self.path(work, phase, kind)

    def child() -> dict:
      command = [sys.executable, "-m", self.module, *args.argv, f"--phase={phase}",
                 f"--kind={kind}", f"--work_dir={work}"]
      done = run_process(command, self.path(work, phase, kind, ".log"),
                         dict(self.env, **(env or {})))
      self.log(f"{phase}{' ' + kind if kind else ''} done in {done['seconds']:.0f}s, peak "
               f"RSS {gib(done['peak_rss_bytes'])} GiB")
      return read_json(path)

    return cached(path, child, keep, self.log)

  def child(self, args) -> int:
    """The child's side: functions[args.phase](args, args.work_dir), its result written
    where the parent reads it. Returns 0, the process's exit code."""
    if args.phase not in self.functions:
      raise SystemExit(f"unknown phase {args.phase!r} (of {', '.join(self.functions)})")
    result = self.functions[args.phase](args, args.work_dir)
    _write_step(self.path(args.work_dir, args.phase, args.kind), result)
    return 0


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


def share_stderr(share: float, n: int) -> float:
  """One binomial standard error of a share measured over `n` trials."""
  return math.sqrt(max(share * (1 - share), 0.0) / max(n, 1))


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


class BackgroundLoop:
  """`_run` on a daemon thread while in its `with`; `_stop` (an Event) is set on exit,
  which `_run` polls or waits on, and the exit joins the thread."""

  def __init__(self):
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)

  def _run(self):
    raise NotImplementedError

  def __enter__(self):
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join()


class PeakSampler(BackgroundLoop):
  """Samples a process's RSS on a thread while in its `with`: `samples`, [(seconds since
  the sampler was made, RSS bytes)], and `peak`, the largest (VmHWM cannot be reset, so a
  peak within one stretch of a long process is sampled)."""

  def __init__(self, pid: int, every: float = 0.05):
    super().__init__()
    self.pid, self.every, self.samples = pid, every, []
    self._begin = time.monotonic()

  @property
  def peak(self) -> int:
    return max((rss for _, rss in self.samples), default=0)

  def _run(self):
    while not self._stop.is_set():
      try:
        rss = rss_bytes(self.pid)
      except OSError:  # it has ended
        return
      if rss:  # 0: a zombie's status has no VmRSS
        self.samples.append((round(time.monotonic() - self._begin, 2), rss))
      self._stop.wait(self.every)


def inode_sizes(path: str, on_disk: bool = False) -> dict:
  """{(device, inode): bytes} of the files under `path`, a file hard-linked several times
  once: its size, or (on_disk) the blocks the disk holds for it, as `du` counts them. A
  file removed while the tree is walked is passed over."""
  sizes = {}
  for root, _, names in os.walk(path):
    for name in names:
      try:
        stat = os.lstat(os.path.join(root, name))
      except FileNotFoundError:
        continue
      sizes[(stat.st_dev, stat.st_ino)] = stat.st_blocks * 512 if on_disk else stat.st_size
  return sizes


def du_bytes(path: str, on_disk: bool = False) -> int:
  """Bytes of the files under `path`, hard links counted once: their sizes, or (on_disk)
  what the disk holds for them (`inode_sizes`)."""
  return sum(inode_sizes(path, on_disk).values())


class DiskPeakSampler(BackgroundLoop):
  """Samples the disk held under a directory (du_bytes, on disk) on a thread while in its
  `with`; `peak` is the largest sample, `samples` how many were taken. Why: a step's
  largest disk use can come and go inside it (an import beside the release it reads, an
  export beside the run), which a reading after the step misses."""

  def __init__(self, path: str, every: float = 5.0):
    super().__init__()
    self.path, self.every, self.peak, self.samples = path, every, 0, 0

  def _sample(self):
    self.peak = max(self.peak, du_bytes(self.path, on_disk=True))
    self.samples += 1

  def _run(self):
    while True:
      self._sample()
      if self._stop.wait(self.every):
        return

  def __exit__(self, *exc):
    super().__exit__(*exc)
    self._sample()  # the step's end, however short it was


def gib(n: float, digits: int = 3) -> float:
  """`n` bytes in GiB, rounded to `digits`."""
  return round(n / 2**30, digits)


def read_questions(limit: int, fill: bool = False) -> list[str]:
  """Up to `limit` NQ-Open questions from the shared data (its files in name order).
  fill: exactly `limit`, the questions repeated as needed, and without the shared data the
  warm-up's question varied."""
  path = os.path.join(SHARED_DATA, "openqa", "nq_open")
  names = sorted(os.listdir(path)) if os.path.isdir(path) or not fill else []
  questions = []
  for name in (n for n in names if n.endswith(".jsonl")):
    with open(os.path.join(path, name)) as f:
      for line in f:
        questions.append(json.loads(line)["question"])
        if len(questions) >= limit:
          return questions
  if not fill:
    return questions
  questions = questions or [f"who wrote the iliad {i}?" for i in range(limit)]
  return (questions * (limit // len(questions) + 1))[:limit]


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
