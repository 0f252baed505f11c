"""Draws docs/architecture.png: realm_tf's processes and the directories between them.

    python docs/architecture.py [--output docs/architecture.png]

Processes (rounded boxes) never call each other: each publishes into a directory (square
boxes; local disk or GCS) by writing files and committing a manifest last, and the next
one polls for committed versions. Re-run this script after changing the picture; the PNG
is committed beside it for docs/design.md.
"""
import argparse
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

PROCESS = dict(facecolor="#dbe9f6", edgecolor="#2b5d8a")
STORE = dict(facecolor="#fdf1d6", edgecolor="#9a6d12")
CLIENT = dict(facecolor="#e3f2e1", edgecolor="#3c7a35")


def box(ax, x, y, w, h, title, lines, style, rounded=True):
  """A box with a bold title and smaller lines below it; returns its anchor points."""
  shape = "round,pad=0.02,rounding_size=0.12" if rounded else "square,pad=0.02"
  ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle=shape, linewidth=1.6, **style))
  ax.text(x + w / 2, y + h - 0.2, title, ha="center", va="top", fontsize=10.5,
          fontweight="bold")
  ax.text(x + w / 2, y + h - 0.55, "\n".join(lines), ha="center", va="top", fontsize=8.2,
          linespacing=1.35)
  return dict(left=(x, y + h / 2), right=(x + w, y + h / 2), top=(x + w / 2, y + h),
              bottom=(x + w / 2, y), x=x, y=y, w=w, h=h)


def arrow(ax, start, end, label="", color="#333333", rad=0.0, label_at=0.5, dy=0.12,
          dx=0.0, dashed=False):
  ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14,
                               linewidth=1.4, color=color, linestyle="--" if dashed else "-",
                               connectionstyle=f"arc3,rad={rad}", shrinkA=2, shrinkB=2))
  if label:
    x = start[0] + (end[0] - start[0]) * label_at + dx
    y = start[1] + (end[1] - start[1]) * label_at + dy
    ax.text(x, y, label, ha="center", va="bottom", fontsize=7.8, color=color,
            bbox=dict(facecolor="white", edgecolor="none", alpha=0.85, pad=0.6))


def draw(path: str):
  fig, ax = plt.subplots(figsize=(15, 8.6))
  ax.set_xlim(0, 15)
  ax.set_ylim(0, 8.6)
  ax.axis("off")
  ax.text(7.5, 8.55, "realm_tf: processes talk only through the file system (local disk or "
          "GCS); every output is written, then committed by a manifest written last",
          ha="center", va="top", fontsize=12, fontweight="bold")

  raw = box(ax, 0.2, 6.3, 2.5, 1.5, "Raw text", ["Wikipedia XML dump,", "CC-News, or",
                                                 "{title, text} JSON lines"], STORE, False)
  prep = box(ax, 3.3, 6.0, 3.0, 2.0, "Corpus pipeline", [
      "python -m beam.preprocess", "Apache Beam: Direct or Dataflow", "sentences → blocks;",
      "salient spans: CoNLL tagger", "(RunInference) or title gazetteer,", "+ dates"],
      PROCESS)
  corpus = box(ax, 6.9, 6.3, 2.6, 1.5, "corpus dir", ["blocks-*  pretraining-*  ict-*",
                                                      "dead_letter-*", "manifest.json (last)"],
               STORE, False)
  trainer = box(ax, 9.9, 5.6, 4.9, 2.4, "Trainer: python -m realm_tf.train", [
      "tasks ict | pretrain | openqa (tf-models Task + orbit)",
      "TPUStrategy / MirroredStrategy / CPU; in the step:",
      "query tower → exact MIPS over block embeddings sharded",
      "across replicas (x's own block excluded, + null doc)",
      "→ knowledge-augmented encoder / reader:",
      "p(y|x) = Σ_z p(y|z,x) p(z|x)"], PROCESS)
  snapshots = box(ax, 9.9, 3.2, 2.3, 1.5, "model_dir/export/", [
      "query_encoder/<step>/", "block_encoder/<step>/", "(SavedModel snapshots)"],
      STORE, False)
  index = box(ax, 12.6, 3.2, 2.2, 1.5, "model_dir/index/", [
      "<step>/ embedding shards", "(+ ScaNN), manifest last;", "old versions GC'd"],
      STORE, False)
  builder = box(ax, 5.4, 3.0, 3.7, 2.0, "Index builder", [
      "python -m beam.index_builder (child of", "the trainer, other machines, Dataflow);",
      "first index: beam.embed_corpus;", "RunInference embeds every block;",
      "stops at TRAINING_DONE"], PROCESS)
  checkpoints = box(ax, 0.2, 3.2, 2.8, 1.5, "model_dir/", [
      "checkpoints/  params.yaml", "metrics.jsonl  eval/", "TRAINING_DONE"], STORE, False)
  export = box(ax, 0.2, 0.3, 2.9, 2.2, "Export", [
      "python -m realm_tf.export", "(a checkpoint + the newest index)",
      "realm_qa: question → answer,", "blocks, titles, p(z|x);",
      "realm_qa_scann, reader, encoders"], PROCESS)
  models = box(ax, 3.7, 0.4, 2.6, 2.0, "/models/<kind>/<ver>/", [
      "TF Serving layout,", "saved_model.pb last;", "warm-up requests,",
      "realm_provenance.json"], STORE, False)
  server = box(ax, 6.9, 0.3, 3.6, 2.2, "Model server", [
      "python -m serving.server", "(TF Serving's gRPC PredictionService,",
      "ModelService, REST), or a real", "tensorflow_model_server on the", "same directories"],
      PROCESS)
  clients = box(ax, 11.1, 0.4, 3.7, 2.0, "Clients", [
      "python -m serving.client", "any TF Serving API stub (gRPC)", "or REST JSON:",
      "answer + source titles + p(z|x)"], CLIENT)

  arrow(ax, raw["right"], prep["left"], "read")
  arrow(ax, prep["right"], corpus["left"], "commit")
  arrow(ax, corpus["right"], (trainer["x"], 7.05), "blocks, x", dy=0.08)
  arrow(ax, (snapshots["x"] + 1.15, trainer["y"]), snapshots["top"],
        "snapshot every\nrefresh_every_steps", label_at=0.5, dy=-0.25, dx=-0.85)
  arrow(ax, snapshots["left"], (builder["x"] + builder["w"], snapshots["y"] + 0.75),
        "newest", dy=0.08)
  arrow(ax, (corpus["x"] + 1.3, corpus["y"]), (builder["x"] + 2.6, builder["y"] +
                                                builder["h"]), "blocks", label_at=0.35,
        dy=0.0)
  arrow(ax, (builder["x"] + 3.2, builder["y"]), index["bottom"], "commit index <step>",
        rad=0.15, label_at=0.5, dy=-0.5)
  arrow(ax, index["top"], (index["x"] + 1.1, trainer["y"]), "swap newest\nbetween loops",
        label_at=0.5, dy=-0.25, dx=-0.7)
  arrow(ax, (trainer["x"], trainer["y"] + 0.3), checkpoints["right"], "checkpoints",
        rad=0.05, label_at=0.82, dy=0.05)
  arrow(ax, checkpoints["bottom"], (export["x"] + 1.4, export["y"] + export["h"]))
  arrow(ax, export["right"], models["left"], "publish")
  arrow(ax, models["right"], server["left"], "poll, load,\nwarm up", dy=0.05)
  arrow(ax, clients["left"], server["right"], "Predict", dy=0.05)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--output", default=os.path.join(os.path.dirname(
      os.path.abspath(__file__)), "architecture.png"))
  args = parser.parse_args(argv)
  draw(args.output)
  print(args.output)


if __name__ == "__main__":
  main()
