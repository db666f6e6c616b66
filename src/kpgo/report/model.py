"""The report as data: sections of paragraphs, tables and figures, rendered to HTML and Markdown by
kpgo.report.render, and each section's numbers kept raw for report.json."""

from __future__ import annotations

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


@dataclass
class Preformatted:
    """Text shown as it is, in fixed-width lines (the bench's terminal tables in summary.md)."""

    text: str


Block = str | Table | Figure | Preformatted  # a str is a paragraph


@dataclass(frozen=True)
class Heading:
    """A section's place in the report, registered once (kpgo.report.sections): its number, its id (its key in
    report.json, its anchor in report.html) and its title."""

    number: int
    id: str
    title: str


@dataclass
class Headed:
    """A section or a skipped one: its number, id and title are its heading's."""

    heading: Heading

    @property
    def number(self) -> int:
        return self.heading.number

    @property
    def id(self) -> str:
        return self.heading.id

    @property
    def title(self) -> str:
        return self.heading.title


@dataclass
class Section(Headed):
    measured: str  # one line: accelerator, clock or counters, design
    blocks: list[Block] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Skipped(Headed):
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

