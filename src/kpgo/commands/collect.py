"""kpgo collect: a kernel profile under a workload."""

from __future__ import annotations

import argparse
from pathlib import Path

from kpgo.commands.common import add_guest_options, add_workload_options, guest_from


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "collect",
        help="boot an instrumented kernel, run a workload, snapshot its kernel profile",
        description="Boot the instrumented kernel of BUILD_DIR under virtme-ng, start the workload's server on the "
        "guest's loopback, warm up, reset the kernel's gcov counters, run the measured load, and write every .gcda "
        "(paths relative to the build directory) plus profile.json into -o DIR.",
    )
    p.add_argument("build_dir", type=Path, metavar="BUILD_DIR", help="an instrumented build (from `kpgo build --variant instrumented`)")
    p.add_argument("-o", "--out", type=Path, required=True, metavar="DIR", help="profile directory to write (must not exist)")
    add_workload_options(p)
    add_guest_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kpgo import collect, workloads

    wl = workloads.load(args.workload, args.set)
    prof = collect.collect(args.build_dir, wl, args.out, guest=guest_from(args))
    print(f"profile: {args.out}  ({prof['files']} files, counter sum {prof['arcs_sum']}, {prof['throughput']:.0f} {prof['workload']['unit']})")
    return 0
