"""`--precision`: a bench adds randomized rounds (every cell of the workloads with a wide cell) until every cell's
interval is narrow enough or a cap is hit, and a bench's plan (seed, order, rounds, the workloads of an added round)
is on disk before its first boot, so an interrupted bench resumes the same order (fake boots with a spread:
tests/fake_boot.py)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import fake_boot
from conftest import workload
from kpgo import bench, vm
from kpgo.errors import UserError
from test_cluster_bench import TESTS, fake_build

FAKE = f"import sys; sys.path.insert(0, {str(TESTS)!r}); import fake_boot; fake_boot.install()"


@pytest.fixture
def kernels(tmp_path: Path) -> list[bench.Kernel]:
    return [bench.Kernel("vanilla", fake_build(tmp_path / "k1", "aaaa1111", 4000)),
            bench.Kernel("optimized", fake_build(tmp_path / "k2", "bbbb2222", 3800))]


@pytest.fixture
def spread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vm, "run_agent", fake_boot.fake_run_agent)
    monkeypatch.setenv("KPGO_ACCEL", "tcg")
    monkeypatch.setenv(fake_boot.SPREAD, "0.02")


def _run(kernels: list[bench.Kernel], out: Path, **design: Any) -> dict[str, Any]:
    return bench.bench(kernels, [workload("fake"), workload("other")], out, design=bench.Design(seed=5, **design), guest=vm.Guest())


def _half_width_after(res: dict[str, Any], kernels: list[bench.Kernel], rounds: int) -> float:
    """The widest cell's half-width with only the first `rounds` rounds' samples."""
    got = [s for s in res["samples"] if s["round"] < rounds]
    cells = [(k.label, w) for w in ("fake", "other") for k in kernels]
    summary = bench.summarize(kernels, [workload("fake"), workload("other")], cells, got, "vanilla")
    return max(c["half_width"] for c in bench.wide_cells(summary, "speedup", 0.0))


def test_rounds_are_added_until_every_cell_is_within_the_target(kernels: list[bench.Kernel], tmp_path: Path, spread: None) -> None:
    res = _run(kernels, tmp_path / "b", boots=2, precision=0.03, max_boots=12)
    p = res["design"]["precision"]
    assert p["stopped"] == "met" and p["wide"] == [] and p["metric"] == "speedup"
    rounds = p["rounds"]
    assert 2 < rounds < 12 and res["design"]["boots_per_kernel"] == rounds
    assert len(res["samples"]) == 2 * sum(res["design"]["boots_by_workload"].values())  # each round: every cell of its workloads once
    assert max(res["design"]["boots_by_workload"].values()) == rounds
    assert _half_width_after(res, kernels, rounds) <= 0.03 < _half_width_after(res, kernels, rounds - 1)
    assert f"every cell within it after {rounds} round(s)" in bench.format_table(res)
    assert json.loads((tmp_path / "b" / "plan.json").read_text())["rounds"] == rounds


def test_added_rounds_hold_only_the_workloads_still_wide(kernels: list[bench.Kernel], tmp_path: Path, spread: None) -> None:
    """A workload narrow after the first rounds gets no more boots; the other's every cell (baseline included) goes on
    in rounds of its own, recorded in the plan before they are booted."""
    wls = [workload("fake"), workload("quiet")]
    res = bench.bench(kernels, wls, tmp_path / "b", design=bench.Design(seed=5, boots=2, precision=0.03, max_boots=12), guest=vm.Guest())
    p, d = res["design"]["precision"], res["design"]
    assert p["stopped"] == "met" and 2 < p["rounds"] == d["boots_per_kernel"]
    assert d["boots_by_workload"] == {"fake": p["rounds"], "quiet": 2}
    per_cell = {(k.label, w): sum(1 for s in res["samples"] if (s["kernel"], s["workload"]) == (k.label, w)) for k in kernels for w in ("fake", "quiet")}
    assert per_cell == {("vanilla", "fake"): p["rounds"], ("optimized", "fake"): p["rounds"], ("vanilla", "quiet"): 2, ("optimized", "quiet"): 2}
    assert all(s["workload"] == "fake" for s in res["design"]["sequence"] if s["round"] >= 2)
    plan = json.loads((tmp_path / "b" / "plan.json").read_text())
    assert plan["partial"] == {str(i): ["fake"] for i in range(2, p["rounds"])}
    assert bench.plan([(k.label, w) for w in ("fake", "quiet") for k in kernels], p["rounds"], "random", 5,
                      {int(i): w for i, w in plan["partial"].items()}) == res["design"]["sequence"]
    assert f"2–{p['rounds']} boots per kernel and workload (fake {p['rounds']}; the others 2)" in bench.format_table(res)


def test_a_bench_stopped_in_an_added_round_resumes_it(kernels: list[bench.Kernel], tmp_path: Path, spread: None,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped at the 10th boot (in the third round, one --precision added for one workload), the same bench again
    boots what was left of the same plan: the sequence and the samples of a bench never stopped."""
    wls = [workload("fake"), workload("quiet")]
    design = bench.Design(seed=5, boots=2, precision=0.03, max_boots=12)
    whole = bench.bench(kernels, wls, tmp_path / "whole", design=design, guest=vm.Guest())
    assert whole["design"]["boots_by_workload"]["quiet"] == 2 < whole["design"]["boots_by_workload"]["fake"]

    booted = []

    def stopped_at_ten(*args: Any, **kw: Any) -> Any:
        if len(booted) == 9:
            raise KeyboardInterrupt
        booted.append(1)
        return fake_boot.fake_run_agent(*args, **kw)

    monkeypatch.setattr(vm, "run_agent", stopped_at_ten)
    with pytest.raises(KeyboardInterrupt):
        bench.bench(kernels, wls, tmp_path / "b", design=design, guest=vm.Guest())
    assert json.loads((tmp_path / "b" / "plan.json").read_text())["partial"] == {"2": ["fake"]}
    monkeypatch.setattr(vm, "run_agent", fake_boot.fake_run_agent)
    res = bench.bench(kernels, wls, tmp_path / "b", design=design, guest=vm.Guest())
    assert res["design"]["sequence"] == whole["design"]["sequence"]
    assert [(s["round"], s["kernel"], s["workload"], s["mean"]) for s in res["samples"]] == \
        [(s["round"], s["kernel"], s["workload"], s["mean"]) for s in whole["samples"]]


def test_the_boots_cap_stops_it_and_names_the_wide_cells(kernels: list[bench.Kernel], tmp_path: Path, spread: None) -> None:
    res = _run(kernels, tmp_path / "b", boots=2, precision=0.001, max_boots=4)
    p = res["design"]["precision"]
    assert p["stopped"] == "max_boots" and p["rounds"] == 4 and len(res["samples"]) == 16
    assert sorted((c["kernel"], c["workload"]) for c in p["wide"]) == [("optimized", "fake"), ("optimized", "other")]
    assert all(0.001 < c["half_width"] < math.inf for c in p["wide"])
    table = bench.format_table(res)
    assert "stopped at --max-boots 4 after 4 round(s) with 2 cell(s) wider: optimized on fake ±" in table


def test_the_time_cap_begins_no_round_that_would_not_fit(kernels: list[bench.Kernel], tmp_path: Path, spread: None,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fake_boot.SECONDS, "0.2")  # a round of 4 boots: ~0.8 s
    res = _run(kernels, tmp_path / "b", boots=2, precision=0.001, max_boots=10, max_time=2.0)
    p = res["design"]["precision"]
    assert p["stopped"] == "max_time" and p["rounds"] == 2 and len(res["samples"]) == 8
    assert "stopped at --max-time 2s after 2 round(s)" in bench.format_table(res)


def test_precision_options_are_checked_before_any_boot(kernels: list[bench.Kernel], tmp_path: Path, spread: None) -> None:
    with pytest.raises(UserError, match="--precision needs --boots of at least 2"):
        _run(kernels, tmp_path / "b", boots=1, precision=0.01)
    with pytest.raises(UserError, match="between 0 and 1"):
        _run(kernels, tmp_path / "b", boots=2, precision=1.5)
    assert not (tmp_path / "b").exists()


def _kill_after(args: list[str], env: dict[str, str], out: Path, samples: int) -> None:
    """Start `kpgo ARGS` with fake boots and SIGKILL it once `samples` boots have finished."""
    p = subprocess.Popen([sys.executable, "-c", FAKE + "\nfrom kpgo.cli import main; sys.exit(main(sys.argv[1:]))", *args],
                         env={**os.environ, **env}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(list(out.glob("boots/*/sample.json"))) < samples:
        assert p.poll() is None, p.stderr.read() if p.stderr else ""
        assert time.monotonic() < deadline, "the bench made no progress"
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", FAKE + "\nfrom kpgo.cli import main; sys.exit(main(sys.argv[1:]))", *args],
                          env={**os.environ, **env}, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("extra, killed_at", [([], 3), (["--precision", "0.001", "--max-boots", "4"], 13)])
def test_a_killed_bench_resumes_its_plan(kernels: list[bench.Kernel], tmp_path: Path, extra: list[str], killed_at: int) -> None:
    """SIGKILL mid-bench (in its first rounds, or in a round --precision added), then the same command: the boots of
    both invocations ran in the order of the plan results.json records, under the seed plan.json held from the start."""
    out = tmp_path / "b"
    args = ["bench", "--kernel", f"vanilla={kernels[0].build_dir}", "--kernel", f"optimized={kernels[1].build_dir}",
            "--workload", "redis,micro", "--client", "guest", "--boots", "3", "--no-sim", "-o", str(out), *extra]  # no host port
    env = {"KPGO_ACCEL": "tcg", fake_boot.SPREAD: "0.02", fake_boot.SECONDS: "0.3"}
    _kill_after(args, env, out, killed_at)
    plan = json.loads((out / "plan.json").read_text())
    assert not (out / "results.json").exists()
    done = _cli(args, env)
    assert done.returncode == 0, done.stderr
    assert f"{killed_at} of " in done.stderr and "boots kept from an earlier bench" in done.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["design"]["seed"] == plan["seed"]
    ran = [(s["round"], s["kernel"], s["workload"]) for s in sorted(res["samples"], key=lambda s: s["finished_at"])]
    assert ran == [(s["round"], s["kernel"], s["workload"]) for s in res["design"]["sequence"]]
    if extra:
        assert res["design"]["precision"]["stopped"] == "max_boots" and len(ran) == 16
