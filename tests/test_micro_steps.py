"""micro measured per stressor: a fixed count of operations per stress-ng step (parsed from output recorded in a TCG
guest, tests/data/workloads/micro/), a simulator window per load step (the workload's `windows = "step"`: the agent
opens one around each step and records each step's count; bench.sim_steps and sim_per_op turn a recorded report
of such windows into per-step figures and their geometric mean), and the boot-to-boot spread per step."""

from __future__ import annotations

import json
import math
import stat
from pathlib import Path

import pytest

from kpgo import bench, workloads
from kpgo import sim as simulator
from kpgo.errors import InfraError
from kpgo.guest import contract
from test_workloads import agent, recorded_steps

SIMREC = Path(__file__).resolve().parent / "data" / "sim" / "micro-steps"  # a real boot's sim.json and result.json


def test_micro_runs_fixed_counts_in_recorded_output() -> None:
    """Each step of the recorded run did exactly the operations its parameter asks (--X-ops: the total over the
    step's instances), and its rate is that count over the step's real time (the wall-clock metric)."""
    a = agent()
    wl = workloads.load("micro")
    assert wl.windows == "step"
    seen = set()
    for step, name, path in recorded_steps("micro"):
        text = path.read_text()
        family = name.rsplit("-", 1)[0]
        params = dict(wl.params, each=name.rsplit("-", 1)[-1])
        parts, _ = a.parse_step(text, step)
        count = a.op_count(text, step, parts, params)
        assert count == float(wl.params[f"{family}_ops"]), name
        real = float(next(ln.split()[5] for ln in text.splitlines() if ln.startswith("stress-ng: metrc:") and ln.split()[3] == step_stressor(step)))
        assert parts[""] == pytest.approx(count / real, rel=0.01), name
        seen.add(name)
    assert seen == {n for s in wl.load for n, _ in a.expand(s, dict(wl.params))}


def step_stressor(step: contract.Step) -> str:
    """The stress-ng stressor a step runs (its first --NAME option after stress-ng)."""
    argv = list(step.argv)
    return next(a[2:] for a in argv[argv.index("stress-ng") + 1:] if a.startswith("--"))


def test_every_micro_count_splits_evenly_over_its_instances() -> None:
    """stress-ng runs ceil(N / instances) per instance: a count that does not split evenly over 1..16 instances would
    run more than asked (1000 over 16 ran 1008)."""
    wl = workloads.load("micro")
    for key, value in wl.params.items():
        if key.endswith("_ops"):
            assert int(value) % 16 == 0, key


def test_windows_must_be_run_or_step() -> None:
    spec = workloads.load("redis").to_json()
    assert "windows" not in spec  # the default is not written: other workloads' bench keys stay as they were
    spec["windows"] = "stressor"
    assert any("windows must be one of" in p for p in workloads.validate(spec))


def fake_window(tmp_path: Path) -> tuple[Path, Path]:
    """A kpgo-window stand-in that logs its argument."""
    log = tmp_path / "windows.log"
    tool = tmp_path / "kpgo-window"
    tool.write_text(f"#!/bin/sh\necho \"$1\" >> {log}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return tool, log


def steps_workload(windows: str) -> contract.Workload:
    """Two steps, one of them repeated for two values: each prints a rate and a count."""
    step = {"argv": ["sh", "-c", "echo rate 10; echo count {n}"], "metric": "^rate (?P<value>[0-9.]+)", "ops": "^count (?P<value>[0-9]+)"}
    return contract.Workload.from_json({
        "name": "t", "description": "t", "unit": "ops/s", "higher_is_better": True, "aggregate": "geomean", "windows": windows,
        "params": {"n": 7, "m": "3,5"},
        "load": [{"name": "a", **step}, {"name": "b", "each": "m", **step, "argv": ["sh", "-c", "echo rate 20; echo count {each}"]}]})


@pytest.mark.parametrize("windows, marks", [("step", ["open", "close"] * 3), ("run", ["open", "close"])])
def test_agent_opens_a_window_per_step(tmp_path: Path, windows: str, marks: list[str]) -> None:
    """The agent, as it runs in the guest (here on the host, with a stand-in for kpgo-window): with windows = "step"
    one window around each expanded step, in the order of the run's step_ops; with "run" one around them all."""
    a = agent()
    tool, log = fake_window(tmp_path)
    wl = steps_workload(windows)
    run = a.measured_run(wl, dict(wl.params, rundir=str(tmp_path)), 0, str(tmp_path), None, str(tool))
    assert log.read_text().split() == marks
    assert run.step_ops == {"a": 7.0, "b-3": 3.0, "b-5": 5.0} and run.ops == 15.0 and run.ops_method == "count"
    assert contract.Result(ok=True, mode="bench", kernel="x", runs=[run]).window_count(windows) == len(marks) // 2


def test_result_without_step_ops_still_loads() -> None:
    """result.json written before runs had step_ops (a kept bench sample's boot)."""
    run = {"value": 1.0, "parts": {"x": 1.0}, "secondary": {}, "seconds": 1.0, "step_seconds": {"x": 1.0}, "ops": 2.0, "ops_method": "count",
           "ops_estimate": 2.0, "kernel_share": 0.5, "cpu_ticks": {}}
    assert contract.Result.from_json({"ok": True, "mode": "bench", "kernel": "k", "runs": [run]}).runs[0].step_ops == {}


def window(kernel_insns: int, user_insns: int, scale: int = 1) -> dict:
    side = {c: 0 for c in simulator.COUNTERS}
    k = dict(side, insns=kernel_insns, l1i_misses=kernel_insns // 10, l1i_accesses=kernel_insns // 4, itlb_misses=kernel_insns // 100,
             taken_branches=kernel_insns // 7, indirect_branches=kernel_insns // 50)
    u = dict(side, insns=user_insns, l1i_misses=user_insns // 20, l1i_accesses=user_insns // 4, itlb_misses=user_insns // 200,
             taken_branches=user_insns // 9, indirect_branches=user_insns // 70)
    return {"kernel": k, "user": u}


def test_sim_per_op_with_a_window_per_step() -> None:
    """Each step's window over that step's own count; the boot's figure their geometric mean, whatever the counts
    (the old pooled figure, all events over all operations, would follow the step with the most operations); the
    kernel's shares those of the run's events summed."""
    wins = [window(1_000_000, 100_000), window(90_000_000, 1_000_000), window(2_000_000, 200_000), window(80_000_000, 3_000_000)]
    steps = [{"syscall": 10_000.0, "fork": 300.0}, {"syscall": 20_000.0, "fork": 200.0}]  # two runs of two steps
    per = bench.sim_steps(wins, steps, line=64)
    assert list(per) == ["syscall", "fork"]
    assert per["syscall"]["kernel_insns_per_op"] == pytest.approx((100 + 100) / 2)
    assert per["fork"]["kernel_insns_per_op"] == pytest.approx((300_000 + 400_000) / 2)
    assert per["fork"]["kernel_fetch_bytes_per_op"] == pytest.approx((90_000_000 / 4 * 64 / 300 + 80_000_000 / 4 * 64 / 200) / 2)
    boot = bench.sim_per_op(wins, [10_300.0, 20_200.0], line=64, step_ops=steps)
    assert set(boot) == set(bench.SIM_METRICS)
    for m in bench.SIM_HEADLINE:
        assert boot[m] == pytest.approx(math.sqrt(per["syscall"][m] * per["fork"][m]))
    k1, k2 = 91_000_000, 82_000_000
    assert boot["kernel_insn_share"] == pytest.approx((k1 / (k1 + 1_100_000) + k2 / (k2 + 3_200_000)) / 2)
    with pytest.raises(InfraError, match="3 window"):
        bench.sim_per_op(wins[:3], [10_300.0, 20_200.0], step_ops=steps)


def test_sim_per_op_one_window_per_run_is_unchanged() -> None:
    w = window(1_000_000, 100_000)
    assert bench.sim_per_op([w, w], [100.0, 50.0])["kernel_insns_per_op"] == pytest.approx((10_000 + 20_000) / 2)


def test_sim_steps_of_a_recorded_boot() -> None:
    """A real boot of micro on the tiny kernel with the simulator (tests/data/sim/micro-steps: its sim.json and
    result.json as kpgo.vm left them): one window per step, each divided by its own step's count."""
    windows = json.loads((SIMREC / "sim.json").read_text())["windows"]  # as read_windows returns them (format 5)
    result = contract.Result.from_json(json.loads((SIMREC / "result.json").read_text()))
    [run] = result.runs
    assert len(windows) == result.window_count("step") == len(run.step_ops) == 22
    per = bench.sim_steps(windows, [run.step_ops])
    for w, (name, ops) in zip(windows, run.step_ops.items()):
        assert per[name]["kernel_insns_per_op"] == pytest.approx(w["kernel"]["insns"] / ops)
        assert w["closed"] and w["kernel"]["insns"] > 0
    # a fork+exec costs far more kernel work than a round of get* calls or a pipe write/read: unlike operations
    assert per["exec"]["kernel_insns_per_op"] > 20 * per["pipe"]["kernel_insns_per_op"]
    boot = bench.sim_per_op(windows, [run.ops], step_ops=[run.step_ops])
    logs = [math.log(d["kernel_insns_per_op"]) for d in per.values()]
    assert boot["kernel_insns_per_op"] == pytest.approx(math.exp(sum(logs) / len(logs)))


def sample(kernel: str, rnd: int, figs: dict[str, float]) -> dict:
    return {"kernel": kernel, "workload": "micro", "round": rnd,
            "sim_steps": {step: dict.fromkeys(bench.SIM_HEADLINE, v) for step, v in figs.items()}}


def test_step_spread_and_its_table() -> None:
    samples = [sample("vanilla", 0, {"pipe": 100.0, "fork": 1000.0}), sample("vanilla", 1, {"pipe": 110.0, "fork": 1000.0}),
               sample("pgo", 0, {"pipe": 90.0, "fork": 900.0}), sample("pgo", 1, {"pipe": 90.0, "fork": 990.0}),
               {"kernel": "vanilla", "workload": "redis", "round": 0, "sim_steps": None}]
    spread = bench.step_spread(samples)
    assert list(spread) == ["micro"]
    pipe = spread["micro"]["vanilla"]["pipe"]["kernel_insns_per_op"]
    assert pipe["n"] == 2 and pipe["mean"] == pytest.approx(105.0) and pipe["sd"] == pytest.approx(math.sqrt(50))
    assert pipe["cv"] == pytest.approx(math.sqrt(50) / 105)
    assert spread["micro"]["pgo"]["pipe"]["kernel_l1i_misses_per_op"]["cv"] == 0.0
    results = {"baseline": "vanilla", "samples": samples,
               "workloads": {"micro": {"kernels": ["vanilla", "pgo"]}, "redis": {"kernels": ["vanilla"]}}}
    bench.add_step_spread(results)
    assert list(results["workloads"]["micro"]["step_spread"]) == ["vanilla", "pgo"] and "step_spread" not in results["workloads"]["redis"]
    lines = bench.step_spread_lines(results)
    text = "\n".join(lines)
    assert "micro: boot-to-boot spread per load step" in text and "up to 2 boots" in text
    [pipe_row] = [ln for ln in lines if ln.split()[:1] == ["pipe"]]
    assert pipe_row.split()[1:] == ["105", "6.7%/6.7%/6.7%", "0.0%/0.0%/0.0%"]


def test_summarize_adds_the_spread_per_step() -> None:
    """summarize (what results.json and the terminal tables are made from) carries step_spread for micro only."""
    wls = [workloads.load("micro"), workloads.load("redis")]
    kernels = [bench.Kernel("vanilla", Path("/v")), bench.Kernel("pgo", Path("/p"))]
    samples = []
    for rnd in range(2):
        for k, f in (("vanilla", 1.0), ("pgo", 0.9)):
            s = sample(k, rnd, {"pipe": 100.0 * f + rnd, "fork": 1000.0 * f})
            s["mean"] = 10.0 * f + rnd
            s["sim_per_op"] = {m: math.sqrt(100.0 * f * 1000.0 * f) + rnd for m in bench.SIM_METRICS}
            samples.append(s)
            samples.append({"kernel": k, "workload": "redis", "round": rnd, "mean": 5.0 + rnd, "sim_per_op": None})
    res = bench.summarize(kernels, wls, [(k.label, w.name) for w in wls for k in kernels], samples, "vanilla")
    assert "step_spread" not in res["workloads"]["redis"]
    spread = res["workloads"]["micro"]["step_spread"]
    assert list(spread) == ["vanilla", "pgo"] and list(spread["pgo"]) == ["pipe", "fork"]
    assert spread["vanilla"]["pipe"]["kernel_insns_per_op"]["mean"] == pytest.approx(100.5)
