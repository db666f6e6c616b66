"""kpgo workloads: list the workloads and their parameters; install their packages."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "workloads",
        help="list workloads and their parameters; install their packages",
        description="Workloads are data files in the kpgo package (kpgo/workloads/*.toml). `list` shows each with its "
        "parameters (override with --set KEY=VALUE or --set NAME.KEY=VALUE), its unit and whether its Debian packages "
        "are installed; `install` installs the missing packages with apt-get (root or sudo) and builds kpgo's helper "
        "programs (idempotent).",
    )
    wsub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    ls = wsub.add_parser("list", help="show every workload, its parameters and package status")
    ls.add_argument("names", nargs="?", default="all", metavar="NAME[,NAME...]", help="workloads to show (default all)")
    ls.set_defaults(func=run_list)
    ins = wsub.add_parser("install", help="apt-get install the workloads' packages and build helper programs")
    ins.add_argument("names", nargs="?", default="all", metavar="NAME[,NAME...]", help="workloads (default all)")
    ins.set_defaults(func=run_install)


def run_list(args: argparse.Namespace) -> int:
    from kpgo import workloads
    from kpgo.workloads import install

    specs = workloads.load_many(args.names, what="the argument")
    gaps = install.missing_packages(specs)
    for s in specs:
        status = "ready" if s.name not in gaps else "missing " + ", ".join(gaps[s.name])
        print(f"{s.name}  —  {s.description}")
        print(f"  unit: {s.unit} ({'higher' if s.higher_is_better else 'lower'} is better; {s.aggregate} over "
              f"{', '.join(st.name + ('' if st.each is None else '×' + st.each) for st in s.load)})")
        print(f"  packages: {', '.join(s.packages)}  [{status}]")
        print("  params: " + "  ".join(f"{k}={v}" for k, v in s.params.items()))
        if s.paper is not None:
            src = "" if s.paper.source is None else f"  ({s.paper.source})"
            print(f"  real hardware: {s.paper.params}{src}")
        print()
    if gaps:
        print(f"install the missing packages with: kpgo workloads install {','.join(gaps)}")
    return 0


def run_install(args: argparse.Namespace) -> int:
    from kpgo import workloads
    from kpgo.workloads import install

    specs = workloads.load_many(args.names, what="the argument")
    install.install(specs)
    print(f"workloads ready: {', '.join(s.name for s in specs)}")
    return 0
