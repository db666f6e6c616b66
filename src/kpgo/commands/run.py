"""kpgo run: the main job."""

from __future__ import annotations

import argparse
from pathlib import Path

from kpgo.commands.common import add_guest_options, add_kernel_options, add_workload_options, chosen_workloads, guest_from


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="the whole loop: builds, collect, fix, optimized build with proof, bench, summary",
        description="Build the instrumented kernel, collect a profile under each workload, add the object summary, "
        "build one optimized kernel per workload and prove GCC used its profile, build the vanilla kernel, benchmark "
        "vanilla vs optimized under each workload, and write summary.md and run.json. Steps are cached: run it again "
        "to resume.",
    )
    p.add_argument("--dir", type=Path, metavar="RUN_DIR", help="run directory (default: kpgo-runs/<base>-<workload>)")
    p.add_argument("--boots", type=int, default=3, help="bench boots per kernel (default 3)")
    p.add_argument("--runs", type=int, default=1, help="bench runs per boot after the warm-up (default 1)")
    add_kernel_options(p)
    add_workload_options(p)
    add_guest_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kpgo import pipeline

    specs = chosen_workloads(args)
    name = args.config.stem if args.config else (args.base or "server")
    label = "all" if args.workload.strip() == "all" else "-".join(s["name"] for s in specs)
    run_dir = args.dir or Path("kpgo-runs") / f"{name}-{label}"
    opts = pipeline.RunOptions(run_dir, args.base, args.config, tuple(args.fragment), args.source, tuple(specs), args.boots, args.runs, args.jobs, guest_from(args))
    pipeline.run(opts)
    print((run_dir / "summary.md").read_text())
    return 0
