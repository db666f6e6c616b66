"""kpgo build: one kernel variant, out of tree."""

from __future__ import annotations

import argparse
from pathlib import Path

from kpgo.commands.common import add_kernel_options


def add_variant_file_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--variant-file", type=Path, action="append", default=[], metavar="FILE",
                   help="a variant of your own (a TOML file like kpgo's, docs/COMPILERS.md), chosen by its name; repeatable")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "build",
        help="build a kernel variant (vanilla, instrumented, optimized, o3, clang, ...: `kpgo variants list`) out of tree",
        description="Build one kernel variant with Kbuild (O=). A variant names the compiler, the optimization level, extra "
        "flags and whether it takes a profile (`kpgo variants list`, docs/COMPILERS.md). A variant with a profile compiles "
        "with it and proves, per object and by the counts GCC read, that GCC used it; it fails below 95% of the objects or 80% of the counts. "
        "A variant with an order (order, pgo-order) links "
        "the functions in the order C3 gives from a recorded call graph and checks it in the binary; one with BOLT (bolt, pgo-bolt) "
        "rewrites vmlinux with BOLT from recorded branches and fails when BOLT could use too little of them (docs/LAYOUT.md). "
        "Cached: an unchanged build is not redone.",
    )
    p.add_argument("--variant", metavar="NAME", default=None,
                   help="the variant to build (default vanilla, or the one --variant-file defines when it is given once)")
    add_variant_file_option(p)
    p.add_argument("--profile", type=Path, metavar="DIR", help="profile directory for a variant that takes one (after `kpgo profile fix`)")
    p.add_argument("--stale-profile", action="store_true",
                   help="use a --profile collected on another kernel version as it is: GCC drops the functions whose code changed "
                   "(what `kpgo profile port` is compared with; docs/PROFILES.md)")
    p.add_argument("--call-graph", type=Path, metavar="DIR",
                   help="for a variant that orders functions (order, pgo-order): the branch profile of `kpgo collect BUILD_DIR --branches` "
                   "(or its callgraph.tsv) whose call graph C3 orders; best recorded on the kernel being reordered (docs/LAYOUT.md)")
    p.add_argument("--branches", type=Path, metavar="DIR",
                   help="for a variant that runs BOLT (bolt, pgo-bolt): the branch profile of `kpgo collect BUILD_DIR --branches`, "
                   "recorded on a kernel of the same code without BOLT: vanilla for bolt, pgo-nosplit for pgo-bolt (docs/LAYOUT.md, \"BOLT\")")
    p.add_argument("-o", "--out", type=Path, metavar="DIR", help="build directory (default: builds/<base>-<variant>)")
    p.add_argument("--kcflags", default="", help="extra compiler flags for every kernel object, after the variant's")
    p.add_argument("--partial-training", action=argparse.BooleanOptionalAction, default=None,
                   help="with a variant that takes a profile: code the profile never ran keeps its normal optimization "
                   "(GCC's -fprofile-partial-training), the default for such variants (docs/COMPILERS.md says why); "
                   "--no-partial-training: GCC's default, that code optimized for size")
    p.add_argument("--hot-share", type=float, metavar="S",
                   help="with a variant that takes a profile: only the code holding the hottest share S of the profile's "
                   "executed work (e.g. 0.99) is optimized for speed, the rest of the executed code for size (GCC's "
                   "hot-bb-count-fraction, computed from the profile; docs/COMPILERS.md)")
    p.add_argument("--values", action="store_true",
                   help="with --variant instrumented: record value profiles too (indirect-call targets, divisors, string "
                   "sizes; GCC's -fprofile-values) from a patched copy of the source and kpgo's GCC plugin (docs/VALUES.md)")
    p.add_argument("--dry-run", action="store_true", help="print the configure and make command lines (CC=, LLVM=, KCFLAGS) and build nothing")
    add_kernel_options(p)
    p.set_defaults(func=run)


def chosen_variant(name: str | None, files: list[Path]):  # -> variants.Variant
    """--variant NAME among kpgo's and the --variant-file ones; without it vanilla, or the one file's variant."""
    from kpgo import variants

    if name is None:
        if len(files) > 1:
            from kpgo.errors import UserError

            raise UserError(f"{len(files)} --variant-file given and no --variant", "name the one to build with --variant NAME")
        return variants.read(files[0]) if files else variants.get("vanilla")
    return variants.get(name, files)


def run(args: argparse.Namespace) -> int:
    from kpgo import variants
    from kpgo.errors import UserError
    from kpgo.kernel import bolt, kbuild, kconfig, order, proof, source

    variant = chosen_variant(args.variant, args.variant_file)
    if args.partial_training and not variant.profile:
        raise UserError(f"--partial-training is only for --variant optimized and the other variants that take a profile; {variant.name} takes none",
                        "drop it or add --variant optimized --profile DIR")
    if args.partial_training and variants.NO_PARTIAL_TRAINING in variant.flags:
        raise UserError(f"--partial-training contradicts the variant {variant.name}, which turns it off",
                        "drop --partial-training, or build --variant optimized")
    kbuild.check_request(variant, args.profile, need_compiler=not args.dry_run, with_values=args.values, call_graph=args.call_graph,
                         branches=args.branches)
    kcflags = tuple(args.kcflags.split())
    if args.partial_training is not False:  # the default wherever a profile is used
        kcflags += kbuild.partial_training_flags(variant)
    kcflags += kbuild.hot_share_flags(variant, args.profile, args.hot_share)
    spec = kconfig.resolve(args.base, args.config, args.fragment)
    src = source.resolve(args.source)
    out = args.out or Path("builds") / f"{spec.name}-{variant.name}"
    req = kbuild.BuildRequest(src, spec, variant, out, args.profile, args.jobs, kcflags, args.values, args.call_graph,
                              args.branches, args.stale_profile)
    if args.dry_run:
        print("\n".join(kbuild.dry_run(req)))
        return 0
    m = kbuild.build(req)
    sizes = m["sizes"]
    print(f"kernel: {m['bzImage']}  ({m['kernel_release']}, {m['seconds']['total']:.0f} s)")
    print(f"size: functions {sizes.get('functions_size') or '–'}  text span {sizes.get('text_span') or '–'}  "
          f"objects' .text.hot {sizes['text_hot']}  .text.unlikely {sizes['text_unlikely']} bytes (vmlinux .text section, padded: {sizes['vmlinux_text']})")
    if "proof" in m and variant.autofdo:
        from kpgo import afdo

        print(afdo.summary_line(m["proof"]))
    elif "proof" in m:
        pr = m["proof"]
        read = f"; {pr['weight_read']:.1%} of its arc counts read" if "weight_read" in pr else ""
        print(f"profile used by GCC in {pr['objects_used']}/{pr['objects_nonempty']} objects with a non-empty profile ({pr['ratio']:.1%}){read}")
        print(proof.format_values(pr.get("values")))
    if "order" in m:
        print("\n".join(order.summary_lines(m["order"])))
    if "bolt" in m:
        print("\n".join(bolt.summary_lines(m["bolt"])))
    return 0
