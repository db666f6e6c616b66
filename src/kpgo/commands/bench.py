"""kpgo bench: the same workload on two or more kernels, interleaved, with statistics."""

from __future__ import annotations

import argparse
from pathlib import Path

from kpgo.commands.common import add_guest_options, add_workload_options, chosen_workloads, guest_from


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark kernels against each other (interleaved boots, 95%% CI of ratios)",
        description="Boot each kernel BOOTS times, alternating (A B, B A, ...), warm up, run the workload RUNS times per "
        "boot, and print per kernel mean, sd, and the ratio to the first kernel with a bootstrap 95%% CI over boots. "
        "Each workload's results go to OUT/NAME/results.json.",
    )
    p.add_argument("--kernel", action="append", required=True, metavar="LABEL=BUILD_DIR", help="a kernel build; the first is the baseline (repeat to compare; one alone gives its throughput)")
    p.add_argument("--boots", type=int, default=3, help="boots per kernel (default 3)")
    p.add_argument("--runs", type=int, default=1, help="measured runs per boot after the warm-up (default 1)")
    p.add_argument("-o", "--out", type=Path, default=Path("bench"), metavar="DIR", help="results directory (default ./bench), one subdirectory per workload; finished boots in it are reused")
    p.add_argument("--json", action="store_true", help="print results.json instead of the table")
    add_workload_options(p)
    add_guest_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from kpgo import bench

    specs = chosen_workloads(args)
    kernels = [bench.parse_kernel_arg(k) for k in args.kernel]
    guest = guest_from(args)
    for wl in specs:
        res = bench.bench(kernels, wl, args.out / wl["name"], boots=args.boots, runs=args.runs, guest=guest)
        print(json.dumps(res, indent=2) if args.json else bench.format_table(res) + "\n", flush=True)
    return 0
