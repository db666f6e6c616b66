"""kpgo run: the main job."""

from __future__ import annotations

import argparse
from pathlib import Path

from kpgo.commands.common import (
    add_cluster_option,
    add_design_options,
    add_guest_options,
    add_kernel_options,
    add_workload_options,
    cluster_from,
    design_from,
    guest_from,
    prepare_workloads,
    sim_mode,
)
from kpgo.remote import Remote


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="the whole loop: builds, collect, fix, optimized build with proof, bench, summary",
        description="Build the instrumented kernel, collect a profile under each workload, add the object summary, "
        "build one optimized kernel per workload and prove GCC used its profile, build the vanilla kernel, benchmark "
        "vanilla and each optimized kernel on its workload in one interleaved design, and write summary.md and run.json. "
        "--study universal adds kernels built from the merged profile of all workloads (raw and normalized) measured on "
        "every workload; --study cross measures every optimized kernel on every workload; --study variability collects every "
        "profile a second time, compares the two collections and measures the kernel built from the second beside the first; "
        "--study layout records every workload's branches and measures BOLT on vanilla and on its PGO kernel and PGO with "
        "C3's function order, each on its workload, and their universal variants from every workload's records merged, on "
        "every workload (docs/LAYOUT.md); "
        "--study clang adds Clang kernels "
        "(clang, clang-thinlto, and AutoFDO ones from the clang-train kernel's branch records under every workload) "
        "measured on every workload (docs/CLANG.md). Steps are cached: run it "
        "again (or with a study added) to resume. With --cluster the builds run on the Ray cluster's nodes (each step's at "
        "once) and the collections and bench boots on its guest nodes.",
    )
    p.add_argument("--dir", type=Path, metavar="RUN_DIR", help="run directory (default: kpgo-runs/<base>-<workload>)")
    p.add_argument("--study", action="append", default=[], choices=("universal", "cross", "variability", "layout", "clang"),
                   help="add a study (repeatable; needs two or more workloads)")
    p.add_argument("--partial-training", action=argparse.BooleanOptionalAction, default=True,
                   help="kernels built with a profile keep code the profile never ran at its normal optimization (GCC's "
                   "-fprofile-partial-training; the default, docs/COMPILERS.md says why); --no-partial-training: GCC's "
                   "default, that code optimized for size")
    p.add_argument("--hot-share", type=float, metavar="S",
                   help="optimized kernels optimize for speed only the code holding the hottest share S of their "
                   "profile's executed work (e.g. 0.99), the rest of the executed code for size (docs/COMPILERS.md)")
    p.add_argument("--values", action="store_true",
                   help="the instrumented kernel records value profiles too (indirect-call targets, divisors, string sizes), "
                   "which the optimized kernels then use (docs/VALUES.md)")
    add_cluster_option(p, "build, collect and boot")
    add_design_options(p)
    add_kernel_options(p)
    add_workload_options(p)
    add_guest_options(p)
    p.set_defaults(func=run)


def options_from(args: argparse.Namespace):  # -> pipeline.RunOptions
    """The typed request of these options; every option is checked here, before anything is built."""
    from kpgo import pipeline, workloads

    name = args.config.stem if args.config else (args.base or "server")
    label = "all" if args.workload.strip() == "all" else "-".join(workloads.parse_names(args.workload))
    return pipeline.RunOptions(
        args.dir or Path("kpgo-runs") / f"{name}-{label}", args.base, args.config, tuple(args.fragment), args.source, args.workload,
        tuple(args.set), design_from(args), args.jobs, guest_from(args), args.client, sim_mode(args), tuple(args.sim_opt),
        tuple(dict.fromkeys(args.study)), args.partial_training, args.values,
        args.hot_share,
    )


def execute(opts, cluster: Remote | None = None) -> int:  # opts: pipeline.RunOptions; cluster: from cluster_from
    """Run (or extend) a run: helpers installed and ports checked first (on a cluster: on each guest node, before its
    first boot), then the pipeline, then its summary."""
    from kpgo import atomic, bench, inputs, pipeline

    atomic.refuse_if_held(opts.run_dir, "run directory")  # before minutes of preparing (a kernel source, helpers)
    if not cluster:
        prepare_workloads(list(opts.workloads))
    pipeline.run(opts, cluster)
    print(inputs.read_text(opts.run_dir / "summary.md", "run the same command again"))
    bench.raise_if_failed(inputs.read_json(opts.run_dir / "bench" / "results.json", "run the same command again", dict), opts.run_dir / "bench")
    return 0


def run(args: argparse.Namespace) -> int:
    return execute(options_from(args), cluster_from(args))
