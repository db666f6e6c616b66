#!/usr/bin/env python3
"""The evidence table of a `kpgo run --workload all --study universal` bench (prints figures; not a test).
docs/MEASUREMENTS.md has the command and what it printed for the server study.

    .venv/bin/python benchmarks/study_table.py RUN_DIR/bench/results.json [--exclude micro] [--kernels KIND,...]

Per workload and headline metric (simulated kernel instructions, L1i misses and taken branches per operation), the
ratio to vanilla with its 95% CI (and user instructions/op, the control) of the app-specific kernel (optimized-WORKLOAD on WORKLOAD) and of each universal
kernel measured there; then per kernel kind the geometric mean over the workloads not excluded, with its CI (each
workload's boots resampled; kpgo.stats.geomean_record), and universal-norm minus app-specific in points."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kpgo import bench, stats
from kpgo.report import present

KINDS = ("app-specific", "universal-raw", "universal-norm")


def per_boot(res: dict, kernel: str, workload: str, metric: str) -> list[float]:
    return [s["sim_per_op"][metric] for s in res["samples"] if s["kernel"] == kernel and s["workload"] == workload and s.get("sim_per_op")]


def label_of(kind: str, workload: str) -> str:
    return f"optimized-{workload}" if kind == "app-specific" else kind


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--exclude", default="micro", help="workloads left out of the geometric means (comma-separated)")
    ap.add_argument("--kernels", default=",".join(KINDS), help="kernel kinds to show")
    a = ap.parse_args()
    res = json.loads(a.results.read_text())
    base = res["baseline"]
    kinds = [k for k in a.kernels.split(",") if k]
    excluded = set(a.exclude.split(",")) - {""}
    names = sorted(res["workloads"])
    # user instructions/op as a control: the kernel does not change the application's code, so a ratio far from 1
    # there means the per-operation divisor (or the work in the window) differed between boots.
    metrics = (*bench.SIM_HEADLINE, "user_insns_per_op")
    print("| workload | kernel | " + " | ".join(present.metric_title(m, short=True) for m in metrics) + " |")
    print("|---|---|" + "---:|" * len(metrics))
    pairs: dict[tuple[str, str], list[tuple[list[float], list[float]]]] = {}
    used: dict[str, list[str]] = {}
    for w in names:
        for kind in kinds:
            label = label_of(kind, w)
            cells = []
            for m in metrics:
                b, o = per_boot(res, base, w, m), per_boot(res, label, w, m)
                if not b or not o:
                    cells.append("–")
                    continue
                cells.append(present.md_escape(present.ratio_ci(stats.ratio_record(b, o))))
                if w not in excluded:
                    pairs.setdefault((kind, m), []).append((b, o))
            if any(c != "–" for c in cells):
                print(f"| {w} | {kind} | " + " | ".join(cells) + " |")
                if w not in excluded:
                    used.setdefault(kind, []).append(w)
    print()
    print(f"geometric mean over {', '.join(used.get(kinds[0], []))} (excluded: {', '.join(sorted(excluded)) or 'none'}):")
    print()
    print("| kernel | " + " | ".join(present.metric_title(m, short=True) for m in metrics) + " |")
    print("|---|" + "---:|" * len(metrics))
    geo: dict[tuple[str, str], dict] = {}
    for kind in kinds:
        cells = []
        for m in metrics:
            ps = pairs.get((kind, m), [])
            if len(ps) != len(used.get(kinds[0], [])):
                cells.append("–")  # not measured on every workload of the mean
                continue
            geo[(kind, m)] = stats.geomean_record(ps)
            cells.append(present.md_escape(present.ratio_ci(geo[(kind, m)])))
        print(f"| {kind} | " + " | ".join(cells) + " |")
    if "app-specific" in kinds and "universal-norm" in kinds:
        print()
        print("universal-norm minus app-specific, points of the ratio to vanilla (kernel instructions/op), per workload:")
        m = metrics[0]
        for w in names:
            b = per_boot(res, base, w, m)
            a_ = per_boot(res, label_of("app-specific", w), w, m)
            u = per_boot(res, "universal-norm", w, m)
            if b and a_ and u:
                d = 100 * (stats.ratio_record(b, u)["ratio"] - stats.ratio_record(b, a_)["ratio"])
                print(f"  {w}: {d:+.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
