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

from kpgo import inputs, proc
from kpgo.errors import UserError
from kpgo.paths import cache_dir
from kpgo.progress import say

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
    ks = _from_tree(_tree_in(dest, stem))
    return KernelSource(ks.path, ks.version, hashlib.sha256(stamp.encode()).hexdigest()[:16])


def _tree_in(dest: Path, stem: str) -> Path:
    """The kernel tree of an extracted tarball: the directory named as the file (linux-6.12.tar.xz: linux-6.12/), else
    its one top-level directory with a Makefile (Debian names every release's tarball's directory linux-source-6.12,
    however the file is called: linux-source-6.12.111.tar.xz from the archive holds linux-source-6.12/), else dest."""
    if (dest / stem / "Makefile").exists():
        return dest / stem
    tops = [d for d in dest.iterdir() if d.is_dir() and (d / "Makefile").is_file()]
    return tops[0] if len(tops) == 1 else dest


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
    if not inputs.is_regular(makefile) or not inputs.is_regular(tree / "Kconfig"):
        raise UserError(f"{tree} is not a kernel source tree (no top-level Makefile and Kconfig)", "pass --source PATH to a Linux tree")
    if not (tree / "arch" / "x86" / "Makefile").is_file():
        raise UserError(f"{tree} has no arch/x86: kpgo builds x86-64 kernels", "pass an x86-capable Linux tree")
    head = inputs.read_bytes(makefile, "pass --source PATH to a Linux tree", inputs.TEXT_LIMIT)[:2000].decode(errors="replace")
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
    def read(path: Path) -> str | None:  # anything but a small text file (a FIFO, a device) is no git here
        try:
            return inputs.read_text(path, "", 64 * inputs.KiB).strip()
        except UserError:
            return None

    ref = read(tree / ".git" / "HEAD")
    if ref is None:
        return "nogit"
    if ref.startswith("ref: "):
        return read(tree / ".git" / ref[5:]) or ref
    return ref


# ---- patched copies: kpgo's kernel patches (value profiles, function order) go on a cached copy, never the user's tree ----

def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
    return h.hexdigest()[:12]


def patch_files(patch: Path) -> list[str]:
    """The files a patch changes or adds, relative to the tree."""
    return re.findall(r"^\+\+\+ b/(\S+)", patch.read_text(), re.M)


def patched_copy(source: KernelSource, patch: Path, prefix: str, what: str, hint: str) -> KernelSource:
    """A copy of `source` with `patch` applied, made once in the cache (cache/src/PREFIX-IDENT-DIGEST) and keyed by
    the source and the patch: its ident changes with either. A tree the patch does not fit is refused in one line
    naming the hunk (`what` names the patch in it, `hint` says what to do instead)."""
    digest = _digest(patch.read_bytes())
    dest = cache_dir() / "src" / f"{prefix}-{source.ident}-{digest}"
    marker = dest / ".kpgo-patched"
    ident = _digest(source.ident.encode(), digest.encode())
    if not marker.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest.parent / f".{dest.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a second kpgo waits for the copy instead of making its own
            if not marker.exists():
                _make_patched(source.path, dest, patch, what, hint)
    return KernelSource(dest, source.version, ident)


def _patch_argv(tree: Path, patch: Path, dry: bool) -> list[str]:
    # --fuzz=0: a hunk whose context moved is refused, not placed somewhere near it
    return ["patch", "-p1", "--batch", "--forward", "--fuzz=0", *(["--dry-run"] if dry else ["--silent"]), "-d", str(tree), "-i", str(patch)]


def _make_patched(tree: Path, dest: Path, patch: Path, what: str, hint: str) -> None:
    # First on the user's tree without writing anything: a tree the patch does not fit gets one line naming the hunk.
    dry = proc.run(_patch_argv(tree, patch, dry=True), check=False, what="patch --dry-run")
    if dry.returncode != 0:
        # patch says "checking file F" before each file's hunks and "Hunk #N FAILED at L." for each that does not fit
        where, failed = "", ""
        for ln in (ln.strip() for ln in dry.output.splitlines()):
            if ln.startswith(("checking file ", "patching file ")):
                where = ln.split(" file ", 1)[1]
            elif "FAILED" in ln or "can't find file" in ln or "Reversed" in ln or "malformed" in ln:
                failed = ln.rstrip(".")
                break
        failed = failed or (dry.output.strip().splitlines() or ["patch failed"])[-1]
        raise UserError(f"{what} does not apply to {tree}: {where + ': ' if where else ''}{failed}", hint)
    say(f"making a patched copy of {tree} in {dest} ({patch.name}; once)")
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".partial"))
    try:
        # Hard links make the copy cheap; each file the patch changes is then copied for real, so the source stays as it was.
        linked = proc.run(["cp", "-al", f"{tree}/.", str(tmp)], check=False, what="cp -al")
        if linked.returncode != 0:
            shutil.rmtree(tmp)
            tmp.mkdir()
            proc.run(["cp", "-a", f"{tree}/.", str(tmp)], what="cp -a")
        for rel in patch_files(patch):
            f = tmp / rel
            if f.exists():
                data, mode = f.read_bytes(), f.stat().st_mode
                f.unlink()
                f.write_bytes(data)
                f.chmod(mode)  # a script the patch changes stays executable (scripts/link-vmlinux.sh)
        proc.run(_patch_argv(tmp, patch, dry=False), what="patch")
        (tmp / ".kpgo-patched").write_text(patch.name)
        if dest.exists():
            shutil.rmtree(dest)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
