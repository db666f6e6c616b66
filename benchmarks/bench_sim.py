#!/usr/bin/env python3
"""Cost and reproducibility of kpgo's simulated counters (prints figures; not a test). docs/SIM.md has the commands
and the figures measured here.

    .venv/bin/python benchmarks/bench_sim.py slowdown [--kernel BZIMAGE] [--loop N] [--syscalls N] [--bigcode N]
                                                      [--repeat 3] [--workload micro --set procs=1]
    .venv/bin/python benchmarks/bench_sim.py spread [--kernel BZIMAGE] [--boots 3] [--workload redis --set requests=20000]

slowdown: the same guest programs run in two boots, without and with the plugin, and the in-window slowdown is the
ratio of the guest's own time for each window (tests/data/sim_probe.c times its window with the guest clock, which
follows the host's under TCG), best of --repeat runs per boot. With --workload, the workload also runs once in each mode through the guest agent,
and each load step's throughput ratio (without / with) is that step's in-window slowdown. The target (issue 10) is <= 2.5x.

spread: the same workload in --boots boots with the plugin; per boot the counters per operation of the measured
window (kernel and user instructions, L1i and iTLB misses, taken and indirect branches) and, over boots, (max - min) / mean and
the coefficient of variation.

Default kernel: the tiny vanilla test kernel (.kpgo-test/run-tiny/builds/vanilla). One guest at a time.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kpgo import bench, sim, vm, workloads
from kpgo.errors import KpgoError
from kpgo.guest import contract

REPO = Path(__file__).resolve().parent.parent
PROBE = REPO / "tests" / "data" / "sim_probe.c"
DEFAULT_KERNEL = REPO / ".kpgo-test" / "run-tiny" / "builds" / "vanilla" / "arch" / "x86" / "boot" / "bzImage"
GUEST = vm.Guest(cpus=2, memory="2G", timeout=1800)


def probe_times(kernel: Path, cmd: str, work: Path, config: sim.SimConfig | None, accel: str) -> dict[str, float]:
    tag = "plugin" if config else "none"
    t = time.monotonic()
    res = vm.run_command(kernel, cmd, guest=GUEST, log=work / f"console-{tag}.log", accel=accel, sim=config, report=work / "sim.json")
    found: dict[str, float] = {}
    for m in re.finditer(r"^sim_probe (\w+) (\d+) guest_seconds=([0-9.]+)", res.output, re.M):
        key = f"{m[1]} {m[2]}"
        found[key] = min(found.get(key, math.inf), float(m[3]))  # best of the repeats: host noise only adds
    print(f"  boot {tag}: {time.monotonic() - t:.1f} s wall", file=sys.stderr)
    return found


def slowdown(args: argparse.Namespace, accel: str) -> None:
    work = Path(tempfile.mkdtemp(prefix="kpgo-bench-sim."))
    probe = work / "sim_probe"
    subprocess.run(["gcc", "-O2", "-static", "-o", probe, PROBE], check=True)
    runs = [("loop", args.loop), ("syscalls", args.syscalls), ("bigcode", args.bigcode)]
    cmd = "; ".join(f"{probe} {m} {n}" for m, n in runs for _ in range(args.repeat))
    base = probe_times(args.kernel, cmd, work, None, accel)
    with_sim = probe_times(args.kernel, cmd, work, sim.SimConfig(), accel)
    windows = sim.read_windows(work / "sim.json")[:: args.repeat]
    print(f"{'window (best of ' + str(args.repeat) + ')':26} {'no plugin s':>12} {'plugin s':>10} {'slowdown':>9} {'kernel share':>13}")
    for (m, n), w in zip(runs, windows):
        key = f"{m} {n}"
        print(f"{key:26} {base[key]:12.3f} {with_sim[key]:10.3f} {with_sim[key] / base[key]:8.2f}x {w['kernel_insn_share']:13.3f}")
    if args.workload:
        wl = workloads.load(args.workload, args.set)
        rates = {}
        for tag, config in (("none", None), ("plugin", sim.SimConfig())):
            t = time.monotonic()
            r = vm.run_agent(args.kernel, work / f"wl-{tag}", contract.Job(mode="bench", workload=wl, runs=1), guest=GUEST,
                             log=work / f"wl-{tag}.log", accel=accel, sim=config)
            print(f"  boot {args.workload} {tag}: {time.monotonic() - t:.1f} s wall", file=sys.stderr)
            rates[tag] = r.runs[0]
        ratios = {k: v / rates["plugin"].parts[k] for k, v in rates["none"].parts.items()}
        for k, v in ratios.items():
            print(f"{args.workload + ' ' + k:26} {'':12} {'':10} {v:8.2f}x   (throughput without / with)")
        geo = math.exp(sum(math.log(v) for v in ratios.values()) / len(ratios))
        print(f"{args.workload + ' geomean':26} {'':12} {'':10} {geo:8.2f}x   window {rates['none'].seconds} s -> {rates['plugin'].seconds} s")
    print(f"(kernel {args.kernel}; logs in {work})")


def spread(args: argparse.Namespace, accel: str) -> None:
    work = Path(tempfile.mkdtemp(prefix="kpgo-bench-sim."))
    wl = workloads.load(args.workload, args.set)
    keys = [("kernel", "insns"), ("user", "insns"), ("kernel", "l1i_misses"), ("kernel", "itlb_misses"), ("user", "l1i_misses"),
            ("kernel", "taken_branches"), ("user", "taken_branches"), ("kernel", "indirect_branches"), ("user", "indirect_branches")]
    rows = []
    for b in range(args.boots):
        t = time.monotonic()
        r = vm.run_agent(args.kernel, work / f"boot-{b}", contract.Job(mode="bench", workload=wl, runs=1), guest=GUEST,
                         log=work / f"boot-{b}.log", accel=accel, sim=sim.SimConfig())
        ops = r.runs[0].ops
        # a window per load step (micro): each step over its own count, their geometric mean (kpgo.bench.sim_per_op)
        per = bench.sim_per_op(r.sim or [], [ops], step_ops=[r.runs[0].step_ops] if wl.windows == "step" else None)
        rows.append([per[f"{s}_{c}_per_op"] for s, c in keys] + [ops, per["kernel_insn_share"]])
        print(f"  boot {b}: {time.monotonic() - t:.1f} s wall, ops {ops:.0f}, windows {sum(w['seconds'] for w in r.sim or []):.2f} s", file=sys.stderr)
    names = [f"{s} {c}/op" for s, c in keys] + ["ops", "kernel share"]
    print(f"{'per boot':22}" + "".join(f"{n:>21}" for n in names))
    for b, row in enumerate(rows):
        print(f"{'boot ' + str(b):22}" + "".join(f"{v:21.4g}" for v in row))
    cols = list(zip(*rows))
    print(f"{'(max-min)/mean':22}" + "".join(f"{(max(c) - min(c)) / statistics.fmean(c):21.2%}" for c in cols))
    if len(rows) > 1:
        print(f"{'cv (sd/mean)':22}" + "".join(f"{statistics.stdev(c) / statistics.fmean(c):21.2%}" for c in cols))
    print(f"(workload {args.workload} {args.set}; kernel {args.kernel}; logs in {work})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("slowdown", "spread"))
    p.add_argument("--kernel", type=Path, default=DEFAULT_KERNEL)
    p.add_argument("--loop", type=int, default=100_000_000, help="iterations of the 4-instruction loop")
    p.add_argument("--syscalls", type=int, default=1_000_000, help="getppid calls")
    p.add_argument("--bigcode", type=int, default=50_000, help="sweeps over 64 KiB of code")
    p.add_argument("--repeat", type=int, default=3, help="slowdown: runs of each probe per boot (the best counts)")
    p.add_argument("--workload", default=None, help="slowdown: also this workload; spread: default redis")
    p.add_argument("--set", action="append", default=None, metavar="KEY=VALUE", help="workload parameter override")
    p.add_argument("--boots", type=int, default=3)
    args = p.parse_args()
    if args.what == "spread" and not args.workload:
        args.workload = "redis"
        args.set = args.set or ["requests=20000"]
    args.set = args.set or []
    try:
        sim.setup()
        accel = vm.accelerator(args.kernel)
        (slowdown if args.what == "slowdown" else spread)(args, accel)
    except KpgoError as e:
        print(f"bench_sim: error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
