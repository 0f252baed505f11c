"""Draws docs/packages.png: realm_tf's packages in their layers, from `.importlinter`.

    python docs/packages.py [--output docs/packages.png]

The picture is read from the contract that `make test` enforces (`lint-imports`), so it
cannot drift from what the code does: one row per layer, top to bottom; a package may
import the rows below its own, never those above. Siblings separated by `|` in the
contract must not import each other (drawn apart), those separated by `:` may (drawn
joined). Each box lists the package's modules. The entry points outside the library
(`beam/`, `serving/`, `benchmarks/`) sit on top: they import realm_tf, never the reverse.
"""
import argparse
import configparser
import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRY = dict(facecolor="#e3f2e1", edgecolor="#3c7a35")
LAYER = dict(facecolor="#dbe9f6", edgecolor="#2b5d8a")
FOUNDATION = dict(facecolor="#fdf1d6", edgecolor="#9a6d12")


def read_layers(path: str) -> list[list[list[str]]]:
  """The layers contract's rows: [row][group of siblings that may import each other][name].

  `a | b` is two groups (independent), `a : b` one group of two."""
  parser = configparser.ConfigParser()
  parser.read(path)
  text = parser["importlinter:contract:layers"]["layers"]
  rows = []
  for line in text.strip().splitlines():
    groups = [[name.strip() for name in group.split(":")] for group in line.split("|")]
    rows.append(groups)
  return rows


def modules_of(package: str, root: str) -> list[str]:
  """The modules (files and subpackages) directly in realm_tf/<package>, or the module
  itself for a top-level module such as realm_tf/train.py."""
  path = os.path.join(root, package)
  if not os.path.isdir(path):
    return [f"{package}.py"]
  names = []
  for entry in sorted(os.listdir(path)):
    if entry.startswith("_") or entry in ("vocab", "results"):
      continue
    if entry.endswith(".py"):
      names.append(entry[:-3])
    elif os.path.isdir(os.path.join(path, entry)) and re.match(r"^[a-z_]+$", entry):
      names.append(entry + "/")
  return names


def draw(output: str):
  rows = read_layers(os.path.join(REPO, ".importlinter"))
  root = os.path.join(REPO, "realm_tf")
  rows = [[[f"{d}/" for d in ("beam", "serving", "benchmarks")]]] + rows
  width, row_height, gap = 16.0, 1.05, 0.3
  fig, ax = plt.subplots(figsize=(width, (row_height + gap) * len(rows) + 0.6))
  ax.set_xlim(0, width)
  ax.set_ylim(0, (row_height + gap) * len(rows) + 0.2)
  ax.axis("off")
  for r, groups in enumerate(rows):
    y = (row_height + gap) * (len(rows) - 1 - r) + 0.2
    names = [n for g in groups for n in g]
    slot = (width - 0.4) / len(names)
    x = 0.2
    style = ENTRY if r == 0 else (FOUNDATION if r >= len(rows) - 2 else LAYER)
    for group in groups:
      w = slot * len(group) - 0.15
      ax.add_patch(FancyBboxPatch((x, y), w, row_height, linewidth=1.4,
                                  boxstyle="round,pad=0.02,rounding_size=0.08", **style))
      for i, name in enumerate(group):
        cx = x + slot * i + (slot - 0.15) / 2
        title = name if r == 0 else f"realm_tf.{name}"
        ax.text(cx, y + row_height - 0.12, title, ha="center", va="top", fontsize=9.5,
                fontweight="bold")
        modules = modules_of(name.rstrip("/"), REPO if r == 0 else root)
        if modules:
          per_line = max(3, int((slot - 0.15) / 1.4))  # wide boxes take longer lines
          lines = [", ".join(modules[i:i + per_line])
                   for i in range(0, len(modules), per_line)]
          ax.text(cx, y + row_height - 0.38, "\n".join(lines), ha="center", va="top",
                  fontsize=7.6, linespacing=1.2)
      x += slot * len(group)
  ax.set_title("realm_tf packages, top-down: each row imports only the rows below it "
               "(checked by lint-imports in make test)", fontsize=11)
  fig.tight_layout()
  fig.savefig(output, dpi=110)


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--output", default=os.path.join(REPO, "docs", "packages.png"))
  draw(parser.parse_args().output)


if __name__ == "__main__":
  main()
