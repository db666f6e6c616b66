#!/usr/bin/env python3
"""A profile across Debian's point releases of linux-source-6.12 (docs/PROFILES.md, "Across point releases"): is a
profile collected on an older release worth porting, and how much of it does each release change? Prints figures
and writes JSON and Markdown; not a test. Every step is a kpgo command whose output is kept, so the script resumes.

    .venv/bin/python benchmarks/porting.py --run RUN_DIR --releases DIR --workload redis,nginx,postgresql,mysql \\
        --dir WORK_DIR -o docs/results/porting

RUN_DIR is a finished-enough `kpgo run --base server` of the newest release (its builds/instrumented, builds/vanilla
and builds/optimized-WL, profiles/WL: the fresh profiles). DIR holds linux-source-6.12.VERSION.tar.xz of the older
releases (apt-get download linux-source-6.12=VERSION, or snapshot.debian.org). The oldest is the training release:

 1. an instrumented server build of every older release (ccache answers what the releases share);
 2. each workload's profile on the oldest one (kpgo collect, kpgo profile fix);
 3. kpgo profile port of it to the newest release's instrumented build, and along every consecutive pair of
    releases (the weight each release keeps, carries, maps and drops);
 4. optimized builds of the newest release from the ported profile and from the old profile as it is (GCC drops
    what mismatches; kpgo re-keys it for the new tree's path, docs/PROFILES.md);
 5. one bench per workload: vanilla, fresh (the run's optimized-WL), ported, old as it is, simulated counters;
 6. the ported kernel's gain as a share of the fresh one's on kernel instructions and L1i misses per operation
    (goal >= 0.9), and the weight table.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hot_sets import provenance

from kpgo import atomic

KPGO = [sys.executable, "-m", "kpgo"]
METRICS = ("kernel_insns_per_op", "kernel_l1i_misses_per_op", "kernel_taken_branches_per_op")
GOAL = 0.9  # the ported profile's gain as a share of the fresh profile's
BENCH = ["--boots", "3", "--precision", "0.015", "--max-boots", "6"]  # as the server run's bench


def kpgo(*args: object) -> None:
    argv = [*KPGO, *map(str, args)]
    print("$ kpgo " + " ".join(map(str, args)), flush=True)
    t = time.monotonic()
    subprocess.run(argv, check=True)
    print(f"  ({time.monotonic() - t:.0f} s)", flush=True)


def version_of(tarball: Path) -> str:
    m = re.fullmatch(r"linux-source-(\d+\.\d+\.\d+)\.tar\.xz", tarball.name)
    if not m:
        sys.exit(f"porting: {tarball} is not linux-source-X.Y.Z.tar.xz")
    return m.group(1)


def key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def done(d: Path, name: str = "profile.json") -> bool:
    return (d / name).is_file()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--releases", type=Path, required=True)
    ap.add_argument("--workload", default="redis,nginx,postgresql,mysql")
    ap.add_argument("--dir", type=Path, required=True, help="where builds, profiles and benches go")
    ap.add_argument("-o", "--out", type=Path, required=True, help="results directory (porting.json, porting.md)")
    ap.add_argument("--steps", default="1,2,3,4,5,6", help="the steps to run (comma-separated)")
    a = ap.parse_args()
    steps = {int(s) for s in a.steps.split(",")}
    wls = a.workload.split(",")
    run, work = a.run.resolve(), a.dir.resolve()
    new_build = run / "builds" / "instrumented"
    new = json.loads((new_build / "build.json").read_text())["source_version"]
    tarballs = {version_of(t): t for t in sorted(a.releases.glob("linux-source-*.tar.xz"))}
    olds = sorted((v for v in tarballs if key(v) < key(new)), key=key)
    if not olds:
        sys.exit(f"porting: no release older than {new} in {a.releases}")
    old = olds[0]
    chain = [*olds, new]
    instr = {v: work / "builds" / f"instrumented-{v}" for v in olds} | {new: new_build}
    print(f"porting: releases {', '.join(chain)}; training on {old}, building {new}; workloads {', '.join(wls)}", flush=True)

    if 1 in steps:
        for v in olds:
            kpgo("build", "--source", tarballs[v], "--base", "server", "--variant", "instrumented", "-o", instr[v])
    profiles = {wl: work / "profiles" / old / wl for wl in wls}
    if 2 in steps:
        for wl in wls:
            raw = work / "profiles" / old / f"{wl}.raw"
            if not done(raw):
                kpgo("collect", instr[old], "--workload", wl, "-o", raw)
            if not done(profiles[wl]):
                kpgo("profile", "fix", raw, "-o", profiles[wl])
    ported = {wl: work / "profiles" / "ported" / wl for wl in wls}
    pairs: dict[str, dict[str, Any]] = {}
    if 3 in steps:
        for wl in wls:
            if not done(ported[wl]):
                kpgo("profile", "port", profiles[wl], "--from", instr[old], "--to", new_build, "-o", ported[wl])
            # along the chain: each release's changes to the profile carried so far
            src = profiles[wl]
            for a_, b_ in zip(chain, chain[1:]):
                out = work / "profiles" / "chain" / f"{a_}-{b_}" / wl
                if not done(out):
                    kpgo("profile", "port", src, "--from", instr[a_], "--to", instr[b_], "-o", out)
                src = out
    builds = {("ported", wl): work / "builds" / f"ported-{wl}" for wl in wls} | {("old", wl): work / "builds" / f"old-{wl}" for wl in wls}
    if 4 in steps:
        for (kind, wl), out in builds.items():
            prof = ported[wl] if kind == "ported" else profiles[wl]
            kpgo("build", "--base", "server", "--variant", "optimized", "--profile", prof, "-o", out, *(["--stale-profile"] if kind == "old" else []))
    benches = {wl: work / f"bench-{wl}" for wl in wls}
    if 5 in steps:
        for wl in wls:
            kpgo("bench", "--kernel", f"vanilla={run / 'builds' / 'vanilla'}", "--kernel", f"fresh={run / 'builds' / f'optimized-{wl}'}",
                 "--kernel", f"ported={builds['ported', wl]}", "--kernel", f"old={builds['old', wl]}", "--workload", wl, *BENCH,
                 "-o", benches[wl])
    if 6 in steps:
        for wl in wls:
            for a_, b_ in [*zip(chain, chain[1:]), (old, new)]:
                d = ported[wl] if (a_, b_) == (old, new) else work / "profiles" / "chain" / f"{a_}-{b_}" / wl
                if done(d):
                    t = json.loads((d / "profile.json").read_text())["ported"]["report"]["total"]
                    pairs.setdefault(f"{a_} -> {b_}", {})[wl] = {s: t[s] for s in ("weight", "kept", "carried", "mapped", "dropped")} | {
                        "objects": t["objects"], "functions": t["functions"]}
        read = {wl: json.loads((builds["old", wl] / "build.json").read_text()).get("proof", {}).get("weight_read") for wl in wls
                if (builds["old", wl] / "build.json").is_file()}
        table(a.out, wls, benches, pairs, chain, run, read)
    return 0


def table(out: Path, wls: list[str], benches: dict[str, Path], pairs: dict[str, dict[str, Any]], chain: list[str], run: Path,
          old_read: dict[str, float | None]) -> None:
    """old_read: per workload, the share of the old profile's arc counts GCC read building the new release (its proof)."""
    rows: dict[str, Any] = {}
    for wl in wls:
        f = benches[wl] / "results.json"
        if not f.is_file():
            continue
        res = json.loads(f.read_text())
        sim = res["workloads"][wl].get("sim", {})
        rows[wl] = {k: {m: sim[k][m] for m in METRICS if m in sim.get(k, {})} for k in ("fresh", "ported", "old")}
        for m in METRICS:
            fr, po = (rows[wl][k].get(m, {}).get("ratio") for k in ("fresh", "ported"))
            if fr is not None and po is not None and fr < 1:
                rows[wl].setdefault("ported_share_of_fresh_gain", {})[m] = (1 - po) / (1 - fr)
    doc = {"provenance": provenance(), "releases": chain, "run": str(run), "goal": GOAL, "workloads": rows, "weight": pairs,
           "old_profile_counts_read": old_read}
    out.mkdir(parents=True, exist_ok=True)
    atomic.write_json(out / "porting.json", doc)
    lines = [f"# A profile across point releases ({chain[0]} -> {chain[-1]})", "",
             f"Made {doc['provenance']['made']} by kpgo {doc['provenance']['kpgo_commit']}. Simulated counters (TCG), per operation, ratio to "
             "vanilla [95% CI] on the workload's own bench; the share: (1 - ported) / (1 - fresh).", "",
             "| workload | metric | fresh | ported | old as it is | ported / fresh gain |", "|---|---|---:|---:|---:|---:|"]
    for wl, r in rows.items():
        for m in METRICS:
            cells = [fmt(r[k].get(m)) for k in ("fresh", "ported", "old")]
            share = r.get("ported_share_of_fresh_gain", {}).get(m)
            lines.append(f"| {wl} | {m} | " + " | ".join(cells) + f" | {'–' if share is None else f'{share:.0%}'} |")
    lines += ["", "The old profile as it is: the share of its arc counts GCC read building the new release (the old kernel's proof, "
              "`weight_read`; the rest GCC dropped as changed): "
              + ", ".join(f"{wl} {'–' if v is None else f'{v:.1%}'}" for wl, v in old_read.items()) + "."]
    lines += ["", "Profile weight (sum of arc counters) each release pair keeps, carries (lines moved), maps (CFG changed) and drops "
              "(nothing is kept as it is: a line checksum hashes the source path, and each release's tree has its own):", "",
              "| releases | workload | weight | kept | carried | mapped | dropped |", "|---|---|---:|---:|---:|---:|---:|"]
    for pair, per in pairs.items():
        for wl, t in per.items():
            w = t["weight"] or 1
            lines.append(f"| {pair} | {wl} | {t['weight']:,} | " + " | ".join(f"{t[s] / w:.2%}" for s in ("kept", "carried", "mapped", "dropped")) + " |")
    atomic.write_text(out / "porting.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


def fmt(s: dict[str, Any] | None) -> str:
    if not s or s.get("ratio") is None or math.isnan(s["ratio"]):
        return "–"
    star = "*" if s.get("ci_includes_1") else ""
    return f"{s['ratio']:.3f} [{s['ci_low']:.3f}, {s['ci_high']:.3f}]{star}"


if __name__ == "__main__":
    sys.exit(main())
