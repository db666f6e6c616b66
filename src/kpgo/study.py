"""Studies that extend a finished `kpgo run` directory (the universal and cross-application studies
are part of the run itself: see kpgo.pipeline).

  sensitivity   one workload under several settings of one parameter: a profile and an optimized
                kernel per setting (RUN/builds/optimized-WL+KEY-VALUE), each measured under every
                setting beside vanilla -> RUN/studies/sensitivity/results.json
  share         the kernel's share of guest CPU time, instructions and simulated L1i/iTLB misses
                per workload on the vanilla kernel (simulated counters) -> RUN/studies/share/results.json
  compiler      compiler variants (kpgo.variants: levels, compilers, flags, PGO with them) built from the
                run's source, configuration and profiles, each measured beside -O2 vanilla on the run's
                workloads -> RUN/studies/compiler/results.json and compiler.json

All reuse the run's instrumented and vanilla builds, its kernel source and configuration."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kpgo import atomic, bench, pipeline, records, variants, vm, workloads
from kpgo.errors import UserError
from kpgo.guest.contract import Workload
from kpgo.remote import Remote
from kpgo.report import present


def run_options(run_dir: Path) -> pipeline.RunOptions:
    """The request of the finished run in run_dir, to extend it exactly as it was started."""
    run = records.Run.read(run_dir / "run.json")
    if run is None:
        raise UserError(f"{run_dir} holds no finished kpgo run (no run.json)", "run `kpgo run --dir RUN_DIR` first")
    if run.request is None:
        raise UserError(f"{run_dir / 'run.json'} was written by an older kpgo (no request)", "re-run `kpgo run --dir RUN_DIR` (cached steps are kept)")
    return pipeline.RunOptions.from_json(run.request, run_dir)


def _builder(run_dir: Path, cluster: Remote | None = None) -> pipeline.Builder:
    opts = run_options(run_dir)
    return opts.builder(*opts.kernel(), cluster)


def vary(name: str, key: str, values: list[str], overrides: list[str]) -> list[Workload]:
    """The workload once per value of KEY, renamed NAME+KEY-VALUE (a name that is also a directory name virtme-ng
    can share: letters, digits and _ + . - only, so other characters of the value become _)."""
    if len(values) < 2:
        raise UserError("--vary needs two or more values", "e.g. --vary clients=1,50")
    out = []
    for v in values:
        spec = workloads.load(name, overrides + [f"{key}={v}"])
        out.append(replace(spec, name=re.sub(r"[^A-Za-z0-9_.+-]", "_", f"{name}+{key}-{v}")))
    return out


def sensitivity(run_dir: Path, specs: list[Workload], design: bench.Design, guest: vm.Guest, sim: Any = None,
                cluster: Remote | None = None) -> dict:
    build = _builder(run_dir, cluster)
    out = run_dir / "studies" / "sensitivity"
    instr = build("instrumented", "instrumented")
    instr_dir = run_dir / "builds" / "instrumented"
    raws = pipeline.collect_cached_on_cluster(out / "profiles", instr_dir, instr, specs, guest, cluster) if cluster else {}
    for wl in specs:
        prof = raws.get(wl.name) or pipeline.collect_cached(out / "profiles", instr_dir, instr, wl, guest)
        pipeline.fix_cached(out / "profiles", instr, wl, prof)
    build.many([("optimized", f"optimized-{wl.name}", out / "profiles" / wl.name) for wl in specs] + [("vanilla", "vanilla", None)])
    kernels = [bench.Kernel("vanilla", run_dir / "builds" / "vanilla")] + [
        bench.Kernel(f"optimized-{w.name}", run_dir / "builds" / f"optimized-{w.name}") for w in specs]
    return bench.bench(kernels, specs, out, design=design, guest=guest, sim=sim, cluster=cluster)


def share_dir(run_dir: Path, sets: list[str], vary: str | None, cpus: int | None, data: str = "tmpfs") -> Path:
    """Where a share study goes: studies/share for the run's own workloads and guest; an experiment that changes them
    (--set, --vary, --cpus, --data disk) gets studies/share-WHAT, WHAT naming the change (share-concurrency,
    share-4cpus, share-disk), so that no bench mixes boots of two set-ups."""
    what = [*(s.partition("=")[0].strip().rpartition(".")[2] + "-" + s.partition("=")[2].strip() for s in sets),
            *([vary.partition("=")[0].strip()] if vary else []), *([f"{cpus}cpus"] if cpus else []), *([data] if data != "tmpfs" else [])]
    return run_dir / "studies" / ("share-" + re.sub(r"[^A-Za-z0-9_.+-]", "_", "_".join(what)) if what else "share")


def share(run_dir: Path, specs: list[Workload], out: Path, design: bench.Design, guest: vm.Guest, sim: Any,
          cluster: Remote | None = None) -> dict:
    _builder(run_dir, cluster)("vanilla", "vanilla")
    res = bench.bench([bench.Kernel("vanilla", run_dir / "builds" / "vanilla")], specs, out, design=design, guest=guest, sim=sim, cluster=cluster)
    atomic.write_json(out / "share.json", bench.kernel_share(res))
    return res


def format_share(table: dict) -> str:
    rows = [[n, present.pct(r["cpu_time"]), *(present.pct(r[k]) for k in bench.SHARES)] for n, r in table.items()]
    return present.text_table(["workload", "CPU time", "insns", "L1i miss", "iTLB miss"], rows, [False, True, True, True, True],
                              note="(kernel's share)")


@dataclass(frozen=True)
class VariantBuild:
    """One kernel of the compiler study: a variant, built once (no profile) or once per workload with that workload's
    profile from the run; `label` names both RUN/builds/LABEL and the kernel in the bench."""

    variant: variants.Variant
    label: str
    workload: str | None  # whose profile it was compiled with; None: measured on every workload


def compiler_plan(chosen: list[variants.Variant], names: list[str]) -> list[VariantBuild]:
    """The study's kernels, baseline (-O2 vanilla) first: PGO variants once per workload, the run's own optimized
    kernels reused under their names; a UserError for a variant the study cannot measure or labels that collide."""
    van = variants.get("vanilla")
    order = [van] + [v for v in chosen if v.name != "vanilla"]
    for v in order:
        if v.gcov:
            raise UserError(f"variant {v.name} is the instrumented kernel, which collects profiles; it is not measured",
                            "drop it from --variants")
    plan = []
    for v in order:
        if v.profile:
            plan += [VariantBuild(v, f"optimized-{n}" if v.name == "optimized" else f"{v.name}-{n}", n) for n in names]
        else:
            plan.append(VariantBuild(v, v.name, None))
    labels = [b.label for b in plan]
    twice = sorted({x for x in labels if labels.count(x) > 1})
    if twice:
        raise UserError(f"two of the study's kernels would be named {twice[0]} (a variant's name clashes with a PGO variant's "
                        "per-workload kernel)", "rename your variant file's variant")
    return plan


def check_compiler(run_dir: Path, plan: list[VariantBuild]) -> None:
    """Everything the study can check in seconds, before its first build: every variant's compiler installed and
    accepting the variant's flags, and every profile a PGO variant needs present and usable by that compiler."""
    from kpgo.kernel import kbuild

    for v in dict.fromkeys(b.variant for b in plan):
        variants.require(v)
        variants.check_flags(v)
    for b in plan:
        if b.workload is not None:
            prof = run_dir / "profiles" / b.workload
            if not (prof / "profile.json").is_file():
                raise UserError(f"{run_dir} has no profile of {b.workload} ({prof})", "re-run the run's `kpgo run` command to finish it")
            kbuild.check_request(b.variant, prof)


def compiler(run_dir: Path, chosen: list[variants.Variant], names: list[str] | None, design: bench.Design, guest: vm.Guest,
             sim: Any = None, cluster: Remote | None = None) -> tuple[dict, dict]:
    """Build every variant (cached), measure each beside vanilla on the run's workloads (or `names` among them) in one
    bench, and write the study's table (compiler.json). Returns the table and the bench's results."""
    opts = run_options(run_dir)
    wls = [w for w in opts.workloads if names is None or w.name in names]
    unknown = sorted(set(names or ()) - {w.name for w in opts.workloads})
    if unknown:
        raise UserError(f"--workload {unknown[0]}: not a workload of the run in {run_dir}",
                        f"choose among {', '.join(w.name for w in opts.workloads)}")
    plan = compiler_plan(chosen, [w.name for w in wls])
    check_compiler(run_dir, plan)
    builds = opts.builder(*opts.kernel(), cluster).many([(b.variant, b.label, run_dir / "profiles" / b.workload if b.workload else None) for b in plan])
    out = run_dir / "studies" / "compiler"
    kernels = [bench.Kernel(b.label, run_dir / "builds" / b.label) for b in plan]
    cells = [(b.label, w.name) for b in plan for w in wls if b.workload in (None, w.name)]
    res = bench.bench(kernels, wls, out, design=design, guest=guest, cells=cells, sim=sim, cluster=cluster)
    table = compiler_table(records.Results.from_json(res, out / "results.json"), plan, {label: b.sizes for label, b in builds.items()})
    atomic.write_json(out / "compiler.json", table)
    return table, res


SIZE_KEYS = ("functions_size", "text_span", "text_unlikely", "bzimage")


def compiler_table(results: records.Results, plan: list[VariantBuild], sizes: dict[str, dict]) -> dict:
    """The study's table from its bench results: per variant and workload the ratio to vanilla in each headline metric
    with its CI, the geomean over workloads, and the code size (PGO variants: the mean over their per-workload
    builds, with the range)."""
    m = results.measurement
    headline = m.headline or ("simulated" if m.sim else "wall-clock")  # older benches did not say
    simulated = headline == "simulated"
    metrics = bench.SIM_HEADLINE + ("speedup",) if simulated else ("speedup",)
    names = list(results.workloads)
    rows = []
    for v in dict.fromkeys(b.variant for b in plan):
        mine = [b for b in plan if b.variant == v]
        labels = {n: next(b.label for b in mine if b.workload in (None, n)) for n in names}
        size: dict[str, Any] = {}
        for k in SIZE_KEYS:
            vals = [x for b in mine if isinstance(x := sizes.get(b.label, {}).get(k), int)]
            if vals:
                size[k] = {"mean": sum(vals) / len(vals), "min": min(vals), "max": max(vals), "builds": len(vals)}
        rows.append({
            "variant": v.name, "summary": v.summary(), "description": v.description, "profile": v.profile,
            "kernels": {n: labels[n] for n in names}, **_ratios(results, labels, metrics, v.name == "vanilla"), "size": size,
        })
    return {"schema": 1, "baseline": "vanilla", "headline": headline, "metrics": list(metrics), "workloads": names,
            "variants": rows, "note": results.note or "", "interval": present.interval_text(results)}


def _ratios(results: records.Results, labels: dict[str, str], metrics: Sequence[str], baseline: bool) -> dict[str, Any]:
    """A variant's row of ratios: per workload its kernel's ratio to vanilla in each metric, and the geomeans (computed
    from the samples by kpgo.bench, over the results as read)."""
    per: dict[str, dict[str, Any]] = {}
    for n, label in labels.items():
        w = results.workloads[n]
        row = w.row(label)
        sim = w.sim.get(label) or {}
        per[n] = {m: _ratio(sim[m]) for m in metrics if m in sim} | ({"speedup": _ratio(row, speedup=True)} if row else {})
    return {"workloads": per, "geomean": {m: g for m in metrics if not baseline and (g := bench.geomean_of(results.raw, labels, m))}}


def restate_table(table: dict, results: records.Results) -> dict:
    """compiler.json as this kpgo computes its ratios from the study's (restated: kpgo.bench.restate) results."""
    if table.get("interval") == present.interval_text(results):
        return table
    rows = [{**v, **_ratios(results, v["kernels"], table["metrics"], v["variant"] == "vanilla")} for v in table["variants"]]
    return {**table, "variants": rows, "interval": present.interval_text(results)}


def _ratio(s: records.Stat, speedup: bool = False) -> dict[str, Any]:
    """A ratio of the table as compiler.json keeps it; speedup: a summary row's speedup, with the row's interval."""
    return {"ratio": s.speedup if speedup else s.ratio, "ci_low": s.ci_low, "ci_high": s.ci_high, "ci_includes_1": s.ci_includes_1,
            "ci_method": s.ci_method}


def _metric_name(m: str) -> str:
    return "speedup (wall-clock)" if m == "speedup" else f"{present.metric_title(m)} (simulated)"


def compiler_tables(table: dict) -> list[tuple[str, list[str], list[list[str]], list[bool]]]:
    """The study's tables as (title, header, rows, numeric): each variant's ratio to vanilla per workload in the
    headline metric; then per variant the geomean of every metric and the code size. Cells are plain text (the '*'
    included); the terminal, summary and report each render them."""
    head = table["metrics"][0]
    names = table["workloads"]
    van = next((v for v in table["variants"] if v["variant"] == "vanilla"), None)
    van_size = ((van or {}).get("size", {}).get("functions_size") or {}).get("mean")
    first = []
    for v in table["variants"][1:]:
        cells = [present.ratio_ci(v["workloads"][n][head]) if head in v["workloads"].get(n, {}) else "–" for n in names]
        g = v["geomean"].get(head)
        first.append([v["variant"], *cells, present.ratio_ci(g) if g else "–"])
    second = []
    for v in table["variants"]:
        fs = (v["size"].get("functions_size") or {})
        unl = (v["size"].get("text_unlikely") or {})
        rel = f"{fs['mean'] / van_size - 1:+.1%}" if fs and van_size else "–"
        spread = f" ({present.size(fs['min'])}–{present.size(fs['max'])})" if fs and fs["builds"] > 1 else ""
        measured = {m for x in table["variants"] for m in x["geomean"]}
        geos = [("1" if m in measured else "–") if v["variant"] == "vanilla" else present.ratio_ci(v["geomean"][m]) if m in v["geomean"] else "–"
                for m in table["metrics"]]
        second.append([v["variant"], v["summary"], *geos, present.size(fs.get("mean")) + spread, rel, present.size(unl.get("mean"))])
    return [
        (f"{_metric_name(head)}: ratio to -O2 vanilla [95% CI]", ["variant", *names, "geomean"], first, [False] * (len(names) + 2)),
        ("Per variant: geomean over the workloads of the ratio to -O2 vanilla [95% CI], and code size (bytes)",
         ["variant", "compiler, level, flags", *(_metric_name(m) for m in table["metrics"]), "functions", "vs vanilla", ".text.unlikely"],
         second, [False, False, *([False] * len(table["metrics"])), True, True, True]),
    ]


def format_compiler(table: dict) -> str:
    """The study's tables in Markdown (what the terminal prints and docs can take as they are)."""
    lines = []
    for title, header, rows, numeric in compiler_tables(table):
        lines += [f"## {title}", "", *present.md_table(header, [[present.md_cell(c) for c in r] for r in rows], numeric), ""]
    interval = present.md_escape(table.get("interval") or present.BOOTSTRAP_TEXT)
    lines += [present.md_escape(present.footnote()) + f"; {interval}. PGO variants: one kernel per workload, built with that workload's "
              "profile and measured on it; their size is the mean of those kernels (range in parentheses). Functions: the "
              "sum of vmlinux's function symbols. " + table["note"]]
    return "\n".join(lines)
