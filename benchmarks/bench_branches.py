#!/usr/bin/env python3
"""What branch records cost and how the sampling period matters (prints figures; not a test). docs/SIM.md, "Branch
records", has the command and the figures measured here.

    .venv/bin/python benchmarks/bench_branches.py BUILD_DIR [--workload redis --set requests=20000]
                                                  [--periods 256,1024,4096,16384] [--repeat 2]

Per round, in a shuffled order, one boot each: plain TCG (no plugin), the simulator without branch records, and
`kpgo collect --branches` at each period. Each boot runs the workload's measured load once; its throughput (measured
by the load generator) gives the slowdowns: plain / with, simulator / with. Each recording's files and its sampled
stacks' agreement with the exact edges (kpgo.branches.sampling_match) are printed too. One guest at a time.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kpgo import collect, sim, vm, workloads
from kpgo.guest import contract
from kpgo.kernel import kbuild


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", type=Path)
    ap.add_argument("--workload", default="redis")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--periods", default="256,1024,4096,16384")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    wl = workloads.load(args.workload, args.set)
    kernel = kbuild.image(args.build.resolve())
    guest = vm.Guest(timeout=1800)
    work = Path(tempfile.mkdtemp(prefix="kpgo-bench-branches."))
    configs = ["tcg", "sim"] + [f"N={p}" for p in args.periods.split(",")]
    rates: dict[str, list[float]] = {c: [] for c in configs}
    info: dict[str, dict] = {}
    rng = random.Random(args.seed)
    for r in range(args.repeat):
        order = configs[:]
        rng.shuffle(order)
        for c in order:
            t = time.monotonic()
            if c.startswith("N="):
                out = work / f"{c.replace('=', '')}-{r}"
                prof = collect.collect_branches(args.build, wl, out, guest=guest, period=int(c[2:]))
                rates[c].append(prof["throughput"])
                info[c] = prof
            else:
                res = vm.run_agent(kernel, work / f"{c}-{r}", contract.Job(mode="bench", workload=wl, runs=1), guest=guest,
                                   log=work / f"{c}-{r}.log", accel="tcg", sim=sim.SimConfig() if c == "sim" else None)
                rates[c].append(res.runs[0].value)
            print(f"  round {r} {c}: {rates[c][-1]:.0f} {wl.unit} ({time.monotonic() - t:.0f} s)", file=sys.stderr, flush=True)
    mean = {c: statistics.mean(v) for c, v in rates.items()}
    print(f"{'config':10} {wl.unit:>14} {'vs plain':>9} {'vs sim':>7} {'records':>10} {'perf.script':>12} {'bolt':>10} "
          f"{'samples':>8} {'distinct':>8} {'spearman':>8} {'cosine':>7} {'top1%':>6}")
    for c in configs:
        line = f"{c:10} {mean[c]:14.0f} {mean['tcg'] / mean[c]:8.2f}x {mean['sim'] / mean[c]:6.2f}x"
        if c in info:
            p, s = info[c], info[c]["sampling"]
            f = p["files"]
            line += (f" {f['branches.rec']:10,} {f['perf.script']:12,} {f['bolt.preagg']:10,} {p['records']['samples']:8,} "
                     f"{p['records']['stacks']:8,} {s['spearman']:8.4f} {s['cosine']:7.4f} {s['hot1pct_overlap']:6.3f}")
        print(line)
    print(json.dumps({"rates": rates, "work": str(work)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
