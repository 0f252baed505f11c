"""The progress line and per-loop history: step, loss, examples/s, ETA."""
import logging
import time

import numpy as np

from realm_tf.io.layout import append_metrics


def _scalar(value):
  try:
    return float(np.asarray(value))
  except (TypeError, ValueError):
    return value


class ProgressReporter:
  """An orbit train action: logs one line per train loop and appends metrics.jsonl (when
  this process writes it)."""

  def __init__(self, model_dir: str, global_step, total_steps: int, global_batch_size: int,
               mode: str, write_metrics: bool = True):
    self.model_dir = model_dir
    self.write_metrics = write_metrics  # the chief's job only (realm_tf.io.roles)
    self.global_step = global_step
    self.total_steps = total_steps
    self.global_batch_size = global_batch_size
    self.mode = mode
    self._last_step = int(global_step.numpy())
    self._last_time = time.time()

  def __call__(self, output: dict):
    step = int(self.global_step.numpy())
    now = time.time()
    elapsed = max(now - self._last_time, 1e-9)
    steps = step - self._last_step
    examples_per_second = steps * self.global_batch_size / elapsed
    steps_per_second = steps / elapsed
    eta = (self.total_steps - step) / steps_per_second if steps_per_second > 0 else float("inf")
    self._last_step, self._last_time = step, now
    record = {k: _scalar(v) for k, v in (output or {}).items()}
    record.update(step=step, time=now, examples_per_second=examples_per_second, mode=self.mode)
    if self.write_metrics:
      append_metrics(self.model_dir, record)
    extras = "".join(f" {k} {record[k]:.4g}" for k in sorted(record)
                     if k not in ("step", "time", "examples_per_second", "mode", "loss")
                     and isinstance(record[k], float))
    logging.info("[%s] step %d/%d loss %.4f%s | %.1f examples/s | ETA %s", self.mode, step,
                 self.total_steps, record.get("loss", float("nan")), extras,
                 examples_per_second, _duration(eta))


def _duration(seconds: float) -> str:
  if not np.isfinite(seconds):
    return "?"
  seconds = int(seconds)
  return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"
