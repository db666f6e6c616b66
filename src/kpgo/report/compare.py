"""`kpgo report RUN_DIR --compare OTHER`: speedups of the kernels and workloads both runs measured, side by side.

Each run's speedup is against its own baseline, so runs on different machines or accelerators compare as ratios;
both measurement statements are shown, since a TCG and a KVM ratio do not mean the same thing."""

from __future__ import annotations

from typing import Any

from kpgo.report import measure, present
from kpgo.report.load import RunData
from kpgo.report.model import Section, Skipped, Table
from kpgo.report.sections import COMPARE, FOOTNOTE, Context, kernel_order


def section(ctx: Context, other: RunData) -> Section | Skipped:
    a, b = ctx.data.results, other.results
    other_dir = ctx.data.shown(other.run_dir.resolve())
    if a is None or b is None:
        return Skipped(COMPARE, f"no bench/results.json in {ctx.data.shown(ctx.data.run_dir.resolve()) if a is None else other_dir}")
    rows = []
    data: list[dict[str, Any]] = []
    for name, w in a.workloads.items():
        wb = b.workloads.get(name)
        if wb is None:
            continue
        ra, rb = w.rows_by_kernel(), wb.rows_by_kernel()
        for k in kernel_order(a)[1:]:
            if k not in ra or k not in rb:
                continue
            sa, sb = ra[k].as_speedup(), rb[k].as_speedup()
            change = sa.ratio / sb.ratio if sa.ratio is not None and sb.ratio and not (sa.missing or sb.missing) else None
            rows.append([name, k, present.ratio_ci(sa), present.ratio_ci(sb), present.ratio(change)])
            data.append({"workload": name, "kernel": k, "this": sa.raw, "other": sb.raw, "change": change})
    if not rows:
        return Skipped(COMPARE, f"{other_dir} measured none of this run's kernel/workload pairs")
    how = f"This run: {measure.wall(a, ctx.data.run)[len('Measured: '):]} Other run ({other_dir}): {measure.wall(b, other.run)[len('Measured: '):]}"
    same = measure.accelerator(a, ctx.data.run) == measure.accelerator(b, other.run)
    blocks: list[Any] = [
        f"Speedups of this run next to those of {other_dir}, each against its own baseline ({a.baseline} / "
        f"{b.baseline}); change = this run's speedup over the other's."
        + ("" if same else " The runs used different accelerators: compare with care."),
        Table(f"Speedup [95% CI] in both runs. Measured: {how}", ["workload", "kernel", "this run", "other run", "change"],
              rows, [False, False, True, True, True]),
        FOOTNOTE,
    ]
    return Section(COMPARE, f"Measured: {how}", blocks, {"other_run_dir": other_dir, "pairs": data})
