#!/usr/bin/env python3
"""What reusing unchanged objects saves, and a check that a reused object is what GCC produces (prints figures; not
a test). docs/MEASUREMENTS.md has the command and the figures measured here.

    .venv/bin/python benchmarks/bench_reuse.py RUN_DIR [--workloads redis,micro] [--out DIR] [--sample 20]

Builds the optimized kernel of each workload's profile of RUN_DIR (a `kpgo run` directory: its kernel source,
config and fixed profiles RUN_DIR/profiles/NAME), one after the other, into OUT/optimized-NAME, with an empty
ccache of their own (OUT/cache is the kpgo cache for these builds; the kernel source is linked from the usual
cache), and prints each build's wall time, objects compiled, reused from ccache and missed. Then, for --sample
objects of the last build that ccache supplied, recompiles each with plain gcc from its own Kbuild command line and
the workload's own (un-canonicalized) .gcda, and compares the bytes with the reused object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--workloads", default=None, help="comma-separated, in build order (default: the run's)")
    ap.add_argument("--out", type=Path, default=None, help="default: RUN_DIR/bench-reuse")
    ap.add_argument("--sample", type=int, default=20)
    args = ap.parse_args()
    run = json.loads((args.run_dir / "run.json").read_text())
    names = args.workloads.split(",") if args.workloads else list(run["workloads"])
    out = (args.out or args.run_dir / "bench-reuse").resolve()
    shutil.rmtree(out, ignore_errors=True)
    cache = out / "cache"
    cache.mkdir(parents=True)
    usual = Path(os.environ.get("KPGO_CACHE") or Path.home() / ".cache" / "kpgo")
    (cache / "src").symlink_to((usual / "src").resolve())
    os.environ["KPGO_CACHE"] = str(cache)  # an empty ccache (cache/ccache), the same extracted source

    from kpgo import pipeline
    from kpgo.kernel import kbuild

    opts = pipeline.RunOptions.from_json(run["request"], args.run_dir)
    spec, src = opts.kernel()
    rows = []
    last = None
    for n in names:
        t = time.monotonic()
        m = kbuild.build(kbuild.BuildRequest(src, spec, "optimized", out / f"optimized-{n}", args.run_dir / "profiles" / n, opts.jobs))
        secs = time.monotonic() - t
        reuse = m.get("reuse") or {}
        rows.append((n, secs, m["objects_compiled"], reuse.get("objects_all_zero_profile"), reuse.get("reused"), reuse.get("cache_misses"),
                     m["proof"]["objects_used"], m["proof"]["objects_nonempty"]))
        last = (n, out / f"optimized-{n}")
    print(f"\n{'build':<24} {'wall':>8} {'CC lines':>9} {'all-zero':>9} {'reused':>7} {'missed':>7}  proof")
    for n, secs, cc, zero, hit, miss, used, nonempty in rows:
        print(f"optimized-{n:<14} {secs:>7.0f}s {cc:>9} {zero:>9} {hit:>7} {miss:>7}  {used}/{nonempty}")
    if len(rows) > 1:
        print(f"second build / first: {rows[1][1] / rows[0][1]:.2f}")
    assert last is not None
    n, build = last
    first = out / f"optimized-{names[0]}"
    print(f"\nsample: objects of optimized-{n} taken from ccache (all-zero in optimized-{names[0]} too), recompiled with gcc "
          "from the workload's own .gcda")
    same = checked = 0
    marks = sorted(m for m in build.rglob("*" + kbuild.ZERO_MARK) if (first / m.relative_to(build)).exists())
    random.Random(1).shuffle(marks)
    for mark in marks:
        if checked >= args.sample:
            break
        obj = mark.with_suffix(".o")
        cmdfile = obj.with_name(f".{obj.name}.cmd")
        if not obj.is_file() or not cmdfile.is_file():
            continue  # not linked into this configuration, or not compiled through Kbuild's .cmd
        rel = obj.relative_to(build)
        line = next(ln for ln in cmdfile.read_text().splitlines() if ln.startswith("savedcmd_"))
        cmd = line.split(":=", 1)[1].strip()
        wrapper = f"sh {kbuild.REUSE_CC} "
        if not cmd.startswith(wrapper):
            continue
        cmd = "gcc " + cmd[len(wrapper):].replace(" -fdump-ipa-profile", "")
        gcda = obj.with_suffix(".gcda")
        own = args.run_dir / "profiles" / n / rel.with_suffix(".gcda")
        canonical = gcda.read_bytes()
        reused = obj.read_bytes()
        try:
            gcda.write_bytes(own.read_bytes())  # the workload's file as `kpgo profile fix` wrote it
            subprocess.run(["sh", "-c", cmd], cwd=build, check=True, capture_output=True)
            direct = obj.read_bytes()
        finally:
            gcda.write_bytes(canonical)
            obj.write_bytes(reused)
        checked += 1
        same += direct == reused
        print(f"  {'identical' if direct == reused else 'DIFFERENT'}  {rel}  ({len(reused):,} bytes; own .gcda {own.stat().st_size} bytes"
              f"{', differs from the installed one' if own.read_bytes() != canonical else ''})")
    print(f"{same} of {checked} reused objects byte-identical to a direct compile with the workload's own profile")
    return 0 if same == checked else 1


if __name__ == "__main__":
    sys.exit(main())
