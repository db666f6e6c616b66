"""kpgo report: a run directory's results as one self-contained HTML page, Markdown and JSON."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="write report.html (self-contained), report.md and report.json for a run directory",
        description="Read RUN_DIR (run.json, bench/results.json, studies/, profiles/, builds/) and write a report of every "
        "section its data support: run and design, speedups with 95% CIs, simulated counters, universal vs "
        "app-specific kernels, cross-application and sensitivity heatmaps, profile similarity, kernel share, code size "
        "and top functions, proof that GCC used the profile. Each figure and table says how it was measured. "
        "See docs/REPORT.md.",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="directory of a `kpgo run` (its --dir)")
    p.add_argument("-o", "--out", type=Path, metavar="OUT_DIR", help="output directory (default RUN_DIR/report); existing report files are replaced")
    p.add_argument("--compare", type=Path, metavar="OTHER_RUN_DIR", help="add a section comparing speedups with another run")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # a few small arrays: one BLAS thread starts faster
    from kpgo import report
    from kpgo.atomic import check_writable
    from kpgo.errors import UserError

    out = args.out if args.out is not None else args.run_dir / "report"
    # Before the figures are drawn: a destination that cannot take the three files fails now, with its name.
    if out.exists() and not out.is_dir():
        raise UserError(f"report directory {out} is a file", "choose another -o (a directory)")
    if args.run_dir.is_dir():
        check_writable(out, "report directory")
    rep = report.generate(args.run_dir, out, compare=args.compare)
    paths = report.write(rep, out)
    shown = ", ".join(f"{s.number} {s.title}" for s in rep.sections)
    print(f"report: sections {shown}")
    print(f"report: {rep.skipped_line()}")
    for p in paths:
        print(p)
    return 0
