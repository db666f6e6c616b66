"""`kpgo run`: the whole loop as cached steps under one run directory.

  RUN/builds/instrumented   RUN/profiles/<wl>.raw -> RUN/profiles/<wl>   RUN/builds/optimized (+ proof)
  RUN/builds/vanilla        RUN/bench/                                   RUN/summary.md, RUN/run.json

Each step is skipped when its output exists with the same inputs, so running the same command
again after an interruption redoes only what is missing."""

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
    workload: dict
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
    wl = opts.workload
    say(f"run: {spec.name} kernel {src.version}, workload {wl['name']}, in {rd}")

    def timed(name: str, fn):  # type: ignore[no-untyped-def]
        t = time.monotonic()
        value = fn()
        phases[name] = round(time.monotonic() - t, 1)
        say(f"run: phase {name} took {fmt_secs(phases[name])}")
        return value

    def req(variant: str, profile: Path | None = None) -> kbuild.BuildRequest:
        return kbuild.BuildRequest(src, spec, variant, rd / "builds" / variant, profile, opts.jobs)

    instr = timed("build instrumented", lambda: kbuild.build(req("instrumented")))
    raw = rd / "profiles" / f"{wl['name']}.raw"
    fixed = rd / "profiles" / wl["name"]

    def do_collect() -> dict:
        have = collect.load_profile_json(raw)
        if have.get("build_key") == instr["key"] and have.get("workload", {}).get("params") == wl["params"]:
            say(f"collect {wl['name']}: up to date in {raw}")
            return have
        shutil.rmtree(fixed, ignore_errors=True)
        return collect.collect(rd / "builds" / "instrumented", wl, raw, guest=opts.guest, replace=True)

    prof = timed("collect", do_collect)

    def do_fix() -> dict:
        from kpgo.gcov.profile import fix_profile, profile_stats

        have = collect.load_profile_json(fixed)
        if have.get("build_key") == instr["key"] and have.get("collected_at") == prof.get("collected_at") and "fixed" in have:
            say(f"profile fix: up to date in {fixed}")
        else:
            shutil.rmtree(fixed, ignore_errors=True)
            fix_profile(raw, fixed)
        return profile_stats(fixed)

    pstats = timed("profile fix", do_fix)
    opt = timed("build optimized", lambda: kbuild.build(req("optimized", fixed)))
    van = timed("build vanilla", lambda: kbuild.build(req("vanilla")))
    kernels = [bench.Kernel("vanilla", rd / "builds" / "vanilla"), bench.Kernel("optimized", rd / "builds" / "optimized")]
    res = timed("bench", lambda: bench.bench(kernels, wl, rd / "bench", boots=opts.boots, runs=opts.runs, guest=opts.guest))
    summary = {
        "run_dir": str(rd),
        "kernel": {"source": str(src.path), "version": src.version, "config": spec.name},
        "workload": {"name": wl["name"], "params": wl["params"]},
        "builds": {m["variant"]: {"seconds": m["seconds"]["total"], "sizes": m["sizes"], "release": m["kernel_release"]} for m in (van, instr, opt)},
        "profile": {"collected": {k: prof.get(k) for k in ("files", "arcs_sum", "throughput", "gcov_version")}, "stats": pstats},
        "proof": opt["proof"],
        "bench": {"summary": res["summary"], "host": res["host"], "design": res["design"], "note": res["note"]},
        "phases_seconds": phases,
        "total_seconds": round(time.monotonic() - t_start, 1),
    }
    atomic.write_json(rd / "run.json", summary)
    atomic.write_text(rd / "summary.md", markdown(summary, res))
    return summary


def markdown(s: dict, res: dict) -> str:
    unit = res["workload"]["unit"]
    b = s["builds"]
    pr = s["proof"]
    lines = [
        f"# kpgo run: {s['kernel']['config']} kernel {s['kernel']['version']}, workload {s['workload']['name']}",
        "",
        f"Workload parameters: `{json.dumps(s['workload']['params'], sort_keys=True)}`",
        f"Host: {res['host']['cpu']}; guests under **{res['host']['accelerator'].upper()}**; {res['host']['qemu']}; gcc {res['host']['gcc']}",
        "",
        "## Builds",
        "",
        "| variant | build time | vmlinux .text | objects' .text* | .text.hot | .text.unlikely |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for v in ("vanilla", "instrumented", "optimized"):
        z = b[v]["sizes"]
        lines.append(f"| {v} | {fmt_secs(b[v]['seconds'])} | {z['vmlinux_text']:,} | {z.get('objects_text', 0):,} | {z['text_hot']:,} | {z['text_unlikely']:,} |")
    c = s["profile"]["collected"]
    lines += [
        "",
        "Sizes in bytes; .text.hot/.text.unlikely summed over the objects linked into vmlinux (the linker folds them into .text).",
        "",
        "## Profile",
        "",
        f"{c['files']} .gcda files, counter sum {c['arcs_sum']:,}, collected at {c['throughput']:.0f} {unit}; gcov version {c['gcov_version']}.",
        f"Object summary added by `kpgo profile fix` (the kernel does not write it; GCC ≥ 9 ignores a .gcda without it).",
        "",
        "## Proof that GCC used the profile",
        "",
        f"GCC read the profile in **{pr['objects_used']} of {pr['objects_nonempty']}** objects with a non-empty profile "
        f"(**{pr['ratio']:.1%}**, threshold {pr['threshold']:.0%}); functions with counts read: {pr['functions_read']}, "
        f"functions where GCC gave up: {pr['functions_giving_up']}. Method: {pr['method']}."
        + (f" Profiled objects not in this build (instrumented kernel only): {', '.join(pr['profiled_but_not_built'])}." if pr.get("profiled_but_not_built") else ""),
        "",
        "## Benchmark",
        "",
        "```",
        bench.format_table(res),
        "```",
        "",
        "Phases: " + ", ".join(f"{k} {fmt_secs(v)}" for k, v in s["phases_seconds"].items()) + f"; total {fmt_secs(s['total_seconds'])}.",
        "",
    ]
    return "\n".join(lines)
