"""How kpgo shows its numbers, wherever it shows them: the terminal tables of `kpgo bench` (kpgo.bench.format_table),
RUN/summary.md (kpgo.report.summary) and the report (kpgo.report.sections, .render, .figures) all take from here:

- a ratio with its 95% CI, the '*' that marks a CI including 1.0 (no difference shown) and the footnote saying so;
- measured values, shares and sizes;
- the names of metrics for people;
- tables in Markdown and HTML (the terminal's fixed-width columns are kpgo.bench.format_table's alone).

No I/O and no third-party imports: the bench and the run import it too."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from kpgo.records import Results, Stat
from kpgo.report.model import Table


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


def size(x: Any) -> str:
    return "–" if missing(x) else f"{int(x):,}"


# -- ratios, their CIs and the '*' ---------------------------------------------------------------------------------

MARK = "*"
NO_DIFFERENCE = "no difference shown at this sample size"


def ratio(x: Any) -> str:
    return "–" if missing(x) else f"{float(x):.3f}"


RANGE = "range"  # kpgo.stats.RANGE: the ci_method of a ratio with fewer than 2 boots on a side
BOOTSTRAP_TEXT = "percentile bootstrap over boots"  # the interval of results.json before it named its method


def ci(lo: Any, hi: Any, method: str | None = None) -> str:
    """The 95% CI, the range where there is none (method RANGE: fewer than 2 boots on a side), or '[n<2]' for a
    record of before ranges."""
    if missing(lo) or missing(hi):
        return "[n<2]"
    if method == RANGE:
        return f"range {float(lo):.3f}–{float(hi):.3f}"
    return f"[{float(lo):.3f}, {float(hi):.3f}]"


def boots_count(per_kernel: int | None, by_workload: dict[str, int] | None) -> tuple[str, str]:
    """How many boots each cell had: one number, or with --precision's rounds added for some workloads the range, and
    beside it which workloads got more than the first rounds."""
    ns = sorted(set((by_workload or {}).values()))
    if per_kernel is None or len(ns) < 2:
        return ("?" if per_kernel is None else str(per_kernel)), ""
    more = ", ".join(f"{w} {n}" for w, n in sorted((by_workload or {}).items(), key=lambda x: (-x[1], x[0])) if n > ns[0])
    return f"{ns[0]}–{ns[-1]}", f"{more}; the others {ns[0]}"


def boots_text(per_kernel: int | None, by_workload: dict[str, int] | None) -> str:
    n, more = boots_count(per_kernel, by_workload)
    return f"{n} boots per kernel and workload" + (f" ({more})" if more else "")


def interval_text(results: Results | Mapping[str, Any] | None) -> str:
    """How a bench's intervals were computed, as its results.json says (kpgo.stats.METHOD_TEXT since it says so)."""
    text = results.design.interval if isinstance(results, Results) else ((results or {}).get("design") or {}).get("interval")
    return text if isinstance(text, str) and text else BOOTSTRAP_TEXT


def stat(row: Stat | Mapping[str, Any], key: str = "ratio") -> Stat:
    """A ratio of results.json as a Stat (the bench's terminal tables hand its dicts); key "speedup": the speedup
    as its ratio."""
    s = row if isinstance(row, Stat) else Stat.from_json(dict(row))
    return replace(s, ratio=s.speedup) if key == "speedup" else s


def no_difference(row: Stat | Mapping[str, Any]) -> bool:
    """Whether a ratio of results.json (a summary row, a simulated metric, a geometric mean) gets the mark: the bench
    stored whether its CI includes 1.0 (kpgo.stats.includes_one); a row without that verdict shows no difference."""
    return bool(stat(row).ci_includes_1)


def mark(row: Stat | Mapping[str, Any], pad: bool = False) -> str:
    """'*' when the row's CI includes 1.0; else nothing, or a space (pad) to keep terminal columns aligned."""
    return MARK if no_difference(row) else " " if pad else ""


def ratio_ci(row: Stat | Mapping[str, Any], key: str = "ratio", pad: bool = False) -> str:
    """'1.127 [1.051, 1.211]', with the mark when the CI includes 1.0 (or a space instead, with pad)."""
    s = stat(row, key)
    return f"{ratio(s.ratio)} {ci(s.ci_low, s.ci_high, s.ci_method)}{mark(s, pad)}"


def footnote(interval: str = "95% CI", meaning: str = NO_DIFFERENCE) -> str:
    """What the mark means: '* the 95% CI includes 1.0: no difference shown at this sample size' under tables;
    figure captions name the interval shorter and may leave the meaning out ('')."""
    return f"{MARK} the {interval} includes 1.0 (or only a range was possible)" + (f": {meaning}" if meaning else "")


# -- metric names --------------------------------------------------------------------------------------------------

# Simulated counts (the COUNT of results.json's SIDE_COUNT_per_op): the name, and the short one of the narrow
# columns of the terminal tables and summary.md.
COUNTS = {
    "insns": ("instructions", "insns"),
    "l1i_misses": ("L1i misses", "L1i misses"),
    "itlb_misses": ("iTLB misses", "iTLB misses"),
    "itlb_4k_misses": ("iTLB misses on 4 KiB pages", "iTLB 4k misses"),
    "taken_branches": ("taken branches", "taken branches"),
    "indirect_branches": ("indirect branches", "indirect branches"),
}
SHARE_COUNTS = {"kernel_insn_share": "insns", "kernel_l1i_share": "l1i_misses", "kernel_itlb_share": "itlb_misses"}  # of which count


def count_title(count: str, short: bool = False) -> str:
    """'insns' -> 'instructions' ('insns' short)."""
    return COUNTS[count][1 if short else 0]


def metric_title(key: str, short: bool = False) -> str:
    """A simulated metric of results.json: 'kernel_insns_per_op' -> 'kernel instructions/op' ('kernel insns/op' short);
    a kernel share, 'kernel_l1i_share' -> 'L1i misses' (the kernel's share of them)."""
    if key in SHARE_COUNTS:
        return count_title(SHARE_COUNTS[key], short)
    side, _, count = key.removesuffix("_per_op").partition("_")
    return f"{side} {count_title(count, short)}/op"


# Profile comparison matrices (kpgo.analysis.characterize.compare_profiles): the title, and whether 1 means the
# same (a similarity; else 0 does: a distance). A plot's title is the part before " (".
SIMILARITY = {
    "function_cosine": ("Cosine similarity of function execution counts", True),
    "branch_cosine": ("Cosine similarity of branch execution counts", True),
    "taken_l0": ("L0 of taken-probability differences (share of common branches differing by more than the threshold)", False),
    "taken_l1": ("L1 of taken-probability differences (mean absolute difference)", False),
    "taken_l2": ("L2 of taken-probability differences (root mean square)", False),
}


def similarity_title(key: str, short: bool = False) -> str:
    title = SIMILARITY[key][0]
    return title.split(" (")[0] if short else title


# -- tables --------------------------------------------------------------------------------------------------------


def md_escape(s: Any) -> str:
    """Text safe in Markdown: a literal '*' (the mark) must not start a list or emphasis."""
    return str(s).replace("*", "\\*")


def md_cell(s: Any) -> str:
    return md_escape(s).replace("|", "\\|").replace("\n", " ")


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[bool]) -> list[str]:
    """A Markdown table of cells already in Markdown (md_cell them first unless they carry markup); numeric columns
    right-aligned."""

    def row(cells: Sequence[str]) -> str:
        return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"  # an empty cell is '| |'

    return [row(header), "|" + "|".join("---:" if n else "---" for n in numeric) + "|", *(row(r) for r in rows)]


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[bool], note: str = "") -> str:
    """A fixed-width table for the terminal: each column as wide as its widest cell, numeric columns right-aligned,
    `note` after the header."""
    cols = list(zip(header, *rows))
    widths = [max(len(c) for c in col) for col in cols]

    def line(cells: Sequence[str]) -> str:
        return " ".join(c.rjust(w) if n else c.ljust(w) for c, w, n in zip(cells, widths, numeric)).rstrip()

    head = line(header) + (f"   {note}" if note else "")
    return "\n".join([head, *(line(r) for r in rows)])


def html_escape(s: Any) -> str:
    return html.escape(str(s), quote=True)


def html_table(t: Table) -> str:
    """A table and its caption below it; a two-column table with an empty header is a key-value list."""
    kv = ' class="kv"' if t.header == ["", ""] else ""
    right = ' class="num"'
    out = [f'<div class="table"><table{kv}>', "<thead><tr>"]
    out += [f"<th{right if n else ''}>{html_escape(h)}</th>" for h, n in zip(t.header, t.numeric)]
    out.append("</tr></thead><tbody>")
    for r in t.rows:
        out.append("<tr>" + "".join(f"<td{right if n else ''}>{html_escape(c)}</td>" for c, n in zip(r, t.numeric)) + "</tr>")
    out.append(f'</tbody></table><p class="caption">{html_escape(t.caption)}</p></div>')
    return "\n".join(out)
