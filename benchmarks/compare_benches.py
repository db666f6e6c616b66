#!/usr/bin/env python3
"""The same cells in two benches measured at different times (prints figures; not a test). docs/MEASUREMENTS.md
("Boots measured at different times are not comparable") has the command and what it printed for the server study.

    .venv/bin/python benchmarks/compare_benches.py EARLIER/results.json LATER/results.json [--metric M]

Per (kernel, workload) measured in both: the mean over boots of a simulated per-operation figure in each bench and
later ÷ earlier, with user instructions/op beside it (the control). Ratios of a kernel to vanilla are only fair
within one bench; this shows how far the absolute figures of one cell move between benches."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def cell_means(path: Path, metrics: tuple[str, ...]) -> dict[tuple[str, str], dict[str, float]]:
    boots: dict[tuple[str, str], list[dict[str, float]]] = defaultdict(list)
    for s in json.loads(path.read_text())["samples"]:
        if s.get("sim_per_op"):
            boots[(s["kernel"], s["workload"])].append(s["sim_per_op"])
    return {cell: {m: statistics.mean(b[m] for b in bs) for m in metrics} for cell, bs in boots.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("earlier", type=Path)
    ap.add_argument("later", type=Path)
    ap.add_argument("--metric", default="kernel_insns_per_op", help="a key of sim_per_op (default: %(default)s)")
    a = ap.parse_args()
    metrics = (a.metric, "user_insns_per_op")
    try:
        before, after = cell_means(a.earlier, metrics), cell_means(a.later, metrics)
    except (OSError, ValueError, KeyError) as e:
        print(f"compare_benches: cannot read the benches ({e}); give two bench results.json with simulated counters",
              file=sys.stderr)
        return 2
    cells = sorted(set(before) & set(after))
    if not cells:
        print("compare_benches: the two benches share no (kernel, workload) cell with simulated counters", file=sys.stderr)
        return 2
    print(f"| kernel | workload | {a.metric} earlier | later | later ÷ earlier | user insns/op later ÷ earlier |")
    print("|---|---|---:|---:|---:|---:|")
    for k, w in cells:
        b, f = before[(k, w)], after[(k, w)]
        print(f"| {k} | {w} | {b[a.metric]:.0f} | {f[a.metric]:.0f} | {f[a.metric] / b[a.metric]:.3f} | "
              f"{f['user_insns_per_op'] / b['user_insns_per_op']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
