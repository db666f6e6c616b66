"""kpgo collect: a kernel profile under each chosen workload."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from kpgo.commands.common import add_cluster_option, add_guest_options, add_workload_options, chosen_workloads, cluster_from, guest_from

if TYPE_CHECKING:
    from kpgo.errors import KpgoError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "collect",
        help="boot an instrumented kernel, run workloads, snapshot their kernel profiles",
        description="Boot the instrumented kernel of BUILD_DIR under virtme-ng, start the workload's server, drive it "
        "with its load generator (from the host through the guest's NIC, or with --client guest in the guest over loopback), "
        "warm up, reset the kernel's gcov counters, run the measured load, and write every .gcda "
        "(paths relative to the build directory) plus profile.json. One workload: the profile is -o DIR. Several "
        "(--workload a,b or all): one boot each, profiles in DIR/NAME; a workload that fails does not stop the "
        "others, and the exit status is non-zero if any failed. With --cluster, each workload's collection is a Ray "
        "task on a node offering the kpgo_guest resource, one guest per node at a time (docs/SCALE.md). "
        "With --branches, any kernel (vanilla too) boots under kpgo's QEMU plugin instead, which records the kernel's "
        "taken branches in the measured window; the profile directory then holds the records, BOLT's pre-aggregated "
        "profile, perf-script branch stacks for llvm-profgen --kernel, the call graph and profile.json (docs/SIM.md, "
        "\"Branch records\").",
    )
    p.add_argument("build_dir", type=Path, metavar="BUILD_DIR",
                   help="an instrumented build (from `kpgo build --variant instrumented`); with --branches, any kpgo build")
    p.add_argument("-o", "--out", type=Path, required=True, metavar="DIR", help="profile directory to write (must not exist)")
    p.add_argument("--branches", action="store_true",
                   help="record the kernel's branches under the QEMU plugin instead of gcov counters (any kernel; docs/SIM.md)")
    p.add_argument("--branch-period", type=int, default=None, metavar="N",
                   help="with --branches: sample one 32-entry branch stack every N recorded branches (default: kpgo.sim.BRANCH_PERIOD)")
    add_cluster_option(p, "collect")
    add_workload_options(p)
    add_guest_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kpgo import collect
    from kpgo.errors import KpgoError
    from kpgo.progress import say

    guest = guest_from(args)
    if args.branch_period is not None and not args.branches:
        from kpgo.errors import UserError

        raise UserError("--branch-period is for --branches", "add --branches, or leave --branch-period out")
    if args.branches:
        return _run_branches(args, guest)
    cluster = cluster_from(args)
    if cluster:  # the nodes that boot need the packages and helpers, not this one: each node is checked first
        from kpgo import workloads

        specs = workloads.load_many(args.workload, args.set, args.client)
        outs = {wl.name: args.out if len(specs) == 1 else args.out / wl.name for wl in specs}
        failed: list[KpgoError] = []
        for wl, res in collect.on_cluster(cluster, args.build_dir, outs, specs, guest=guest):
            if isinstance(res, KpgoError):
                say(f"collect {wl.name}: FAILED: {res}")
                failed.append(res)
            else:
                print(f"profile: {outs[wl.name]}  ({res['files']} files, {res['throughput']:.0f} {res['workload']['unit']})", flush=True)
        if len(specs) == 1 and failed:
            raise failed[0]
        return _failed(failed, len(specs))
    specs = chosen_workloads(args)
    if len(specs) == 1:
        prof = collect.collect(args.build_dir, specs[0], args.out, guest=guest)
        print(f"profile: {args.out}  ({prof['files']} files, counter sum {prof['arcs_sum']}, {prof['throughput']:.0f} {prof['workload']['unit']})")
        return 0
    failed = []
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
    return _failed(failed, len(specs))


def _run_branches(args: argparse.Namespace, guest) -> int:
    from kpgo import collect
    from kpgo.errors import KpgoError, UserError
    from kpgo.progress import say

    if args.cluster:
        raise UserError("--branches does not run on a cluster yet", "leave --cluster out")
    specs = chosen_workloads(args)
    failed: list[KpgoError] = []
    for n, wl in enumerate(specs, 1):
        out = args.out if len(specs) == 1 else args.out / wl.name
        if len(specs) > 1:
            say(f"collect --branches: workload {n}/{len(specs)}: {wl.name}")
        try:
            prof = collect.collect_branches(args.build_dir, wl, out, guest=guest, period=args.branch_period)
        except KpgoError as e:
            if len(specs) == 1:
                raise
            say(f"collect {wl.name}: FAILED: {e}")
            failed.append(e)
            continue
        rec = prof["records"]
        print(f"branch profile: {out}  ({rec['branches']} branches, {rec['edges']} edges, {rec['samples']} samples, "
              f"{prof['throughput']:.0f} {prof['workload']['unit']})", flush=True)
    return _failed(failed, len(specs))


def _failed(failed: list[KpgoError], n: int) -> int:
    if failed:
        first = failed[0]
        raise type(first)(f"{len(failed)} of {n} workloads failed (first: {first.message})", first.hint)
    return 0
