"""The ways the served reader can run, measured side by side by benchmarks/serving.py (speed)
and benchmarks/serving_memory.py (memory over hand-overs), named once here so both measure
the same things and the shipped one is read from the code's own defaults.

  baseline     as shipped today: passes of realm_tf.export's MAX_BLOCKS_PER_PASS blocks,
               each read at the shortest READER_LENGTH_STEP multiple that holds it, no XLA,
               oneDNN off (`python -m serving.server`'s default)
  full_length  baseline read at the reader's full length: what padding per pass saves
  xla          baseline with the reader's pass XLA-compiled (realm_tf.export --reader_xla;
               the server with --xla_cpu_compilation_enabled)
  onednn       baseline with TensorFlow's oneDNN kernels on (TF_ENABLE_ONEDNN_OPTS=1)
  xla_onednn   both

Why a process per variant: TensorFlow reads TF_ENABLE_ONEDNN_OPTS once, when it loads, so
oneDNN on and off cannot share a process; every variant gets its own, alike.
"""
import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class Variant:
  """How a realm_qa export is built and served.

  Attributes:
    name: the variant's name in results.
    reader_xla: the export's reader pass XLA-compiled (QAModule's reader_xla).
    onednn: TF_ENABLE_ONEDNN_OPTS of every process that runs it ("0" or "1").
    reader_length_step: the export's reader length step; None: realm_tf.export's default.
  """
  name: str
  reader_xla: bool = False
  onednn: str = "0"
  reader_length_step: Optional[int] = None

  def env(self) -> dict:
    """The environment of a process that runs this variant."""
    return {"TF_ENABLE_ONEDNN_OPTS": self.onednn}

  def server_flags(self) -> list[str]:
    """serving.server flags this variant needs (the binary's, as a deployment passes
    them)."""
    return ["--xla_cpu_compilation_enabled=true"] if self.reader_xla else []

  def length_step(self) -> int:
    from realm_tf.export.assembly import READER_LENGTH_STEP  # noqa: PLC0415  TensorFlow loads with it; callers choose when
    return READER_LENGTH_STEP if self.reader_length_step is None else self.reader_length_step


VARIANTS = {v.name: v for v in (
    Variant("baseline"),
    Variant("full_length", reader_length_step=0),
    Variant("xla", reader_xla=True),
    Variant("onednn", onednn="1"),
    Variant("xla_onednn", reader_xla=True, onednn="1"),
)}


def parse(names: str) -> list[Variant]:
  """Comma-separated variant names → Variants, in order.

  Raises:
    ValueError: an unknown name (the known ones listed) or none at all.
  """
  chosen = [n.strip() for n in names.split(",") if n.strip()]
  unknown = [n for n in chosen if n not in VARIANTS]
  if unknown or not chosen:
    raise ValueError(f"unknown variants {unknown or '(none given)'}; variants are "
                     f"{', '.join(VARIANTS)}")
  return [VARIANTS[n] for n in chosen]


def shipped() -> Variant:
  """The variant that ships: realm_tf.export.assembly.READER_XLA (the export's default) and
  the server's oneDNN default (off), at the default length step. Flipping READER_XLA flips
  this."""
  from realm_tf.export.assembly import READER_XLA  # noqa: PLC0415  TensorFlow loads with it; callers choose when
  return next(v for v in VARIANTS.values()
              if v.reader_xla == READER_XLA and v.onednn == "0" and v.reader_length_step is None)


def save_export(run, variant: Variant, out_dir: str) -> str:
  """`run`'s realm_qa built as `variant` (realm_tf.export's passes, the variant's length
  step and reader_xla), published as <out_dir>/realm_qa/1 with the provenance
  realm_tf.export writes (deploy/entrypoint.sh reads its reader_xla); the version path."""
  from realm_tf.export import exporter  # noqa: PLC0415  TensorFlow loads with it; callers choose when
  step = variant.length_step()
  provenance = dict(run.provenance("realm_qa"), max_blocks_per_pass=exporter.MAX_BLOCKS_PER_PASS,
                    reader_length_step=step, reader_xla=variant.reader_xla)
  return exporter.save_export(
      exporter.build_module(run, "realm_qa", exporter.MAX_BLOCKS_PER_PASS, step,
                            reader_xla=variant.reader_xla),
      out_dir, "realm_qa", 1, provenance, exporter.warmup_requests("realm_qa", run))
