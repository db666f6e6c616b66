"""kpgo variants: list the compiler variants; install their compilers."""

from __future__ import annotations

import argparse

from kpgo.commands.build import add_variant_file_option


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "variants",
        help="list compiler variants (compiler, level, flags, profile); install their compilers",
        description="Compiler variants are data files in the kpgo package (kpgo/variants/*.toml; docs/COMPILERS.md); "
        "--variant-file FILE adds one of your own. `list` shows each with its compiler, optimization level, extra flags, "
        "whether it takes a profile and whether its compiler is installed; `install` installs the missing compilers' Debian "
        "packages with apt-get (root or sudo).",
    )
    vsub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    ls = vsub.add_parser("list", help="show every variant and whether its compiler is installed")
    ls.add_argument("names", nargs="?", default="all", metavar="NAME[,NAME...]", help="variants to show (default all)")
    add_variant_file_option(ls)
    ls.set_defaults(func=run_list)
    ins = vsub.add_parser("install", help="apt-get install the compilers of the variants")
    ins.add_argument("names", nargs="?", default="all", metavar="NAME[,NAME...]", help="variants (default all)")
    add_variant_file_option(ins)
    ins.set_defaults(func=run_install)


def run_list(args: argparse.Namespace) -> int:
    from kpgo import variants
    from kpgo.kernel import kbuild

    chosen = variants.parse_names(args.names, args.variant_file, what="the argument")
    rows = [["name", "compiler", "opt", "profile", "installed", "order", "flags"]]
    for v in chosen:
        profile = "gcov" if v.gcov else "yes" if v.profile else "no"
        missing = v.compiler.missing_tools()
        # what kpgo adds by default to a build with a profile, in (+ ...) (--no-partial-training drops it)
        added = kbuild.partial_training_flags(v)
        installed = "yes" if not missing else "no: " + " ".join(v.compiler.packages)
        rows.append([v.name, v.compiler.name, f"-{v.opt}", profile, installed, "yes" if v.order else "no",
                     (" ".join(v.flags) or "–") + (f"  (+ {' '.join(added)})" if added else "")])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    print()
    for v in chosen:
        print(f"{v.name}: {v.description}" + ("" if v.shipped else f" ({v.path})"))
    if any(v.order for v in chosen):
        print("\norder: the functions are linked in the order C3 gives from a recorded call graph (--call-graph DIR; docs/LAYOUT.md)")
    if any(v.profile for v in chosen):
        print("\n(+ ...): added by kpgo to a build with a profile unless --no-partial-training (docs/COMPILERS.md, \"Partial training by default\")")
    lacking = [v.name for v in chosen if not v.compiler.installed()]
    if lacking:
        print(f"\ninstall the missing compilers with: kpgo variants install {','.join(lacking)}")
    return 0


def run_install(args: argparse.Namespace) -> int:
    from kpgo import variants
    from kpgo.workloads import install

    chosen = variants.parse_names(args.names, args.variant_file, what="the argument")
    lacking = [v for v in chosen if not v.compiler.installed()]
    if lacking:
        # the workloads' apt-get mechanism (dpkg check, refresh the lists once on failure), one entry per compiler
        install.install_packages({v.compiler.name: v.compiler.packages for v in lacking})
    still = [v.name for v in chosen if v.compiler.missing_tools()]
    if still:
        from kpgo.errors import InfraError

        raise InfraError(f"compilers still missing after apt-get install: {', '.join(still)}", "see ~/.cache/kpgo/apt.log")
    print(f"compilers ready: {', '.join(sorted({v.compiler.name for v in chosen}))}")
    return 0
