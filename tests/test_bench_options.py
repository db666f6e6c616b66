"""The bench's measurement defaults and its tables, without booting: simulated counters are the
default exactly where guests run under TCG (the accelerator forced through KPGO_ACCEL, as the KVM
probe's cache would decide it), both overridable; the tables lead with simulated figures and list
failed cells."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import workload
from kpgo import bench, cli, sim, vm
from kpgo.commands.common import sim_from
from kpgo.errors import InfraError, UserError
from kpgo.report import present


def _args(*extra: str):  # the real parser of `kpgo bench`
    return cli.make_parser().parse_args(["bench", "--kernel", "a=/x", *extra])


@pytest.mark.parametrize("accel, flags, expect", [
    ("tcg", [], True), ("kvm", [], False),                      # the default follows the machine
    ("tcg", ["--no-sim"], False), ("kvm", ["--sim"], True),     # both overridable
    ("kvm", ["--no-sim"], False), ("tcg", ["--sim"], True),
])
def test_simulated_counters_default_to_tcg(monkeypatch: pytest.MonkeyPatch, accel: str, flags: list[str], expect: bool) -> None:
    monkeypatch.setenv("KPGO_ACCEL", accel)
    choice = sim_from(_args(*flags))
    got = choice.resolve(vm.accelerator(Path("/nonexistent/bzImage")))
    assert (got is not None) == expect
    if expect:
        assert got == sim.SimConfig()


def test_sim_options_carry_over_and_conflict() -> None:
    choice = sim_from(_args("--sim-opt", "l1i_size=16k"))
    assert choice.mode == "auto" and choice.resolve("tcg").l1i_size == 16384
    with pytest.raises(UserError, match="--no-sim"):
        sim_from(_args("--no-sim", "--sim-opt", "l1i_size=16k"))


def _sample(kernel: str, workload: str, rnd: int, value: float, insns: float) -> dict:
    per_op = {m: 1.0 for m in bench.SIM_METRICS} | {"kernel_insns_per_op": insns}
    return {"round": rnd, "kernel": kernel, "workload": workload, "mean": value, "values": [value], "sim_per_op": per_op}


def test_tables_lead_with_simulated_figures_and_list_failures() -> None:
    kernels = [bench.Kernel("vanilla", Path("/v")), bench.Kernel("opt", Path("/o"))]
    wls = [workload("w", unit="ops/s"), workload("bad", unit="ops/s")]
    cells = [(k.label, w.name) for k in kernels for w in wls]
    samples = [_sample("vanilla", "w", r, 100 + r, 1000 + r) for r in range(3)] + [_sample("opt", "w", r, 101 + r, 900 + r) for r in range(3)]
    res = bench.summarize(kernels, wls, cells, samples, "vanilla")
    assert "bad" not in res["workloads"]  # no baseline sample: no ratios
    g = res["sim_geomean"]["opt"]["kernel_insns_per_op"]
    assert g["ratio"] == pytest.approx(901 / 1001) and g["ci_high"] < 1
    res |= {"failed": [{"kernel": "vanilla", "workload": "bad", "round": 0, "error": "workload bad failed in the guest (load)",
                        "console_log": "/b/console.log"}],
            "design": {"boots_per_kernel": 3, "runs_per_boot": 1, "order": "random", "seed": 1, "sequence": [{}] * 12},
            "measurement": {"accelerator": "tcg", "ops_methods": {"w": ["count"]}}, "note": "note"}
    text = bench.format_table(res)
    assert text.index("simulated per operation") < text.index("wall-clock (TCG: indicative only)")
    assert "×0.900" in text and "FAILED boots (1" in text and "/b/console.log" in text
    with pytest.raises(InfraError, match=r"1 of 12 boots failed \(vanilla on bad") as e:  # exit 3: the boot failed, not the user
        bench.raise_if_failed(res, Path("/out"))
    assert type(e.value) is InfraError and e.value.exit_code == 3 and "\n" not in str(e.value)


def test_indirect_branches_are_a_metric_not_a_headline() -> None:
    """Indirect branches per op on both sides, summarized like every count; the headline stays instructions, L1i
    misses and taken branches (results measured before the counter existed have those three)."""
    assert {"kernel_indirect_branches_per_op", "user_indirect_branches_per_op"} <= set(bench.SIM_METRICS)
    assert bench.SIM_HEADLINE == ("kernel_insns_per_op", "kernel_l1i_misses_per_op", "kernel_taken_branches_per_op")
    assert present.metric_title("kernel_indirect_branches_per_op") == "kernel indirect branches/op"
    kernels = [bench.Kernel("vanilla", Path("/v")), bench.Kernel("opt", Path("/o"))]
    samples = [_sample(k, "w", r, 100, 1000) for k in ("vanilla", "opt") for r in range(2)]
    for s in samples:
        s["sim_per_op"]["kernel_indirect_branches_per_op"] = 40.0 if s["kernel"] == "vanilla" else 30.0
    res = bench.summarize(kernels, [workload("w", unit="ops/s")], [(k.label, "w") for k in kernels], samples, "vanilla")
    assert res["workloads"]["w"]["sim"]["opt"]["kernel_indirect_branches_per_op"]["ratio"] == pytest.approx(0.75)
    assert res["sim_geomean"]["opt"]["kernel_indirect_branches_per_op"]["ratio"] == pytest.approx(0.75)
