"""kpgo's figures as PNG bytes, the report's and `kpgo profile compare --plot`'s (matplotlib's object API on the Agg
renderer: no pyplot state, no display).

A cell of a bar chart or heatmap is a Cell: a ratio, its 95% CI (NaN when there is none) and whether the CI
includes 1.0, which is drawn as the mark of kpgo.report.present ("no difference shown")."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kpgo.records import Stat
from kpgo.report import present

DPI = 100


@dataclass
class Cell:
    value: float
    lo: float = math.nan
    hi: float = math.nan
    star: bool = False

    @classmethod
    def of(cls, row: Stat | Mapping[str, Any] | None, key: str = "ratio") -> Cell | None:
        """From a results.json row (summary, sim metric or geomean); None when it has no value."""
        if not row:
            return None
        s = present.stat(row, key)
        if s.ratio is None or math.isnan(s.ratio):
            return None
        return cls(s.ratio, math.nan if s.ci_low is None else s.ci_low, math.nan if s.ci_high is None else s.ci_high, present.no_difference(s))


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})  # no version string: same bytes each run
    return buf.getvalue()


def _colors(n: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _bars(ax: Any, groups: Sequence[str], series: Sequence[str], cells: dict[tuple[str, str], Cell],
          ylabel: str, ref: float = 1.0) -> list[Any]:
    """Grouped bars drawn from the reference line (ratios near 1 would all look alike from 0), CI whiskers, '*'
    beyond the whisker where the CI includes 1. Returns the legend handles."""
    width = 0.8 / max(len(series), 1)
    colors = _colors(len(series))
    handles = []
    lows: list[float] = [ref]
    highs: list[float] = [ref]
    for j, s in enumerate(series):
        xs: list[float] = []
        hs: list[float] = []
        errs: list[list[float]] = [[], []]
        stars: list[tuple[float, float, bool]] = []
        for i, g in enumerate(groups):
            c = cells.get((g, s))
            if c is None:
                continue
            x = i - 0.4 + width * (j + 0.5)
            xs.append(x)
            hs.append(c.value - ref)
            has_ci = not (math.isnan(c.lo) or math.isnan(c.hi))
            errs[0].append(max(c.value - c.lo, 0.0) if has_ci else 0.0)
            errs[1].append(max(c.hi - c.value, 0.0) if has_ci else 0.0)
            top = max(c.value, c.hi) if has_ci else c.value
            bottom = min(c.value, c.lo) if has_ci else c.value
            lows.append(bottom)
            highs.append(top)
            if c.star:
                stars.append((x, top if c.value >= ref else bottom, c.value >= ref))
        handles.append(ax.bar(xs, hs, width * 0.92, bottom=ref, color=colors[j], label=s))
        if xs:
            ax.errorbar(xs, [ref + h for h in hs], yerr=errs, fmt="none", ecolor="black", elinewidth=0.9, capsize=2)
        for x, y, up in stars:
            ax.annotate(present.MARK, (x, y), xytext=(0, 2 if up else -10), textcoords="offset points", ha="center",
                        fontsize=11, fontweight="bold")
    ax.axhline(ref, color="black", linewidth=0.8)
    span = max(max(highs) - min(lows), 0.02)
    ax.set_ylim(min(lows) - 0.12 * span, max(highs) + 0.15 * span)
    ax.set_xticks(range(len(groups)), groups, rotation=30 if len(groups) > 5 else 0,
                  ha="right" if len(groups) > 5 else "center")
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    return handles


def bar_chart(groups: Sequence[str], series: Sequence[str], cells: dict[tuple[str, str], Cell], *, title: str,
              ylabel: str, separate_last: bool = False) -> bytes:
    """One group per entry of `groups`, one bar per entry of `series`; separate_last draws a divider before the last
    group (the geometric mean)."""
    width = min(16.0, max(6.5, 1.2 + len(groups) * (0.28 * len(series) + 0.45)))
    fig = _figure(width, 4.6 + 0.25 * ((len(series) + 3) // 4))
    ax = fig.add_subplot()
    handles = _bars(ax, groups, series, cells, ylabel)
    if separate_last and len(groups) > 1:
        ax.axvline(len(groups) - 1.5, color="grey", linewidth=0.8, linestyle=":")
    ax.set_title(_wrap(title, width), fontsize=11)
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(series), 4), fontsize=9, frameon=False)
    return png(fig)


def bar_panels(panels: Sequence[tuple[str, dict[tuple[str, str], Cell]]], groups: Sequence[str],
               series: Sequence[str], *, title: str, ylabel: str, columns: int = 3) -> bytes:
    """Several bar charts of the same groups and series side by side (one panel per metric)."""
    bars = len(groups) * len(series)
    columns = min(columns, 3 if bars <= 15 else 2 if bars <= 40 else 1)  # many bars: wider panels, fewer per row
    rows = (len(panels) + columns - 1) // columns
    ncol = min(columns, len(panels))
    panel_w = min(16.0 / ncol, max(3.6, 0.8 + len(groups) * (0.22 * len(series) + 0.35)))
    fig = _figure(panel_w * ncol, 3.4 * rows + 0.8)
    handles: list[Any] = []
    for k, (name, cells) in enumerate(panels):
        ax = fig.add_subplot(rows, ncol, k + 1)
        handles = _bars(ax, groups, series, cells, ylabel if k % ncol == 0 else "")
        ax.set_title(name, fontsize=10)
    fig.suptitle(_wrap(title, panel_w * ncol), fontsize=11)
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(series), 4), fontsize=9, frameon=False)
    return png(fig)


def heatmap(rows: Sequence[str], cols: Sequence[str], cells: dict[tuple[int, int], Cell], *, title: str,
            xlabel: str, ylabel: str, diagonal: set[tuple[int, int]] | None = None, center: float = 1.0,
            lower_is_better: bool = False, scale: str = "speedup (1 = same as baseline)") -> bytes:
    """Ratios around `center` on a diverging scale (blue better, red worse; with lower_is_better, as for simulated
    events per operation, below `center` is better), each cell annotated with its value and '*' where the CI
    includes 1; cells not measured are grey; `diagonal` cells (a kernel on its own workload) framed."""
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.colors import Normalize
    from matplotlib.patches import Rectangle

    m = np.full((len(rows), len(cols)), np.nan)
    for (i, j), c in cells.items():
        m[i, j] = c.value
    dev = float(np.nanmax(np.abs(m - center))) if np.isfinite(m).any() else 0.0
    dev = max(dev, 0.02)
    norm = Normalize(center - dev, center + dev)
    cmap = colormaps["RdBu_r" if lower_is_better else "RdBu"].with_extremes(bad="#dddddd")
    width = min(16.0, max(6.0, 2.4 + 0.95 * len(cols)))
    fig = _figure(width, min(14.0, max(3.4, 1.6 + 0.55 * len(rows))))
    ax = fig.add_subplot()
    im = ax.imshow(np.ma.masked_invalid(m), cmap=cmap, norm=norm, aspect="auto")
    for i in range(len(rows)):
        for j in range(len(cols)):
            cell = cells.get((i, j))
            if cell is None:
                ax.text(j, i, "–", ha="center", va="center", fontsize=9, color="#666666")
                continue
            strong = abs(cell.value - center) > 0.6 * dev
            ax.text(j, i, present.ratio(cell.value) + (present.MARK if cell.star else ""), ha="center", va="center", fontsize=9,
                    color="white" if strong else "black")
    for i, j in diagonal or ():
        ax.add_patch(Rectangle((j - 0.44, i - 0.44), 0.88, 0.88, fill=False, edgecolor="black", linewidth=1.8))
    ax.set_xticks(range(len(cols)), cols, rotation=30 if len(cols) > 4 else 0, ha="right" if len(cols) > 4 else "center")
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(_wrap(title, width), fontsize=11)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02, label=scale)
    return png(fig)


def matrices(labels: Sequence[str], panels: Sequence[tuple[str, list[list[float | None]], bool]], *, title: str | None = None) -> bytes:
    """Symmetric profile-comparison matrices on 0..1 as heatmaps, side by side, one panel per (title, values,
    is_similarity): similarities (cosines) dark where low, distances dark where high."""
    import numpy as np
    from matplotlib import colormaps

    n = len(labels)
    side = min(6.0, max(3.4, 1.5 + 0.42 * n))
    fig = _figure((side + 0.9) * len(panels), side + 0.9)
    for k, (name, values, similarity) in enumerate(panels):
        m = np.array([[np.nan if v is None else float(v) for v in row] for row in values])
        ax = fig.add_subplot(1, len(panels), k + 1)
        cmap = colormaps["viridis" if similarity else "magma_r"].with_extremes(bad="#dddddd")
        im = ax.imshow(np.ma.masked_invalid(m), vmin=0.0, vmax=1.0, cmap=cmap)
        for i in range(n):
            for j in range(n):
                v = m[i, j]
                dark = not np.isnan(v) and ((v < 0.5) if similarity else (v > 0.5))
                ax.text(j, i, "–" if np.isnan(v) else f"{v:.2f}", ha="center", va="center", fontsize=8 if n > 6 else 9,
                        color="white" if dark else "black")
        ax.set_xticks(range(n), labels, rotation=45, ha="right")
        ax.set_yticks(range(n), labels if k == 0 else [])
        ax.set_title(_wrap(name, side + 0.9), fontsize=10)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
    if title:
        fig.suptitle(title, fontsize=11)
    return png(fig)


def _wrap(text: str, inches: float, points: float = 11) -> str:
    """Break a title into lines that fit `inches` (about 0.55 em per character)."""
    import textwrap

    return "\n".join(textwrap.wrap(text, max(20, int(inches * 72 / (0.55 * points)))))


def fraction_bars(labels: Sequence[str], fractions: Sequence[float], *, title: str, xlabel: str, threshold: float | None = None) -> bytes:
    """Horizontal bars of fractions in [0, 1] (one per label), each annotated, with an optional threshold line."""
    fig = _figure(7.5, 1.2 + 0.38 * len(labels))
    ax = fig.add_subplot()
    ys = list(range(len(labels)))[::-1]
    ax.barh(ys, fractions, color=_colors(1)[0], height=0.6)
    for y, f in zip(ys, fractions):
        ax.annotate(f"{f:.1%}", (f, y), xytext=(-4, 0), textcoords="offset points", ha="right", va="center", color="white", fontsize=9)
    if threshold is not None:
        ax.axvline(threshold, color="black", linestyle="--", linewidth=0.9, label=f"threshold {threshold:.0%}")
        ax.legend(loc="lower left", fontsize=8, frameon=False)
    ax.set_yticks(ys, labels)
    ax.set_xlim(0, 1)
    ax.set_xlabel(xlabel)
    ax.set_title(_wrap(title, 7.5), fontsize=11)
    return png(fig)


def strips(groups: Sequence[str], series: Sequence[str], values: dict[tuple[str, str], list[float]], *, title: str, ylabel: str) -> bytes:
    """Every boot's value as a dot, per group (workload) and series (kernel), beside the series' mean: the spread
    behind each ratio, on a scale relative to the first series' mean of the group."""
    width = min(16.0, max(6.5, 1.2 + len(groups) * (0.3 * len(series) + 0.5)))
    fig = _figure(width, 4.4)
    ax = fig.add_subplot()
    colors = _colors(len(series))
    step = 0.8 / max(len(series), 1)
    for j, s in enumerate(series):
        for i, g in enumerate(groups):
            vs = values.get((g, s)) or []
            ref = values.get((g, series[0])) or []
            if not vs or not ref:
                continue
            r = sum(ref) / len(ref)
            x = i - 0.4 + step * (j + 0.5)
            rel = [v / r for v in vs]
            ax.scatter([x] * len(rel), rel, color=colors[j], s=16, zorder=3, label=s if i == 0 else None)
            ax.hlines(sum(rel) / len(rel), x - step * 0.4, x + step * 0.4, color=colors[j], linewidth=1.6)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(groups)), groups, rotation=30 if len(groups) > 5 else 0, ha="right" if len(groups) > 5 else "center")
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(_wrap(title, width), fontsize=11)
    fig.legend(loc="outside lower center", ncol=min(len(series), 4), fontsize=9, frameon=False)
    return png(fig)


def tradeoff(panels: Sequence[tuple[str, Sequence[tuple[str, float, Cell]]]], *, title: str, xlabel: str,
             lower_is_better: bool) -> bytes:
    """One point per variant: code size (x) against a ratio to the baseline (y) with its CI as a whisker, each point
    named; one panel per metric (y label, points), side by side, so that a variant the metrics disagree on is seen
    in both; the baseline's line at 1 and where "better" is (smaller and better)."""
    fig = _figure(6.4 * len(panels), 5.2)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (ylabel, points) in zip(axes, panels):
        colors = _colors(len(points))
        for (_, x, c), color in zip(points, colors):
            has_ci = not (math.isnan(c.lo) or math.isnan(c.hi))
            yerr = [[max(c.value - c.lo, 0.0)], [max(c.hi - c.value, 0.0)]] if has_ci else None
            ax.errorbar([x], [c.value], yerr=yerr, fmt="o", color=color, ecolor="black", elinewidth=0.9, capsize=3, markersize=7)
        _name_points(ax, [(label + (present.MARK if c.star else ""), x, c.value, color) for (label, x, c), color in zip(points, colors)])
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.annotate("better", xy=(0.04, 0.06 if lower_is_better else 0.94), xycoords="axes fraction", fontsize=9,
                    color="grey", va="bottom" if lower_is_better else "top")
    fig.suptitle(_wrap(title, 6.4 * len(panels)), fontsize=11)
    return png(fig)


def _name_points(ax: Any, points: Sequence[tuple[str, float, float, Any]]) -> None:
    """Name each point beside it, on the side (right or left, above or below) where its name covers the fewest other
    points and names already placed, in its point's colour: variants of about the same size and ratio would otherwise
    print over each other, or a name sit nearer another point than its own."""
    ax.autoscale_view()
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    width_in, height_in = ax.get_position().width * ax.figure.get_figwidth(), ax.get_position().height * ax.figure.get_figheight()
    char_w, line_h = 0.075 / width_in, 0.17 / height_in  # a 9-point character and line, in axes fractions
    dots = [((x - x0) / (x1 - x0), (y - y0) / (y1 - y0)) for _, x, y, _ in points]
    placed: list[tuple[float, float, float, float]] = []
    sides = ((1, 1), (1, -1), (-1, 1), (-1, -1))  # right/left, above/below
    for (label, x, y, color), (px, py) in zip(points, dots):
        w = len(label) * char_w
        boxes = [(px + (0.01 if dx > 0 else -0.01 - w), py + (0.008 if dy > 0 else -0.008 - line_h), w, line_h) for dx, dy in sides]
        costs = [sum(_overlap(b, (qx - 0.02, qy - 0.02, 0.04, 0.04)) for qx, qy in dots) + sum(_overlap(b, o) for o in placed)
                 + 10 * (not (0 <= b[0] and b[0] + w <= 1 and 0 <= b[1] and b[1] + line_h <= 1)) for b in boxes]
        k = costs.index(min(costs))
        placed.append(boxes[k])
        dx, dy = sides[k]
        ax.annotate(label, (x, y), xytext=(6 * dx, 4 * dy), textcoords="offset points", fontsize=9,
                    color=color, ha="left" if dx > 0 else "right", va="bottom" if dy > 0 else "top")


def _overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    """Whether two boxes (x, y, width, height) overlap."""
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]
