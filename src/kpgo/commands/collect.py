"""kpgo collect: a kernel profile under each chosen workload."""

from __future__ import annotations

import argparse
from pathlib import Path

from kpgo.commands.common import add_guest_options, add_workload_options, chosen_workloads, guest_from


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "collect",
        help="boot an instrumented kernel, run workloads, snapshot their kernel profiles",
        description="Boot the instrumented kernel of BUILD_DIR under virtme-ng, start the workload's server, drive it "
        "with its load generator (from the host through the guest's NIC, or with --client guest in the guest over loopback), "
        "warm up, reset the kernel's gcov counters, run the measured load, and write every .gcda "
        "(paths relative to the build directory) plus profile.json. One workload: the profile is -o DIR. Several "
        "(--workload a,b or all): one boot each, profiles in DIR/NAME; a workload that fails does not stop the "
        "others, and the exit status is non-zero if any failed.",
    )
    p.add_argument("build_dir", type=Path, metavar="BUILD_DIR", help="an instrumented build (from `kpgo build --variant instrumented`)")
    p.add_argument("-o", "--out", type=Path, required=True, metavar="DIR", help="profile directory to write (must not exist)")
    add_workload_options(p)
    add_guest_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kpgo import collect
    from kpgo.errors import KpgoError
    from kpgo.progress import say

    specs = chosen_workloads(args)
    guest = guest_from(args)
    if len(specs) == 1:
        prof = collect.collect(args.build_dir, specs[0], args.out, guest=guest)
        print(f"profile: {args.out}  ({prof['files']} files, counter sum {prof['arcs_sum']}, {prof['throughput']:.0f} {prof['workload']['unit']})")
        return 0
    failed: list[KpgoError] = []
    for n, wl in enumerate(specs, 1):
        out = args.out / wl.name
        say(f"collect: workload {n}/{len(specs)}: {wl.name}")
        try:
            prof = collect.collect(args.build_dir, wl, out, guest=guest)
            print(f"profile: {out}  ({prof['files']} files, {prof['throughput']:.0f} {prof['workload']['unit']})", flush=True)
        except KpgoError as e:
            # Keep going: the profiles already written (and those still to come) are not lost.
            say(f"collect {wl.name}: FAILED: {e}")
            failed.append(e)
    if failed:
        first = failed[0]
        raise type(first)(f"{len(failed)} of {len(specs)} workloads failed (first: {first.message})", first.hint)
    return 0
