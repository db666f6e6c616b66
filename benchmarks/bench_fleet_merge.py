#!/usr/bin/env python3
"""A fleet merge: N profiles of one build merged serially and as a tree of Ray tasks (prints figures; not a test).

    .venv/bin/python benchmarks/bench_fleet_merge.py --profile DIR [-n 50] [--fan-in 16] [--workers 1,2]
                                                     [--modes plain,weighted,normalize] [--work DIR] [--seed 1]

The N inputs are made from one real kernel profile (--profile, e.g. RUN/profiles/redis from `kpgo run`; only read)
by perturbing it: input i multiplies every arc counter by its own factor drawn uniformly from [0.25, 4) by a
numpy RNG seeded with seed + i, rounded to the nearest integer; a counter that was zero stays zero and one that was
not stays at least 1, so every input has the structure (records, functions, the set of arcs that ran) of the real
profile and counts of its order. They are written with kpgo's .gcda code (the counters stored into the profile's
words in place, as `kpgo profile merge` writes its output), under --work (kept: a rerun with the same N and seed
reuses them).

For each mode (plain: all weights 1; weighted: weights drawn from 0.5, 1, 1.5, 2, 3; normalize: --normalize) it
times `kpgo profile merge` as one process (wall time, peak RSS from /usr/bin/time) and then, for each --workers
count, the tree merge on a local Ray cluster of that many worker processes, in a fresh process: the time to start
Ray, the merge's own wall time, the driver's peak RSS, and per kind of task (fold: at most fan_in inputs; combine:
at most fan_in partials; totals: --normalize's first pass) the count, the summed and longest task time and the
largest peak RSS of one task (a worker process's peak during the task; after "+", how far above the worker's RSS
at the task's start it went: a worker holds ~120 MB of Ray and numpy before any task). Every tree output is
compared with the serial one, byte for byte (a difference stops the benchmark). docs/SCALE.md has the commands and
the figures.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
SRC = HERE / "src"
sys.path.insert(0, str(SRC))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_profile import machine, timed_process  # noqa: E402

WEIGHTS = (0.5, 1.0, 1.5, 2.0, 3.0)


def perturb(base: Path, dst: Path, seed: int) -> Path:
    """A profile of base's build with every arc counter scaled by its own random factor in [0.25, 4) (see the
    module's doc); files kpgo cannot index at once are copied unchanged."""
    import numpy as np

    from kpgo.atomic import output_dir
    from kpgo.gcov.gcda import ARCS_TAG, counter_values, index_image, store_counters
    from kpgo.gcov.image import read_image
    from kpgo.gcov.profile import _rels_or_fail, write_tree

    rels = _rels_or_fail(base)
    t = index_image(read_image(base, rels))
    lo, _ = t.counter_slots(t.rec_tag == ARCS_TAG)
    v = counter_values(t.image.words, lo)
    rng = np.random.default_rng(seed)
    scaled = np.rint(v.astype(np.float64) * rng.uniform(0.25, 4.0, size=len(v)))
    new = np.where(v == 0, 0, np.maximum(scaled, 1)).astype(np.uint64)
    words = t.image.words.copy()
    store_counters(words, lo, new)
    buf = words.view(np.uint8).tobytes()
    with output_dir(dst) as tmp:
        write_tree(tmp, ((rel, buf[4 * int(t.image.wstart[k]): 4 * int(t.image.wstart[k]) + int(t.image.size[k])])
                         for k, rel in enumerate(rels)))
        (tmp / "profile.json").write_text(json.dumps({"perturbed": {"source": str(base), "seed": seed}}) + "\n")
    return dst


def inputs(base: Path, work: Path, n: int, seed: int) -> list[Path]:
    out = []
    for i in range(n):
        d = work / "inputs" / f"s{seed}-{i:05d}"
        if not d.is_dir():
            perturb(base, d, seed + i)
        out.append(d)
    return out


def tree_run(req: dict[str, object]) -> int:
    """One tree merge in this fresh process, on a local Ray of req["workers"] worker processes; JSON on stdout."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import ray

    from kpgo import cluster

    t0 = time.monotonic()
    cluster.connect("local", num_cpus=int(req["workers"]))  # type: ignore[call-overload]
    t1 = time.monotonic()
    try:
        res = cluster.tree_merge([Path(d) for d in req["dirs"]], Path(str(req["out"])), weights=req["weights"],  # type: ignore[attr-defined]
                                 normalize=bool(req["normalize"]), fan_in=int(req["fan_in"]), address="local")  # type: ignore[call-overload]
        t2 = time.monotonic()
    finally:
        ray.shutdown()
    kinds: dict[str, dict[str, float]] = {}
    for s in res["cluster"]["tasks"]:
        k = kinds.setdefault(s["kind"], {"count": 0, "sum_s": 0.0, "max_s": 0.0, "max_rss_mb": 0.0, "max_growth_mb": 0.0})
        k["count"] += 1
        k["sum_s"] += s["seconds"]
        k["max_s"] = max(k["max_s"], s["seconds"])
        k["max_rss_mb"] = max(k["max_rss_mb"], s["peak_rss_mb"])
        k["max_growth_mb"] = max(k["max_growth_mb"], s["peak_rss_mb"] - s["start_rss_mb"])
    print(json.dumps({"start_s": t1 - t0, "merge_s": t2 - t1, "levels": res["cluster"]["levels"], "kinds": kinds,
                      "driver_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
    return 0


def same_tree(a: Path, b: Path) -> bool:
    cmp = filecmp.dircmp(a, b)
    if cmp.left_only or cmp.right_only or cmp.funny_files:
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    return not mismatch and not errors and all(same_tree(a / d, b / d) for d in cmp.common_dirs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", type=Path, help="a real kernel profile directory (only read)")
    ap.add_argument("-n", type=int, default=50, help="profiles to merge (default 50)")
    ap.add_argument("--fan-in", type=int, default=16, help="inputs or partials per task (default 16)")
    ap.add_argument("--workers", default="1,2", help="local Ray worker processes to measure, comma-separated (default 1,2)")
    ap.add_argument("--modes", default="plain,weighted,normalize", help="merges to time (default all three)")
    ap.add_argument("--seed", type=int, default=1, help="input i is perturbed with seed + i (default 1)")
    ap.add_argument("--work", type=Path, default=Path("/dev/shm/kpgo-fleet"), help="inputs and outputs (kept)")
    ap.add_argument("--tree-run", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tree_run:
        return tree_run(json.loads(Path(args.tree_run).read_text()))
    if not args.profile:
        ap.error("--profile DIR is required")
    import numpy as np

    from kpgo.gcov.profile import profile_stats

    t = time.monotonic()
    dirs = inputs(args.profile.resolve(), args.work, args.n, args.seed)
    st = profile_stats(dirs[0])
    m = machine()
    print(f"{args.n} profiles made from {args.profile} in {args.work / 'inputs'} ({time.monotonic() - t:.1f} s): "
          f"{st['files']} files, {st['arcs']} arc counters each")
    print(f"machine: {m['cpus']} CPUs ({m['cpu']}), load average {m['load']}, Python {m['python']}, numpy {m['numpy']}\n")
    weights = np.random.default_rng(args.seed).choice(WEIGHTS, size=args.n).tolist()
    rows = []
    for mode in args.modes.split(","):
        w = weights if mode == "weighted" else None
        ref = args.work / f"out-serial-{mode}"
        shutil.rmtree(ref, ignore_errors=True)
        argv = [sys.executable, "-m", "kpgo", "profile", "merge", *map(str, dirs), "-o", str(ref)]
        argv += ["--weights", ",".join(map(str, w))] if w else []
        argv += ["--normalize"] if mode == "normalize" else []
        dt, mb = timed_process(argv, env={**os.environ, "PYTHONPATH": str(SRC)})
        rows.append((mode, "serial (1 process)", f"{dt:.2f}", "", f"{mb:.0f}" if mb else "?", ""))
        for workers in [int(x) for x in args.workers.split(",")]:
            out = args.work / f"out-tree-{mode}-{workers}"
            shutil.rmtree(out, ignore_errors=True)
            req = args.work / "tree-request.json"
            req.write_text(json.dumps({"dirs": [str(d) for d in dirs], "out": str(out), "weights": w,
                                       "normalize": mode == "normalize", "fan_in": args.fan_in, "workers": workers}))
            cp = subprocess.run([sys.executable, __file__, "--tree-run", str(req)], capture_output=True, text=True,
                                env={**os.environ, "PYTHONPATH": str(SRC)})
            if cp.returncode != 0:
                raise SystemExit(f"tree merge failed:\n{cp.stderr[-3000:]}")
            r = json.loads(cp.stdout.strip().splitlines()[-1])
            if not same_tree(ref, out):
                raise SystemExit(f"{out} differs from the serial merge {ref}")
            tasks = "; ".join(f"{k} x{v['count']}: sum {v['sum_s']:.2f} s, max {v['max_s']:.2f} s, {v['max_rss_mb']:.0f} MB (+{v['max_growth_mb']:.0f})"
                              for k, v in r["kinds"].items())
            rows.append((mode, f"tree, {workers} worker(s), {r['levels']} levels", f"{r['merge_s']:.2f}",
                         f"{r['start_s']:.1f}", f"{r['driver_rss_mb']:.0f}", tasks))
            shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(ref, ignore_errors=True)
    print(f"fan-in {args.fan_in}; every tree output equals the serial one byte for byte\n")
    print("| merge | how | seconds | Ray start s | peak RSS MB (process / driver) "
          "| tasks: count, time, largest peak RSS of a task (+ above the worker's RSS at its start) |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
