"""The report's study sections (12 variability, 13 layout, 14 clang): one kernel family per column, each workload on
its own kernel of the family. The data: the recorded tiny bench (tests/data/report/tiny-cross-sim) with kernels
derived from its own boots (each boot's counts scaled by a known factor) and summarized again by kpgo.bench, so every
ratio shown can be checked against kpgo.stats on the same boots; the goals' verdicts follow from the factors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from kpgo import bench, stats
from kpgo.report import present

DATA = Path(__file__).resolve().parent / "data" / "report" / "tiny-cross-sim"
# label pattern -> (the kernel whose boots it takes, the factor on every simulated count)
DERIVED = {
    "optimized-{w}.2": ("optimized-{w}", 1.01),
    "pgo-order-{w}": ("optimized-{w}", 0.90),
    "pgo-bolt-{w}": ("optimized-{w}", 0.80),
    "bolt-{w}": ("vanilla", 0.95),
    "universal-norm": ("optimized-{w}", 1.02),
    "pgo-bolt-universal": ("optimized-{w}", 0.84),
    "clang": ("vanilla", 1.03),
    "clang-afdo": ("vanilla", 0.88),
}


def derived_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(DATA, run)
    res = json.loads((run / "bench" / "results.json").read_text())
    samples = list(res["samples"])
    for pattern, (src, f) in DERIVED.items():
        for w in res["workloads"]:
            for s in res["samples"]:
                if s["kernel"] == src.format(w=w) and s["workload"] == w:
                    samples.append({**s, "kernel": pattern.format(w=w), "mean": s["mean"] / f,
                                    "sim_per_op": {k: v * f for k, v in s["sim_per_op"].items()}})
    labels = [res["baseline"], *sorted({s["kernel"] for s in samples} - {res["baseline"]})]
    wls = [bench.Measured(n, w["unit"], bool(w["higher_is_better"]), w.get("params") or {}) for n, w in res["workloads"].items()]
    cells = sorted({(s["kernel"], s["workload"]) for s in samples})
    again = bench.summarize([bench.Kernel(k, Path(k)) for k in labels], wls, cells, samples, res["baseline"])
    res = {**res, **again, "kernels": {k: {"build_dir": k} for k in labels}}
    (run / "bench" / "results.json").write_text(json.dumps(res))
    doc = json.loads((run / "run.json").read_text())
    wl = list(res["workloads"])
    doc["layout"] = {f"pgo-bolt-{wl[0]}": {"proof": None, "bolt": {"ok": True, "valid_share": 0.97, "report": {
        "functions_profiled": 1200, "functions": 30000, "stale_share": 0.01, "functions_rewritten": 900, "cold_bytes_moved": 123456}},
        "order": None}}
    doc["clang"] = {"clang-afdo": {"proof": {"ok": True, "share_functions": 0.97, "share_samples": 0.99, "threshold": 0.9, "promoted_calls": 8,
                                             "promoted_across_objects": 2, "promoted_hottest": [
                                                 {"caller": "a_fn", "callee": "b_fn", "count": 90, "of": 100, "across_objects": True}]}}}
    names = [*wl, *(f"{n}.2" for n in wl)]
    n = len(names)
    mat = [[1.0 if i == j else 0.99 if names[i].split(".")[0] == names[j].split(".")[0] else 0.5 for j in range(n)] for i in range(n)]
    (run / "studies" / "variability").mkdir(parents=True)
    (run / "studies" / "variability" / "similarity.json").write_text(json.dumps(
        {"names": names, "function_cosine": mat, "branch_cosine": mat, "taken_l1": [[1 - x for x in r] for r in mat]}))
    doc["variability"] = {"similarity": "studies/variability/similarity.json"}
    (run / "run.json").write_text(json.dumps(doc))
    return run


def boots(res: dict[str, Any], kernel: str, wl: str, metric: str) -> list[float]:
    return [s["sim_per_op"][metric] for s in res["samples"] if s["kernel"] == kernel and s["workload"] == wl]


@pytest.fixture(scope="module")
def doc(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any], str]:
    from kpgo import report as rep

    run = derived_run(tmp_path_factory.mktemp("studies"))
    rep.write(rep.generate(run, run / "report"), run / "report")
    return (json.loads((run / "report" / "report.json").read_text()), json.loads((run / "bench" / "results.json").read_text()),
            (run / "report" / "report.md").read_text())


def test_the_three_sections_appear(doc: tuple[dict[str, Any], dict[str, Any], str]) -> None:
    d, _, md = doc
    for sid, title in (("variability", "12. Profile variability"), ("layout", "13. Code layout"), ("clang", "14. Clang")):
        assert sid in d["sections"], d["skipped"]
        assert f"## {title}" in md
        assert all("Measured" in t["caption"] for t in d["sections"][sid]["tables"])


def test_every_ratio_is_kpgo_stats_on_the_same_boots(doc: tuple[dict[str, Any], dict[str, Any], str]) -> None:
    d, res, _ = doc
    m = "kernel_l1i_misses_per_op"
    lay = d["sections"]["layout"]["data"]
    for wl in res["workloads"]:
        got = lay["against_vanilla"][m][wl]["PGO + BOLT"]
        want = stats.ratio_record(boots(res, "vanilla", wl, m), boots(res, f"pgo-bolt-{wl}", wl, m))
        assert got["ratio"] == pytest.approx(want["ratio"]) and got["ci_low"] == pytest.approx(want["ci_low"])
        # against the baseline, the same number the bench recorded
        assert got["ratio"] == pytest.approx(res["workloads"][wl]["sim"][f"pgo-bolt-{wl}"][m]["ratio"])
        on_pgo = lay["against_pgo"]["PGO + BOLT"][m][wl]["PGO + BOLT / PGO"]
        assert on_pgo["ratio"] == pytest.approx(0.80) and on_pgo["against"] == f"optimized-{wl}"
    geo = lay["against_vanilla"][m]["geomean"]["PGO + order"]
    pairs = [(boots(res, "vanilla", w, m), boots(res, f"pgo-order-{w}", w, m)) for w in res["workloads"]]
    assert geo["ratio"] == pytest.approx(stats.geomean_record(pairs)["ratio"]) and geo["workloads"] == list(res["workloads"])
    var = d["sections"]["variability"]["data"]
    assert var["second_over_first"]["kernel_insns_per_op"]["geomean"]["second / first"]["ratio"] == pytest.approx(1.01)
    assert var["similarity"][next(iter(res["workloads"]))]["function_cosine"] == {"self": 0.99, "closest_other": 0.5}
    cl = d["sections"]["clang"]["data"]
    assert cl["afdo_over_clang"]["kernel_insns_per_op"]["geomean"]["clang-afdo / clang"]["ratio"] == pytest.approx(0.88 / 1.03)


def test_goals_are_said_met_or_missed_from_the_numbers(doc: tuple[dict[str, Any], dict[str, Any], str]) -> None:
    d, res, md = doc
    goals = d["sections"]["layout"]["data"]["goals"]
    # the recorded bench predates the taken-branch counter: no verdict, and the missing count named
    assert any(g.startswith("PGO + BOLT over its PGO kernel") and "kernel L1i misses/op ×0.800" in g
               and g.endswith("no verdict (kernel taken branches/op not counted by this bench).") for g in goals)
    pgo_gain = 1 - d["sections"]["layout"]["data"]["against_vanilla"]["kernel_l1i_misses_per_op"]["geomean"]["PGO"]["ratio"]
    bolt = next(g for g in goals if g.startswith("Vanilla + BOLT"))
    assert f"reaches {0.05 / pgo_gain:.0%} of GCC PGO" in bolt
    assert "clang-afdo" in md and "a_fn" in md and "b_fn" in md and present.pct(0.97) in md


def test_the_goal_verdicts() -> None:
    from kpgo.report.sections import _layout_goals

    def geo(**ratios: float) -> dict[str, Any]:
        return {m: {"geomean": {"F / PGO": {"ratio": r}}} for m, r in ratios.items()}

    both = {"kernel_l1i_misses_per_op": 0.80, "kernel_taken_branches_per_op": 0.88, "kernel_insns_per_op": 0.99}
    assert _layout_goals({"against_pgo": {"F": geo(**both)}})[0].endswith(": met.")
    for m, worse in (("kernel_l1i_misses_per_op", 0.86), ("kernel_taken_branches_per_op", 0.91), ("kernel_insns_per_op", 1.001)):
        assert _layout_goals({"against_pgo": {"F": geo(**(both | {m: worse}))}})[0].endswith(": missed.")
    van = {"kernel_l1i_misses_per_op": {"geomean": {"PGO": {"ratio": 0.70}, "vanilla + BOLT": {"ratio": 0.82}}}}
    assert _layout_goals({"against_vanilla": van}) == ["Vanilla + BOLT from branch records alone reaches 60% of GCC PGO's kernel L1i gain "
                                                        "(goal ≥ 60%): met."]


def test_without_the_studies_the_sections_are_skipped(tmp_path: Path) -> None:
    from kpgo import report as rep

    run = tmp_path / "run"
    shutil.copytree(DATA, run)
    skipped = {s.id: s.reason for s in rep.generate(run, tmp_path / "out").skipped}
    assert "variability study" in skipped["variability"] and "layout kernel" in skipped["layout"] and "Clang kernel" in skipped["clang"]
