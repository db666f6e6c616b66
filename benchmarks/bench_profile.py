#!/usr/bin/env python3
"""Speed of `kpgo profile` on full-size profiles, side by side with `gcov-tool merge` (prints figures; not a test).

    PYTHONPATH=src python3 benchmarks/bench_profile.py [--profile DIR --build BUILD_DIR] [--files 2500]

With --profile (a real kernel profile, e.g. from `kpgo collect`) and --build (its instrumented build directory) the
figures are for that profile. Without, a ~2500-file profile is synthesized: a generated C file with many functions
is compiled with --coverage and run, and its .gcda/.gcno are copied to 2500 paths with perturbed counters.
Eight profiles for the 8-way merge and compare are derived from the base by scaling each file's counters randomly.
Targets (issue): stats, fix and 2-way merge each no slower than gcov-tool merge of the same two profiles; 8-way
merge under 2 s; compare of 8 profiles under 60 s on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kpgo.gcov.gcda import ARCS, parse_gcda  # noqa: E402
from kpgo.gcov.profile import fix_profile, iter_gcda, profile_stats  # noqa: E402


def generate_source(n_funcs: int = 40) -> str:
    parts = ["#include <stdlib.h>"]
    for i in range(n_funcs):
        parts.append(f"""
int f{i}(int x) {{
    int r = 0;
    for (int k = 0; k < (x & 7); k++) {{ if ((k ^ x) & {i % 5 + 1}) r += k; else r -= {i}; }}
    switch (x % 4) {{ case 0: r += 1; break; case 1: r *= 3; break; case 2: r ^= x; break; default: r--; }}
    {f"if (x % {i % 7 + 2} == 0) r += f{i - 1}(x / 2) & 1;" if i else "if (x < 0) r = -r;"}
    return r;
}}""")
    calls = " + ".join(f"f{i}(i + {i})" for i in range(n_funcs))
    parts.append(f"int main(int c, char **v) {{ long s = 0; int n = c > 1 ? atoi(v[1]) : 2000;"
                 f" for (int i = 0; i < n; i++) s += {calls}; return s == 7; }}")
    return "\n".join(parts)


def synthesize(work: Path, files: int) -> tuple[Path, Path]:
    """A base profile and build directory of `files` objects sharing one real GCC-made .gcda/.gcno pair."""
    src = work / "src"
    src.mkdir(parents=True)
    (src / "obj.c").write_text(generate_source())
    subprocess.run(["gcc", "-O1", "--coverage", "-c", "obj.c", "-o", "obj.o"], cwd=src, check=True)
    subprocess.run(["gcc", "--coverage", "obj.o", "-o", "prog"], cwd=src, check=True)
    subprocess.run([str(src / "prog"), "3000"], cwd=src, check=False)
    g = parse_gcda((src / "obj.gcda").read_bytes(), "obj.gcda").without_summary()  # the kernel's shape
    base_vals = g.counters(ARCS)
    notes = (src / "obj.gcno").read_bytes()
    prof, build = work / "base", work / "build"
    rng = np.random.default_rng(7)
    for i in range(files):
        rel = Path(f"dir{i % 60}/sub{i % 7}/obj{i}")
        for root in (prof, build):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
        vals = (base_vals * rng.integers(1, 50)).astype(np.uint64)
        (prof / rel).with_suffix(".gcda").write_bytes(g.with_counters(ARCS, vals).to_bytes())
        (build / rel).with_suffix(".gcno").write_bytes(notes)
    return prof, build


def derive(base: Path, dst: Path, seed: int) -> Path:
    """A profile of the same build: each file's counters scaled by a random factor (integer, 1..20)."""
    rng = np.random.default_rng(seed)
    for rel in iter_gcda(base):
        g = parse_gcda((base / rel).read_bytes(), str(rel))
        out = g.with_counters(ARCS, g.counters(ARCS) * np.uint64(rng.integers(1, 20)))
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        (dst / rel).write_bytes(out.to_bytes())
    return dst


def timed(label: str, fn, results: dict[str, float], repeat: int = 3) -> None:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    results[label] = best
    print(f"  {label:<42} {best:8.3f} s", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", type=Path, help="a real profile directory (default: synthesize one)")
    ap.add_argument("--build", type=Path, help="its instrumented build directory (for compare)")
    ap.add_argument("--files", type=int, default=2500, help="files in a synthesized profile (default 2500)")
    ap.add_argument("--work", type=Path, help="scratch directory (default: a temporary one, removed at the end)")
    ap.add_argument("--no-compare", action="store_true", help="skip the compare of 8 profiles")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="kpgo-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        if args.profile:
            base, build = args.profile, args.build
        else:
            print(f"synthesizing a {args.files}-file profile in {work} ...", flush=True)
            base, build = synthesize(work, args.files)
        profs = [base] + [derive(base, work / f"p{i}", seed=i) for i in range(1, 8)]
        st = profile_stats(base)
        print(f"profile: {st['files']} files, {st['functions']} functions, {st['arcs']} arc counters, "
              f"{st['bytes'] / 1e6:.1f} MB, gcov {st['gcov_version']}")
        from kpgo.analysis.characterize import compare_profiles
        from kpgo.gcov.merge import merge_profiles

        res: dict[str, float] = {}
        n = [0]

        def out() -> Path:
            n[0] += 1
            return work / f"out{n[0]}"

        def gcov_tool() -> None:
            subprocess.run(["gcov-tool", "merge", "-o", str(out()), str(profs[0]), str(profs[1])], check=True,
                           capture_output=True)

        print("timings (best of 3, in-process; gcov-tool as a process):")
        if shutil.which("gcov-tool"):
            timed("gcov-tool merge (2 profiles)", gcov_tool, res)
        timed("kpgo profile stats", lambda: profile_stats(profs[0]), res)
        timed("kpgo profile fix", lambda: fix_profile(profs[0], out()), res)
        timed("kpgo profile merge (2 profiles)", lambda: merge_profiles(profs[:2], out()), res)
        timed("kpgo profile merge (2, --normalize)", lambda: merge_profiles(profs[:2], out(), normalize=True), res)
        timed("kpgo profile merge (8 profiles)", lambda: merge_profiles(profs, out()), res)
        if build and not args.no_compare:
            timed("kpgo profile compare (8 profiles)", lambda: compare_profiles(profs, build), res, repeat=1)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import numpy, kpgo.gcov.profile"], check=True,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")})
        print(f"  {'(python + numpy start-up, per CLI call)':<42} {time.perf_counter() - t0:8.3f} s")
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"peak RSS of this process: {rss:.0f} MB (profile size {st['bytes'] / 1e6:.1f} MB)")
        ref = res.get("gcov-tool merge (2 profiles)")
        if ref:
            for k in ("kpgo profile stats", "kpgo profile fix", "kpgo profile merge (2 profiles)"):
                print(f"  {k}: {res[k] / ref:.2f}x gcov-tool merge")
        print(f"  8-way merge under 2 s: {res['kpgo profile merge (8 profiles)'] < 2}")
        if "kpgo profile compare (8 profiles)" in res:
            print(f"  compare of 8 under 60 s: {res['kpgo profile compare (8 profiles)'] < 60}")
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
