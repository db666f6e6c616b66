"""`kpgo report`: one run directory -> report.html (self-contained), report.md and report.json.

    generate(run_dir, out_dir, compare=None) -> Report   reads the run, builds every section its data support
    write(report, out_dir) -> list[Path]                 renders all three forms, then writes each atomically

Sections, their data and how each was measured: docs/REPORT.md."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kpgo.records import KernelInfo
from kpgo.report.model import Report, Section, Skipped

if TYPE_CHECKING:
    from kpgo.report.load import RunData

FILES = ("report.html", "report.md", "report.json")


def generate(run_dir: Path, out_dir: Path, compare: Path | None = None) -> Report:
    from kpgo.report import load, sections

    data = load.load(Path(run_dir))
    other = load.load(Path(compare)) if compare is not None else None
    ctx = sections.Context(data, Path(out_dir))
    built: list[Section] = []
    skipped: list[Skipped] = []
    builders = list(sections.BUILDERS)
    if other is not None:
        from kpgo.report import compare as cmp

        builders.append(lambda c: cmp.section(c, other))
    for build in builders:
        s = build(ctx)
        if isinstance(s, Section):
            built.append(s)
        else:
            skipped.append(s)
    return Report(title=_title(data), run_dir=data.shown(data.run_dir.resolve()) or str(data.run_dir), sections=built, skipped=skipped)


def _title(data: RunData) -> str:
    kern = data.run.kernel if data.run else KernelInfo()
    names = data.workload_names()
    what = " ".join(x for x in (kern.config, "kernel", kern.version) if x)
    return f"kpgo report: {what}" + (f", workloads {', '.join(names)}" if names else "")


def clean(obj: Any) -> Any:
    """NaN and infinities become null: report.json is strict JSON (a CI that could not be computed is null)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj


def write(report: Report, out_dir: Path) -> list[Path]:
    """Render everything first (an interruption then leaves the old files), then replace each file atomically."""
    from kpgo import atomic
    from kpgo.report import render

    texts = {
        "report.html": render.html_page(report),
        "report.md": render.markdown(report),
        "report.json": json.dumps(clean(render.json_doc(report)), indent=2, sort_keys=True, allow_nan=False) + "\n",
    }
    paths = []
    for name in FILES:
        atomic.write_text(Path(out_dir) / name, texts[name])
        paths.append(Path(out_dir) / name)
    return paths
