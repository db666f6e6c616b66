"""kpgo package: a build as the kernel's own .deb (bindeb-pkg), carrying kpgo's manifest."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "package",
        help="a build as an installable .deb (the kernel's bindeb-pkg) that carries kpgo's manifest",
        description="Run the kernel's own `make bindeb-pkg` in the build directory with the make line and environment the "
        "build used (build.json), so nothing is compiled or linked again (checked: vmlinux keeps its build id, the package's "
        "vmlinuz is the build's bzImage), and add kpgo's manifest to the image package at /boot/kpgo-RELEASE.json: kernel "
        "release and source, config, compiler and flags, vmlinux's GNU build id and sha256, the profile's digest and the "
        "workloads it was collected under, the proof that GCC used it, the reproducible-build settings. Install the .deb "
        "with `apt install ./FILE.deb` (or dpkg -i), boot it, and `kpgo verify` says whether it runs (docs/PACKAGING.md). "
        "Needs dpkg-dev and debhelper.",
    )
    p.add_argument("build", type=Path, metavar="BUILD_DIR", help="a directory written by `kpgo build`")
    p.add_argument("-o", "--out", type=Path, metavar="DIR",
                   help="where the .deb files go (default BUILD_DIR/packages); kpgo.json there is the manifest too")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kpgo import package

    done = package.package(args.build, args.out or args.build / "packages")
    print(package.summary(done))
    for other in done.others:
        print(f"package: also {other}")
    return 0
