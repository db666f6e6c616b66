"""RUN/summary.md: `kpgo run`'s own account of a run, as a view of the report's model (kpgo.report.model) rendered by
the report's Markdown renderer (kpgo.report.render), so that a ratio, its CI, the mark and the tables the report
has too are built in one place (the studies' kernel-by-workload tables are kpgo.report.sections.matrix).

    sections(run, results) -> list[Section]   the summary's sections, from the run's records (kpgo.records)
    markdown(run, results) -> str              summary.md

What it shows: the simulated kernel work per operation of each app-specific kernel (when counted), the wall-clock
speedups with whether GCC used the profile, the studies' kernels on every workload, the builds' times and sizes,
each workload's parameters, profile and proof, and the bench's terminal tables."""

from __future__ import annotations

import json

from kpgo import bench
from kpgo.progress import fmt_secs
from kpgo.records import Host, Results, Run
from kpgo.report import measure, present, render
from kpgo.report.model import Block, Heading, Preformatted, Report, Section, Table
from kpgo.report.sections import matrix

SIZES = ("functions_size", "text_span", "objects_text", "text_hot", "text_unlikely", "bzimage", "vmlinux_text")


def _proof_cell(run: Run, name: str) -> str:
    w = run.workloads.get(name)
    p = w.proof if w else None
    if p is None:
        return "–"
    return f"{p.objects_used}/{p.objects_nonempty} objects ({present.pct(p.ratio)})"


def _studies_table(res: Results, run: Run, metric: str | None) -> Table:
    """Every kernel but the baseline on every workload it was measured on, and its geometric mean over them, in
    `metric` (None: wall-clock speedup): the universal, cross-application and other studies' kernels."""
    labels = [k for k in res.kernels if k != res.baseline]
    names = list(run.workloads)
    rows, _, _ = matrix(res, labels, names, metric)
    for label, row in zip(labels, rows):
        g = res.sim_geomean.get(label, {}).get(metric) if metric else (res.geomean[label].as_speedup() if label in res.geomean else None)
        row.append(present.ratio_ci(g) if g else "–")
    what = (f"simulated {present.metric_title(metric, short=True)}, ratio to {res.baseline} [95% CI]" if metric
            else f"speedup over {res.baseline} [95% CI]")
    return Table(f"Studies: {', '.join(run.studies)} — {what}", ["kernel", *names, "geomean"], rows, [False] + [True] * (len(names) + 1))


def _simulated(res: Results, run: Run, number: int) -> Section:
    heads = bench.SIM_HEADLINE
    methods = res.measurement.ops_methods or {}
    rows = []
    for n in run.workloads:
        w = res.workloads.get(n)
        sim = w.sim.get(f"optimized-{n}") if w else None
        rows.append([n, *(f"×{present.ratio_ci(sim[k])}" if sim and k in sim else "–" for k in heads), "/".join(methods.get(n) or ["–"])])
    geo = res.sim_own_geomean()
    if geo:
        rows.append(["geomean", *(f"×{present.ratio_ci(geo[k])}" if k in geo else "–" for k in heads), ""])
    blocks: list[Block] = [
        Table("Each app-specific kernel on its own workload; the geomean is over the app-specific kernels, each on its own workload",
              ["workload", *(present.metric_title(k, short=True) for k in heads), "operations counted"], rows, [False] * (len(heads) + 2)),
        f"Counted by kpgo's QEMU plugin in the measured window (docs/SIM.md); {present.footnote('CI', '')}.",
    ]
    if run.studies:
        blocks.append(_studies_table(res, run, heads[0]))
    title = f"Results: simulated kernel work per operation (ratio to {res.baseline} [95% CI]; < 1 = fewer events)"
    return Section(Heading(number, "sim", title), measure.sim(res, run), blocks)


def _wall_clock(res: Results, run: Run, number: int) -> Section:
    tcg = bool(run.host and run.host.accelerator == "tcg")
    rows = []
    for n, w in run.workloads.items():
        wr = res.workloads.get(n)
        van, o = (wr.row(res.baseline), wr.row(f"optimized-{n}")) if wr else (None, None)
        rows.append([n, w.unit or "–", f"{van.mean:.1f}" if van and van.mean is not None else "FAILED",
                     f"{o.mean:.1f}" if o and o.mean is not None else "FAILED", present.ratio_ci(o) if van and o else "–", _proof_cell(run, n)])
    blocks: list[Block] = [
        Table(f"Each workload on {res.baseline} and on the kernel optimized with its own profile",
              ["workload", "unit", res.baseline, "app-specific (optimized-WORKLOAD)", "speedup [95% CI]", "GCC used the profile"], rows,
              [False, False, True, True, False, False]),
    ]
    if run.studies:
        blocks.append(_studies_table(res, run, None))
    blocks.append(f"{present.footnote()}; {present.interval_text(res)}.")
    title = "Results: wall-clock" + (" (TCG: indicative only — software emulation does not show what code layout does on a real CPU)" if tcg else "")
    return Section(Heading(number, "wall_clock", title), measure.wall(res, run), blocks)


def _builds(run: Run, number: int) -> Section:
    rows = [[label, "–" if b.seconds is None else fmt_secs(b.seconds), *(present.size(b.sizes.get(k)) for k in SIZES)]
            for label, b in run.builds.items()]
    blocks: list[Block] = [
        Table("Each build's time and sizes in bytes",
              ["build", "build time", "functions", "text span", "objects' .text*", ".text.hot", ".text.unlikely", "bzImage", ".text section (padded)"],
              rows, [False] + [True] * (1 + len(SIZES))),
        "Sizes in bytes. Functions: vmlinux's function symbols (`nm -S`) summed, each address once; text span: from _stext to "
        "the end of the last function in .text below the entry text (2 MiB-aligned); objects' .text* (which includes .text.hot "
        "and .text.unlikely): summed over the objects linked into vmlinux (the linker folds them into .text); .text section: "
        "vmlinux's, padded to 2 MiB by the linker script, not the code size.",
    ]
    return Section(Heading(number, "builds", "Builds"), "Static sizes and times of the builds (build.json); no run involved.", blocks)


def _workload(res: Results, run: Run, name: str, number: int) -> Section:
    from kpgo.kernel import proof

    w = run.workloads[name]
    c, p = w.collected, w.proof
    blocks: list[Block] = [f"Parameters: `{json.dumps(w.params, sort_keys=True)}`",
              f"Profile: {c.files} .gcda files, counter sum {c.arcs_sum or 0:,}, collected at {c.throughput or 0:.0f} {w.unit}; "
              f"gcov version {c.gcov_version}; object summary added by `kpgo profile fix` (the kernel does not write it; "
              "GCC ≥ 9 ignores a .gcda without it)."]
    if p is not None:
        blocks += [f"Proof that GCC used the profile: read in {p.objects_used} of {p.objects_nonempty} objects with a non-empty "
                   f"profile ({present.pct(p.ratio)}, threshold {p.threshold or 0:.0%}); functions with counts read: {p.functions_read}, "
                   f"functions where GCC gave up: {p.functions_giving_up}"
                   + (f"; share of the profile's arc counts read: {present.pct(p.weight_read)}" if p.weight_read is not None else "")
                   + f". Method: {p.method}."
                   + (f" Profiled objects not in this build (instrumented kernel only): {', '.join(p.profiled_but_not_built)}."
                      if p.profiled_but_not_built else ""),
                   proof.format_values(p.values) + "."]
    how = (f"Profile: gcov counters of the instrumented kernel {measure.guests(res, run)}; proof: GCC's own "
           "-fdump-ipa-profile dumps of the optimized build.")
    return Section(Heading(number, f"workload-{name}", name), how, blocks)


def _bench(res: Results, run: Run, number: int) -> Section:
    phases = ", ".join(f"{k} {fmt_secs(v)}" for k, v in run.phases_seconds.items())
    blocks: list[Block] = [Preformatted(bench.format_table(res.raw)),
              f"Phases: {phases}; total {fmt_secs(run.total_seconds or 0)}."]
    how = measure.sim(res, run) if measure.has_sim(res) else measure.wall(res, run)
    return Section(Heading(number, "bench", "Bench"), how, blocks)


def sections(run: Run, res: Results) -> list[Section]:
    out: list[Section] = []
    if any(w.sim for n, w in res.workloads.items() if n in run.workloads):
        out.append(_simulated(res, run, len(out) + 1))
    out += [_wall_clock(res, run, len(out) + 1)]
    out += [_builds(run, len(out) + 1)]
    for name in run.workloads:
        out.append(_workload(res, run, name, len(out) + 1))
    out.append(_bench(res, run, len(out) + 1))
    return out


def markdown(run: Run, res: Results) -> str:
    h = run.host or Host()
    intro = f"Host: {h.cpu}; guests under {(h.accelerator or '?').upper()}; {h.qemu}; gcc {h.gcc}"
    title = f"kpgo run: {run.kernel.config} kernel {run.kernel.version}, workloads {', '.join(run.workloads)}"
    return render.markdown(Report(title, "", sections(run, res), []), intro=[present.md_escape(intro)])
