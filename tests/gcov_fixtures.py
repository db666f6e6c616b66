"""Real GCC-produced coverage files for the profile tests, generated at test time.

A small C "kernel" (three objects in subdirectories, like a build tree) is compiled with --coverage, run with
different workloads, and each run's .gcda files are copied into a profile directory (paths relative to the build
directory, as kpgo collects them from a kernel)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

SOURCES = {
    "main.c": r"""
#include <stdlib.h>
int sched_pick(int i, int mode);
int net_rx(int i, int mode);
int never_called(int x);
typedef int (*op_t)(int);
static int twice(int x) { return 2 * x; }
static int thrice(int x) { return 3 * x; }
op_t ops[2] = { twice, thrice };
int main(int argc, char **argv) {
    int mode = argc > 1 ? atoi(argv[1]) : 0;
    int n = argc > 2 ? atoi(argv[2]) : 1000;
    long s = 0;
    for (int i = 0; i < n; i++) {
        s += sched_pick(i, mode);
        s += ops[(mode + i) & 1](i) % (mode + 3);   /* indirect call, variable divisor: value profiling */
        if (mode != 1)
            s += net_rx(i, mode);
    }
    return s == 42;
}
""",
    "kernel/sched.c": r"""
static int helper(int x) { return x * 3 + 1; }
int never_called(int x) { if (x > 5) return x - 1; return x + 1; }
int sched_pick(int i, int mode) {
    int r = 0;
    if (i % 4 == 0)          /* taken 1/4 */
        r += helper(i);
    if (mode == 2 && i % 2)  /* mode 2 only, taken 1/2 */
        r -= 1;
    switch (i % 3) {
    case 0: r += 2; break;
    case 1: r += 5; break;
    default: r ^= 1;
    }
    return r;
}
""",
    "net/core.c": r"""
int net_rx(int i, int mode) {
    int acc = 0;
    for (int k = 0; k < (i & 7); k++)   /* inner loop, 0..7 iterations */
        acc += k;
    if (mode == 0 && acc > 10)
        return acc;
    return -acc;
}
""",
}

OBJECTS = ("main.o", "kernel/sched.o", "net/core.o")


def have_tool(name: str) -> bool:
    return shutil.which(name) is not None


def require_gcc() -> None:
    for tool in ("gcc", "gcov-dump", "gcov-tool", "gcov"):
        if not have_tool(tool):
            pytest.fail(f"{tool} not found: install gcc (with gcov, gcov-dump and gcov-tool); `make test` does")


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, check=True, capture_output=True, text=True)


@dataclass
class GccBuild:
    root: Path  # build directory: sources, objects, .gcno
    exe: Path

    def clear_gcda(self) -> None:
        for p in self.root.rglob("*.gcda"):
            p.unlink()

    def run(self, mode: int, n: int) -> None:
        subprocess.run([str(self.exe), str(mode), str(n)], cwd=self.root, check=False)

    def snapshot(self, dst: Path) -> Path:
        """Copy the current .gcda files into a profile directory (relative paths kept)."""
        dst.mkdir(parents=True)
        for p in self.root.rglob("*.gcda"):
            rel = p.relative_to(self.root)
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, dst / rel)
        return dst

    def profile(self, dst: Path, mode: int, n: int, runs: int = 1) -> Path:
        self.clear_gcda()
        for _ in range(runs):
            self.run(mode, n)
        return self.snapshot(dst)


def build_program(root: Path, flags: tuple[str, ...] = ("--coverage",), opt: str = "-O1") -> GccBuild:
    root.mkdir(parents=True, exist_ok=True)
    for rel, text in SOURCES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for obj in OBJECTS:
        run(["gcc", opt, *flags, "-c", obj[:-2] + ".c", "-o", obj], cwd=root)
    run(["gcc", *flags, *OBJECTS, "-o", "prog"], cwd=root)
    return GccBuild(root=root, exe=root / "prog")


def kernelize(data: bytes) -> bytes:
    """Rewrite a libgcov-written .gcda the way the kernel writes it: no summary, header checksum 0, every counter
    record with its values (no negative lengths), no end marker."""
    import numpy as np

    from kpgo.gcov.gcda import parse_gcda

    g = parse_gcda(data, "fixture").without_summary()
    # Force every counter record to carry its payload: give all counters a value, then put the real values back.
    # (Top-N records always carry theirs.)
    for kind in sorted(g.counter_kinds_present()):
        if not g.is_topn(kind):
            values = g.counters(kind)
            g = g.with_counters(kind, values + np.uint64(1)).with_counters(kind, values)
    g.checksum = 0 if g.checksum is not None else None
    g.trailer = np.zeros(0, dtype=np.uint32)
    return g.to_bytes()


def kernelize_tree(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for p in src.rglob("*.gcda"):
        rel = p.relative_to(src)
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        (dst / rel).write_bytes(kernelize(p.read_bytes()))
    return dst


def gcda_files(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*.gcda"))


@dataclass
class Profiles:
    build: GccBuild
    mode0: Path  # libgcov-written, as produced
    mode1: Path
    mode2: Path
    k0: Path  # kernelized copies (no summary)
    k1: Path
    k2: Path


@pytest.fixture(scope="session")
def gcc_build(tmp_path_factory: pytest.TempPathFactory) -> GccBuild:
    require_gcc()
    return build_program(tmp_path_factory.mktemp("gccbuild"))


@pytest.fixture(scope="session")
def profiles(gcc_build: GccBuild, tmp_path_factory: pytest.TempPathFactory) -> Profiles:
    base = tmp_path_factory.mktemp("profiles")
    m0 = gcc_build.profile(base / "mode0", 0, 1000)
    m1 = gcc_build.profile(base / "mode1", 1, 3000)
    m2 = gcc_build.profile(base / "mode2", 2, 500, runs=2)
    gcc_build.clear_gcda()
    return Profiles(
        build=gcc_build, mode0=m0, mode1=m1, mode2=m2,
        k0=kernelize_tree(m0, base / "k0"), k1=kernelize_tree(m1, base / "k1"), k2=kernelize_tree(m2, base / "k2"),
    )


@pytest.fixture(scope="session")
def value_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A profile from -fprofile-generate (value-profiling counters: topn, indirect_call, time_profiler, ...)."""
    require_gcc()
    root = tmp_path_factory.mktemp("valuebuild")
    b = build_program(root, flags=("-fprofile-generate", "-fprofile-update=single"), opt="-O2")
    b.run(0, 200)
    return root


def env_without_gcov_prefix() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GCOV_")}


# -- synthesized files in any supported layout (written from the format rules, not by kpgo's writer) -------------

TAG_WORDS = (0x01000000, 0x01A10000, 0xA1000000)  # counter values that look like record tags


def version_word(major: int, minor: int = 1) -> int:
    s = f"{chr(ord('A') + major // 10)}{major % 10}{minor}*"
    return int.from_bytes(s.encode(), "big")


Site = tuple[int, list[tuple[int, int]]]  # a top-N site: total, [(value, count), ...]


def synth_gcda(major: int = 12, order: str = "<", functions: list[list[int]] | None = None, *, stamp: int = 0x1234,
               summary: tuple[int, int] | None = None, trailer: list[int] | None = None, negative: bool = False,
               idents: list[int] | None = None, sites: list[list[Site]] | None = None) -> bytes:
    """A .gcda of GCC `major`: header, optional object summary, per function a FUNCTION record and an arc counter
    record, optional words after an end marker (`trailer`, starting with 0). With negative=True (GCC >= 12) a
    record whose counters are all zero is written as libgcov does: negative length, no payload. sites (GCC >= 11):
    per function, the sites of an indirect_call record after its arcs (each: total, n, n value/count pairs)."""
    import numpy as np

    unit = 4 if major >= 12 else 1
    words = [0x67636461, version_word(major), stamp]
    if major >= 12:
        words.append(0)
    if summary is not None:
        words += [0xA1000000, 2 * unit, *summary]
    for i, counts in enumerate([[1, 2, 3], [0], [1 << 40]] if functions is None else functions):
        ident = idents[i] if idents is not None else 1000 + i
        words += [0x01000000, 3 * unit, ident, 0xAAAA0000 + i, 0xBBBB0000 + i]
        if negative and major >= 12 and counts and not any(counts):
            words += [0x01A10000, (1 << 32) - 2 * len(counts) * unit]
        else:
            words += [0x01A10000, 2 * len(counts) * unit]
            for c in counts:
                words += [c & 0xFFFFFFFF, c >> 32]
        if sites is not None and i < len(sites):
            body = []
            for total, pairs in sites[i]:
                for c in (total, len(pairs), *(x for pair in pairs for x in pair)):
                    c &= (1 << 64) - 1
                    body += [c & 0xFFFFFFFF, c >> 32]
            words += [0x01A90000, len(body) * unit, *body]
    if trailer:
        words += trailer
    return np.array(words, dtype=order + "u4").tobytes()


def write_profile(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root
