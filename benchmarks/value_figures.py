#!/usr/bin/env python3
"""The value-profile figures of a run made with --values, per workload, as files (JSON and a short Markdown): the
pool use the kernel reported, the transforms GCC's dumps proved (build.json as recorded), the promoted sites and
what the linked vmlinux still holds of each, and the indirect calls with a dominant target by where the target lies
(kpgo.analysis.values). Not a test; docs/results/values/ holds what it wrote and docs/MEASUREMENTS.md the command.

    .venv/bin/python benchmarks/value_figures.py RUN_DIR -o docs/results/values --name tiny

Needs the run's instrumented build (its .gcno name the functions), the fixed profiles profiles/W and the optimized
kernels builds/optimized-W (their vmlinux)."""

from __future__ import annotations

import argparse
import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from kpgo import atomic
from kpgo.analysis.values import CALL, GUARD, dominant_sites, promotions_in_vmlinux, site_summary

TOP = 30  # sites listed in the Markdown (the JSON lists them all)


def kpgo_commit() -> str:
    here = Path(__file__).resolve().parent
    res = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return res.stdout.strip() or "unknown"


def workload_figures(run: Path, wl: str) -> dict:
    profile = json.loads((run / "profiles" / wl / "profile.json").read_text())
    build = json.loads((run / "builds" / f"optimized-{wl}" / "build.json").read_text())
    values = build["proof"]["values"]
    promoted = values["hot_promoted_sites"]
    seen = promotions_in_vmlinux(run / "builds" / f"optimized-{wl}" / "vmlinux", promoted)
    sites = site_summary(dominant_sites(run / "profiles" / wl, run / "builds" / "instrumented"))
    return {
        "collected_at": profile.get("collected_at"),
        "kernel_release": profile.get("kernel_release"),
        "pool": profile.get("value_profiles"),
        "transforms": values["totals"],
        "promoted_sites": [s | {"in_vmlinux": v} for s, v in zip(promoted, seen)],
        "promoted_in_vmlinux": sum(v in (CALL, GUARD) for v in seen),
        "indirect_sites": sites,
    }


def markdown(name: str, data: dict) -> str:
    lines = [f"# Value profiles: the {name} run, per workload", "",
             f"Made by `benchmarks/value_figures.py` (kpgo {data['kpgo']}, {data['made']}) from the run `{data['run']}` "
             f"({data['base']} kernel, {', '.join(data['workloads'])}); every figure and list is in `{name}-values.json`.", "",
             "| workload | pool nodes used (of) | values dropped | indirect calls profiled (GCC) | promoted (GCC's dumps) | "
             "promoted, still in vmlinux | sites with a dominant target | target in the same object | in another object | "
             "not in the profile | div/mod | string ops |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for wl, f in data["workloads"].items():
        t, s, p = f["transforms"], f["indirect_sites"], f["pool"] or {}
        lines.append(f"| {wl} | {p.get('used_nodes', '–'):,} ({p.get('pool_nodes', '–'):,}) | {p.get('dropped_values', '–')} | "
                     f"{t['indirect_calls_trained']:,} | {t['indirect_calls_promoted']} | {f['promoted_in_vmlinux']} | "
                     f"{s['sites_with_dominant_target']} | {s['target_in_same_object']} | {s['target_in_another_object']} | "
                     f"{s['target_not_in_profile']} | {t['divmod']} | {t['stringop']} |")
    lines += ["", "A dominant target takes at least 50% of the site's executions: GCC 12's ipa-profile speculates on no less "
              "(`REG_BR_PROB_BASE / 2`). A site counts once, whatever the number of targets it tracked. \"Still in vmlinux\": "
              "the caller's code in the linked kernel holds the direct call or, when the target was inlined, the guard's "
              "compare with the target's address (objdump); GCC's inliner can drop a speculation it made."]
    for wl, f in data["workloads"].items():
        lines += ["", f"## {wl}", "", "Promoted sites (caller → target, executions reaching the target of the site's):", ""]
        lines += [f"- `{s['caller']}` → `{s['target']}` ({s['object']}): {s['count']:,} of {s['all']:,}; in vmlinux: {s['in_vmlinux']}"
                  for s in f["promoted_sites"]] or ["- none"]
        lines += ["", f"The {min(TOP, len(f['indirect_sites']['sites']))} hottest sites with a dominant target:", "",
                  "| caller | target | executions to it | of | object | target |", "|---|---|---|---|---|---|"]
        lines += [f"| `{s['caller']}` | `{s['target']}` | {s['count']:,} | {s['all']:,} | {s['object']} | {s['where']} |"
                  for s in f["indirect_sites"]["sites"][:TOP]]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a run directory made with --values")
    ap.add_argument("-o", "--out", type=Path, required=True, help="directory for NAME-values.json and NAME-values.md")
    ap.add_argument("--name", required=True, help="the run's name in the files (e.g. tiny)")
    a = ap.parse_args()
    run_json = json.loads((a.run / "run.json").read_text())
    options = run_json.get("request", {})
    workloads = [wl for wl in sorted(p.name for p in (a.run / "profiles").iterdir() if p.is_dir() and not p.name.endswith(".raw"))
                 if (a.run / "builds" / f"optimized-{wl}" / "build.json").is_file()]
    data = {"kpgo": kpgo_commit(), "made": datetime.now(UTC).strftime("%Y-%m-%d"), "run": a.run.name,
            "base": options.get("base", "?"), "workloads": {wl: workload_figures(a.run, wl) for wl in workloads}}
    a.out.mkdir(parents=True, exist_ok=True)
    atomic.write_json(a.out / f"{a.name}-values.json", data)
    atomic.write_text(a.out / f"{a.name}-values.md", markdown(a.name, data))
    print(f"wrote {a.out / (a.name + '-values.json')} and {a.out / (a.name + '-values.md')}")


if __name__ == "__main__":
    main()
