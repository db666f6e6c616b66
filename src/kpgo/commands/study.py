"""kpgo study: the published studies on a run directory."""

from __future__ import annotations

import argparse
from pathlib import Path

from kpgo.commands.build import add_variant_file_option
from kpgo.commands.common import add_cluster_option, add_design_options, add_guest_options, cluster_from, design_from, guest_from, sim_from


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("study", help="studies on a run: universal profile, cross-application, sensitivity, kernel share, compiler variants",
                       description="Extend a finished `kpgo run` directory with a study; cached steps are reused. "
                       "Each prints its table; `kpgo report RUN_DIR` draws the figures.")
    s = p.add_subparsers(dest="study_name", required=True, metavar="STUDY")
    for name, text in (
        ("universal", "app-specific vs universal (raw and normalized merge of all the run's profiles) vs vanilla, on every workload"),
        ("cross", "every workload on the kernel optimized for each workload (cross-application matrix)"),
        ("variability", "each workload's profile collected a second time: the two collections' similarity beside the workloads', "
         "and the kernel built from the second measured beside the first"),
        ("layout", "BOLT on vanilla and on each workload's PGO kernel, and PGO with C3's function order, from branch records of "
         "the workload, each measured on it; with several workloads their universal variants from every workload's records "
         "merged, measured on every workload (docs/LAYOUT.md)"),
        ("clang", "Clang kernels (clang, clang-thinlto; AutoFDO ones from the clang-train kernel's branch records under every "
         "workload) on every workload (docs/CLANG.md)"),
    ):
        q = s.add_parser(name, help=text, description=text + ". Same as re-running the run's command with --study " + name + ".")
        q.add_argument("run_dir", type=Path, metavar="RUN_DIR")
        add_cluster_option(q, "build, collect and boot")
        q.set_defaults(func=extend_run)
    q = s.add_parser("sensitivity", help="a kernel optimized under one workload setting, measured under the others",
                     description="Collect a profile and build an optimized kernel for each value of one workload parameter, "
                     "then measure every such kernel and vanilla under every value. Results: RUN_DIR/studies/sensitivity/.")
    q.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    q.add_argument("--workload", required=True, metavar="NAME", help="the workload")
    q.add_argument("--vary", required=True, metavar="KEY=V1,V2[,...]", help="the parameter and its values, e.g. clients=1,50")
    q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="other parameters of the workload (repeatable)")
    add_cluster_option(q, "build, collect and boot")
    add_design_options(q)
    add_guest_options(q)
    q.set_defaults(func=sensitivity)
    q = s.add_parser("share", help="the kernel's share of CPU time, instructions and simulated L1i/iTLB misses per workload",
                     description="Boot the run's vanilla kernel under each of its workloads with simulated counters and print "
                     "the kernel's share of busy CPU time, of instructions and of L1i/iTLB misses (the characterization table of "
                     "\"One Profile Fits All\"). Results: RUN_DIR/studies/share/. An experiment on what the shares depend on "
                     "(--set, --vary, --cpus: the load, the guest) gets a directory of its own, studies/share-WHAT/ (docs/EVALUATION.md).")
    q.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    q.add_argument("--workload", metavar="NAME[,NAME...]", default=None, help="these of the run's workloads only (default: all of them)")
    q.add_argument("--set", action="append", default=[], metavar="[NAME.]KEY=VALUE", help="a workload parameter for this study (repeatable)")
    q.add_argument("--vary", metavar="KEY=V1,V2[,...]", default=None,
                   help="measure one workload (--workload NAME) once per value of its parameter KEY, e.g. concurrency=1,32")
    add_cluster_option(q, "build and boot")
    add_design_options(q)
    add_guest_options(q)
    q.set_defaults(func=share, boots=1)
    q = s.add_parser("compiler", help="compiler variants (-O3, -Os, GCC 11, Clang, inlining, no reordering, PGO with them) beside -O2",
                     description="Build each compiler variant from the run's kernel source and configuration (PGO variants once "
                     "per workload, with the run's profiles; every build cached and proven like the run's), measure each beside "
                     "-O2 vanilla on the run's workloads with the bench design below (simulated counters under TCG, wall-clock "
                     "under KVM), and print per variant and workload the ratio to vanilla with its 95% CI, the geomeans and the "
                     "code size. The design options left out (boots, runs, order, simulator) are the run's own. Results: "
                     "RUN_DIR/studies/compiler/ (results.json, compiler.json); `kpgo report RUN_DIR` draws the figures. "
                     "docs/COMPILERS.md.")
    q.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    q.add_argument("--variants", metavar="NAME[,NAME...]", default=None,
                   help="the variants (`kpgo variants list`; vanilla, the baseline, is always measured); default: "
                   "vanilla,o3,os,gcc11,clang,inline,noreorder,optimized,pgo-o3,pgo-no-pt")
    q.add_argument("--workload", metavar="NAME[,NAME...]", default=None, help="measure on these of the run's workloads only (default: all of them)")
    add_variant_file_option(q)
    add_cluster_option(q, "build and boot")
    add_design_options(q)
    add_guest_options(q)
    q.set_defaults(func=compiler, boots=None, runs=None, order=None)  # None: the run's (see compiler())


def extend_run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from kpgo import study
    from kpgo.commands import run

    opts = study.run_options(args.run_dir)
    return run.execute(replace(opts, studies=tuple(dict.fromkeys((*opts.studies, args.study_name)))), cluster_from(args))


def parse_vary(vary: str, sets: list[str]) -> tuple[str, list[str]]:
    """--vary KEY=V1,V2 as (KEY, [V1, V2]), refused when malformed, a value is given twice or --set fixes KEY."""
    from kpgo.errors import UserError

    key, sep, values = vary.partition("=")
    if not sep or not key.strip():
        raise UserError(f"--vary {vary!r}: expected KEY=V1,V2", "e.g. --vary clients=1,50")
    key = key.strip()
    vals = [v.strip() for v in values.split(",") if v.strip()]
    if len(set(vals)) < len(vals):
        raise UserError(f"--vary {vary}: a value is given twice", "give each value once, e.g. --vary clients=1,50")
    fixed = [s for s in sets if s.partition("=")[0].strip().rpartition(".")[2] == key]
    if fixed:
        raise UserError(f"--set {fixed[0]} fixes the parameter --vary {key} varies", f"drop --set {key}=... or vary another parameter")
    return key, vals


def sensitivity(args: argparse.Namespace) -> int:
    from kpgo import bench, study
    from kpgo.errors import UserError
    from kpgo.workloads import install

    key, vals = parse_vary(args.vary, args.set)
    specs = study.vary(args.workload, key, vals, args.set)
    names = [s.name for s in specs]
    twice = [n for i, n in enumerate(names) if n in names[:i]]
    if twice:
        # Values that differ only in characters a directory name cannot hold would share one kernel and profile.
        raise UserError(f"--vary {args.vary}: two values give the same kernel name {twice[0]}", "use values that differ in letters or digits")
    if not args.cluster:  # on a cluster each guest node checks them
        install.require(specs)
    res = study.sensitivity(args.run_dir, specs, design_from(args), guest_from(args), sim_from(args), cluster_from(args))
    print(bench.format_table(res), flush=True)
    bench.raise_if_failed(res, args.run_dir / "studies" / "sensitivity")
    return 0


def share(args: argparse.Namespace) -> int:
    from kpgo import bench, study, workloads
    from kpgo.errors import UserError

    if args.sim is False:  # the study is the simulated counters' shares: there is nothing to measure without them
        raise UserError("kpgo study share counts simulated events; --no-sim leaves it nothing to measure",
                        "drop --no-sim (the kernel's share of CPU time alone is in every bench's results.json)")
    args.sim = True
    run = study.run_options(args.run_dir).workloads
    names = workloads.parse_names(args.workload) if args.workload else [w.name for w in run]
    outside = [n for n in names if n not in {w.name for w in run}]
    if outside:
        raise UserError(f"--workload {outside[0]} is not one of the run's workloads ({', '.join(w.name for w in run)})",
                        "choose among them, or extend the run with it")
    if args.vary:
        if len(names) != 1:
            raise UserError("--vary needs one --workload", "e.g. --workload memcached --vary concurrency=1,32")
        key, vals = parse_vary(args.vary, args.set)
        specs = study.vary(names[0], key, vals, args.set)
    else:
        specs = workloads.load_many(",".join(names), args.set)
    out = study.share_dir(args.run_dir, args.set, args.vary, args.cpus, args.data)
    res = study.share(args.run_dir, specs, out, design_from(args), guest_from(args), sim_from(args), cluster_from(args))
    print(study.format_share(bench.kernel_share(res)), flush=True)
    bench.raise_if_failed(res, out)
    return 0


def compiler(args: argparse.Namespace) -> int:
    from kpgo import bench, study, variants, workloads

    chosen = variants.parse_names(args.variants or ",".join(variants.STUDY_DEFAULTS), args.variant_file)
    names = workloads.parse_names(args.workload) if args.workload else None
    run = study.run_options(args.run_dir).design
    design = bench.Design(args.boots or run.boots, args.runs or run.runs, args.order or run.order, args.seed,
                          args.precision if args.precision is not None else run.precision, args.max_boots, args.max_time)
    sim = sim_from(args) if args.sim is not None or args.sim_opt else study.run_options(args.run_dir).sim
    table, results = study.compiler(args.run_dir, chosen, names, design, guest_from(args), sim, cluster_from(args))
    print(study.format_compiler(table), flush=True)
    bench.raise_if_failed(results, args.run_dir / "studies" / "compiler")
    return 0
