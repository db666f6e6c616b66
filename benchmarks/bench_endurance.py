#!/usr/bin/env python3
"""Endurance of kpgo's guest loop (prints figures; not a test). docs/RELIABILITY.md has the command and the figures.

    .venv/bin/python benchmarks/bench_endurance.py [--run RUN_DIR] [--boots 8] [--collects 2] [--workload micro,redis]
                                                   [--set micro.tcp_ops=64 ...] [--out DIR]

Boots back to back through the real command line: one `kpgo bench` of the run's vanilla kernel with --boots per
workload (--no-sim: the guest loop itself), then --collects `kpgo collect` of its instrumented kernel (one boot per
workload each). Default: 8 boots x 2 workloads + 2 collects x 2 workloads = 20 boots on the session's tiny run.

While each command runs, its open file descriptors and its descendant processes are sampled every 0.2 s and read at
every boot boundary (the "boot N/M" and "collect W: booting" lines). Printed: seconds per boot (median, max: a hang
shows as a max far above the median), the kpgo process's open files at the first and the last boot (growth means a
leak), processes left behind after each command (anything whose command line names the output directory, and QEMU
processes beyond those running before), and disk: what the outputs hold, and how much /tmp and the cache grew
besides them.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BOUNDARY = re.compile(r"bench: boot \d+/\d+|collect \S+: booting")


def du(path: Path) -> int:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else 0


def descendants(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    kids = [int(k) for k in out]
    return kids + [g for k in kids for g in descendants(k)]


def fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def qemus() -> set[str]:
    return set(subprocess.run(["pgrep", "-f", "qemu-system"], capture_output=True, text=True).stdout.split())


def watch(argv: list[str], out: Path) -> dict:
    """Run one kpgo command; per boot boundary: time, the kpgo process's open fds and descendant count."""
    before = qemus()
    t0 = time.monotonic()
    env = {**os.environ, "TMPDIR": str(out / "tmp")}  # what kpgo leaves in its TMPDIR is measured apart from /tmp
    p = subprocess.Popen([sys.executable, "-m", "kpgo", *argv], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, env=env)
    assert p.stderr is not None
    marks: list[tuple[float, int | None, int]] = []
    peak = {"fds": 0, "procs": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            n = fds(p.pid)
            if n is not None:
                peak["fds"] = max(peak["fds"], n)
            peak["procs"] = max(peak["procs"], len(descendants(p.pid)))
            time.sleep(0.2)

    threading.Thread(target=sample, daemon=True).start()
    tail: list[str] = []
    for line in p.stderr:
        tail = (tail + [line])[-20:]
        if BOUNDARY.search(line):
            marks.append((time.monotonic() - t0, fds(p.pid), len(descendants(p.pid))))
    code = p.wait()
    done.set()
    total = time.monotonic() - t0
    time.sleep(3)  # what outlives kpgo by more than a few seconds is a leak
    left = [ln for ln in subprocess.run(["pgrep", "-af", str(out)], capture_output=True, text=True).stdout.splitlines()
            if "pgrep" not in ln and ln.split()[0] != str(os.getpid())]  # this benchmark names the directory too
    if code != 0:
        sys.exit(f"kpgo {' '.join(argv)} failed ({code}):\n{''.join(tail)}")
    starts = [m[0] for m in marks] + [total]
    return {"boots": len(marks), "seconds": [b - a for a, b in zip(starts, starts[1:])], "fds": [m[1] for m in marks],
            "procs": [m[2] for m in marks], "peak": peak, "left": left, "new_qemus": sorted(qemus() - before)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, default=REPO / ".kpgo-test" / "run-tiny", help="a finished kpgo run (its vanilla and instrumented builds)")
    ap.add_argument("--boots", type=int, default=8)
    ap.add_argument("--collects", type=int, default=2)
    ap.add_argument("--workload", default="micro,redis")
    ap.add_argument("--set", action="append", default=None, help="default: micro.procs=1, redis.requests=10000")
    ap.add_argument("--out", type=Path, default=Path("/tmp/kpgo-endurance"))
    args = ap.parse_args()
    sets = [a for s in (args.set or ["micro.procs=1", "redis.requests=10000"]) for a in ("--set", s)]
    shutil.rmtree(args.out, ignore_errors=True)
    (args.out / "tmp").mkdir(parents=True)
    cache = Path(os.environ.get("KPGO_CACHE") or Path.home() / ".cache" / "kpgo")
    tmp_before, cache_before = set(os.listdir("/tmp")), du(cache)

    runs = [("bench", watch(["bench", "--kernel", f"vanilla={args.run / 'builds' / 'vanilla'}", "--workload", args.workload, "--boots",
                             str(args.boots), "--no-sim", *sets, "-o", str(args.out / "bench")], args.out))]
    for i in range(args.collects):
        runs.append((f"collect {i + 1}", watch(["collect", str(args.run / "builds" / "instrumented"), "--workload", args.workload, *sets,
                                                "-o", str(args.out / f"collect-{i + 1}")], args.out)))
    outputs, tmp_left, cache_growth = du(args.out) - du(args.out / "tmp"), du(args.out / "tmp"), du(cache) - cache_before
    new_in_tmp = sorted(set(os.listdir("/tmp")) - tmp_before - {args.out.name})

    print(f"{'command':<10} {'boots':>5} {'s/boot median':>14} {'max':>6} {'fds first':>9} {'last':>5} {'peak':>5} "
          f"{'procs peak':>10} {'left':>5} {'QEMUs left':>10}")
    total = 0
    for name, r in runs:
        total += r["boots"]
        secs = r["seconds"]
        print(f"{name:<10} {r['boots']:>5} {statistics.median(secs):>14.1f} {max(secs):>6.1f} {r['fds'][0]!s:>9} {r['fds'][-1]!s:>5} "
              f"{r['peak']['fds']:>5} {r['peak']['procs']:>10} {len(r['left']):>5} {len(r['new_qemus']):>10}")
        for ln in r["left"]:
            print(f"  left behind: {ln}")
    print(f"\n{total} boots; outputs {outputs / 1e6:.1f} MB in {args.out}; left in kpgo's TMPDIR {tmp_left} bytes; "
          f"new in /tmp: {new_in_tmp or 'nothing'}; the cache grew {cache_growth / 1e6:+.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
