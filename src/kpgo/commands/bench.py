"""kpgo bench: kernels × workloads, interleaved boots, with statistics (and simulated counters)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kpgo.commands.common import (
    add_cluster_option,
    add_design_options,
    add_guest_options,
    add_workload_options,
    chosen_workloads,
    cluster_from,
    design_from,
    guest_from,
    sim_from,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark kernels × workloads (interleaved boots, 95%% CI of ratios, optional simulated counters)",
        description="Boot every kernel on every workload BOOTS times in randomized blocks (each round a fresh random "
        "order; or --order abba), warm up, run the workload RUNS times per boot, and print per kernel and workload the "
        "mean, sd, cv and the speedup over the first kernel with a 95% interval over boots (Welch t on the log ratio), "
        "and each kernel's geometric-mean speedup across workloads. With --sim, a QEMU plugin also counts guest "
        "instructions and simulated L1i/iTLB misses, kernel and user, per operation. With --precision P, rounds of the "
        "workloads not there yet are added until every kernel's interval is within ±P (or a cap). The plan (seed, order) is written to "
        "OUT/plan.json before the first boot. Everything goes to OUT/results.json; finished boots in OUT are reused. "
        "With --cluster, each boot is a Ray task on a node offering the kpgo_guest resource, one guest per node at a "
        "time, each round whole on one node (docs/SCALE.md).",
    )
    p.add_argument("--kernel", action="append", required=True, metavar="LABEL=BUILD_DIR",
                   help="a kernel build; the first is the baseline (repeat to compare; one alone gives its throughput)")
    p.add_argument("-o", "--out", type=Path, default=Path("bench"), metavar="DIR", help="results directory (default ./bench); finished boots in it are reused")
    p.add_argument("--json", action="store_true", help="print results.json instead of the tables")
    add_cluster_option(p, "boot (each round on one node)")
    add_design_options(p)
    add_workload_options(p)
    add_guest_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kpgo import atomic, bench, workloads
    from kpgo.progress import print_json

    kernels = [bench.parse_kernel_arg(k) for k in args.kernel]
    design, guest, sim = design_from(args), guest_from(args), sim_from(args)
    atomic.check_resumable(args.out, "bench directory", bench.BENCH_MARKS, "-o")
    atomic.refuse_if_held(args.out, "bench directory")
    if args.cluster:  # the nodes that boot need the packages and helpers, not this one: each node is checked first
        specs = workloads.load_many(args.workload, args.set, args.client)
    else:
        specs = chosen_workloads(args)  # last: it may compile a workload's helper
    res = bench.bench(kernels, specs, args.out, design=design, guest=guest, sim=sim, cluster=cluster_from(args))
    if args.json:
        print_json(res, sort_keys=False)
    else:
        print(bench.format_table(res), flush=True)
    bench.raise_if_failed(res, args.out)
    return 0
