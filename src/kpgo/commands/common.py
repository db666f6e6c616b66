"""Options shared by several subcommands."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def add_kernel_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("kernel")
    g.add_argument("--source", type=Path, metavar="PATH", help="kernel tree or linux-*.tar.* (default: Debian's /usr/src/linux-source-6.12.tar.xz, extracted once into the cache)")
    g.add_argument("--base", metavar="NAME", default=None, help="built-in base config: server (default) or tiny")
    g.add_argument("--config", type=Path, metavar="FILE", help="start from this .config instead of a built-in base")
    g.add_argument("--fragment", type=Path, action="append", default=[], metavar="FILE", help="config fragment merged on top (repeatable)")
    g.add_argument("-j", "--jobs", type=int, default=(os.cpu_count() or 2) + 1, help="parallel compile jobs (default: cores + 1)")


def add_guest_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("guest")
    g.add_argument("--cpus", type=int, default=2, help="guest vCPUs (default 2)")
    g.add_argument("--memory", default="2G", help="guest memory (default 2G)")
    g.add_argument("--guest-timeout", type=float, default=900, metavar="SECONDS", help="hard limit per guest boot (default 900)")


def add_workload_options(p: argparse.ArgumentParser) -> None:
    from kpgo import workloads

    p.add_argument("--workload", default="redis", metavar="NAME[,NAME...]",
                   help=f"workload(s): {', '.join(workloads.names())}, or all (default redis; see `kpgo workloads list`)")
    p.add_argument("--set", action="append", default=[], metavar="[NAME.]KEY=VALUE",
                   help="override a workload parameter, for every chosen workload that has it or for NAME only (repeatable)")


def chosen_workloads(args: argparse.Namespace) -> list[dict]:
    """The --workload list with --set applied; fails before any boot if a package is missing."""
    from kpgo import workloads
    from kpgo.workloads import install

    specs = workloads.load_many(args.workload, args.set)
    install.require(specs)
    return specs


def guest_from(args: argparse.Namespace):  # -> vm.Guest
    from kpgo import vm

    from kpgo.errors import UserError

    if args.cpus < 1 or args.guest_timeout <= 0:
        raise UserError("--cpus must be ≥ 1 and --guest-timeout > 0", "fix the option")
    return vm.Guest(cpus=args.cpus, memory=args.memory, timeout=args.guest_timeout)
