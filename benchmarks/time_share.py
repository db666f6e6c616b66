#!/usr/bin/env python3
"""How much of a bench's kernel work per operation is paid per second of window (prints figures; not a test).
docs/MEASUREMENTS.md ("Value profiles", the separation) has the command and what it printed.

    .venv/bin/python benchmarks/time_share.py BENCH/results.json [--metric insns]

Per workload, a least-squares fit over every boot of the bench: the kernel's count in a window = (a cost per
operation of that boot's kernel) × operations + (one cost per second, shared by all kernels) × window seconds.
Under TCG the guest's ticks and periodic work arrive per second of host time, so a boot that ran slower spreads
more of them over its operations; the fit separates the two parts (where every window lasts the same, as wrk's, the
shared part is a cost per window, the same thing for this purpose). It prints the shared rate, the per-operation
costs and their ratios to the bench's first kernel beside the plain ratios of means. Three boots a kernel make the
fit a rough one: no interval is given."""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="a bench's results.json (with simulated counters)")
    ap.add_argument("--metric", default="insns", help="kernel counter: insns, l1i_misses, taken_branches (default insns)")
    args = ap.parse_args()
    try:
        doc = json.loads(args.results.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"{args.results}: cannot read a bench's results.json ({e}); give OUT/results.json of `kpgo bench`") from None
    boots: dict[str, dict[str, list[tuple[float, float, float]]]] = defaultdict(lambda: defaultdict(list))
    for s in doc["samples"]:
        if not s.get("sim") or not s.get("ops"):
            continue
        if s.get("sim_steps"):  # a window per load step (micro): each step is fitted on its own, as WORKLOAD/STEP
            windows = iter(s["sim"])
            for steps in s["step_ops"]:
                for name, ops in steps.items():
                    w = next(windows)
                    boots[f"{s['workload']}/{name}"][s["kernel"]].append((float(ops), float(w["seconds"]), float(w["kernel"][args.metric])))
            continue
        for run, ops in zip(s["sim"], s["ops"]):
            boots[s["workload"]][s["kernel"]].append((float(ops), float(run["seconds"]), float(run["kernel"][args.metric])))
    if not boots:
        raise SystemExit(f"{args.results}: no boot with simulated counters and an operation count")
    base = doc.get("baseline")  # the bench's baseline first, as its tables have it
    for workload, by_kernel in boots.items():
        kernels = sorted(by_kernel, key=lambda k: k != base)
        rows, y = [], []
        for i, k in enumerate(kernels):
            for ops, secs, count in by_kernel[k]:
                rows.append([ops if j == i else 0.0 for j in range(len(kernels))] + [secs])
                y.append(count)
        coef = np.linalg.lstsq(np.array(rows), np.array(y), rcond=None)[0]
        per_op, rate = coef[:-1], float(coef[-1])
        plain = [statistics.mean(c / o for o, _, c in by_kernel[k]) for k in kernels]
        windows = [w for k in kernels for _, w, _ in by_kernel[k]]
        print(f"{workload}: kernel {args.metric} per second of window {rate:,.0f} (shared); windows {min(windows):.1f}-{max(windows):.1f} s")
        print(f"  {'kernel':24s} {'per op (plain)':>16s} {'ratio':>7s} {'per op (fit)':>14s} {'ratio':>7s}")
        for i, k in enumerate(kernels):
            print(f"  {k:24s} {plain[i]:16,.1f} {plain[i] / plain[0]:7.3f} {per_op[i]:14,.1f} {per_op[i] / per_op[0]:7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
