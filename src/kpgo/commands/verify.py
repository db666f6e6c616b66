"""kpgo verify: is the running kernel this kpgo build, and which profile did it use? One line."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="is the running kernel a kpgo build (installed package, --build DIR, --package FILE.deb), and which profile did it use?",
        description="Compare the running kernel's GNU build id (/sys/kernel/notes) with a kpgo build's vmlinux: the one "
        "the installed package's manifest names (/boot/kpgo-$(uname -r).json, written by `kpgo package`), or a build "
        "directory's, or a package's. Prints one line: 'yes: ...' with the build and its profile (digest, workloads, proof), "
        "'no: ...' or 'cannot tell: ...' with the reason. Exit status: 0 yes, 4 no, 5 cannot tell (no manifest for the running "
        "kernel, no build id in its notes), 1 bad input (docs/PACKAGING.md).",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument("--build", type=Path, metavar="DIR", help="the build directory of `kpgo build` to compare with")
    g.add_argument("--package", type=Path, metavar="FILE.deb", help="the .deb of `kpgo package` to compare with")
    p.add_argument("--notes", type=Path, metavar="FILE", default=None,
                   help="the running kernel's notes (default /sys/kernel/notes); e.g. a copy taken on the machine in question")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kpgo import package

    verdict = package.verify(args.build, args.package, args.notes or package.NOTES)
    print(verdict.line)
    return verdict.exit_code
