"""The studies on the session's tiny run, for real.

`share` (the vanilla kernel with simulated counters, one boot per workload) runs in every `make test`.
`universal`, `cross` on the same copy and `sensitivity` build three more kernels and collect two more
profiles (~35 min on 2 cores), so they are marked `slow`: deselected by default (pyproject addopts),
run with `make test PYTEST_ARGS='-m slow'`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import MICRO_OPS, assert_one_line_error, copy_of_run, kpgo

pytestmark = pytest.mark.vm


def test_share_study(tiny_run: Path) -> None:
    res = kpgo("study", "share", tiny_run, "--boots", "1")
    assert res.returncode == 0, res.stderr[-2000:]
    table = json.loads((tiny_run / "studies" / "share" / "share.json").read_text())
    assert set(table) == {"redis", "micro"}
    for row in table.values():
        for key in ("cpu_time", "kernel_insn_share", "kernel_l1i_share", "kernel_itlb_share"):
            assert 0 < row[key] < 1, (key, row)
    # a network server runs mostly kernel code; the printed table says so in words
    assert table["redis"]["kernel_insn_share"] > 0.5
    assert "kernel's share" in res.stdout and "redis" in res.stdout
    results = json.loads((tiny_run / "studies" / "share" / "results.json").read_text())
    assert results["measurement"]["sim"]["l1i_size"] == 32768 and list(results["kernels"]) == ["vanilla"]


def test_share_experiment_gets_its_own_directory(tiny_run: Path) -> None:
    """An experiment on the shares (one workload, a parameter varied) is measured beside, not into, the run's share
    study: studies/share-clients/ holds a cell per value; a workload the run does not have is one line."""
    res = kpgo("study", "share", tiny_run, "--workload", "redis", "--vary", "clients=1,32", "--boots", "1")
    assert res.returncode == 0, res.stderr[-2000:]
    table = json.loads((tiny_run / "studies" / "share-clients" / "share.json").read_text())
    assert set(table) == {"redis+clients-1", "redis+clients-32"} and all(0 < r["kernel_insn_share"] < 1 for r in table.values())
    assert_one_line_error(kpgo("study", "share", tiny_run, "--workload", "nginx"), 1, "is not one of the run's workloads")
    assert_one_line_error(kpgo("study", "share", tiny_run, "--vary", "clients=1,32"), 1, "--vary needs one --workload")


def test_study_needs_a_run(tmp_path: Path) -> None:
    assert_one_line_error(kpgo("study", "share", tmp_path), 1, "no finished kpgo run")
    assert_one_line_error(kpgo("study", "sensitivity", tmp_path, "--workload", "micro", "--vary", "procs=1"), 1, "two or more values")


@pytest.fixture(scope="module")
def studies_run(tiny_run: Path, test_dir: Path) -> Path:
    """A copy of the session run to add studies to."""
    return copy_of_run(tiny_run, test_dir / "run-studies")


@pytest.mark.slow
def test_universal_and_cross_studies(studies_run: Path) -> None:
    res = kpgo("study", "universal", studies_run)
    assert res.returncode == 0, res.stderr[-3000:]
    run = json.loads((studies_run / "run.json").read_text())
    assert set(run["studies"]) == {"cross", "universal"}
    for label, normalized in (("universal-raw", False), ("universal-norm", True)):
        merged = json.loads((studies_run / "profiles" / label / "profile.json").read_text())["merged"]
        assert merged["normalize"] is normalized and len(merged["inputs"]) == 2
        assert run["universal"][label]["proof"]["ok"]  # GCC used the merged profile
    inputs = json.loads((studies_run / "profiles" / "universal-norm" / "profile.json").read_text())["merged"]["inputs"]
    scaled = [i["total_arcs"] * i["scale"] for i in inputs]
    assert scaled[0] == pytest.approx(scaled[1], rel=1e-6)  # normalized: both inputs weigh the same
    assert min(i["scale"] for i in inputs) == 1.0 < max(i["scale"] for i in inputs)  # the smaller one scaled up
    results = json.loads((studies_run / "bench" / "results.json").read_text())
    for n in ("redis", "micro"):
        assert {r["kernel"] for r in results["workloads"][n]["summary"]} == {
            "vanilla", "optimized-redis", "optimized-micro", "universal-raw", "universal-norm"}
    assert {"universal-raw", "universal-norm"} <= set(results["geomean"])
    assert "universal-norm" in (studies_run / "summary.md").read_text()


@pytest.mark.slow
def test_sensitivity_study(studies_run: Path) -> None:
    res = kpgo("study", "sensitivity", studies_run, "--workload", "micro", "--vary", "procs=1,4", *(a for o in MICRO_OPS for a in ("--set", o)), "--boots", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    out = studies_run / "studies" / "sensitivity"
    results = json.loads((out / "results.json").read_text())
    names = ["micro+procs-1", "micro+procs-4"]
    assert list(results["workloads"]) == names
    assert results["workloads"]["micro+procs-4"]["params"]["procs"] == "4"
    for n in names:
        assert {r["kernel"] for r in results["workloads"][n]["summary"]} == {"vanilla", "optimized-micro+procs-1", "optimized-micro+procs-4"}
    for n in names:
        meta = json.loads((out / "profiles" / f"{n}.raw" / "profile.json").read_text())
        assert meta["workload"]["params"]["procs"] == n[-1]
        assert (studies_run / "builds" / f"optimized-{n}" / "proof.json").is_file()
