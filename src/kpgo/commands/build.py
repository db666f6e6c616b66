"""kpgo build: one kernel variant, out of tree."""

from __future__ import annotations

import argparse
from pathlib import Path

from kpgo.commands.common import add_kernel_options


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "build",
        help="build a kernel variant (vanilla, instrumented, optimized) out of tree",
        description="Build one kernel variant with Kbuild (O=). The optimized variant compiles with the profile and "
        "proves, per object, that GCC used it; it fails below 95%. Cached: an unchanged build is not redone.",
    )
    p.add_argument("--variant", choices=("vanilla", "instrumented", "optimized"), default="vanilla")
    p.add_argument("--profile", type=Path, metavar="DIR", help="profile directory for --variant optimized (after `kpgo profile fix`)")
    p.add_argument("-o", "--out", type=Path, metavar="DIR", help="build directory (default: builds/<base>-<variant>)")
    p.add_argument("--kcflags", default="", help="extra compiler flags for every kernel object")
    p.add_argument("--partial-training", action="store_true",
                   help="with --variant optimized: code the profile never ran keeps its normal optimization "
                   "(GCC's -fprofile-partial-training) instead of being optimized for size")
    add_kernel_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kpgo.errors import UserError
    from kpgo.kernel import kbuild, kconfig, source

    kbuild.check_request(args.variant, args.profile)
    kcflags = tuple(args.kcflags.split())
    if args.partial_training:
        if args.variant != "optimized":
            raise UserError("--partial-training is only for --variant optimized", "drop it or add --variant optimized --profile DIR")
        kcflags += (kbuild.PARTIAL_TRAINING,)
    spec = kconfig.resolve(args.base, args.config, args.fragment)
    src = source.resolve(args.source)
    out = args.out or Path("builds") / f"{spec.name}-{args.variant}"
    m = kbuild.build(kbuild.BuildRequest(src, spec, args.variant, out, args.profile, args.jobs, kcflags))
    sizes = m["sizes"]
    print(f"kernel: {m['bzImage']}  ({m['kernel_release']}, {m['seconds']['total']:.0f} s)")
    print(f"size: functions {sizes.get('functions_size') or '–'}  text span {sizes.get('text_span') or '–'}  "
          f"objects' .text.hot {sizes['text_hot']}  .text.unlikely {sizes['text_unlikely']} bytes (vmlinux .text section, padded: {sizes['vmlinux_text']})")
    if "proof" in m:
        pr = m["proof"]
        print(f"profile used by GCC in {pr['objects_used']}/{pr['objects_nonempty']} objects with a non-empty profile ({pr['ratio']:.1%})")
    return 0
