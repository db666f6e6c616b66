"""kpgo run: the main job."""

from __future__ import annotations

import argparse
from pathlib import Path

from kpgo.commands.common import (
    add_design_options,
    add_guest_options,
    add_kernel_options,
    add_workload_options,
    chosen_workloads,
    design_from,
    guest_from,
    sim_from,
)

# The options `kpgo study` needs to extend a run exactly as it was started (kept in run.json "request").
REQUEST_KEYS = ("source", "base", "config", "fragment", "jobs", "workload", "set", "boots", "runs", "order", "seed", "sim", "sim_opt",
                "cpus", "memory", "guest_timeout", "study", "client", "partial_training")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="the whole loop: builds, collect, fix, optimized build with proof, bench, summary",
        description="Build the instrumented kernel, collect a profile under each workload, add the object summary, "
        "build one optimized kernel per workload and prove GCC used its profile, build the vanilla kernel, benchmark "
        "vanilla and each optimized kernel on its workload in one interleaved design, and write summary.md and run.json. "
        "--study universal adds kernels built from the merged profile of all workloads (raw and normalized) measured on "
        "every workload; --study cross measures every optimized kernel on every workload. Steps are cached: run it "
        "again (or with a study added) to resume.",
    )
    p.add_argument("--dir", type=Path, metavar="RUN_DIR", help="run directory (default: kpgo-runs/<base>-<workload>)")
    p.add_argument("--study", action="append", default=[], choices=("universal", "cross"), help="add a study (repeatable; needs two or more workloads)")
    p.add_argument("--partial-training", action="store_true",
                   help="optimized kernels keep code the profile never ran at its normal optimization (GCC's "
                   "-fprofile-partial-training) instead of optimizing it for size")
    add_design_options(p)
    add_kernel_options(p)
    add_workload_options(p)
    add_guest_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from kpgo import bench, pipeline

    specs = chosen_workloads(args)
    name = args.config.stem if args.config else (args.base or "server")
    label = "all" if args.workload.strip() == "all" else "-".join(s["name"] for s in specs)
    run_dir = args.dir or Path("kpgo-runs") / f"{name}-{label}"
    request = {k: (str(v) if isinstance(v, Path) else [str(x) for x in v] if k == "fragment" else v) for k, v in vars(args).items() if k in REQUEST_KEYS}
    opts = pipeline.RunOptions(
        run_dir, args.base, args.config, tuple(args.fragment), args.source, tuple(specs), design_from(args), args.jobs, guest_from(args),
        sim=sim_from(args), studies=tuple(dict.fromkeys(args.study)), request=request,
        partial_training=bool(getattr(args, "partial_training", False)),
    )
    pipeline.run(opts)
    print((run_dir / "summary.md").read_text())
    bench.raise_if_failed(json.loads((run_dir / "bench" / "results.json").read_text()), run_dir / "bench")
    return 0
