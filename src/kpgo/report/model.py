"""The report as data: sections of paragraphs, tables and figures, rendered to HTML and Markdown by
kpgo.report.render, and each section's numbers kept raw for report.json."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Table:
    caption: str  # says how the numbers were measured
    header: list[str]
    rows: list[list[str]]
    numeric: list[bool]  # right-aligned columns


@dataclass
class Figure:
    id: str
    caption: str  # shown under the figure; says how it was measured
    alt: str  # short, also names the measurement
    png: bytes


Block = str | Table | Figure  # a str is a paragraph


@dataclass
class Section:
    id: str
    number: int
    title: str
    measured: str  # one line: accelerator, clock or counters, design
    blocks: list[Block] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Skipped:
    id: str
    number: int
    title: str
    reason: str


@dataclass
class Report:
    title: str
    run_dir: str
    sections: list[Section]
    skipped: list[Skipped]

    def skipped_line(self) -> str:
        if not self.skipped:
            return "All sections present."
        return "Skipped: " + "; ".join(f"{s.number} {s.title} ({s.reason})" for s in self.skipped) + "."


# -- number formatting shared by tables (the tests format results.json values the same way) --------------------


def missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def num(x: Any) -> str:
    """A measured value: thousands separators for large values, 4 significant digits for small ones."""
    if missing(x):
        return "–"
    x = float(x)
    if abs(x) >= 100:
        return f"{x:,.1f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.4g}"


def pct(x: Any) -> str:
    return "–" if missing(x) else f"{float(x):.1%}"


def ratio(x: Any) -> str:
    return "–" if missing(x) else f"{float(x):.3f}"


def ci(lo: Any, hi: Any) -> str:
    """The 95% CI, or why there is none (a bootstrap needs two boots on each side)."""
    if missing(lo) or missing(hi):
        return "[n<2]"
    return f"[{float(lo):.3f}, {float(hi):.3f}]"


def ratio_ci(row: dict[str, Any], key: str = "ratio") -> str:
    """'1.127 [1.051, 1.211]' with '*' when the CI includes 1.0 (no difference shown)."""
    star = "*" if row.get("ci_includes_1", True) else ""
    return f"{ratio(row.get(key))} {ci(row.get('ci_low'), row.get('ci_high'))}{star}"


def size(x: Any) -> str:
    return "–" if missing(x) else f"{int(x):,}"
