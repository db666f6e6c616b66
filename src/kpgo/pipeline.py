"""`kpgo run`: the whole loop as cached steps under one run directory.

  RUN/builds/instrumented   RUN/profiles/<wl>.raw -> RUN/profiles/<wl>   RUN/builds/optimized-<wl> (+ proof)
  RUN/builds/vanilla        RUN/bench/<wl>/                             RUN/summary.md, RUN/run.json

With several workloads, each gets its own profile, its own optimized kernel (app-specific PGO)
and its own bench against the one vanilla kernel. Each step is skipped when its output exists
with the same inputs, so running the same command again after an interruption redoes only what
is missing."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from kpgo import atomic, bench, collect, vm
from kpgo.kernel import kbuild, kconfig, source
from kpgo.progress import fmt_secs, say


@dataclass(frozen=True)
class RunOptions:
    run_dir: Path
    base: str | None
    config: Path | None
    fragments: tuple[Path, ...]
    source: Path | None
    workloads: tuple[dict, ...]
    boots: int
    runs: int
    jobs: int
    guest: vm.Guest


def run(opts: RunOptions) -> dict:
    t_start = time.monotonic()
    phases: dict[str, float] = {}
    spec = kconfig.resolve(opts.base, opts.config, list(opts.fragments))
    src = source.resolve(opts.source)
    rd = opts.run_dir.resolve()
    rd.mkdir(parents=True, exist_ok=True)
    names = [wl["name"] for wl in opts.workloads]
    say(f"run: {spec.name} kernel {src.version}, workloads {', '.join(names)}, in {rd}")

    def timed(name: str, fn):  # type: ignore[no-untyped-def]
        t = time.monotonic()
        value = fn()
        phases[name] = round(time.monotonic() - t, 1)
        say(f"run: phase {name} took {fmt_secs(phases[name])}")
        return value

    def req(variant: str, out: str, profile: Path | None = None) -> kbuild.BuildRequest:
        return kbuild.BuildRequest(src, spec, variant, rd / "builds" / out, profile, opts.jobs)

    instr = timed("build instrumented", lambda: kbuild.build(req("instrumented", "instrumented")))
    profiles: dict[str, tuple[dict, dict]] = {}
    for wl in opts.workloads:
        prof = timed(f"collect {wl['name']}", lambda: _collect(rd, instr, wl, opts.guest))
        pstats = timed(f"profile fix {wl['name']}", lambda: _fix(rd, instr, wl, prof))
        profiles[wl["name"]] = (prof, pstats)
    opt = {n: timed(f"build optimized-{n}", lambda: kbuild.build(req("optimized", f"optimized-{n}", rd / "profiles" / n))) for n in names}
    van = timed("build vanilla", lambda: kbuild.build(req("vanilla", "vanilla")))
    results = {}
    for wl in opts.workloads:
        n = wl["name"]
        kernels = [bench.Kernel("vanilla", rd / "builds" / "vanilla"), bench.Kernel("optimized", rd / "builds" / f"optimized-{n}")]
        results[n] = timed(f"bench {n}", lambda: bench.bench(kernels, wl, rd / "bench" / n, boots=opts.boots, runs=opts.runs, guest=opts.guest))
    summary = {
        "run_dir": str(rd),
        "kernel": {"source": str(src.path), "version": src.version, "config": spec.name},
        "builds": {"vanilla": _build_info(van), "instrumented": _build_info(instr)} | {f"optimized-{n}": _build_info(m) for n, m in opt.items()},
        "workloads": {
            n: {
                "params": wl["params"],
                "unit": wl["unit"],
                "profile": {"collected": {k: profiles[n][0].get(k) for k in ("files", "arcs_sum", "throughput", "gcov_version")}, "stats": profiles[n][1]},
                "proof": opt[n]["proof"],
                "bench": {"summary": results[n]["summary"], "design": results[n]["design"], "note": results[n]["note"]},
            }
            for n, wl in zip(names, opts.workloads)
        },
        "host": next(iter(results.values()))["host"],
        "phases_seconds": phases,
        "total_seconds": round(time.monotonic() - t_start, 1),
    }
    atomic.write_json(rd / "run.json", summary)
    atomic.write_text(rd / "summary.md", markdown(summary, results))
    return summary


def _build_info(m: dict) -> dict:
    return {"seconds": m["seconds"]["total"], "sizes": m["sizes"], "release": m["kernel_release"]}


def _collect(rd: Path, instr: dict, wl: dict, guest: vm.Guest) -> dict:
    raw = rd / "profiles" / f"{wl['name']}.raw"
    have = collect.load_profile_json(raw)
    if have.get("build_key") == instr["key"] and have.get("workload", {}).get("params") == wl["params"]:
        say(f"collect {wl['name']}: up to date in {raw}")
        return have
    shutil.rmtree(rd / "profiles" / wl["name"], ignore_errors=True)
    return collect.collect(rd / "builds" / "instrumented", wl, raw, guest=guest, replace=True)


def _fix(rd: Path, instr: dict, wl: dict, prof: dict) -> dict:
    from kpgo.gcov.profile import fix_profile, profile_stats

    raw = rd / "profiles" / f"{wl['name']}.raw"
    fixed = rd / "profiles" / wl["name"]
    have = collect.load_profile_json(fixed)
    if have.get("build_key") == instr["key"] and have.get("collected_at") == prof.get("collected_at") and "fixed" in have:
        say(f"profile fix {wl['name']}: up to date in {fixed}")
    else:
        shutil.rmtree(fixed, ignore_errors=True)
        fix_profile(raw, fixed)
    return profile_stats(fixed)


def markdown(s: dict, results: dict[str, dict]) -> str:
    host = s["host"]
    b = s["builds"]
    lines = [
        f"# kpgo run: {s['kernel']['config']} kernel {s['kernel']['version']}, workloads {', '.join(s['workloads'])}",
        "",
        f"Host: {host['cpu']}; guests under **{host['accelerator'].upper()}**; {host['qemu']}; gcc {host['gcc']}",
        "",
        "## Results",
        "",
        "| workload | unit | vanilla | optimized | ratio [95% CI] | GCC used the profile |",
        "|---|---|---:|---:|---|---|",
    ]
    for n, w in s["workloads"].items():
        rows = {r["kernel"]: r for r in w["bench"]["summary"]}
        o = rows["optimized"]
        ci = f"[{o['ci_low']:.3f}, {o['ci_high']:.3f}]" if o["ci_low"] == o["ci_low"] else "[n<2]"
        pr = w["proof"]
        lines.append(f"| {n} | {w['unit']} | {rows['vanilla']['mean']:.1f} | {o['mean']:.1f} | {o['ratio']:.3f} {ci}{'*' if o['ci_includes_1'] else ''} "
                     f"| {pr['objects_used']}/{pr['objects_nonempty']} objects ({pr['ratio']:.1%}) |")
    lines += [
        "",
        "\\* the 95% CI (bootstrap over boots) includes 1.0: no difference shown at this sample size.",
        "",
        "## Builds",
        "",
        "| build | build time | vmlinux .text | objects' .text* | .text.hot | .text.unlikely |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for v, info in b.items():
        z = info["sizes"]
        lines.append(f"| {v} | {fmt_secs(info['seconds'])} | {z['vmlinux_text']:,} | {z.get('objects_text', 0):,} | {z['text_hot']:,} | {z['text_unlikely']:,} |")
    lines += ["", "Sizes in bytes; .text.hot/.text.unlikely summed over the objects linked into vmlinux (the linker folds them into .text).", ""]
    for n, w in s["workloads"].items():
        c = w["profile"]["collected"]
        pr = w["proof"]
        lines += [
            f"## {n}",
            "",
            f"Parameters: `{json.dumps(w['params'], sort_keys=True)}`",
            "",
            f"Profile: {c['files']} .gcda files, counter sum {c['arcs_sum']:,}, collected at {c['throughput']:.0f} {w['unit']}; "
            f"gcov version {c['gcov_version']}; object summary added by `kpgo profile fix` (the kernel does not write it; "
            "GCC ≥ 9 ignores a .gcda without it).",
            "",
            f"Proof that GCC used the profile: read in **{pr['objects_used']} of {pr['objects_nonempty']}** objects with a non-empty "
            f"profile (**{pr['ratio']:.1%}**, threshold {pr['threshold']:.0%}); functions with counts read: {pr['functions_read']}, "
            f"functions where GCC gave up: {pr['functions_giving_up']}. Method: {pr['method']}."
            + (f" Profiled objects not in this build (instrumented kernel only): {', '.join(pr['profiled_but_not_built'])}." if pr.get("profiled_but_not_built") else ""),
            "",
            "```",
            bench.format_table(results[n]),
            "```",
            "",
        ]
    lines += ["Phases: " + ", ".join(f"{k} {fmt_secs(v)}" for k, v in s["phases_seconds"].items()) + f"; total {fmt_secs(s['total_seconds'])}.", ""]
    return "\n".join(lines)
