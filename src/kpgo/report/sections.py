"""The report's sections, each from the data of a run directory: a Section when its data exist, else a Skipped
naming what is missing. Numbers come from results.json as the bench computed them (the report recomputes nothing
but the kernel-share means over boots); docs/REPORT.md says what each section shows."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from kpgo import bench
from kpgo.errors import KpgoError
from kpgo.records import Host, KernelEntry, Results, Run, RunBuild, Stat, WorkloadResults
from kpgo.report import figures, measure, present
from kpgo.report.figures import Cell
from kpgo.report.load import RunData
from kpgo.report.model import Figure, Heading, Section, Skipped, Table

# Every section registered once, in report order; report.md, report.html, report.json and the skipped line take
# their number, id and title from here.
HEADLINE = Heading(0, "headline", "Headline")
HEADER = Heading(1, "header", "Run")
SPEEDUP = Heading(2, "speedup", "Speedup")
SIM = Heading(3, "sim", "Simulated counters")
UNIVERSAL = Heading(4, "universal", "Universal vs app-specific")
CROSS = Heading(5, "cross", "Cross-application")
SENSITIVITY = Heading(6, "sensitivity", "Workload sensitivity")
SIMILARITY = Heading(7, "similarity", "Profile similarity")
KERNEL_SHARE = Heading(8, "kernel_share", "Kernel share")
CODE_SIZE = Heading(9, "code_size", "Code size and top functions")
PROOF = Heading(10, "proof", "Proof that GCC used the profile")
COMPILER = Heading(11, "compiler", "Compiler study")
VARIABILITY = Heading(12, "variability", "Profile variability")
LAYOUT = Heading(13, "layout", "Code layout: function order and BOLT")
CLANG = Heading(14, "clang", "Clang: AutoFDO and ThinLTO")
COMPARE = Heading(15, "compare", "Comparison with another run")  # only with --compare (kpgo.report.compare)

UNIVERSAL_KERNELS = ("universal-raw", "universal-norm")
SIM_COUNTS = ("insns", "l1i_misses", "itlb_misses")  # the simulated counts of section 3's tables
FOOTNOTE = present.footnote() + "."


class Context:
    """What every section builder gets: the run's data, the output directory (profile cache) and lazily computed
    profile analyses shared by sections 7 and 9."""

    def __init__(self, data: RunData, out_dir: Path) -> None:
        self.data = data
        self.out_dir = out_dir
        self._analysis: Any = None
        self._nm: dict[Path, Any] = {}

    def analysis(self) -> Any:
        from kpgo.report import profiles

        if self._analysis is None:
            profs = profiles.fixed_profiles(self.data.run_dir, self.data.workload_names())
            build = self.data.run_dir / "builds" / "instrumented"
            self._analysis = profiles.analyze(profs, build, self.out_dir) if profs and build.is_dir() else False
        return self._analysis or None

    def sizes(self, vmlinux: Path) -> Any:
        """nm sizes of a vmlinux (or the error text), once per file."""
        from kpgo.errors import KpgoError
        from kpgo.report import profiles

        if vmlinux not in self._nm:
            try:
                self._nm[vmlinux] = profiles.text_sizes(vmlinux) if vmlinux.is_file() else f"no {vmlinux}"
            except KpgoError as e:
                self._nm[vmlinux] = str(e)
        return self._nm[vmlinux]


def kernel_order(res: Results) -> list[str]:
    """Baseline, then the app-specific kernels in workload order, then the rest as they first appear."""
    seen: list[str] = [res.baseline]
    for w in res.workloads.values():
        for k in [*w.kernels, *(str(r.kernel) for r in w.summary)]:
            if k not in seen:
                seen.append(k)
    own = [f"optimized-{w}" for w in res.workloads if f"optimized-{w}" in seen]
    return [seen[0]] + own + [k for k in seen[1:] if k not in own]


def raw_sim(w: WorkloadResults) -> dict[str, dict[str, Any]]:
    """A workload's simulated metrics as results.json has them (report.json passes them on)."""
    return {k: {m: s.raw for m, s in ms.items()} for k, ms in w.sim.items()}


def _kv_table(caption: str, rows: list[tuple[str, Any]]) -> Table:
    return Table(caption, ["", ""], [[k, "–" if v is None or v == "" else str(v)] for k, v in rows], [False, False])


# -- 1. header -----------------------------------------------------------------------------------------------------


def _flags(flags: list[str] | None) -> str:
    """A kernel's compiler flags beyond -O2 and the profile-use set (kbuild.extra_flags); '–' where not recorded."""
    return "–" if flags is None else " ".join(flags) or "none"


def header(ctx: Context) -> Section | Skipped:
    d = ctx.data
    res, run = d.results, d.run
    kern = dict(run.kernel.raw) if run else {}
    if kern.get("source"):
        kern["source"] = d.shown(kern["source"])
    releases = sorted({k.kernel_release for k in (res.kernels.values() if res else ()) if k.kernel_release})
    kern.setdefault("version", ", ".join(releases) or None)
    host = (res and res.host) or (run and run.host) or Host()
    accel = measure.accelerator(res, run)
    sim = res.measurement.sim if res else None
    blocks: list[Any] = [
        _kv_table("Kernel", [("version", kern.get("version")), ("base config", kern.get("config")), ("source", kern.get("source"))]),
        _kv_table("Host", [("CPU", host.cpu), ("accelerator", accel), ("QEMU", host.qemu), ("host kernel", host.host_kernel), ("gcc", host.gcc)]),
    ]
    data: dict[str, Any] = {"kernel": kern, "host": dict(host.raw), "accelerator": accel}
    if res is not None:
        des = res.design
        order = des.order or "–"
        if des.order_name and des.order_name not in str(order):
            order = f"{order} [{des.order_name}]"
        boots, more = present.boots_count(des.boots_per_kernel, des.boots_by_workload)
        blocks.append(_kv_table("Design (bench/results.json)", [
            ("baseline", res.baseline), ("order", order), ("seed", des.seed),
            ("boots per kernel and workload", None if des.boots_per_kernel is None else f"{boots} ({more})" if more else boots),
            ("runs per boot", des.runs_per_boot),
            ("warm-up discarded", None if des.warmup_per_boot is None else "yes, every boot" if des.warmup_per_boot else "no"),
            ("unit of replication", des.unit_of_replication), ("boots in total", des.boots or None),
            ("clock", res.measurement.clock),
            ("simulated counters", measure.sim_model(res.measurement) if sim else "none"),
            *([("hosts", bench.hosts_line(res.raw).removeprefix("on "))] if res.hosts else []),
        ]))
        if res.hosts:
            per_host_blocks, per_host = _per_host(res)
            blocks += per_host_blocks
            data["per_host"] = per_host
        kernels = {k: (v.raw | {"build_dir": d.shown(v.build_dir)} if v.build_dir else v.raw) for k, v in res.kernels.items()}
        entries = {k: replace(v, build_dir=d.shown(v.build_dir)) for k, v in res.kernels.items()}
        blocks.append(Table("Kernels compared", ["label", "variant", "flags beyond -O2 and the profile's", "release", "build directory"],
                            [[k, e.variant or "–", _flags(e.flags), e.kernel_release or "–", "–" if e.build_dir is None else e.build_dir]
                             for k in kernel_order(res) for e in [entries.get(k) or KernelEntry()]],
                            [False] * 5))
        data |= {"design": {k: v for k, v in des.raw.items() if k != "sequence"} | {"boots_total": des.boots},
                 "measurement": res.raw.get("measurement"), "baseline": res.baseline, "kernels": kernels}
    wl_rows = []
    wl_data: dict[str, Any] = {}
    for name in d.workload_names():
        rw = res.workloads.get(name) if res else None
        ww = run.workloads.get(name) if run else None
        unit, hib, params = (rw.unit, rw.higher_is_better, rw.params) if rw else (ww.unit, None, ww.params) if ww else (None, None, None)
        wl_rows.append([name, "–" if unit is None else unit, "–" if hib is None else ("higher" if hib else "lower"),
                        json.dumps(params or {}, sort_keys=True)])
        wl_data[name] = {"unit": unit, "higher_is_better": hib, "params": params}
    if wl_rows:
        blocks.append(Table("Workloads", ["workload", "unit", "better", "parameters"], wl_rows, [False] * 4))
    data["workloads"] = wl_data
    if res is not None and res.note:
        blocks.append(res.note)
        data["note"] = res.note
    how = f"Guests under {accel}" if accel != "bare metal" else "Bare metal"
    how += "; wall-clock throughput" + ("; simulated counters" if sim else "") if res is not None else "; no bench results"
    return Section(HEADER, how + ".", blocks, data)


def _per_host(res: Results) -> tuple[list[Table | Figure], list[dict[str, Any]]]:
    """On a cluster: each cell's boots per host and, within the host, its ratio to the baseline on the headline metric
    (each round is whole on one host, so a host holds every kernel of its rounds), as a table and as bars: a host
    that differs shows here."""
    sim = measure.has_sim(res) and all(s.sim_per_op for s in res.samples)
    metric = "kernel_insns_per_op" if sim else "mean"
    title = present.metric_title(metric, short=True) if sim else "wall-clock mean"
    hosts = res.hosts
    cells: dict[tuple[str, str, str], list[float]] = {}
    for smp in res.samples:
        node = str((smp.host or {}).get("node_id"))
        value = (smp.sim_per_op or {})[metric] if sim else smp.mean
        cells.setdefault((smp.workload, node, smp.kernel), []).append(float(value))
    order = kernel_order(res)
    base = res.baseline
    rows: list[list[str]] = []
    data: list[dict[str, Any]] = []
    for (wl, node, kernel), values in sorted(cells.items(), key=lambda c: (c[0][0], c[0][1], order.index(c[0][2]) if c[0][2] in order else len(order))):
        mean = sum(values) / len(values)
        on_base = cells.get((wl, node, base))
        ratio = mean / (sum(on_base) / len(on_base)) if on_base and sum(on_base) else None
        name = f"{(hosts.get(node) or {}).get('hostname', '?')} [{node[:8]}]"
        rows.append([wl, name, kernel, str(len(values)), present.num(mean), present.ratio(ratio)])
        data.append({"workload": wl, "node_id": node, "kernel": kernel, "boots": len(values), "mean": mean, "ratio_within_host": ratio})
    caption = (f"Per host (each round whole on one host): {title} of each cell's boots on that host, and its ratio to "
               f"{base} on the same host; a host whose ratios differ from the others' is what host-to-host spread looks like")
    blocks: list[Table | Figure] = [Table(caption, ["workload", "host", "kernel", "boots", title, f"ratio to {base}"], rows,
                                          [False, False, False, True, True, True])]
    host_name = {n: f"{(hosts.get(n) or {}).get('hostname', '?')} [{n[:8]}]" for n in dict.fromkeys(r["node_id"] for r in data)}
    bars = {(f"{r['workload']}\n{r['kernel']}", host_name[r["node_id"]]): figures.Cell(r["ratio_within_host"])
            for r in data if r["kernel"] != base and r["ratio_within_host"] is not None}
    if bars:
        blocks.append(Figure(
            f"{HEADER.id}-hosts", f"{title[0].upper() + title[1:]} of each kernel relative to {base} on the same host, one bar per host "
            f"(bars start at 1.0): the same ratio on every host means the hosts agree on the kernels' difference. "
            + (measure.sim(res) if sim else measure.wall(res)),
            f"Bar chart: per-host ratio to {base}, {'simulated ' + title if sim else 'wall-clock throughput'} {measure.under(res)}",
            figures.bar_chart(list(dict.fromkeys(g for g, _ in bars)), list(host_name.values()), bars,
                              title=f"Per host: {title}, ratio to {base} on the same host", ylabel=f"ratio to {base}")))
    return blocks, data


# -- 0. headline ---------------------------------------------------------------------------------------------------

def headline(ctx: Context) -> Section | Skipped:
    """The three questions a user asks first, each one sentence and one figure: did GCC use the profile; how much
    less work per operation does the kernel do (simulated counters on TCG, wall-clock with KVM); how was it measured."""
    res, run = ctx.data.results, ctx.data.run
    proofs = run.proofs() if run else {}
    if res is None and not proofs:
        return Skipped(HEADLINE, "no bench/results.json and no proof in run.json")
    blocks: list[Any] = []
    data: dict[str, Any] = {}
    # 1. Did GCC use the profile?
    if proofs:
        ratios = {n: p.ratio or 0.0 for n, p in proofs.items()}
        ok = all(p.ok for p in proofs.values())
        lo = min(ratios, key=lambda n: ratios[n])
        threshold = next(iter(proofs.values())).threshold or 0.95
        blocks.append(f"Did GCC use the profile? {'Yes' if ok else 'Not everywhere'}: in each of the {len(proofs)} optimized "
                      f"build(s), GCC's own profile dump shows it read the counts of at least {ratios[lo]:.1%} of the objects "
                      f"with a non-empty profile (lowest: {lo}; a build below {threshold:.0%} "
                      f"fails; section {PROOF.number}).")
        blocks.append(Figure(f"{HEADLINE.id}-proof", "Share of the objects with a non-empty profile whose counts GCC read, per "
                             "optimized build. Measured: GCC's own -fdump-ipa-profile dumps at build time, object by object; "
                             "no guest involved, so it holds alike for KVM, TCG or bare metal.",
                             "Bar chart: objects whose gcov profile GCC read, per optimized build",
                             figures.fraction_bars(list(ratios), list(ratios.values()), title="Objects whose profile GCC read",
                                                   xlabel="share of objects with a non-empty profile", threshold=threshold)))
        data["proof"] = {n: {"ratio": r, "ok": bool(proofs[n].ok)} for n, r in ratios.items()}
    if res is None:
        return Section(HEADLINE, "No bench results: only the proof.", blocks, data)
    base = res.baseline
    wls = list(res.workloads)
    simulated_headline = headline_metric(res) is not None
    per_boot: dict[tuple[str, str], list[float]]
    # 2. How much less work per operation?
    if simulated_headline:
        how = measure.sim(res, run)
        geo = res.sim_own_geomean()
        own = {n: res.workloads[n].sim.get(f"optimized-{n}") for n in wls}
        parts = [f"{present.metric_title(k)} ×{present.ratio_ci(geo[k])}" for k in bench.SIM_HEADLINE if k in geo]
        ranges = []
        for k in bench.SIM_HEADLINE[:2]:
            vals = {n: r for n, o in own.items() if o and k in o and (r := o[k].ratio) is not None}
            if vals:
                a, b = min(vals, key=lambda n: vals[n]), max(vals, key=lambda n: vals[n])
                ranges.append(f"{present.metric_title(k)} from ×{present.ratio(vals[a])} ({a}) to ×{present.ratio(vals[b])} ({b})")
        blocks.append(f"How much less work does the kernel do per operation? On its own workload, the app-specific kernel "
                      f"relative to {base}, geometric mean over {len(next(iter(geo.values())).workloads) if geo else 0} workload(s): "
                      + ("; ".join(parts) or "–") + (". Per workload: " + "; ".join(ranges) if ranges else "")
                      + f". (< 1: fewer events; {present.footnote(meaning='')}.)")
        panels = []
        for k in bench.SIM_HEADLINE:
            cells = {(n, "app-specific"): c for n, o in own.items() if o and (c := Cell.of(o.get(k))) is not None}
            if k in geo and (c := Cell.of(geo[k])) is not None:
                cells[("geomean", "app-specific")] = c
            if cells:  # results from before a counter existed (taken branches) have none
                panels.append((present.metric_title(k), cells))
        groups = [n for n in wls if own.get(n)] + (["geomean"] if geo else [])
        if groups and panels:
            blocks.append(Figure(f"{HEADLINE.id}-work", f"Simulated kernel events per operation of each app-specific kernel on its own "
                                 f"workload relative to {base}, and their geometric mean (bars start at 1.0; < 1 = fewer; whiskers: "
                                 f"95% CI; {present.footnote('CI', '')}). {how}",
                                 f"Bar charts: kernel instructions, L1i misses and taken branches per operation relative to {base} (simulated)",
                                 figures.bar_panels(panels, groups, ["app-specific"],
                                                    title=f"App-specific kernel relative to {base}, per operation (simulated)",
                                                    ylabel=f"ratio to {base}")))
        data["work"] = {"metric": "simulated", "geomean": {k: g.raw for k, g in geo.items()},
                        "workloads": {n: {k: o[k].raw if k in o else None for k in bench.SIM_HEADLINE} for n, o in own.items() if o}}
        metric_key = bench.SIM_HEADLINE[0]
        metric_label = present.metric_title(metric_key)
        per_boot = {(x.workload, "vanilla" if x.kernel == base else "app-specific"): [] for x in res.samples}
        for x in res.samples:
            if (x.kernel == base or x.kernel == f"optimized-{x.workload}") and metric_key in (x.sim_per_op or {}):
                per_boot[(x.workload, "vanilla" if x.kernel == base else "app-specific")].append((x.sim_per_op or {})[metric_key])
    else:
        how = measure.wall(res, run)
        own_rows = {n: res.workloads[n].row(f"optimized-{n}") for n in wls}
        cells = {(n, "app-specific"): c for n, r in own_rows.items() if r and (c := Cell.of(r.as_speedup())) is not None}
        parts = [f"{n} {present.ratio_ci(r.as_speedup())}" for n, r in own_rows.items() if r]
        blocks.append(f"How much faster is the kernel? Wall-clock speedup of each app-specific kernel over {base} on its own "
                      f"workload: " + ("; ".join(parts) or "–") + f". (> 1 better; {present.footnote(meaning='')}.)")
        if cells:
            blocks.append(Figure(f"{HEADLINE.id}-work", f"Wall-clock speedup of each app-specific kernel over {base} on its own workload "
                                 f"(bars start at 1.0; whiskers: 95% CI). {how}", f"Bar chart: app-specific speedup over {base}, wall-clock",
                                 figures.bar_chart([n for n in wls if (n, "app-specific") in cells], ["app-specific"], cells,
                                                   title=f"App-specific kernel, speedup over {base} (wall-clock)", ylabel=f"speedup over {base}")))
        data["work"] = {"metric": "wall-clock", "workloads": {n: r.raw for n, r in own_rows.items() if r},
                        "geomean": {k: g.raw for k, g in res.geomean.items()}}
        metric_label = "throughput"
        per_boot = {}
        for x in res.samples:
            if x.kernel == base or x.kernel == f"optimized-{x.workload}":
                per_boot.setdefault((x.workload, "vanilla" if x.kernel == base else "app-specific"), []).append(x.mean)
    # 3. How was it measured?
    des, meas = res.design, res.measurement
    blocks.append(f"How was it measured? {measure.accelerator(res, run)}; "
                  + (f"simulated counters are the headline here (wall-clock under TCG is indicative only, section {SPEEDUP.number})" if simulated_headline
                     else "wall-clock throughput") + f"; {present.boots_text(des.boots_per_kernel, des.boots_by_workload)} in "
                  f"{des.order_name or 'random'} order, a warm-up discarded per boot, {present.interval_text(res)}; "
                  + (measure.ops_how(res) + " as the per-operation divisor." if simulated_headline else "") + " Every boot is a dot below.")
    groups = [n for n in wls if per_boot.get((n, "vanilla")) and per_boot.get((n, "app-specific"))]
    if groups:
        blocks.append(Figure(f"{HEADLINE.id}-boots", f"Every boot's {metric_label} relative to the mean of {base}'s boots of the same "
                             f"workload (dots; bars: means): the spread behind each ratio. {how}",
                             f"Dot plot: per-boot {metric_label} of {base} and the app-specific kernel "
                             f"({'simulated' if simulated_headline else 'wall-clock'}, guests under {measure.short_accelerator(res, run)})",
                             figures.strips(groups, ["vanilla", "app-specific"], {k: v for k, v in per_boot.items() if v},
                                            title=f"Per-boot {metric_label}, relative to {base}'s mean", ylabel=f"relative to {base}")))
    data["measured"] = {"accelerator": meas.accelerator, "headline": "simulated" if simulated_headline else "wall-clock",
                        "boots_per_kernel": des.boots_per_kernel, "boots_by_workload": des.boots_by_workload, "ops_methods": meas.ops_methods}
    return Section(HEADLINE, how, blocks, data)


# -- 2. speedup ----------------------------------------------------------------------------------------------------


def speedup_table(res: Results, run: Run | None) -> tuple[Table, dict[tuple[str, str], Cell]]:
    """Every kernel's throughput on every workload and its speedup over the baseline (report section 2, summary.md),
    and the speedups as cells of a bar chart."""
    base = res.baseline
    rows = []
    cells: dict[tuple[str, str], Cell] = {}
    for name, w in res.workloads.items():
        byk = w.rows_by_kernel()
        for k in kernel_order(res):
            r = byk.get(k)
            if r is None:
                continue
            s = r.as_speedup()
            rows.append([name, w.unit or "", k, "–" if r.n is None else str(r.n), present.num(r.mean), present.num(r.sd),
                         present.pct(r.cv), "1 (baseline)" if k == base else present.ratio_ci(s)])
            c = Cell.of(s)
            if k != base and c is not None:
                cells[(name, k)] = c
    return Table(f"Throughput per kernel and speedup over {base} with 95% CI. {measure.wall(res, run)}",
                 ["workload", "unit", "kernel", "boots", "mean", "sd", "cv", "speedup [95% CI]"], rows,
                 [False, False, False, True, True, True, True, True]), cells


def geomean_table(res: Results, run: Run | None) -> tuple[Table, dict[tuple[str, str], Cell]]:
    """Each kernel's geometric mean of speedups across workloads (report section 2, summary.md), and as cells."""
    geo = res.geomean
    order = kernel_order(res)
    rows = []
    cells: dict[tuple[str, str], Cell] = {}
    for k in [k for k in order if k in geo] + [k for k in geo if k not in order]:
        g = geo[k].as_speedup()
        rows.append([k, present.ratio_ci(g), str(len(g.workloads)), ", ".join(g.workloads)])
        c = Cell.of(g)
        if c is not None:
            cells[("geomean", k)] = c
    return Table(f"Geometric mean of speedups across workloads, CI by resampling each workload's boots. {measure.wall(res, run)}",
                 ["kernel", "geomean speedup [95% CI]", "workloads", "which"], rows, [False, True, True, False]), cells


def speedup(ctx: Context) -> Section | Skipped:
    res, run = ctx.data.results, ctx.data.run
    if res is None:
        return Skipped(SPEEDUP, "no bench/results.json")
    base = res.baseline
    series = kernel_order(res)[1:]
    how = measure.wall(res, run)
    accel = measure.short_accelerator(res, run)
    blocks: list[Any] = []
    if accel == "QEMU TCG" and measure.has_sim(res):
        blocks.append("Guests ran under QEMU TCG: these wall-clock ratios are indicative only; the simulated counters "
                      f"(section {SIM.number}) are the headline on this machine.")
    table, cells = speedup_table(res, run)
    blocks.append(table)
    groups = list(res.workloads)
    if res.geomean:
        gtable, gcells = geomean_table(res, run)
        cells |= gcells
        groups.append("geomean")
        blocks.append(gtable)
    blocks.append(FOOTNOTE + " Speedup = ratio of means oriented so that > 1 is better (for a lower-is-better workload, "
                  f"{base}'s mean over the kernel's).")
    if series and cells:
        png = figures.bar_chart(groups, series, cells, title=f"Speedup over {base} ({accel}, wall-clock)",
                                ylabel=f"speedup over {base} (> 1 better)", separate_last=bool(res.geomean))
        blocks.insert(len(blocks) - 1, Figure(
            SPEEDUP.id, f"Speedup of each kernel over {base} per workload and geometric mean (bars start at 1.0; whiskers: "
            f"95% CI; {present.footnote('CI', 'no difference shown')}). {how}",
            f"Bar chart: speedup over {base} per workload with 95% CIs, wall-clock throughput {measure.under(res, run)}", png))
    data = {"baseline": base, "workloads": {n: {"unit": w.unit, "higher_is_better": w.higher_is_better,
                                                "summary": [r.raw for r in w.summary]} for n, w in res.workloads.items()},
            "geomean": {k: g.raw for k, g in res.geomean.items()}}
    return Section(SPEEDUP, how, blocks, data)


# -- 3. simulated counters -----------------------------------------------------------------------------------------


def simulated(ctx: Context) -> Section | Skipped:
    res, run = ctx.data.results, ctx.data.run
    if res is None:
        return Skipped(SIM, "no bench/results.json")
    if not measure.has_sim(res):
        return Skipped(SIM, "the bench recorded no simulated counters")
    base = res.baseline
    how = measure.sim(res, run)
    order = kernel_order(res)
    series = [k for k in order[1:] if any(k in w.sim for w in res.workloads.values())]
    blocks: list[Any] = []
    headline = []
    for name, w in res.workloads.items():
        own = w.sim.get(f"optimized-{name}")
        if own:
            parts = [f"{present.count_title(c)} ×{present.ratio_ci(own[f'kernel_{c}_per_op'])}" for c in SIM_COUNTS if f"kernel_{c}_per_op" in own]
            headline.append(f"{name} on optimized-{name}: kernel " + ", ".join(parts))
    if headline:
        blocks.append("Per operation, the app-specific kernel relative to " + base + " (< 1: fewer events): "
                      + "; ".join(headline) + ".")
    panels = []
    for side in ("kernel", "user"):
        shown = [k for k in (f"{side}_{c}_per_op" for c in SIM_COUNTS) if any(k in mm for w in res.workloads.values() for mm in w.sim.values())]
        if not shown:
            continue
        header = ["workload", "kernel"]
        for key in shown:
            header += [present.metric_title(key), "ratio [95% CI]"]
        rows = []
        for name, w in res.workloads.items():
            for k in [k for k in order if k in w.sim]:
                row = [name, k]
                for key in shown:
                    v = w.sim[k].get(key)
                    row += [present.num(v and v.mean), "1 (baseline)" if k == base else (present.ratio_ci(v) if v else "–")]
                rows.append(row)
        blocks.append(Table(f"{side.capitalize()}-mode events per operation and ratio to {base} (< 1: fewer). {how}",
                            header, rows, [False, False] + [True] * (2 * len(shown))))
        for key in shown:
            cells = {(name, k): c for name, w in res.workloads.items() for k, mm in w.sim.items()
                     if k != base and (c := Cell.of(mm.get(key))) is not None}
            panels.append((present.metric_title(key), cells))
    blocks.append(FOOTNOTE)
    if panels and series:
        accel = measure.short_accelerator(res, run)
        png = figures.bar_panels(panels, list(res.workloads), series,
                                 title=f"Simulated events per operation relative to {base} (< 1 = fewer)", ylabel=f"ratio to {base}")
        blocks.insert(len(blocks) - 1, Figure(
            SIM.id, f"Ratio to {base} of simulated kernel and user instructions, L1i misses and iTLB misses per operation "
            f"(bars start at 1.0; < 1 = fewer; whiskers: 95% CI; {present.footnote('CI', '')}). {how}",
            f"Bar charts: simulated counters per operation relative to {base} (simulated, not wall-clock; guests under {accel})", png))
    data = {"baseline": base, "measurement": res.raw.get("measurement"),  # passed on as recorded
            "workloads": {n: raw_sim(w) for n, w in res.workloads.items() if w.sim}}
    return Section(SIM, how, blocks, data)


# -- 4. universal vs app-specific vs vanilla -----------------------------------------------------------------------


def universal(ctx: Context) -> Section | Skipped:
    res, run = ctx.data.results, ctx.data.run
    if res is None:
        return Skipped(UNIVERSAL, "no bench/results.json")
    base = res.baseline
    order = kernel_order(res)
    unis = [u for u in UNIVERSAL_KERNELS if u in order]
    own = [w for w in res.workloads if res.workloads[w].row(f"optimized-{w}")]
    if not unis or not own:
        return Skipped(UNIVERSAL, "no universal-raw/universal-norm kernels" if not unis
                       else "no optimized-<workload> kernel measured on its workload")
    metric = headline_metric(res)  # the figure: simulated kernel instructions/op on TCG, else wall-clock speedup
    series = ["app-specific"] + unis
    accel = measure.short_accelerator(res, run)
    blocks: list[Any] = [
        "App-specific: the kernel optimized with the profile of the workload itself (optimized-<workload>). Universal: "
        "one kernel for all, optimized with the merged profiles of every workload (universal-raw: counters added as "
        "collected; universal-norm: each profile scaled to the same total first)."]
    data: dict[str, Any] = {"baseline": base, "metric": metric or "wall-clock speedup"}
    for mt in ([metric, None] if metric else [None]):
        how = measure.sim(res, run) if mt else measure.wall(res, run)
        name = f"simulated {present.metric_title(mt)}, ratio to {base} (< 1: fewer)" if mt else f"speedup over {base} (wall-clock)"
        cells: dict[tuple[str, str], Cell] = {}
        rows = []
        per: dict[str, Any] = {}
        for wl in res.workloads:
            picks = {"app-specific": _metric_cell(res, wl, f"optimized-{wl}", mt)} | {u: _metric_cell(res, wl, u, mt) for u in unis}
            if not any(picks.values()):
                continue
            # Universal-norm against app-specific directly: the gap the published work left (points of the ratio).
            norm, app = picks.get("universal-norm"), picks["app-specific"]
            gap = norm.ratio - app.ratio if norm and app and norm.ratio is not None and app.ratio is not None else None
            rows.append([wl, f"optimized-{wl}" if app else "–"] + [present.ratio_ci(r) if r else "–" for r in picks.values()]
                        + ["–" if gap is None else f"{gap * 100:+.1f}"])
            per[wl] = {s_: r.raw for s_, r in picks.items() if r}
            for s_, r in picks.items():
                c = Cell.of(r) if r else None
                if c is not None:
                    cells[(wl, s_)] = c
        if mt:
            sgeo = res.sim_geomean
            gl = [present.ratio_ci(sgeo[u][mt]) if mt in sgeo.get(u, {}) else "–" for u in unis]
        else:
            geo = res.geomean
            gl = [present.ratio_ci(geo[u].as_speedup()) if u in geo else "–" for u in unis]
        if any(x != "–" for x in gl):
            rows.append(["geomean", "–", "–"] + gl + ["–"])
        if mt == metric:
            png = figures.bar_chart(list(per), series, cells, title=f"App-specific and universal profiles: {name} ({accel})",
                                    ylabel=f"ratio to {base}" if mt else f"speedup over {base} (> 1 better)")
            blocks.append(Figure(UNIVERSAL.id, f"{name[0].upper() + name[1:]} per workload of the app-specific kernel and the "
                                 f"universal kernels (bars start at 1.0; whiskers: 95% CI; {present.footnote('CI', '')}). {how}",
                                 f"Bar chart: app-specific vs universal kernels, {name}, "
                                 f"{'simulated counters' if mt else 'wall-clock throughput'} {measure.under(res, run)}", png))
            data["workloads"] = per
            if mt:
                data["geomean"] = {u: (g.raw if (g := res.sim_geomean[u].get(mt)) else None) for u in unis if u in res.sim_geomean}
            else:
                data["geomean"] = {u: res.geomean[u].raw for u in unis if u in res.geomean}
        else:
            data["wall_clock"] = {"workloads": per, "geomean": {u: res.geomean[u].raw for u in unis if u in res.geomean}}
        blocks.append(Table(f"{name[0].upper() + name[1:]} [95% CI]; last column: universal-norm minus app-specific, in points "
                            f"of the ratio" + (" — indicative only under TCG" if mt is None and metric else "") + f". {how}",
                            ["workload", "app-specific kernel", "app-specific"] + unis + ["norm − app (points)"], rows,
                            [False, False] + [True] * (2 + len(unis))))
    blocks.append(FOOTNOTE)
    return Section(UNIVERSAL, measure.sim(res, run) if metric else measure.wall(res, run), blocks, data)


# -- 5./6. heatmaps of kernels optimized for one workload measured on another ---------------------------------------


def headline_metric(res: Results) -> str | None:
    """The simulated metric the comparisons lead with where simulated counters are the machine's headline (TCG), or
    None for wall-clock speedup (KVM, or no simulated counters)."""
    if measure.has_sim(res) and res.measurement.headline in (None, "simulated"):
        return bench.SIM_HEADLINE[0]
    return None


def _metric_cell(res: Results, wl: str, kernel: str, metric: str | None) -> Stat | None:
    """The row of `kernel` on `wl` for `metric`: a speedup (wall-clock, > 1 better) or a simulated ratio (< 1 better)."""
    if metric is None:
        r = res.workloads[wl].row(kernel)
        return r.as_speedup() if r else None
    return res.workloads[wl].sim.get(kernel, {}).get(metric)


def matrix(res: Results, rows: list[str], cols: list[str], metric: str | None) -> tuple[list[list[str]], dict[tuple[int, int], Cell],
                                                                                    list[list[dict[str, Any] | None]]]:
    """Each kernel (rows) on each workload (columns) in `metric` (None: wall-clock speedup) with its CI, '–' where not
    measured: the table's rows (the kernel first), the heatmap's cells and the statistics as recorded (report sections
    5 and 6, summary.md's studies)."""
    cells: dict[tuple[int, int], Cell] = {}
    trows = []
    grid: list[list[dict[str, Any] | None]] = []
    for i, k in enumerate(rows):
        trow = [k]
        grow: list[dict[str, Any] | None] = []
        for j, wl in enumerate(cols):
            s = _metric_cell(res, wl, k, metric)
            grow.append(s.raw if s else None)
            trow.append(present.ratio_ci(s) if s else "–")
            c = Cell.of(s)
            if c is not None:
                cells[(i, j)] = c
        trows.append(trow)
        grid.append(grow)
    return trows, cells, grid


def _matrix_section(res: Results, run: Run | None, heading: Heading,
                    rows: list[str], cols: list[str], diag: Callable[[str, str], bool], what: str) -> Section:
    """The heatmap in the machine's headline metric (simulated kernel instructions/op on TCG, else wall-clock
    speedup); the tables give it and the other metric."""
    base = res.baseline
    metric = headline_metric(res)
    accel = measure.short_accelerator(res, run)
    metrics = [metric, None] if metric else [None]
    blocks: list[Any] = [what]
    data: dict[str, Any] = {"baseline": base, "rows": rows, "cols": cols, "metric": metric or "wall-clock speedup"}
    for mt in metrics:
        how = measure.sim(res, run) if mt else measure.wall(res, run)
        name = f"simulated {present.metric_title(mt)}, ratio to {base} (< 1: fewer)" if mt else f"speedup over {base} (wall-clock)"
        trows, cells, grid = matrix(res, rows, cols, mt)
        if mt == metric:  # the figure: the headline metric
            diagonal = {(i, j) for i, k in enumerate(rows) for j, wl in enumerate(cols) if diag(k, wl)}
            png = figures.heatmap(rows, cols, cells, title=f"{heading.title}: {name} ({accel})", xlabel="workload measured",
                                  ylabel="kernel (profile of)", diagonal=diagonal, lower_is_better=mt is not None,
                                  scale=f"ratio to {base} (< 1 = fewer events)" if mt else "speedup (1 = same as baseline)")
            blocks.append(Figure(heading.id, f"{name[0].upper() + name[1:]} of each kernel (rows) on each workload (columns); framed: "
                                 f"the kernel on the workload it was optimized for; {present.footnote(meaning='')}; – not measured. {how}",
                                 f"Heatmap: {heading.title.lower()}, {name}, {'simulated counters' if mt else 'wall-clock throughput'} "
                                 f"{measure.under(res, run)}", png))
            data["cells"] = grid
        else:
            data["wall_clock_cells"] = grid
        blocks.append(Table(f"{name[0].upper() + name[1:]} [95% CI], kernel (row) on workload (column)"
                            + (" — indicative only under TCG" if mt is None and metric else "") + f". {how}",
                            ["kernel"] + cols, trows, [False] + [True] * len(cols)))
    blocks.append(FOOTNOTE)
    return Section(heading, measure.sim(res, run) if metric else measure.wall(res, run), blocks, data)


def cross(ctx: Context) -> Section | Skipped:
    res = ctx.data.results
    if res is None:
        return Skipped(CROSS, "no bench/results.json")
    wls = list(res.workloads)
    rows = [f"optimized-{a}" for a in wls if any(w.row(f"optimized-{a}") for w in res.workloads.values())]
    off = any(k != f"optimized-{b}" and res.workloads[b].row(k) for k in rows for b in wls)
    if not off:
        return Skipped(CROSS, "no kernel optimized for one workload was measured on another")
    return _matrix_section(res, ctx.data.run, CROSS, rows, wls, lambda k, b: k == f"optimized-{b}",
                           "Each kernel optimized with one workload's profile (rows), measured on every workload "
                           "(columns): how well a profile carries over to other applications.")


def sensitivity(ctx: Context) -> Section | Skipped:
    res = ctx.data.sensitivity
    if res is None:
        return Skipped(SENSITIVITY, "no studies/sensitivity/results.json")
    cols = sorted(res.workloads, key=_natural)
    kernels = kernel_order(res)[1:]
    if not kernels:
        return Skipped(SENSITIVITY, "the study measured only its baseline kernel")

    def own(k: str, c: str) -> bool:  # `kpgo study sensitivity` labels optimized-<workload>+<setting>
        return k == f"optimized-{c}"

    rank = {k: min((j for j, c in enumerate(cols) if own(k, c)), default=len(cols)) for k in kernels}
    rows = sorted(kernels, key=lambda k: (rank[k], kernels.index(k)))
    return _matrix_section(res, ctx.data.run, SENSITIVITY, rows, cols, own,
                           "Kernels optimized with profiles of one workload under different settings (rows), measured "
                           "under each setting (columns: <workload>+<setting>): how much the profile depends on the "
                           "workload's parameters. From studies/sensitivity/results.json.")


def _natural(text: str) -> list[Any]:
    """Sort key that puts clients-8 before clients-64."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", text) if t]


# -- 7. profile similarity -----------------------------------------------------------------------------------------

def _profile_how(ctx: Context) -> str:
    from kpgo.records import Profile
    from kpgo.report import profiles

    # Where the profiles were collected: their own profile.json says; else the run's accelerator.
    accels = {Profile.read(d, strict=False).accelerator for d in profiles.fixed_profiles(ctx.data.run_dir).values()}
    one = accels.pop() if len(accels) == 1 else None
    where = (measure.guests(None, accel=measure.named(one) if one else "unknown accelerator") if one is not None
             else measure.guests(ctx.data.results, ctx.data.run))
    return ("Measured: execution counts from each profile's gcov arc counters (counts, not time), collected with the "
            f"instrumented kernel {where}, with function and branch structure from the instrumented build's .gcno files.")


def similarity(ctx: Context) -> Section | Skipped:
    from kpgo.report import profiles

    profs = profiles.fixed_profiles(ctx.data.run_dir, ctx.data.workload_names())
    if len(profs) < 2:
        return Skipped(SIMILARITY, f"{len(profs)} fixed profile(s) in profiles/, 2 needed")
    if not (ctx.data.run_dir / "builds" / "instrumented").is_dir():
        return Skipped(SIMILARITY, "no builds/instrumented (its .gcno files are needed)")
    a = ctx.analysis()
    if a is None or a.similarity is None:
        return Skipped(SIMILARITY, (a.similarity_error if a else None) or "the profiles could not be compared")
    sim = a.similarity
    names = sim["names"]
    how = _profile_how(ctx)
    blocks: list[Any] = [
        f"Pairwise comparison of the {len(names)} fixed profiles ({', '.join(names)}) as in \"One Profile Fits All\": "
        "cosines of function and branch execution-count vectors (1 = same distribution), and L0/L1/L2 norms of the "
        f"differences in taken probability of two-way branches executed in both profiles (0 = same; L0 threshold "
        f"{sim.get('l0_threshold')}). Definitions: docs/PROFILES.md."
        + (" (From the cache in the report directory: the profiles are unchanged.)" if a.cached else "")]
    mats = sim.get("matrices") or {}
    groups: tuple[tuple[str, tuple[str, ...], str], ...] = (
        (f"{SIMILARITY.id}-cosine", ("function_cosine", "branch_cosine"), "cosine similarity (1 = same)"),
        (f"{SIMILARITY.id}-taken", ("taken_l0", "taken_l1", "taken_l2"), "taken-probability distances (0 = same)"))
    for fid, wanted, what in groups:
        keys = [k for k in wanted if mats.get(k) is not None]
        if not keys:
            continue
        png = figures.matrices(names, [(present.similarity_title(k, short=True), mats[k], present.SIMILARITY[k][1]) for k in keys],
                               title=f"Profile {what}")
        blocks.append(Figure(fid, "; ".join(present.similarity_title(k) for k in keys) + f". {how}",
                             f"Heatmaps: profile {what} between workloads (gcov execution counts, not time)", png))
    shown = [k for k in present.SIMILARITY if mats.get(k) is not None]
    pairs = [[names[i], names[j]] + ["–" if mats[k][i][j] is None else f"{mats[k][i][j]:.3f}" for k in shown]
             for i in range(len(names)) for j in range(i + 1, len(names))]
    blocks.append(Table(f"Every pair of profiles. {how}", ["profile", "profile"] + shown, pairs,
                        [False, False] + [True] * len(shown)))
    sizes = sim.get("sizes") or {}
    blocks.append(f"Compared over {sizes.get('functions', '?')} functions, {sizes.get('branch_arcs', '?')} branch arcs and "
                  f"{sizes.get('two_way_branches', '?')} two-way branches in {sizes.get('files', '?')} objects.")
    rel = ctx.data.shown
    return Section(SIMILARITY, how, blocks, sim | {"build": rel(sim.get("build")), "profiles": [rel(p) for p in sim.get("profiles") or []]})


# -- 8. kernel share -----------------------------------------------------------------------------------------------


def kernel_share(ctx: Context) -> Section | Skipped:
    from kpgo.report import load

    study = load.read_results(ctx.data.run_dir / "studies" / "share" / "results.json", "the kernel-share study (`kpgo study share`)")
    res = study or ctx.data.results
    source = "studies/share/results.json" if study is not None else "bench/results.json"
    if res is None:
        return Skipped(KERNEL_SHARE, "no bench/results.json or studies/share/results.json")
    base = res.baseline
    with_sim = measure.has_sim(res)
    rows = []
    data: dict[str, Any] = {}
    for name, d in bench.kernel_share(res.raw).items():
        if d["cpu_time"] is None and all(d[k] is None for k in bench.SHARES):
            continue
        row = [name, present.pct(d["cpu_time"]), present.pct(d["cpu_time_sd"]), str(d["boots"])]
        if with_sim:
            row += [present.pct(d[key]) for key in bench.SHARES]
        rows.append(row)
        data[name] = d
    if not rows:
        return Skipped(KERNEL_SHARE, f"the samples of {source} carry no kernel_share")
    accel = measure.accelerator(res, ctx.data.run)
    how = (f"Measured on the baseline kernel ({base}), from {source}: share of guest CPU time spent in the kernel "
           "(system + irq + softirq over user + nice + those, from the guest's /proc/stat over the measured window), "
           f"{measure.guests(res, ctx.data.run)}"
           + ("; shares of simulated instructions, L1i misses and iTLB misses executed in kernel mode (simulated counters, "
              f"not wall-clock: {measure.sim_model(res.measurement)})" if with_sim else "")
           + "; mean over boots.")
    header = ["workload", "kernel share of CPU time", "sd over boots", "boots"]
    if with_sim:
        header += [f"kernel share of {present.metric_title(key)} (sim)" for key in bench.SHARES]
    blocks: list[Any] = [
        "How much of each workload runs in the kernel, the part a kernel profile can speed up (the characterization "
        "of \"One Profile Fits All\")."
        + (" Guest CPU-time accounting under QEMU TCG counts emulated time." if "TCG" in accel else ""),
        Table(f"Kernel share per workload on {base}. {how}", header, rows, [False] + [True] * (len(header) - 1)),
    ]
    return Section(KERNEL_SHARE, how, blocks, {"baseline": base, "source": source, "workloads": data})


# -- 9. code size and top functions --------------------------------------------------------------------------------


def code_size(ctx: Context) -> Section | Skipped:
    from kpgo.report import profiles

    d = ctx.data
    builds = _build_order(d.run.builds if d.run else {}, d)
    profs = profiles.fixed_profiles(d.run_dir, d.workload_names())
    instr = d.run_dir / "builds" / "instrumented"
    if not builds and not (profs and instr.is_dir()):
        return Skipped(CODE_SIZE, "no builds in run.json and no profiles with builds/instrumented")
    base = d.baseline
    blocks: list[Any] = []
    data: dict[str, Any] = {"builds": {}, "top_functions": {}}
    if builds:
        sizes = {label: _build_sizes(d, label, b) for label, b in builds.items()}
        base_fn = (sizes.get(base) or {}).get("functions_size")
        rows = []
        for label, rb in builds.items():
            z = sizes[label]
            fn = z.get("functions_size")
            rows.append([label, present.size(fn), present.size(z.get("text_span")), present.size(z.get("objects_text")),
                         present.size(z.get("text_hot")), present.size(z.get("text_unlikely")), present.size(z.get("bzimage")),
                         present.size(z.get("vmlinux_text")), present.ratio(fn / base_fn) if fn is not None and base_fn else "–"])
            data["builds"][label] = {"sizes": z, "seconds": rb.seconds,
                                     "functions_vs_baseline": fn / base_fn if fn is not None and base_fn else None}
        blocks.append(Table(
            "Code size of every build in bytes. Measured: static sizes of the build, no run involved. Functions: "
            "the sizes of vmlinux's function symbols summed (`nm -S`: t/T, and weak W/w in code sections; aliases at "
            "one address counted once). Text span: the part of vmlinux's .text in use, from _stext to the end of the "
            "last function below the entry text (which starts at the next 2 MiB boundary). "
            "Objects' .text*, .text.hot, .text.unlikely: those sections summed over the objects "
            "linked into vmlinux (.text* includes the other two; the linker folds them all into vmlinux's .text). "
            "bzImage: the compressed bootable image. .text section (padded): the size of vmlinux's .text section, "
            "which the x86-64 linker script pads to a 2 MiB boundary (so is _etext): for reference only, it is not "
            "the code size. '–': not recorded by the build and its vmlinux is not there to measure.",
            ["build", "functions", "text span", "objects' .text*", ".text.hot", ".text.unlikely", "bzImage",
             ".text section (padded)", f"functions vs {base}"],
            rows, [False] + [True] * 8))
    how = _profile_how(ctx) + " Function sizes from `nm -S` of each build's vmlinux."
    a = ctx.analysis() if profs and instr.is_dir() else None
    if a is not None and a.top_error:
        blocks.append(f"Top functions not shown: {a.top_error}.")
    for name, top in (a.top if a else {}).items():
        if not top:
            continue
        opt_label = next((k for k in (f"optimized-{name}", name) if k in builds or (d.run_dir / "builds" / k).is_dir()), None)
        before = ctx.sizes(d.build_dir(base) / "vmlinux")
        after = ctx.sizes(d.build_dir(opt_label) / "vmlinux") if opt_label else f"no optimized-{name} build"
        rows = []
        out = []
        for i, f in enumerate(top, 1):
            b = before.get(f["function"]) if isinstance(before, dict) else None
            o = after.get(f["function"]) if isinstance(after, dict) else None
            rows.append([str(i), f["function"], f["object"], f"{f['count']:,}", present.pct(f["share"]),
                         _sym(b, before), _sym(o, after), (present.size(o.cold) if o.cold else "0") if o else "–"])
            out.append(f | {"size_before": b.size if b else None, "size_after": o.size if o else None,
                            "cold_after": o.cold if o else None, "symbols_before": b.symbols if b else None})
        data["top_functions"][name] = {"optimized_build": opt_label, "functions": out}
        notes = [f"{what}: {err}" for what, err in ((base, before), (opt_label or "optimized", after)) if isinstance(err, str)]
        blocks.append(Table(
            f"Top {len(top)} kernel functions by execution count in the {name} profile, with their size in bytes in "
            f"{base} (before) and {opt_label or 'the optimized kernel'} (after). {how}",
            ["#", "function", "object", "executions", "share", f"size in {base}", f"size in {opt_label or 'optimized'}", ".cold part"],
            rows, [True, False, False, True, True, True, True, True]))
        if notes:
            blocks.append("Sizes missing — " + "; ".join(notes) + ".")
    if data["top_functions"]:
        blocks.append("Sizes sum the function's symbols (GCC clones such as .isra/.constprop/.part included; '×n': n "
                      "symbols of that name, e.g. static copies in several objects); the .cold part is code GCC moved "
                      "out as unlikely; 'inlined' = no symbol of that name (inlined into its callers).")
    if not blocks:
        return Skipped(CODE_SIZE, "no build sizes and no top functions")
    return Section(CODE_SIZE, "Static code sizes of the builds" + ("; " + how[len("Measured: "):] if data["top_functions"] else "."),
                   blocks, data)


def _build_order(builds: dict[str, RunBuild], d: RunData) -> dict[str, RunBuild]:
    """Baseline, instrumented, the app-specific kernels in workload order, then the rest (run.json's keys are sorted)."""
    first = [d.baseline, "instrumented"] + [f"optimized-{w}" for w in d.workload_names()]
    keys = [k for k in first if k in builds] + [k for k in builds if k not in first]
    return {k: builds[k] for k in keys}


def _build_sizes(d: RunData, label: str, b: RunBuild) -> dict[str, Any]:
    """The build's recorded sizes; a build recorded before kpgo measured functions_size, text_span and bzimage
    gets them from its vmlinux and bzImage when the build directory is still there (else they stay missing: '–')."""
    from kpgo.kernel import codesize

    return codesize.complete(d.build_dir(label), b.sizes)


def _sym(s: Any, table: Any) -> str:
    if not isinstance(table, dict):
        return "–"
    if s is None or s.symbols == 0:
        return "inlined"
    return present.size(s.size) + (f" ×{s.symbols}" if s.symbols > 1 else "")


# -- 10. proof -----------------------------------------------------------------------------------------------------


def proof(ctx: Context) -> Section | Skipped:
    proofs = ctx.data.run.proofs() if ctx.data.run else {}
    if not proofs:
        return Skipped(PROOF, "run.json has no proof" if ctx.data.run else "no run.json")

    def count(n: int | None) -> str:
        return "–" if n is None else str(n)

    rows = []
    for n, p in proofs.items():
        rows.append([n, f"{count(p.objects_used)}/{count(p.objects_nonempty)}", present.pct(p.ratio), present.pct(p.threshold),
                     count(p.functions_read), count(p.functions_giving_up),
                     "–" if p.weight_read is None else present.pct(p.weight_read), "yes" if p.ok else "no"])
    how = ("Measured: GCC's own -fdump-ipa-profile dumps of the optimized build, object by object (an object counts as "
           "used when at least one function read its edge counts and none gave up; counts read: the counts the dumps say "
           "GCC read against the profile's, – for a build made before kpgo added them); no run involved.")
    blocks: list[Any] = [
        Table(f"Objects with a non-empty profile whose counts GCC read. {how}",
              ["profile", "objects used", "ratio", "threshold", "functions read", "functions giving up", "counts read", "ok"], rows,
              [False, True, True, True, True, True, False]),
        "A build below the threshold fails; a changed binary alone proves nothing, since -fprofile-use changes code even "
        "when every .gcda is ignored.",
    ]
    with_values = {n: p.values for n, p in proofs.items() if p.values is not None}
    if with_values:
        keys = ("indirect_calls_trained", "indirect_calls_promoted", "indirect_calls_promoted_in_vmlinux", "dominant_sites_elsewhere",
                "indirect_targets_elsewhere", "divmod", "stringop")
        vrows = [[n, *(str(v["totals"].get(k, "–")) for k in keys)] for n, v in with_values.items()]
        blocks.append(Table("Value transforms GCC applied with the value profiles (docs/VALUES.md): indirect calls it had "
                            "a profile for, those it promoted to a guarded direct call, those of them the linked vmlinux still "
                            "holds (the direct call, or the guard when the target was inlined), call sites whose dominant target "
                            "(>= 50%) is defined in another object (GCC cannot promote them without LTO), the tracked targets GCC "
                            "did not find in the object (one per target, not per site), divisions/modulos and string operations "
                            "specialized. Measured: GCC's -fdump-ipa-profile-optimized and -fdump-ipa-profile_estimate dumps, the "
                            "profile, and objdump of vmlinux; – where the build was recorded before kpgo counted it.",
                            ["profile", "indirect calls profiled", "promoted", "promoted, in vmlinux", "dominant target elsewhere",
                             "targets not found", "div/mod", "string ops"],
                            vrows, [False, True, True, True, True, True, True, True]))
    return Section(PROOF, how, blocks, {"workloads": {n: p.raw for n, p in proofs.items()}})


# -- 11. compiler study ---------------------------------------------------------------------------------------------


def compiler(ctx: Context) -> Section | Skipped:
    from kpgo import study

    res, table = ctx.data.compiler, ctx.data.compiler_table
    if res is None or table is None:
        return Skipped(COMPILER, "no studies/compiler/results.json and compiler.json (`kpgo study compiler`)")
    run = ctx.data.run
    head = table["metrics"][0]  # compiler.json is the study's own table (kpgo.study.compiler_table), read as it writes it
    how = measure.sim(res, run) if head != "speedup" else measure.wall(res, run)

    def metric_name(metric: str) -> str:
        return f"simulated {present.metric_title(metric)}" if metric != "speedup" else "wall-clock speedup"

    name = metric_name(head)
    rows = table["variants"]
    blocks: list[Any] = ["Each compiler variant (`kpgo variants list`, docs/COMPILERS.md) built from the run's source and "
                         "configuration and measured beside -O2 vanilla in one interleaved bench; PGO variants once per "
                         "workload, with that workload's profile, on that workload. From studies/compiler/."]
    van = next((v for v in rows if v["variant"] == "vanilla"), None)
    van_size = ((van or {}).get("size", {}).get("functions_size") or {}).get("mean")
    # Under simulation the L1i misses beside the instructions: a variant can cut one and raise the other (-O3's longer
    # code, reordering off), and on TCG neither is the time (docs/MEASUREMENTS.md, the compiler study).
    shown = [head, *(["kernel_l1i_misses_per_op"] if head != "speedup" and "kernel_l1i_misses_per_op" in table["metrics"] else [])]
    panels, plotted = [], []
    for metric in shown:
        points = [(v["variant"], v["size"]["functions_size"]["mean"] / 1e6, Cell(1.0) if v is van else Cell.of(v["geomean"].get(metric)))
                  for v in rows if v["size"].get("functions_size") and (v is van or v["geomean"].get(metric))]
        kept = [(lb, x, c) for lb, x, c in points if c is not None]
        if len(kept) > 1:
            plotted.append(metric_name(metric))
            panels.append((f"{plotted[-1]}, ratio to -O2 vanilla", kept))
    if van_size and panels:
        names = " and ".join(plotted)
        blocks.append(Figure("compiler-tradeoff",
                             f"Code size (sum of vmlinux's function symbols, MB = 10^6 bytes; PGO variants: the mean of their "
                             f"per-workload kernels) against the geometric mean over the workloads of {names}, ratio to -O2 "
                             f"vanilla, with its 95% CI; {present.footnote(meaning='')}. {how}",
                             f"Scatter plot: code size against {names} per compiler variant {measure.under(res, run)}",
                             figures.tradeoff(panels, title=f"Compiler variants: code size vs {names} (geomean, ratio to -O2 vanilla)",
                                              xlabel="code size: functions (MB)", lower_is_better=head != "speedup")))
    groups = [*table["workloads"], "geomean"]
    series = [v["variant"] for v in rows if v is not van]
    cells: dict[tuple[str, str], Cell] = {}
    for v in rows:
        for g in groups:
            c = Cell.of(v["geomean"].get(head) if g == "geomean" else v["workloads"].get(g, {}).get(head))
            if c is not None and v is not van:
                cells[(g, v["variant"])] = c
    if cells:
        blocks.append(Figure("compiler-bars", f"{name[0].upper() + name[1:]} per workload and compiler variant, ratio to -O2 vanilla "
                             f"with its 95% CI; {present.footnote(meaning='')}. {how}",
                             f"Bar chart: {name} per workload and compiler variant {measure.under(res, run)}",
                             figures.bar_chart(groups, series, cells, title=f"Compiler study: {name}, ratio to -O2 vanilla",
                                               ylabel="ratio to -O2 vanilla", separate_last=True)))
    for title, header, trows, numeric in study.compiler_tables(table):
        blocks.append(Table(f"{title}. {how}", header, trows, numeric))
    blocks.append(FOOTNOTE)
    return Section(COMPILER, how, blocks, table)


# -- 12.-14. kernel families: one kind of kernel per column, each workload measured on its own of that kind --------

# The simulated counts these sections compare: the headline three and the iTLB (code layout moves pages).
FAMILY_METRICS = (*bench.SIM_HEADLINE, "kernel_itlb_misses_per_op", "kernel_itlb_4k_misses_per_op")
Family = Callable[[str], str]  # workload -> the label of the family's kernel measured on it


def family_ratios(res: Results, families: dict[str, Family], metric: str | None, ref: Family) -> tuple[list[list[str]], dict[str, Any],
                                                                                                        dict[tuple[str, str], Cell]]:
    """Per workload, each family's kernel against the reference kernel on that workload (kpgo.stats: the ratio of means
    with Welch's interval, as the bench records its ratios to the baseline), and per family the geometric mean over the
    workloads both measured: the table's rows, the records, and the bar chart's cells."""
    from kpgo import stats

    rows, data, cells = [], {}, {}
    pairs: dict[str, list[tuple[list[float], list[float]]]] = {f: [] for f in families}
    used: dict[str, list[str]] = {f: [] for f in families}
    for wl in res.workloads:
        row, rec = [wl], {}
        for f, label in families.items():
            pr = bench.boot_pair(res.raw, wl, ref(wl), label(wl), metric or "speedup") if label(wl) != ref(wl) else None
            if pr is None:
                row.append("–")
                continue
            r = stats.ratio_record(*pr)
            pairs[f].append(pr)
            used[f].append(wl)
            rec[f] = {"kernel": label(wl), "against": ref(wl), **r}
            row.append(present.ratio_ci(r))
            if (c := Cell.of(r)) is not None:
                cells[(wl, f)] = c
        if rec:
            rows.append(row)
            data[wl] = rec
    geo = {f: {**stats.geomean_record(ps), "workloads": used[f]} for f, ps in pairs.items() if ps}
    if geo:
        rows.append(["geomean"] + [present.ratio_ci(geo[f]) if f in geo else "–" for f in families])
        data["geomean"] = geo
        cells |= {("geomean", f): c for f, g in geo.items() if (c := Cell.of(g)) is not None}
    return rows, data, cells


def _families_blocks(ctx: Context, heading: Heading, families: dict[str, Family], ref: Family, ref_name: str,
                     figure_metric: str | None) -> tuple[list[Any], dict[str, Any]]:
    """A table per metric (the simulated counts, else the wall-clock speedup) of every family against `ref`, and a bar
    chart in `figure_metric`."""
    res, run = ctx.data.results, ctx.data.run
    assert res is not None
    metrics: list[str | None] = [m for m in FAMILY_METRICS if any(m in (x.sim_per_op or {}) for x in res.samples)] or [None]
    blocks: list[Any] = []
    data: dict[str, Any] = {}
    for mt in metrics:
        how = measure.sim(res, run) if mt else measure.wall(res, run)
        name = f"simulated {present.metric_title(mt)}, ratio to {ref_name} (< 1: fewer)" if mt else f"speedup over {ref_name} (wall-clock)"
        rows, rec, cells = family_ratios(res, families, mt, ref)
        if not rows:
            continue
        data[mt or "speedup"] = rec
        if mt == (figure_metric if figure_metric in metrics else metrics[0]):
            groups = [r[0] for r in rows]
            series = [f for f in families if any((g, f) in cells for g in groups)]
            blocks.append(Figure(f"{heading.id}-{mt or 'speedup'}-{len(data)}", f"{name[0].upper() + name[1:]} per workload and its "
                                 f"geometric mean (bars start at 1.0; whiskers: 95% CI; {present.footnote('CI', '')}). {how}",
                                 f"Bar chart: {heading.title.lower()}, {name} {measure.under(res, run)}",
                                 figures.bar_chart(groups, series, cells, title=f"{heading.title}: {name}", ylabel=f"ratio to {ref_name}",
                                                   separate_last=groups[-1] == "geomean")))
        blocks.append(Table(f"{name[0].upper() + name[1:]} [95% CI], each kernel on the workload it names"
                            + (" — indicative only under TCG" if mt is None and measure.has_sim(res) else "") + f". {how}",
                            ["workload", *families], rows, [False] + [True] * len(families)))
    return blocks, data


def _geo(data: dict[str, Any], metric: str, family: str) -> float | None:
    g = data.get(metric, {}).get("geomean", {}).get(family)
    return None if g is None else g.get("ratio")


def variability(ctx: Context) -> Section | Skipped:
    """Each workload's profile collected twice (separate boots): how alike the two collections are beside how alike
    the workloads are, and the kernel built from the second collection beside the first's."""
    res, run = ctx.data.results, ctx.data.run
    if run is None or run.similarity is None:
        return Skipped(VARIABILITY, "no variability study in run.json (`kpgo run --study variability`)")
    blocks: list[Any] = ["Each workload's profile was collected a second time, in a boot of its own (profiles/again/<workload>). "
                         "Above: how alike the two collections of one workload are, beside how alike that workload's first "
                         "collection is to the other workloads' (kpgo.analysis.characterize, as in section "
                         f"{SIMILARITY.number}). Below: the kernel built from the second collection (optimized-<workload>.2) "
                         "beside the one built from the first, each on its workload."]
    data: dict[str, Any] = {}
    path = ctx.data.run_dir / run.similarity
    try:
        from kpgo import inputs

        num = (float, None)
        sim = inputs.read_json(path, "re-run the variability study", {"names": [str], "function_cosine": [[num]], "branch_cosine": [[num]],
                                                                          "taken_l1": [[num]]})
    except KpgoError as e:  # the report is drawn from what is there: a bad file is said, not fatal
        sim = None
        blocks.append(f"(No similarity table: {e.message}.)")
    if sim is not None:
        names = sim["names"]
        wls = [n for n in names if not n.endswith(".2") and f"{n}.2" in names]
        rows: list[list[str]] = []
        per: dict[str, dict[str, Any]] = {}
        for w in wls:
            i, j = names.index(w), names.index(f"{w}.2")
            others = [names.index(o) for o in wls if o != w]
            row = [w]
            per[w] = {}
            for m in ("function_cosine", "branch_cosine", "taken_l1"):
                mat = sim[m]
                cross = [mat[i][k] for k in others if mat[i][k] is not None]
                best = (max if present.SIMILARITY[m][1] else min)(cross) if cross else None
                per[w][m] = {"self": mat[i][j], "closest_other": best}
                row += [present.num(mat[i][j]), present.num(best)]
            rows.append(row)
        data["similarity"] = per
        blocks.append(Table("Two collections of one workload (self) and the first collection against the closest other workload "
                            "(closest other; cosine: the highest, L1 of taken-probability differences: the lowest). "
                            + _profile_how(ctx),
                            ["workload", "function cosine: self", "closest other", "branch cosine: self", "closest other",
                             "taken L1: self", "closest other"], rows, [False] + [True] * 6))
    if res is not None:
        fams: dict[str, Family] = {"first collection": lambda w: f"optimized-{w}", "second collection": lambda w: f"optimized-{w}.2"}
        b1, d1 = _families_blocks(ctx, VARIABILITY, fams, lambda w: res.baseline, res.baseline, headline_metric(res))
        b2, d2 = _families_blocks(ctx, VARIABILITY, {"second / first": lambda w: f"optimized-{w}.2"}, lambda w: f"optimized-{w}",
                                  "the first collection's kernel", None)
        blocks += b1 + [b for b in b2 if isinstance(b, Table)]
        data["kernels"] = d1
        data["second_over_first"] = d2
    blocks.append(FOOTNOTE)
    return Section(VARIABILITY, measure.sim(res, run) if res is not None and headline_metric(res) else _profile_how(ctx), blocks, data)


LAYOUT_FAMILIES: dict[str, str] = {  # column -> label pattern ({w}: the workload)
    "PGO": "optimized-{w}", "PGO + order": "pgo-order-{w}", "PGO + BOLT": "pgo-bolt-{w}", "vanilla + BOLT": "bolt-{w}",
    "universal PGO": "universal-norm", "universal PGO + order": "pgo-order-universal", "universal PGO + BOLT": "pgo-bolt-universal",
    "vanilla + universal BOLT": "bolt-universal",
}


def _families(res: Results, patterns: dict[str, str]) -> dict[str, Family]:
    """The families some kernel of which the bench measured."""
    measured = {(x.kernel, x.workload) for x in res.samples}
    def family(pattern: str) -> Family:
        return lambda w: pattern.format(w=w)

    return {f: family(p) for f, p in patterns.items() if any((p.format(w=w), w) in measured for w in res.workloads)}


def layout(ctx: Context) -> Section | Skipped:
    res, run = ctx.data.results, ctx.data.run
    if res is None:
        return Skipped(LAYOUT, "no bench/results.json")
    fams = _families(res, LAYOUT_FAMILIES)
    if not set(fams) - {"PGO", "universal PGO"}:  # the references alone: no layout kernel
        return Skipped(LAYOUT, "no layout kernel measured (`kpgo run --study layout`)")
    base = res.baseline
    blocks: list[Any] = [
        "Layout on top of each workload's GCC PGO kernel, from branch records the emulator took under the workload "
        "(docs/LAYOUT.md): the functions in C3's order (PGO + order; recorded on the PGO kernel) and BOLT's block layout "
        "with hot/cold splitting (PGO + BOLT; the PGO kernel built without GCC's own hot/cold split, which BOLT cannot use "
        "on the kernel, recorded on that build); BOLT on vanilla from vanilla's records (vanilla + BOLT: no instrumented "
        "build at all); and the same for one kernel for every workload (universal: the normalized merge of all workloads' "
        "profiles and records). First against vanilla, then the layout stacks against GCC PGO alone."]
    b, d = _families_blocks(ctx, LAYOUT, fams, lambda w: base, base, "kernel_l1i_misses_per_op")
    blocks += b
    data: dict[str, Any] = {"against_vanilla": d}
    on_pgo = {f: fams[f] for f in ("PGO + order", "PGO + BOLT", "universal PGO + order", "universal PGO + BOLT") if f in fams}
    if on_pgo:
        def pgo_of(f: str) -> Family:
            return (lambda w: "universal-norm") if f.startswith("universal") else (lambda w: f"optimized-{w}")

        for f, label in on_pgo.items():  # one reference per family: its own PGO kernel
            b2, d2 = _families_blocks(ctx, LAYOUT, {f"{f} / {'universal PGO' if f.startswith('universal') else 'PGO'}": label}, pgo_of(f),
                                      "its PGO kernel", None)
            blocks += [x for x in b2 if isinstance(x, Table)]
            data.setdefault("against_pgo", {})[f] = d2
    goals = _layout_goals(data)
    if goals:
        blocks.append(" ".join(goals))
        data["goals"] = goals
    builds = run.layout if run else {}
    rows: list[list[str]] = []
    for name, lb in builds.items():
        if lb.bolt:
            rep = lb.bolt.get("report") or {}
            rows.append([name, f"{rep.get('functions_profiled', 0):,}/{rep.get('functions') or 0:,}", present.pct(rep.get("stale_share")),
                         present.pct(lb.bolt.get("valid_share")), f"{rep.get('functions_rewritten', 0):,}", present.size(rep.get("cold_bytes_moved")),
                         "yes" if lb.bolt.get("ok") else "no"])
    if rows:
        blocks.append(Table("BOLT's own report per kernel (llvm-bolt's output, build.json's \"bolt\"): functions with a profile of all, "
                            "the stale share, the profile's samples in functions whose profile matches their code (a build below "
                            "the threshold fails), functions rewritten, cold bytes split off. Measured: BOLT's output at build time, no guest.",
                            ["kernel", "functions with a profile", "stale", "samples usable", "rewritten", "cold bytes moved", "ok"],
                            rows, [False] + [True] * 5 + [False]))
    orows: list[list[str]] = []
    for name, lb in builds.items():
        hot = ((lb.order or {}).get("hot_text") or {}).get("0.9") or {}
        if hot.get("built") and hot.get("recorded"):
            a, b_ = hot["recorded"], hot["built"]
            orows.append([name, f"{a['functions']:,}", present.size(a["bytes"]), present.size(a["span"]), present.size(b_["span"]),
                          f"{a['pages_4k']} → {b_['pages_4k']}", f"{a['pages_2m']} → {b_['pages_2m']}"])
    if orows:
        blocks.append(Table("The hot text (the functions holding 90% of the recorded taken branches) before (the kernel the branches were "
                            "recorded on) and after the order (the built kernel), from the binaries' symbols (kpgo.kernel.order): its "
                            "functions and bytes, the span from the first to the last, and the 4 KiB and 2 MiB pages it touches. Measured: "
                            "the symbols of both vmlinux files, no guest.",
                            ["kernel", "functions", "bytes", "span before", "span after", "4 KiB pages", "2 MiB pages"], orows,
                            [False] + [True] * 6))
    blocks.append(FOOTNOTE)
    return Section(LAYOUT, measure.sim(res, run) if headline_metric(res) else measure.wall(res, run), blocks, data)


def _layout_goals(data: dict[str, Any]) -> list[str]:
    """The layout goals as met or missed, from the geometric means: PGO + layout a further -15% kernel L1i misses/op
    and -10% taken branches/op over PGO alone with no more instructions; vanilla + BOLT >= 60% of PGO's L1i gain."""
    out = []
    l1i, tb, ins = "kernel_l1i_misses_per_op", "kernel_taken_branches_per_op", "kernel_insns_per_op"
    for f, d in (data.get("against_pgo") or {}).items():
        key = next(iter(d.get(l1i, {}).get("geomean", {})), None)
        if key is None:
            continue
        goal = {l1i: 0.85, tb: 0.90, ins: 1.0}
        got = {m: _geo(d, m, key) for m in goal}
        parts = [f"{present.metric_title(m)} ×{present.ratio(r)} (goal ≤ ×{present.ratio(goal[m])})" for m, r in got.items() if r is not None]
        lacking = [present.metric_title(m) for m, r in got.items() if r is None]
        verdict = (f"no verdict ({', '.join(lacking)} not counted by this bench)." if lacking
                   else "met." if all(r is not None and r <= goal[m] for m, r in got.items()) else "missed.")
        out.append(f"{f} over its PGO kernel (geomean): " + ", ".join(parts) + ": " + verdict)
    van = data.get("against_vanilla", {})
    pgo, bolt = _geo(van, l1i, "PGO"), _geo(van, l1i, "vanilla + BOLT")
    if pgo is not None and bolt is not None and pgo < 1:
        share = (1 - bolt) / (1 - pgo)
        out.append(f"Vanilla + BOLT from branch records alone reaches {share:.0%} of GCC PGO's kernel L1i gain (goal ≥ 60%): "
                   + ("met." if share >= 0.6 else "missed."))
    return out


CLANG_FAMILIES: dict[str, str] = {
    "clang": "clang", "clang-thinlto": "clang-thinlto", "clang-afdo": "clang-afdo", "clang-afdo-thinlto": "clang-afdo-thinlto",
    "GCC PGO": "optimized-{w}", "GCC PGO + order": "pgo-order-{w}", "GCC PGO + BOLT": "pgo-bolt-{w}",
}


def clang(ctx: Context) -> Section | Skipped:
    res, run = ctx.data.results, ctx.data.run
    if res is None:
        return Skipped(CLANG, "no bench/results.json")
    fams = _families(res, CLANG_FAMILIES)
    if not any(f.startswith("clang") for f in fams):
        return Skipped(CLANG, "no Clang kernel measured (`kpgo run --study clang`)")
    base = res.baseline
    blocks: list[Any] = [
        "Clang kernels built from the same source and configuration with LLVM=1 (docs/CLANG.md): plain (clang), with ThinLTO "
        "(clang-thinlto), and with AutoFDO from the emulator's branch records of the clang-train kernel under every workload, "
        "one normalized sample profile for all (clang-afdo, clang-afdo-thinlto); beside GCC's PGO kernel and its layout "
        f"stacks on each workload. All against GCC {base}."]
    b, d = _families_blocks(ctx, CLANG, fams, lambda w: base, base, headline_metric(res))
    blocks += b
    data: dict[str, Any] = {"against_vanilla": d}
    if "clang" in fams and "clang-afdo" in fams:  # AutoFDO's own gain, beside GCC PGO's over GCC vanilla
        b2, d2 = _families_blocks(ctx, CLANG, {"clang-afdo / clang": fams["clang-afdo"]}, fams["clang"], "clang", None)
        blocks += [x for x in b2 if isinstance(x, Table)]
        data["afdo_over_clang"] = d2
    ins, l1i = "kernel_insns_per_op", "kernel_l1i_misses_per_op"
    best = {f: (_geo(d, ins, f), _geo(d, l1i, f)) for f in fams}
    best = {f: v for f, v in best.items() if v[0] is not None and v[1] is not None}
    if best:
        f = min(best, key=lambda k: best[k][1])  # type: ignore[arg-type,return-value]
        i_, m_ = best[f]
        assert i_ is not None and m_ is not None
        blocks.append(f"Best kernel on kernel L1i misses/op (geomean over the workloads): {f}, instructions/op ×{present.ratio(i_)} "
                      f"(goal ≤ ×0.850), L1i misses/op ×{present.ratio(m_)} (goal ≤ ×0.600) against GCC {base}: "
                      + ("met." if i_ <= 0.85 and m_ <= 0.60 else "missed."))
    proofs = run.clang if run else {}
    rows = []
    hot_rows: list[list[str]] = []
    for name, pr in proofs.items():
        if not pr:
            continue
        rows.append([name, present.pct(pr.get("share_functions")), present.pct(pr.get("share_samples")), present.pct(pr.get("threshold")),
                     str(pr.get("promoted_calls", "–")), str(pr.get("promoted_across_objects", "–")), "yes" if pr.get("ok") else "no"])
        for h in (pr.get("promoted_hottest") or [])[:10]:
            hot_rows.append([name, str(h.get("caller", "?")), str(h.get("callee", "?")), f"{h.get('count', 0):,} of {h.get('of', 0):,}",
                             "yes" if h.get("across_objects") else "no"])
    if rows:
        blocks.append(Table("Proof that Clang used the sample profile (kpgo.afdo, from Clang's own optimization records): the share of "
                            "sampled functions and of samples whose function received its profile (a build below the threshold "
                            "fails), and the indirect calls Clang promoted, across objects (ThinLTO) or within one. Measured: "
                            "Clang's records at build time, no guest.",
                            ["kernel", "functions", "samples", "threshold", "calls promoted", "across objects", "ok"], rows, [False] + [True] * 5 + [False]))
    if hot_rows:
        blocks.append(Table("The hottest promoted indirect calls per kernel: caller → callee, the samples of that target of all the "
                            "site's, and whether the callee lives in another object. Measured: Clang's optimization records at build "
                            "time.", ["kernel", "caller", "callee", "count", "across objects"], hot_rows, [False, False, False, True, False]))
    blocks.append(FOOTNOTE)
    return Section(CLANG, measure.sim(res, run) if headline_metric(res) else measure.wall(res, run), blocks, data)


BUILDERS: list[Callable[[Context], Section | Skipped]] = [
    headline, header, speedup, simulated, universal, cross, sensitivity, similarity, kernel_share, code_size, proof, compiler,
    variability, layout, clang,
]
