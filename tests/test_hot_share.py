"""`--hot-share S`: the hot-count cut computed from a real profile, and GCC following it.

A small program with one hot function (a 64-step loop per call) and one warm one (called every 100th iteration)
is compiled with -fprofile-arcs and run; its .gcda, fixed by kpgo, is the profile. The cut is checked against the
counters sorted by hand, and GCC's section placement shows the compiler used it: with its default cut both
functions are hot (.text.hot.*); with the hottest 90% of the work hot, the warm function is not."""

from __future__ import annotations

import shutil
import subprocess
from itertools import accumulate
from pathlib import Path

import pytest

from conftest import assert_one_line_error, kpgo
from gcov_fixtures import require_gcc
from kpgo import variants
from kpgo.errors import UserError
from kpgo.gcov.gcda import ARCS, read_gcda
from kpgo.gcov.profile import fix_profile, hot_fraction
from kpgo.kernel import kbuild

PROGRAM = r"""
#include <stdlib.h>
__attribute__((noinline)) int warm(int x) { int s = 0; for (int k = 0; k < (x & 3); k++) s += k * x; return s; }
__attribute__((noinline)) int hot(int x) { int s = 0; for (int k = 0; k < 64; k++) s ^= (x + k) * 7; return s; }
int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 100000; long t = 0;
    for (int i = 0; i < n; i++) { t += hot(i); if (i % 100 == 0) t += warm(i); }
    return t == 3;
}
"""


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(build dir with a.c, fixed profile dir holding a.gcda)."""
    require_gcc()
    root = tmp_path_factory.mktemp("hot")
    build = root / "build"
    build.mkdir()
    (build / "a.c").write_text(PROGRAM)
    subprocess.run(["gcc", "-O2", "-fprofile-arcs", "a.c", "-o", "a"], cwd=build, check=True)
    subprocess.run(["./a"], cwd=build, check=False)
    raw = root / "raw"
    raw.mkdir()
    shutil.move(build / "a.gcda", raw / "a.gcda")
    fix_profile(raw, root / "fixed")
    return build, root / "fixed"


def text_sections(build: Path, profile: Path, flags: tuple[str, ...]) -> set[str]:
    shutil.copyfile(profile / "a.gcda", build / "a.gcda")
    subprocess.run(["gcc", "-O2", "-fprofile-use", "-ffunction-sections", *flags, "-c", "a.c", "-o", "a.o"], cwd=build, check=True)
    out = subprocess.run(["objdump", "-h", "a.o"], cwd=build, check=True, capture_output=True, text=True).stdout
    return {w for w in out.split() if w.startswith(".text")}


@pytest.mark.parametrize("share", [0.5, 0.9, 0.99, 0.999])
def test_cut_matches_the_counters_sorted_by_hand(program: tuple[Path, Path], share: float) -> None:
    _, fixed = program
    counts = sorted((int(c) for c in read_gcda(fixed / "a.gcda").counters(ARCS) if c), reverse=True)
    k = next(i for i, acc in enumerate(accumulate(counts)) if acc >= share * sum(counts))
    h = hot_fraction(fixed, share)
    assert (h["threshold"], h["hot_counters"], h["executed_counters"]) == (counts[k], k + 1, len(counts))
    assert h["sum_max"] == counts[0] and h["fraction"] == max(1, counts[0] // counts[k])
    assert h["gcc_threshold"] == counts[0] // h["fraction"] >= counts[k]


def test_gcc_follows_the_cut(program: tuple[Path, Path]) -> None:
    build, fixed = program
    default = text_sections(build, fixed, ())
    assert {".text.hot.hot", ".text.hot.warm"} <= default
    flags = kbuild.hot_share_flags(variants.get("optimized"), fixed, 0.9)
    assert flags == (f"--param=hot-bb-count-fraction={hot_fraction(fixed, 0.9)['fraction']}",)
    cut = text_sections(build, fixed, flags)
    assert ".text.hot.hot" in cut and ".text.hot.warm" not in cut and ".text.warm" in cut


def test_refused_where_it_does_not_apply(tmp_path: Path, program: tuple[Path, Path]) -> None:
    assert_one_line_error(kpgo("build", "--hot-share", "1.5", "--dry-run"), 1, "--hot-share 1.5 is not a share between 0 and 1")
    assert_one_line_error(kpgo("build", "--variant", "vanilla", "--hot-share", "0.9", "--dry-run"), 1,
                          "--hot-share is only for a variant that takes a profile", "vanilla takes none")
    zero = tmp_path / "zero"
    zero.mkdir()
    g = read_gcda(program[1] / "a.gcda")
    (zero / "a.gcda").write_bytes(g.with_counters(ARCS, g.counters(ARCS) * 0).to_bytes())
    with pytest.raises(UserError, match="every arc counter is zero") as e:  # exit 1: the profile given, not a failure of kpgo's
        hot_fraction(zero, 0.9)
    assert type(e.value) is UserError and e.value.exit_code == 1 and "\n" not in str(e.value)
