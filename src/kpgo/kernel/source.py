"""Find the kernel source: Debian's linux-source tarball extracted once into the cache, or a given tree."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kpgo.errors import UserError
from kpgo.paths import cache_dir

DEFAULT_TARBALL = Path("/usr/src/linux-source-6.12.tar.xz")


@dataclass(frozen=True)
class KernelSource:
    path: Path
    version: str  # from the top Makefile, e.g. "6.12.117"
    ident: str  # identity for cache keys: changes when the tree does


def resolve(source: Path | None) -> KernelSource:
    if source is None:
        return _from_tarball(DEFAULT_TARBALL)
    if source.is_file() and source.name.startswith("linux") and ".tar" in source.name:
        return _from_tarball(source)
    return _from_tree(source)


def _from_tarball(tarball: Path) -> KernelSource:
    if not tarball.exists():
        raise UserError(
            f"kernel source tarball {tarball} not found",
            "install the Debian package linux-source-6.12 (`make setup`) or pass --source PATH to a kernel tree",
        )
    st = tarball.stat()
    stem = tarball.name.split(".tar")[0]
    dest = cache_dir() / "src" / stem
    stamp = f"{tarball}:{st.st_size}:{int(st.st_mtime)}"
    marker = dest / ".kpgo-extracted"
    if not (marker.exists() and marker.read_text() == stamp):
        # One extraction at a time: a second kpgo waits instead of replacing a tree in use.
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest.parent / f".{dest.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (marker.exists() and marker.read_text() == stamp):
                _extract(tarball, dest, stamp)
    ks = _from_tree(dest / stem if (dest / stem / "Makefile").exists() else dest)
    return KernelSource(ks.path, ks.version, hashlib.sha256(stamp.encode()).hexdigest()[:16])


def _extract(tarball: Path, dest: Path, stamp: str) -> None:
    print(f"kpgo: extracting {tarball} into {dest} (once; about 30 s)", file=sys.stderr)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".partial"))
    try:
        with tarfile.open(tarball) as tf:
            tf.extractall(tmp, filter="tar")
        (tmp / ".kpgo-extracted").write_text(stamp)
        if dest.exists():
            shutil.rmtree(dest)
        os.rename(tmp, dest)
    except (tarfile.TarError, EOFError, OSError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and e.errno == 28:
            raise
        # tarfile's "could not be opened" lists every method it tried, one per line: the error stays one line.
        why = "not a complete tar archive" if isinstance(e, (tarfile.ReadError, EOFError)) else " ".join(str(e).split())
        raise UserError(f"cannot extract {tarball}: {why}", "reinstall linux-source-6.12 or pass --source") from None


def _from_tree(tree: Path) -> KernelSource:
    tree = tree.resolve()
    makefile = tree / "Makefile"
    if not makefile.is_file() or not (tree / "Kconfig").is_file():
        raise UserError(f"{tree} is not a kernel source tree (no top-level Makefile and Kconfig)", "pass --source PATH to a Linux tree")
    if not (tree / "arch" / "x86" / "Makefile").is_file():
        raise UserError(f"{tree} has no arch/x86: kpgo builds x86-64 kernels", "pass an x86-capable Linux tree")
    head = makefile.read_text(errors="replace")[:2000]
    nums = {k: re.search(rf"^{k}[ \t]*=[ \t]*(\S*)", head, re.M) for k in ("VERSION", "PATCHLEVEL", "SUBLEVEL", "EXTRAVERSION")}
    if not nums["VERSION"] or not nums["PATCHLEVEL"]:
        raise UserError(f"{makefile} carries no VERSION/PATCHLEVEL", "pass --source PATH to a Linux tree")
    version = ".".join(m.group(1) for k, m in nums.items() if m and m.group(1) and k != "EXTRAVERSION")
    if nums["EXTRAVERSION"] and nums["EXTRAVERSION"].group(1):
        version += nums["EXTRAVERSION"].group(1)
    if (tree / ".config").exists() or (tree / "include" / "config").exists():
        raise UserError(
            f"kernel tree {tree} is not clean (it holds an in-tree build), so out-of-tree builds are refused",
            f"run `make -C {tree} mrproper` or pass another tree",
        )
    ident = f"{tree}:{version}:{_git_head(tree)}:{int(makefile.stat().st_mtime)}"
    return KernelSource(tree, version, hashlib.sha256(ident.encode()).hexdigest()[:16])


def _git_head(tree: Path) -> str:
    head = tree / ".git" / "HEAD"
    try:
        ref = head.read_text().strip()
    except OSError:
        return "nogit"
    if ref.startswith("ref: "):
        try:
            return (tree / ".git" / ref[5:]).read_text().strip()
        except OSError:
            return ref
    return ref
