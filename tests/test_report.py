"""kpgo report on recorded results of a real run (tests/data/report: JSON only, see its README) and, for the profile
sections, on real GCC coverage data of the small program of gcov_fixtures; the page is rendered in headless Chromium.
No kernel is built or booted."""

from __future__ import annotations

import base64
import json
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import assert_one_line_error, kpgo
from gcov_fixtures import GccBuild, Profiles, gcc_build, profiles  # noqa: F401

DATA = Path(__file__).parent / "data" / "report"
DATASETS = sorted(p.name for p in DATA.iterdir() if p.is_dir())  # one recorded run each (see README.md there)
SECTIONS = ("headline", "header", "speedup", "sim", "universal", "cross", "sensitivity", "similarity", "kernel_share",
            "code_size", "proof", "compiler", "variability", "layout", "clang")
CHROMIUM = ("chromium-headless-shell", "chromium")


def load(path: Path) -> dict[str, Any]:
    """A recorded JSON file as the report reads it: a bench's results.json of schema 2 with its intervals computed again
    (kpgo.bench.restate; the recorded benches predate schema 3)."""
    from kpgo import bench

    obj = json.loads(path.read_text())
    return bench.restate(obj) if path.name == "results.json" else obj


@pytest.fixture(params=DATASETS)
def dataset(request: pytest.FixtureRequest) -> Path:
    return DATA / request.param


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def fmt_ci(row: dict[str, Any], key: str = "speedup") -> str:
    """The ratio and CI as the report must print them, from results.json (Markdown escapes the '*')."""
    lo, hi = row["ci_low"], row["ci_high"]
    ci = ("[n<2]" if lo is None or hi is None or math.isnan(lo) or math.isnan(hi) else
          f"range {lo:.3f}–{hi:.3f}" if row.get("ci_method") == "range" else f"[{lo:.3f}, {hi:.3f}]")
    return f"{row.get(key, row.get('ratio')):.3f} {ci}" + ("\\*" if row["ci_includes_1"] else "")


def nan_to_none(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [nan_to_none(v) for v in obj]
    return obj


def expected_sections(run_dir: Path) -> set[str]:
    """Which sections the data in run_dir support, decided from the files themselves."""
    run = load(run_dir / "run.json") if (run_dir / "run.json").exists() else {}
    res = load(run_dir / "bench" / "results.json") if (run_dir / "bench" / "results.json").exists() else None
    out = {"header"}
    if res:
        wls = res["workloads"]
        labels = {r["kernel"] for w in wls.values() for r in w["summary"]}
        out.add("speedup")
        if any(w.get("sim") for w in wls.values()):
            out.add("sim")
        if labels & {"universal-raw", "universal-norm"} and any(f"optimized-{w}" in labels for w in wls):
            out.add("universal")
        if any(r["kernel"].startswith("optimized-") and r["kernel"] != f"optimized-{w}" and r["kernel"][10:] in wls
               for w, v in wls.items() for r in v["summary"]):
            out.add("cross")
        if any(s.get("kernel_share") for s in res["samples"] if s["kernel"] == res["baseline"]):
            out.add("kernel_share")
    if (run_dir / "studies" / "share" / "results.json").exists():
        out.add("kernel_share")
    if (run_dir / "studies" / "sensitivity" / "results.json").exists():
        out.add("sensitivity")
    if (run_dir / "studies" / "compiler" / "compiler.json").exists():
        out.add("compiler")
    fixed = [p for p in (run_dir / "profiles").glob("*/profile.json") if not p.parent.name.endswith(".raw")]
    if len(fixed) >= 2 and (run_dir / "builds" / "instrumented").is_dir():
        out.add("similarity")
    if run.get("builds") or fixed:
        out.add("code_size")
    if any(w.get("proof") for w in run.get("workloads", {}).values()):
        out.add("proof")
    if res or "proof" in out:
        out.add("headline")  # the report opens with it whenever there is a result or a proof
    return out


def add_studies(run_dir: Path) -> None:
    """Universal kernels and a sensitivity study derived from the recorded results (the recorded run had neither):
    universal-raw/-norm rows are copies of the app-specific rows scaled slightly; the sensitivity study is the
    results with workloads renamed W+clients-N and kernels optimized-W+clients-N."""
    res = load(run_dir / "bench" / "results.json")
    for name, w in res["workloads"].items():
        if any(r["kernel"].startswith("universal-") for r in w["summary"]):
            continue
        own = next(r for r in w["summary"] if r["kernel"] == f"optimized-{name}")
        for uni, f in (("universal-raw", 0.99), ("universal-norm", 1.01)):
            w["summary"].append(own | {"kernel": uni, "ratio": own["ratio"] * f, "speedup": own["speedup"] * f})
            w["kernels"].append(uni)
            if (w.get("sim") or {}).get(f"optimized-{name}"):
                w["sim"][uni] = {k: v | {"ratio": v["ratio"] * f} for k, v in w["sim"][f"optimized-{name}"].items()}
    (run_dir / "bench" / "results.json").write_text(json.dumps(res))
    sens = json.loads(json.dumps(res))
    names = list(sens["workloads"])
    ren = {n: f"{names[0]}+clients-{8 * 8 ** i}" for i, n in enumerate(names)}
    sens["workloads"] = {ren[n]: w for n, w in sens["workloads"].items()}

    def relabel(k: str) -> str:
        return f"optimized-{ren[k[10:]]}" if k[10:] in ren else k

    for w in sens["workloads"].values():
        w["summary"] = [r | {"kernel": relabel(r["kernel"])} for r in w["summary"] if not r["kernel"].startswith("universal")]
        w["kernels"] = [relabel(k) for k in w["kernels"] if not k.startswith("universal")]
    (run_dir / "studies" / "sensitivity").mkdir(parents=True)
    (run_dir / "studies" / "sensitivity" / "results.json").write_text(json.dumps(sens))


def report(run_dir: Path, out: Path | None = None) -> tuple[dict[str, Any], str, str]:
    """kpgo report in-process (the CLI is exercised in its own tests); report.json, .md, .html."""
    from kpgo import report as rep

    out = out or run_dir / "report"
    rep.write(rep.generate(run_dir, out), out)
    return load(out / "report.json"), (out / "report.md").read_text(), (out / "report.html").read_text()


# -- recorded results ----------------------------------------------------------------------------------------------


def test_cli_writes_every_supported_section(tmp_path: Path, dataset: Path) -> None:
    run_dir = copy_run(dataset, tmp_path / "run")
    res = kpgo("report", run_dir, timeout=300)
    assert res.returncode == 0, res.stderr
    out = run_dir / "report"
    for name in ("report.html", "report.md", "report.json"):
        assert (out / name).stat().st_size > 1000
    doc = load(out / "report.json")
    want = expected_sections(run_dir)
    assert set(doc["sections"]) == want
    skipped = {s["id"]: s["reason"] for s in doc["skipped"]}
    assert set(skipped) == set(SECTIONS) - want and all(skipped.values())
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    line = next(ln for ln in res.stdout.splitlines() if "Skipped" in ln or "All sections" in ln)
    assert line.removeprefix("report: ") in html.replace("&quot;", '"').replace("&#x27;", "'")
    for sid, sec in doc["sections"].items():
        assert f'<section id="{sid}">' in html
        assert f"## {sec['number']}. {sec['title']}" in md
        assert sec["measured"]
        for t in sec["tables"]:
            assert "Measured" in t["caption"] or sid == "header", t["caption"]
    # another output directory, and a comparison with another run (here: itself, so every change is 1)
    res = kpgo("report", run_dir, "-o", tmp_path / "elsewhere", "--compare", run_dir, timeout=300)
    assert res.returncode == 0, res.stderr
    cmp = load(tmp_path / "elsewhere" / "report.json")["sections"]["compare"]
    assert cmp["data"]["pairs"] and all(p["change"] == pytest.approx(1.0) for p in cmp["data"]["pairs"])


def _speedups(run_dir: Path) -> dict[tuple[str, str], float]:
    """(workload, kernel) -> the speedup over the run's baseline that its results.json records, baseline left out."""
    res = load(run_dir / "bench" / "results.json")
    return {(w, r["kernel"]): r.get("speedup", r.get("ratio")) for w, v in res["workloads"].items() for r in v["summary"]
            if r["kernel"] != res["baseline"]}


@pytest.mark.parametrize("this, other", [("tiny-cross-sim", "studies-tcg"), ("studies-tcg", "tiny-cross-sim"),
                                         ("tiny-cross-sim", "tiny-compiler")])
def test_compare_with_another_run(tmp_path: Path, this: str, other: str) -> None:
    """--compare OTHER: a row for each kernel and workload both runs measured (a kernel only one run has is left out),
    each run's own speedup from its own results.json, and the change between them, this run's over the other's; the
    runs given the other way round give the inverse changes."""
    from kpgo import report as rep

    a, b = copy_run(DATA / this, tmp_path / "this"), copy_run(DATA / other, tmp_path / "other")
    rep.write(rep.generate(a, tmp_path / "out", compare=b), tmp_path / "out")
    cmp = load(tmp_path / "out" / "report.json")["sections"]["compare"]
    ours, theirs = _speedups(a), _speedups(b)
    both = sorted(set(ours) & set(theirs))
    assert both and (bool(set(ours) ^ set(theirs)) == ("studies-tcg" in (this, other)))  # its universal kernels: in one run only
    pairs = cmp["data"]["pairs"]
    assert sorted((p["workload"], p["kernel"]) for p in pairs) == both
    for p in pairs:
        key = (p["workload"], p["kernel"])
        assert p["this"]["ratio"] == pytest.approx(ours[key]) and p["other"]["ratio"] == pytest.approx(theirs[key])
        assert p["change"] == pytest.approx(ours[key] / theirs[key])
    assert any(abs(p["change"] - 1) > 0.01 for p in pairs)  # two different runs: the changes are not all 1
    assert cmp["data"]["other_run_dir"] == "other"  # a directory outside this run's: by its name
    md = (tmp_path / "out" / "report.md").read_text()
    for p in pairs:
        assert f"| {p['workload']} | {p['kernel']} | " in md and f"{p['change']:.3f}" in md
    rep.write(rep.generate(b, tmp_path / "back", compare=a), tmp_path / "back")
    back = {(p["workload"], p["kernel"]): p["change"] for p in load(tmp_path / "back" / "report.json")["sections"]["compare"]["data"]["pairs"]}
    assert sorted(back) == both and all(back[(p["workload"], p["kernel"])] == pytest.approx(1 / p["change"]) for p in pairs)


def test_compare_with_a_run_of_other_pairs_is_skipped(tmp_path: Path) -> None:
    """A run that measured none of this run's kernel/workload pairs: no comparison section, the reason in the skipped."""
    from kpgo import report as rep

    a, b = copy_run(DATA / "tiny-cross-sim", tmp_path / "this"), copy_run(DATA / "tiny-compiler", tmp_path / "other")
    res = json.loads((b / "bench" / "results.json").read_text())
    res["workloads"] = {f"{n}-other": w for n, w in res["workloads"].items()}
    (b / "bench" / "results.json").write_text(json.dumps(res))
    doc = rep.generate(a, tmp_path / "out", compare=b)
    assert "compare" not in {s.heading.id for s in doc.sections}
    [reason] = [s.reason for s in doc.skipped if s.heading.id == "compare"]
    assert reason.endswith("measured none of this run's kernel/workload pairs")


def test_per_host_table_of_a_cluster_bench(tmp_path: Path) -> None:
    """A bench on a cluster (here: the recorded tiny run, its two rounds put on two hosts as `--cluster` does, each
    round whole on one host): the header has each cell's boots per host and, within the host, the ratio to the
    baseline on the headline metric; a single-machine bench has no such table."""
    run_dir = copy_run(DATA / "tiny-cross-sim", tmp_path / "run")
    doc, _, html = report(run_dir, tmp_path / "single")
    assert "per_host" not in doc["sections"]["header"]["data"] and 'id="fig-header-hosts"' not in html
    res = load(run_dir / "bench" / "results.json")
    nodes = ["a1" * 20, "b2" * 20]
    for smp in res["samples"]:
        smp["host"] = {"node_id": nodes[smp["round"]], "hostname": f"h{smp['round']}"}
    res["hosts"] = {n: {"hostname": f"h{i}", "cpu_model": "AMD EPYC", "rounds": [i], "boots": 6} for i, n in enumerate(nodes)}
    (run_dir / "bench" / "results.json").write_text(json.dumps(res))
    doc, md, html = report(run_dir)
    rows = doc["sections"]["header"]["data"]["per_host"]
    assert len(rows) == len(res["samples"])  # two boots per cell, one round on each host
    for row in rows:
        [smp] = [x for x in res["samples"] if x["workload"] == row["workload"] and x["kernel"] == row["kernel"]
                 and x["host"]["node_id"] == row["node_id"]]
        [base] = [x for x in res["samples"] if x["workload"] == row["workload"] and x["kernel"] == res["baseline"]
                  and x["host"]["node_id"] == row["node_id"]]
        assert row["mean"] == pytest.approx(smp["sim_per_op"]["kernel_insns_per_op"])
        assert row["ratio_within_host"] == pytest.approx(smp["sim_per_op"]["kernel_insns_per_op"] / base["sim_per_op"]["kernel_insns_per_op"])
    assert "Per host (each round whole on one host)" in md and f"h1 [{nodes[1][:8]}]" in md
    # The same ratios as bars, one per host in each group (the tiny run's kernels other than vanilla on each workload).
    [fig] = re.findall(r'<figure id="fig-header-hosts"><img src="data:image/png;base64,([A-Za-z0-9+/=]*)" alt="([^"]*)"><figcaption>([^<]*)', html)
    assert base64.b64decode(fig[0])[:8] == b"\x89PNG\r\n\x1a\n" and "simulated" in fig[1] and "Measured: simulated counters" in fig[2]


def test_numbers_match_results(tmp_path: Path, dataset: Path) -> None:
    run_dir = copy_run(dataset, tmp_path / "run")
    res = load(run_dir / "bench" / "results.json")
    doc, md, _ = report(run_dir)
    base = res["baseline"]
    sp = doc["sections"]["speedup"]["data"]
    for name, w in res["workloads"].items():
        assert sp["workloads"][name]["summary"] == nan_to_none(w["summary"])
        for r in w["summary"]:
            cell = "1 (baseline)" if r["kernel"] == base else fmt_ci(r)
            assert f"| {name} | {w['unit']} | {r['kernel']} | {r['n']} | " in md
            assert re.search(rf"\| {re.escape(name)} \|[^\n]*\| {re.escape(r['kernel'])} \|[^\n]*\| {re.escape(cell)} \|", md), (name, r["kernel"])
    for label, g in res.get("geomean", {}).items():
        assert f"| {label} | {fmt_ci(g)} | {len(g['workloads'])} |" in md
    if "sim" in doc["sections"]:
        sim = doc["sections"]["sim"]["data"]["workloads"]
        for name, w in res["workloads"].items():
            assert sim.get(name) == nan_to_none(w.get("sim"))
            for label, metrics in (w.get("sim") or {}).items():
                if label == base:
                    continue
                row = next(ln for ln in md.splitlines() if ln.startswith(f"| {name} | {label} | ") and "instructions" not in ln
                           and fmt_ci(metrics["kernel_insns_per_op"], "ratio") in ln)
                for key in ("kernel_l1i_misses_per_op", "kernel_itlb_misses_per_op"):
                    assert fmt_ci(metrics[key], "ratio") in row
    if "cross" in doc["sections"]:
        c = doc["sections"]["cross"]["data"]
        # The heatmap's cells are the machine's headline metric (simulated kernel instructions/op where the bench
        # simulated under TCG), the wall-clock speedups beside them.
        simulated = any(w.get("sim") for w in res["workloads"].values())
        assert c["metric"] == ("kernel_insns_per_op" if simulated else "wall-clock speedup")
        wall = c["wall_clock_cells"] if simulated else c["cells"]
        for i, k in enumerate(c["rows"]):
            for j, wl in enumerate(c["cols"]):
                got = next((r for r in res["workloads"][wl]["summary"] if r["kernel"] == k), None)
                assert wall[i][j] == (nan_to_none(got | {"ratio": got["speedup"]}) if got else None)
                if simulated:
                    assert c["cells"][i][j] == nan_to_none(((res["workloads"][wl].get("sim") or {}).get(k) or {}).get("kernel_insns_per_op"))
    if "kernel_share" in doc["sections"]:
        ks = doc["sections"]["kernel_share"]["data"]["workloads"]
        share = run_dir / "studies" / "share" / "results.json"  # the share study when there is one, else the bench
        src = load(share) if share.exists() else res
        for name, w in src["workloads"].items():
            boots = [float(np.mean(s["kernel_share"])) for s in src["samples"]
                     if s["workload"] == name and s["kernel"] == src["baseline"] and s.get("kernel_share")]
            sd = f"{np.std(boots, ddof=1):.1%}" if len(boots) > 1 else "–"
            assert ks[name]["cpu_time"] == pytest.approx(np.mean(boots))
            row = f"| {name} | {np.mean(boots):.1%} | {sd} | {len(boots)} |"
            sims = (w.get("sim") or {}).get(src["baseline"]) or {}
            for key in ("kernel_insn_share", "kernel_l1i_share", "kernel_itlb_share") if sims else ():
                assert ks[name][key] == sims[key]["mean"]
                row += f" {sims[key]['mean']:.1%} |"
            assert row in md.splitlines(), row
    run = load(run_dir / "run.json") if (run_dir / "run.json").exists() else {"workloads": {}, "builds": {}}
    for name, w in run["workloads"].items():
        p = w["proof"]
        assert f"| {name} | {p['objects_used']}/{p['objects_nonempty']} | {p['ratio']:.1%} |" in md
    for label, b in run["builds"].items():  # functions, text span, bzImage: '–' or measured from a build directory
        z = b["sizes"]
        assert re.search(rf"^\| {re.escape(label)} \| [\d,–]+ \| [\d,–]+ \| {z['objects_text']:,} \| {z['text_hot']:,} \| "
                         rf"{z['text_unlikely']:,} \| [\d,–]+ \| {z['vmlinux_text']:,} \| ", md, re.M), label


def test_universal_and_sensitivity(tmp_path: Path, dataset: Path) -> None:
    run_dir = copy_run(dataset, tmp_path / "run")
    add_studies(run_dir)
    res = load(run_dir / "bench" / "results.json")
    sens = load(run_dir / "studies" / "sensitivity" / "results.json")
    doc, md, _ = report(run_dir)
    assert {"universal", "sensitivity"} <= set(doc["sections"])
    data = doc["sections"]["universal"]["data"]
    simulated = any(w.get("sim") for w in res["workloads"].values())
    # Led by the machine's headline metric (simulated kernel instructions/op under TCG), wall-clock beside it.
    uni = data["wall_clock"]["workloads"] if simulated else data["workloads"]
    for name, w in res["workloads"].items():
        rows = {r["kernel"]: r for r in w["summary"]}
        assert uni[name]["app-specific"] == nan_to_none(rows[f"optimized-{name}"])
        assert uni[name]["universal-norm"] == nan_to_none(rows["universal-norm"])
        if simulated:
            assert data["workloads"][name]["universal-norm"] == nan_to_none(w["sim"]["universal-norm"]["kernel_insns_per_op"])
        assert f"| {name} | optimized-{name} | {fmt_ci(rows[f'optimized-{name}'])} | {fmt_ci(rows['universal-raw'])} | " \
               f"{fmt_ci(rows['universal-norm'])} |" in md
    s = doc["sections"]["sensitivity"]["data"]
    assert s["cols"] == sorted(sens["workloads"], key=lambda c: int(c.rpartition("-")[2]))  # clients-8 before -64
    assert s["rows"] == [f"optimized-{c}" for c in s["cols"]]  # own setting on the diagonal


def test_sections_registered_once() -> None:
    """Each section's number, id and title are one Heading; the builders run in number order, compare last."""
    from kpgo.report import model, sections

    headings = [v for v in vars(sections).values() if isinstance(v, model.Heading)]
    assert sorted(h.number for h in headings) == list(range(len(headings)))
    assert [h.id for h in sorted(headings, key=lambda h: h.number)] == [*SECTIONS, "compare"]


def test_one_presentation_of_ratios(tmp_path: Path) -> None:
    """The terminal tables, summary.md and the report show a ratio, its CI, the mark and its footnote alike."""
    from kpgo import bench, pipeline, records
    from kpgo.report import present

    run_dir = copy_run(DATA / "tiny-cross-sim", tmp_path / "run")
    res = load(run_dir / "bench" / "results.json")
    assert res["schema"] == 3 and res["design"]["restated"]
    _, md, _ = report(run_dir)
    summary = pipeline.markdown(records.Run.from_json(load(run_dir / "run.json"), run_dir / "run.json"), records.Results.from_json(res, run_dir))
    table = bench.format_table(res)
    for name, w in res["workloads"].items():
        own = next(r for r in w["summary"] if r["kernel"] == f"optimized-{name}")
        assert fmt_ci(own) == present.md_escape(present.ratio_ci(own))
        assert fmt_ci(own) in md and fmt_ci(own) in summary
        assert f"{own['ratio']:.3f} {present.ci(own['ci_low'], own['ci_high'], own['ci_method']):>18}{present.mark(own, pad=True)}" in table
    assert present.footnote() in table and present.md_escape(present.footnote()) in md
    assert present.md_escape(present.footnote()) in summary and present.md_escape(present.interval_text(res)) in summary
    # A recorded arc-only run: the summary says why there are no value figures rather than "0 of N promoted".
    assert "value profiles: none (the profile holds arc counters only" in summary


def test_summary_is_a_view_of_the_report_model(tmp_path: Path) -> None:
    """summary.md is rendered from model sections by the report's Markdown renderer: its sections in order (the
    simulated headline first under TCG), the studies' kernel-by-workload tables the report's cross section has too, and
    every workload's proof, profile and the bench's terminal tables."""
    from kpgo import bench, pipeline, records
    from kpgo.report import render, summary
    from kpgo.report.model import Preformatted, Report, Table

    run_dir = copy_run(DATA / "tiny-cross-sim", tmp_path / "run")
    run = records.Run.from_json(load(run_dir / "run.json"), run_dir / "run.json")
    res = records.Results.from_json(load(run_dir / "bench" / "results.json"), run_dir)
    md = pipeline.markdown(run, res)
    parts = summary.sections(run, res)
    assert [s.title.split(" (")[0] for s in parts] == ["Results: simulated kernel work per operation", "Results: wall-clock", "Builds",
                                                      *run.workloads, "Bench"]
    assert [s.number for s in parts] == list(range(1, len(parts) + 1))
    for s in parts:
        assert f"## {s.number}. {s.title}" in md and render.markdown(Report(s.title, "", [s], []), intro=[]).split("\n", 2)[2] in md
    assert md.index("Results: simulated kernel work per operation") < md.index("Results: wall-clock (TCG: indicative only")
    assert "kernel taken branches/op" in md and "| geomean |" in md and "Studies: cross" in md and "95% CI" in md
    assert md.count("Proof that GCC used the profile: read in") == len(run.workloads)
    assert next(b for b in parts[-1].blocks if isinstance(b, Preformatted)).text == bench.format_table(res.raw)
    # The studies' wall-clock table holds the report's cross-application cells (section 5), plus each kernel's geomean.
    doc, _, _ = report(run_dir)
    cross = next(t for t in doc["sections"]["cross"]["tables"] if t["caption"].startswith("Speedup over"))
    [studies] = [b for b in parts[1].blocks if isinstance(b, Table) and b.caption.startswith("Studies: cross")]
    def cells(header: list[str], rows: list[list[str]]) -> dict[tuple[str, str], str]:
        return {(r[0], h): c for r in rows for h, c in zip(header[1:], r[1:]) if h != "geomean"}

    assert cells(studies.header, studies.rows) == cells(cross["header"], cross["rows"]) != {}


@pytest.mark.parametrize("case", ["missing", "empty", "bad-json", "old-schema", "not-object"])
def test_bad_run_dir(tmp_path: Path, case: str) -> None:
    run_dir = tmp_path / "run"
    needle = {"missing": "does not exist", "empty": "neither run.json nor bench/results.json",
              "bad-json": "not valid JSON", "old-schema": "schema 1", "not-object": "JSON object"}[case]
    if case != "missing":
        run_dir.mkdir()
    if case in ("bad-json", "old-schema", "not-object"):
        (run_dir / "bench").mkdir()
        text = {"bad-json": '{"schema": 2, "work', "old-schema": '{"baseline": "vanilla", "summary": []}', "not-object": "[]"}[case]
        (run_dir / "bench" / "results.json").write_text(text)
    res = kpgo("report", run_dir)
    assert_one_line_error(res, 1, needle)
    assert not (run_dir / "report").exists() or not any((run_dir / "report").glob("report.*"))


def test_interrupted_write_leaves_no_partial_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kpgo import atomic
    from kpgo import report as rep
    from kpgo.report import render

    run_dir = copy_run(DATA / DATASETS[0], tmp_path / "run")
    out = run_dir / "report"

    def interrupt(*_a: Any, **_k: Any) -> str:
        raise KeyboardInterrupt

    # Interrupted while rendering, before any file: nothing appears.
    with monkeypatch.context() as mp:
        mp.setattr(render, "markdown", interrupt)
        with pytest.raises(KeyboardInterrupt):
            rep.write(rep.generate(run_dir, out), out)
    assert not out.exists() or sorted(p.name for p in out.iterdir()) == []

    # Interrupted in the middle of writing report.md over an earlier report: every file is whole, old or new.
    report(run_dir)
    old = {p.name: p.read_bytes() for p in out.glob("report.*")}
    (run_dir / "run.json").write_text(json.dumps({"kernel": {"version": "9.9.9"}}))  # a change the new report shows
    real_replace = atomic.os.replace

    def replace(src: str, dst: Any) -> None:
        if str(dst).endswith("report.md"):
            raise KeyboardInterrupt
        real_replace(src, dst)

    with monkeypatch.context() as mp:
        mp.setattr(atomic.os, "replace", replace)
        with pytest.raises(KeyboardInterrupt):
            rep.write(rep.generate(run_dir, out), out)
    names = sorted(p.name for p in out.iterdir())
    assert [n for n in names if n.startswith(".")] == []  # no temporary file left
    assert (out / "report.md").read_bytes() == old["report.md"]
    assert "9.9.9" in (out / "report.html").read_text()
    json.loads((out / "report.json").read_text())


# -- profile sections on real GCC coverage data --------------------------------------------------------------------


def profile_run(tmp_path: Path, profiles: Profiles, dataset: Path) -> tuple[Path, list[str]]:
    """A recorded run plus: two fixed profiles (and a raw one, to be ignored) named after its workloads, collected
    from the gcov_fixtures program, that program's build as builds/instrumented, and its executable as vanilla's and
    the optimized kernels' vmlinux."""
    run_dir = copy_run(dataset, tmp_path / "run")
    names = list(load(run_dir / "bench" / "results.json")["workloads"])[:2]
    assert len(names) == 2, "the recorded run needs two workloads"
    for name, src in zip(names, (profiles.mode0, profiles.mode1)):
        shutil.copytree(src, run_dir / "profiles" / name)
        (run_dir / "profiles" / name / "profile.json").write_text(json.dumps({"workload": {"name": name}, "src": str(src)}))
    shutil.copytree(profiles.k0, run_dir / "profiles" / f"{names[0]}.raw")
    (run_dir / "profiles" / f"{names[0]}.raw" / "profile.json").write_text("{}")
    (run_dir / "builds").mkdir()
    (run_dir / "builds" / "instrumented").symlink_to(profiles.build.root)
    for label in ["vanilla"] + [f"optimized-{n}" for n in names]:
        (run_dir / "builds" / label).mkdir()
        shutil.copyfile(profiles.build.exe, run_dir / "builds" / label / "vmlinux")
    return run_dir, names


def test_report_prints_no_absolute_path(tmp_path: Path, profiles: Profiles) -> None:
    """A report is read on other machines: it names the run directory, its builds and profiles relative to the run
    directory, and a path outside it (the kernel source, a build elsewhere) by its name, never as an absolute path."""
    run_dir, names = profile_run(tmp_path, profiles, DATA / "tiny-cross-sim")
    res_path = run_dir / "bench" / "results.json"
    res = json.loads(res_path.read_text())
    outside = {k["build_dir"] for label, k in res["kernels"].items() if label != "vanilla"}
    res["kernels"]["vanilla"]["build_dir"] = str(run_dir / "builds" / "vanilla")  # one build inside the run directory
    res_path.write_text(json.dumps(res))
    source = json.loads((run_dir / "run.json").read_text())["kernel"]["source"]
    assert source.startswith("/") and outside and all(p.startswith("/") for p in outside)
    res = kpgo("report", run_dir, "-o", tmp_path / "out", "--compare", run_dir, timeout=300)
    assert res.returncode == 0, res.stderr
    texts = {n: (tmp_path / "out" / n).read_text() for n in ("report.md", "report.html", "report.json")}
    absolute = {str(run_dir), str(run_dir.resolve()), str(tmp_path), str(profiles.build.root), source, *outside}
    for name, text in texts.items():
        assert not [p for p in absolute if p in text], name
    doc = json.loads(texts["report.json"])
    assert doc["run_dir"] == "run"
    kernels = doc["sections"]["header"]["data"]["kernels"]
    assert kernels["vanilla"]["build_dir"] == "builds/vanilla"
    assert {kernels[k]["build_dir"] for k in kernels if k != "vanilla"} == {Path(p).name for p in outside}
    assert doc["sections"]["header"]["data"]["kernel"]["source"] == Path(source).name
    assert sorted(doc["sections"]["similarity"]["data"]["profiles"]) == sorted(f"profiles/{n}" for n in names)
    assert "| 6.12.117 | builds/vanilla |" in texts["report.md"]
    assert "Run directory: `run`" in texts["report.md"]
    assert doc["sections"]["compare"]["data"]["other_run_dir"] == "run"


def nm_sizes(exe: Path) -> dict[str, int]:
    out = subprocess.run(["nm", "-S", "--defined-only", str(exe)], check=True, capture_output=True, text=True).stdout
    return {p[3]: int(p[1], 16) for p in (ln.split() for ln in out.splitlines()) if len(p) == 4 and p[2] in "tT"}


def test_profile_similarity_and_top_functions(tmp_path: Path, profiles: Profiles) -> None:
    from kpgo.analysis.characterize import compare_profiles

    run_dir, names = profile_run(tmp_path, profiles, DATA / DATASETS[0])
    doc, md, _ = report(run_dir)
    assert {"similarity", "code_size"} <= set(doc["sections"])
    sim = doc["sections"]["similarity"]["data"]
    assert sorted(sim["names"]) == sorted(names)  # the .raw profile is not compared
    ref = compare_profiles([run_dir / "profiles" / n for n in sim["names"]], profiles.build.root, names=sim["names"])
    for key, mat in ref["matrices"].items():
        assert sim["matrices"][key] == mat
        assert f"{mat[0][1]:.3f}" in md
    top = doc["sections"]["code_size"]["data"]["top_functions"]
    sizes = nm_sizes(profiles.build.exe)
    first = {f["function"]: f for f in top[names[0]]["functions"]}
    assert first["sched_pick"]["count"] == 1000 and first["net_rx"]["count"] == 1000  # mode 0, n = 1000
    assert first["sched_pick"]["size_before"] == sizes["sched_pick"] == first["sched_pick"]["size_after"]
    assert "net_rx" not in {f["function"] for f in top[names[1]]["functions"]}  # mode 1 never calls it
    assert "| sched_pick | kernel/sched | 1,000 |" in md
    assert "From the cache" not in md
    # unchanged profiles: from the cache; a changed profile.json: computed again
    _, md, _ = report(run_dir)
    assert "From the cache" in md
    (run_dir / "profiles" / names[1] / "profile.json").write_text(json.dumps({"workload": {"name": names[1]}, "v": 2}))
    _, md, _ = report(run_dir)
    assert "From the cache" not in md


def test_profile_from_other_build_skips_only_its_sections(tmp_path: Path, profiles: Profiles) -> None:
    run_dir, names = profile_run(tmp_path, profiles, DATA / DATASETS[0])
    other = tmp_path / "other-build"
    shutil.copytree(profiles.build.root, other)
    for p in other.rglob("*.gcno"):  # another compilation: other stamps
        data = bytearray(p.read_bytes())
        data[8:12] = bytes(b ^ 0xFF for b in data[8:12])
        p.write_bytes(bytes(data))
    (run_dir / "builds" / "instrumented").unlink()
    (run_dir / "builds" / "instrumented").symlink_to(other)
    doc, _, _ = report(run_dir)
    skipped = {s["id"]: s["reason"] for s in doc["skipped"]}
    assert "stamp" in skipped["similarity"]
    assert "speedup" in doc["sections"] and "code_size" in doc["sections"]  # sizes from nm still shown


# -- rendered in a browser -----------------------------------------------------------------------------------------


def chromium() -> str:
    path = next((p for p in map(shutil.which, CHROMIUM) if p), None)
    if path is None:
        pytest.fail("no headless Chromium: install chromium-headless-shell (`make setup` does: scripts/setup.sh)")
    assert path is not None
    return path


def test_html_renders_in_chromium(tmp_path: Path, profiles: Profiles, dataset: Path) -> None:
    from PIL import Image

    run_dir, _ = profile_run(tmp_path, profiles, dataset)
    add_studies(run_dir)
    doc, _, html = report(run_dir)
    # Every figure the data support, embedded, with a caption and alt text that say how it was measured.
    want = {"speedup", "universal", "sensitivity", "similarity-cosine", "similarity-taken"}
    res = load(run_dir / "bench" / "results.json")
    if any(w.get("sim") for w in res["workloads"].values()):
        want.add("sim")
    if "cross" in expected_sections(run_dir):
        want.add("cross")
    if "compiler" in expected_sections(run_dir):  # the size/speed trade-off and the per-workload bars
        want |= {"compiler-tradeoff", "compiler-bars"}
    # The headline opens the report: the work per operation and every boot's spread; the proof when run.json has one.
    want |= {"headline-work", "headline-boots"}
    if (run_dir / "run.json").exists() and any(w.get("proof") for w in load(run_dir / "run.json").get("workloads", {}).values()):
        want.add("headline-proof")
    assert html.index('<section id="headline">') < html.index('<section id="header">') < html.index('<section id="speedup">')
    figs = {m.group(1): m for m in re.finditer(
        r'<figure id="fig-([^"]+)"><img src="data:image/png;base64,([A-Za-z0-9+/=]*)" alt="([^"]*)">'
        r"<figcaption>([^<]*)</figcaption></figure>", html)}
    assert set(figs) == want
    for fid, m in figs.items():
        png = base64.b64decode(m.group(2), validate=True)
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000, fid
        alt, caption = m.group(3), m.group(4)
        assert re.search(r"wall-clock|simulated|gcov", alt), (fid, alt)
        assert "Measured:" in caption and re.search(r"KVM|TCG|bare metal", caption + alt), (fid, caption)
    assert html.count("<img ") == len(want)
    if "compiler-tradeoff" in figs and "simulated" in figs["compiler-tradeoff"].group(4):
        # under simulation the trade-off shows L1i misses beside the instructions: the two can disagree (docs/MEASUREMENTS.md)
        assert "instructions/op and simulated kernel L1i misses/op" in figs["compiler-tradeoff"].group(4)
    assert not re.search(r'(?:src|href)="(?!data:|#)', html)  # nothing fetched from elsewhere
    assert "<script" not in html and "@import" not in html and "url(" not in html

    shot = tmp_path / "shot.png"
    page = (run_dir / "report" / "report.html").resolve()
    cp = subprocess.run([chromium(), "--no-sandbox", "--headless", "--disable-gpu", "--hide-scrollbars",
                         f"--screenshot={shot}", "--window-size=1280,4000", page.as_uri()],
                        capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0 and shot.exists(), cp.stderr[-2000:]
    assert shot.stat().st_size > 50_000
    img = np.asarray(Image.open(shot).convert("RGB"))
    assert img.shape == (4000, 1280, 3)
    packed = (img[..., 0].astype(np.uint32) << 16) | (img[..., 1].astype(np.uint32) << 8) | img[..., 2]
    colours = len(np.unique(packed))
    assert colours > 256, colours  # antialiased text and figures, not a blank page or an error message
    assert (img.min(axis=2) < 200).mean() > 0.03  # a fair share of the page is ink
