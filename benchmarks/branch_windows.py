#!/usr/bin/env python3
"""Kernel counters of branch profiles beside each other (prints figures; not a test). Each `kpgo collect BUILD
--branches` boot also counts the simulator's events in its windows (profile.json's sim_windows: one per run, or one
per stressor for micro); this prints, for each profile after the first, the geometric mean over the windows of its
kernel events divided by the first profile's in the same window, with the smallest and largest of those ratios.

    .venv/bin/python benchmarks/branch_windows.py BASE_PROFILE OTHER_PROFILE...

One boot per profile: a check that the kernels differ the way they should, not a measurement with an interval
(`kpgo bench --sim` is that). Both profiles must have recorded the same workload with the same operations per window.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from kpgo import inputs

EVENTS = ("insns", "l1i_misses", "taken_branches", "itlb_misses")


def windows(profile: Path) -> tuple[list[dict], float]:
    m = inputs.read_json(profile / "profile.json", "give a directory written by `kpgo collect --branches`",
                         {"sim_windows": [{"kernel": {str: (int, float)}}], "ops": (int, float)})
    return m["sim_windows"], float(m["ops"])


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: benchmarks/branch_windows.py BASE_PROFILE OTHER_PROFILE...", file=sys.stderr)
        return 2
    base, base_ops = windows(Path(argv[0]))
    for other in argv[1:]:
        got, ops = windows(Path(other))
        if ops != base_ops or len(got) != len(base):
            print(f"{other}: {len(got)} windows of {ops:.0f} operations, the base {len(base)} of {base_ops:.0f}: not comparable", file=sys.stderr)
            return 1
        parts = []
        for e in EVENTS:
            ratios = [b["kernel"][e] / a["kernel"][e] for a, b in zip(base, got) if a["kernel"].get(e) and b["kernel"].get(e)]
            if ratios:
                g = math.exp(sum(map(math.log, ratios)) / len(ratios))
                parts.append(f"{e} x{g:.3f} ({min(ratios):.2f}-{max(ratios):.2f})")
        print(f"{Path(other).name} vs {Path(argv[0]).name}, {len(got)} windows: " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
