#!/usr/bin/env python3
"""Speed of `kpgo profile` on full-size profiles, side by side with `gcov-tool merge` (prints figures; not a test).

    .venv/bin/python benchmarks/bench_profile.py [--profile DIR --build BUILD_DIR] [--files 2500] [--repeat 5]
                                                 [--baseline-src OLD/src] [--work /dev/shm/x] [--no-compare]

docs/PROFILES.md ("Speed") has the exact commands and the figures. On a machine whose disk is busy (a kernel build
next door), put --work on tmpfs: the outputs of gcov-tool and kpgo then do not wait for the disk.

With --profile (a real kernel profile, e.g. from `kpgo collect`) and --build (its instrumented build directory) the
figures are for that profile; it is only read. Without, a ~2500-file profile is synthesized: a generated C file
with many functions is compiled with --coverage and run, and its .gcda/.gcno are copied to 2500 paths with scaled
counters, in the shape the kernel writes (no summary, no end marker). Seven more profiles of the same build (for the
8-way merge and the compare) are derived in a scratch directory by scaling each file's counters by a random factor
and adding noise to the non-zero ones.

Every figure is the best of --repeat runs, and the runs are interleaved (round r of every measurement before round
r+1), so that a noisy machine affects all columns alike. Columns:
    gcov-tool     `gcov-tool merge -o OUT A B` as a process (the reference of the speed contract)
    in-process    the kpgo function called in a long-lived Python process (no interpreter or import start-up)
    CLI           `python -m kpgo profile ...` as a process: what a user waits for, start-up included
With --baseline-src (another kpgo source tree, e.g. `git archive <rev> src | tar -x -C /tmp/old`), the same
measurements are taken for it in the same rounds ("before" / "after").

Targets (issue): stats, fix and a 2-way merge each no slower than gcov-tool merge of the same two profiles; 8-way
merge under 2 s; compare of 8 profiles under 60 s on 2 cores; memory bounded by the profile size (not by the
number of inputs times it: compare the peak RSS of the 2-way and 8-way merges).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
SRC = HERE / "src"


# -- worker: runs kpgo functions in-process, timed, one request per stdin line ------------------------------------

def worker(src: str) -> int:
    sys.path.insert(0, src)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import resource

    from kpgo.gcov.merge import merge_profiles
    from kpgo.gcov.profile import fix_profile, profile_stats

    ops = {
        "stats": lambda a: profile_stats(a["dir"]),
        "fix": lambda a: fix_profile(a["dir"], a["out"]),
        "merge": lambda a: merge_profiles(a["dirs"], a["out"], normalize=a.get("normalize", False)),
    }
    for line in sys.stdin:
        req = json.loads(line)
        t0 = time.perf_counter()
        ops[req["op"]](req)
        dt = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        sys.stdout.write(json.dumps({"s": dt, "rss_mb": rss}) + "\n")
        sys.stdout.flush()
    return 0


class Worker:
    def __init__(self, src: Path) -> None:
        self.p = subprocess.Popen([sys.executable, __file__, "--worker", str(src)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)

    def run(self, **req: object) -> float:
        assert self.p.stdin and self.p.stdout
        self.p.stdin.write(json.dumps(req) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise SystemExit(f"benchmark worker failed on {req}")
        return float(json.loads(line)["s"])

    def close(self) -> None:
        assert self.p.stdin
        self.p.stdin.close()
        self.p.wait()


TIME = shutil.which("time", path="/usr/bin:/bin")


def timed_process(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float | None]:
    """Wall time and peak RSS (MB) of one process; its output is discarded, a failure stops the benchmark.

    The RSS comes from /usr/bin/time when present: a child forked from this (large) process would report this
    process's RSS as its own high-water mark (Linux keeps it across exec)."""
    with tempfile.NamedTemporaryFile() as err, tempfile.NamedTemporaryFile("r") as rep:
        full = [TIME, "-f", "%M", "-o", rep.name, *argv] if TIME else argv
        t0 = time.perf_counter()
        p = subprocess.run(full, env=env, stdout=subprocess.DEVNULL, stderr=err)
        dt = time.perf_counter() - t0
        if p.returncode != 0:
            msg = Path(err.name).read_text(errors="replace").strip()[-500:]
            raise SystemExit(f"{' '.join(argv)} failed ({p.returncode}): {msg}")
        try:
            mb: float | None = int(rep.read().split()[-1]) / 1024 if TIME else None
        except (ValueError, IndexError):
            mb = None
    return dt, mb


# -- test data ---------------------------------------------------------------------------------------------------

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


def kernel_shape(g):  # type: ignore[no-untyped-def]
    """A libgcov-written file as the kernel writes it: no summary, checksum 0, no end marker."""
    import numpy as np

    g = g.without_summary()
    g.checksum = 0 if g.checksum is not None else None
    g.trailer = np.zeros(0, dtype=np.uint32)
    return g


def synthesize(work: Path, files: int) -> tuple[Path, Path]:
    """A base profile and build directory of `files` objects sharing one real GCC-made .gcda/.gcno pair."""
    import numpy as np

    from kpgo.gcov.gcda import ARCS, parse_gcda

    src = work / "src"
    src.mkdir(parents=True)
    (src / "obj.c").write_text(generate_source())
    subprocess.run(["gcc", "-O1", "--coverage", "-c", "obj.c", "-o", "obj.o"], cwd=src, check=True)
    subprocess.run(["gcc", "--coverage", "obj.o", "-o", "prog"], cwd=src, check=True)
    subprocess.run([str(src / "prog"), "3000"], cwd=src, check=False)
    g = kernel_shape(parse_gcda((src / "obj.gcda").read_bytes(), "obj.gcda"))
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
    """A profile of the same build: each file's counters scaled by a random integer factor (1..19), plus noise
    (0..2) on the non-zero ones. Byte layout unchanged."""
    import numpy as np

    from kpgo.gcov.gcda import ARCS, parse_gcda
    from kpgo.gcov.image import gcda_rels

    rng = np.random.default_rng(seed)
    for rel in gcda_rels(base):
        g = parse_gcda((base / rel).read_bytes(), rel)
        v = g.counters(ARCS)
        noise = rng.integers(0, 3, size=len(v)).astype(np.uint64) * (v > 0)
        out = g.with_counters(ARCS, v * np.uint64(rng.integers(1, 20)) + noise)
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        (dst / rel).write_bytes(out.to_bytes())
    return dst


def machine() -> dict[str, object]:
    if str(SRC) not in sys.path:
        sys.path.insert(0, str(SRC))
    from kpgo.host import cpu_model

    cpu = cpu_model()
    gcc = subprocess.run(["gcc", "-dumpfullversion"], capture_output=True, text=True).stdout.strip()
    import numpy

    return {"cpus": os.cpu_count(), "cpu": cpu, "load": os.getloadavg(), "python": platform.python_version(),
            "numpy": numpy.__version__, "gcc": gcc, "kernel": platform.release()}


# -- main --------------------------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", type=Path, help="a real profile directory, only read (default: synthesize one)")
    ap.add_argument("--build", type=Path, help="its instrumented build directory (for compare)")
    ap.add_argument("--files", type=int, default=2500, help="files in a synthesized profile (default 2500)")
    ap.add_argument("--repeat", type=int, default=5, help="rounds; each figure is the best of them (default 5)")
    ap.add_argument("--baseline-src", type=Path, help="another kpgo source tree (its src/) to measure alongside")
    ap.add_argument("--work", type=Path, help="scratch directory (default: a temporary one, removed at the end)")
    ap.add_argument("--no-compare", action="store_true", help="skip the compare of 8 profiles")
    ap.add_argument("--json", type=Path, help="also write all figures to this file")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker)
    sys.path.insert(0, str(SRC))
    if not shutil.which("gcov-tool"):
        raise SystemExit("gcov-tool not found (it comes with gcc)")
    work = args.work or Path(tempfile.mkdtemp(prefix="kpgo-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    impls = {"kpgo": SRC}
    if args.baseline_src:
        impls = {"before": args.baseline_src.resolve(), "after": SRC}
    try:
        if args.profile:
            base, build = args.profile.resolve(), args.build.resolve() if args.build else None
        else:
            print(f"synthesizing a {args.files}-file profile in {work} ...", flush=True)
            base, build = synthesize(work, args.files)
        print("deriving 7 more profiles of the same build ...", flush=True)
        profs = [base] + [derive(base, work / f"p{i}", seed=i) for i in range(1, 8)]
        from kpgo.gcov.profile import profile_stats

        st = profile_stats(base)
        m0 = machine()
        print(f"\nprofile: {base}\n  {st['files']} files, {st['functions']} functions, {st['arcs']} arc counters, "
              f"{st['bytes'] / 1e6:.1f} MB of payload, gcov {st['gcov_version']}")
        print(f"machine: {m0['cpus']} CPUs ({m0['cpu']}), load average {m0['load']}, Python {m0['python']}, "
              f"numpy {m0['numpy']}, gcc {m0['gcc']}, Linux {m0['kernel']}")
        print(f"rounds: {args.repeat}, best of each; scratch directory {work}\n", flush=True)

        n = [0]

        def out() -> str:
            n[0] += 1
            return str(work / f"out{n[0]}")

        def clean() -> None:
            for p in work.glob("out*"):
                shutil.rmtree(p, ignore_errors=True)

        p0, p1 = str(profs[0]), str(profs[1])
        dirs8 = [str(p) for p in profs]
        ops: dict[str, tuple[dict[str, object], list[str]]] = {
            "stats": ({"op": "stats", "dir": p0}, ["stats", p0]),
            "fix": ({"op": "fix", "dir": p0}, ["fix", p0, "-o"]),
            "merge 2": ({"op": "merge", "dirs": [p0, p1]}, ["merge", p0, p1, "-o"]),
            "merge 2 --normalize": ({"op": "merge", "dirs": [p0, p1], "normalize": True},
                                    ["merge", "--normalize", p0, p1, "-o"]),
            "merge 8": ({"op": "merge", "dirs": dirs8}, ["merge", *dirs8, "-o"]),
        }
        workers = {name: Worker(src) for name, src in impls.items()}
        best: dict[tuple[str, str], float] = {}
        rss: dict[tuple[str, str], float] = {}

        def note(key: tuple[str, str], dt: float, mb: float | None = None) -> None:
            best[key] = min(best.get(key, float("inf")), dt)
            if mb is not None:
                rss[key] = max(rss.get(key, 0.0), mb)

        for r in range(args.repeat):
            dt, mb = timed_process(["gcov-tool", "merge", "-o", out(), p0, p1])
            note(("merge 2", "gcov-tool"), dt, mb)
            for op, (req, argv) in ops.items():
                for name, src in impls.items():
                    req = dict(req)
                    if op != "stats":
                        req["out"] = out()
                    note((op, f"{name} in-process"), workers[name].run(**req))
                    cli = [sys.executable, "-m", "kpgo", "profile", *argv] + ([] if op == "stats" else [out()])
                    env = {**os.environ, "PYTHONPATH": str(src)}
                    dt, mb = timed_process(cli, env)
                    note((op, f"{name} CLI"), dt, mb)
                clean()
            print(f"  round {r + 1}/{args.repeat} done (load {os.getloadavg()[0]:.2f})", flush=True)
        for w in workers.values():
            w.close()
        if build and not args.no_compare:
            for name, src in impls.items():
                cli = [sys.executable, "-m", "kpgo", "profile", "compare", *dirs8, "--build", str(build), "--json"]
                dt, mb = timed_process(cli, {**os.environ, "PYTHONPATH": str(src)})
                note(("compare 8", f"{name} CLI"), dt, mb)
                print(f"  compare of 8 ({name}) done", flush=True)
        m1 = machine()

        cols = ["gcov-tool"] + [f"{name} {how}" for name in impls for how in ("in-process", "CLI")]
        print("\nbest wall time in seconds (peak RSS of the process in MB):")
        print(f"  {'':<22}" + "".join(f"{c:>20}" for c in cols))
        for op in [*ops, "compare 8"]:
            cells = []
            for c in cols:
                t = best.get((op, c))
                m = rss.get((op, c))
                cells.append("" if t is None else f"{t:.3f}" + (f" ({m:.0f})" if m else ""))
            if any(cells):
                print(f"  {op:<22}" + "".join(f"{x:>20}" for x in cells))
        ref = best[("merge 2", "gcov-tool")]
        print(f"\ntargets (gcov-tool merge of the same two profiles: {ref:.3f} s):")
        for name in impls:
            for op in ("stats", "fix", "merge 2"):
                tin, tcli = best[(op, f"{name} in-process")], best[(op, f"{name} CLI")]
                print(f"  {name:<6} {op:<8} in-process {tin / ref:5.2f}x gcov-tool "
                      f"({'ok' if tin <= ref else 'SLOWER'}),  CLI {tcli / ref:5.2f}x "
                      f"({'ok' if tcli <= ref else 'SLOWER'})")
            t8 = best[("merge 8", f"{name} CLI")]
            print(f"  {name:<6} merge 8  CLI {t8:.3f} s ({'ok' if t8 < 2 else 'OVER'} 2 s); peak RSS "
                  f"{rss[('merge 8', f'{name} CLI')]:.0f} MB vs {rss[('merge 2', f'{name} CLI')]:.0f} MB for 2")
            if ("compare 8", f"{name} CLI") in best:
                tc = best[("compare 8", f"{name} CLI")]
                print(f"  {name:<6} compare 8 CLI {tc:.1f} s ({'ok' if tc < 60 else 'OVER'} 60 s), peak RSS "
                      f"{rss[('compare 8', f'{name} CLI')]:.0f} MB")
        print(f"load average at the end: {m1['load']}")
        if args.json:
            args.json.write_text(json.dumps({
                "profile": str(base), "stats": st, "machine_start": m0, "machine_end": m1, "repeat": args.repeat,
                "best_s": {f"{k[0]} | {k[1]}": v for k, v in best.items()},
                "peak_rss_mb": {f"{k[0]} | {k[1]}": v for k, v in rss.items()},
            }, indent=2) + "\n")
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
