"""Full disk: a profile write, a merge and a kernel build on a file system with no space left (a small tmpfs,
filled but for a few pages, so the writes start and then fail) end with one line naming the full file system
and the next step, exit 3, and nothing half-written left that looks complete. Mounting needs root (CI is root)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import assert_one_line_error, kpgo
from gcov_fixtures import Profiles, gcc_build, profiles  # noqa: F401

FREE = 8 * 1024  # two pages: the first files of an output fit, the rest do not


@pytest.fixture
def full(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "full"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "kpgo-full-disk", str(mnt)], capture_output=True, text=True)
    assert res.returncode == 0, f"cannot mount a tmpfs (these tests need root): {res.stderr}"
    try:
        with open(mnt / "filler", "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError as e:
                assert e.errno == errno.ENOSPC
        os.truncate(mnt / "filler", os.path.getsize(mnt / "filler") - FREE)
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def big_profile(src: Path, dst: Path, copies: int = 40) -> Path:
    """A profile of many files (copies of a real kernel-style .gcda), so that its output does not fit in FREE."""
    for i in range(copies):
        d = dst / f"dir{i}"
        d.mkdir(parents=True)
        shutil.copy(src / "main.gcda", d / "main.gcda")
    return dst


def left_behind(mnt: Path) -> list[str]:
    return sorted(p.name for p in mnt.iterdir() if p.name != "filler")


def test_profile_fix_on_a_full_disk(profiles: Profiles, full: Path, tmp_path: Path) -> None:  # noqa: F811
    src = big_profile(profiles.k0, tmp_path / "big")
    res = kpgo("profile", "fix", src, "-o", full / "fixed")
    assert_one_line_error(res, 3, f"the file system of {full / 'fixed'} is full", "free some space there")
    assert left_behind(full) == []  # neither the output nor its temporary sibling


def test_profile_merge_on_a_full_disk(profiles: Profiles, full: Path, tmp_path: Path) -> None:  # noqa: F811
    a = big_profile(profiles.k0, tmp_path / "a")
    b = big_profile(profiles.k1, tmp_path / "b")
    res = kpgo("profile", "merge", a, b, "-o", full / "merged")
    assert_one_line_error(res, 3, f"the file system of {full / 'merged'} is full", "free some space there")
    assert left_behind(full) == []


@pytest.mark.vm  # needs the kernel source (extracted once into the cache); no boot
def test_kernel_build_on_a_full_disk(full: Path) -> None:
    """make fails deep in its log; kpgo says why, and the build directory has no build.json (so it is never
    taken for a finished build, and the next run builds it again)."""
    res = kpgo("build", "--base", "tiny", "-o", full / "b")
    assert_one_line_error(res, 3, f"the file system of {full / 'b'} is full", "run the same command again")
    assert not (full / "b" / "build.json").exists()
