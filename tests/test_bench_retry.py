"""A bench boot that dies of QEMU TCG's race with the kernel's live text patching ("Oops: int3", recorded from a
real micro boot on the server kernel: tests/data/console/int3-in-window.log) is booted once more, and the sample
says so; any other failure, the same oops under KVM, or a second oops fails the cell as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import fake_boot
from conftest import workload
from kpgo import bench, vm
from kpgo.errors import InfraError

OOPS = Path(__file__).parent / "data" / "console" / "int3-in-window.log"
PANIC = "[   45.8] Kernel panic - not syncing: Fatal exception in interrupt\n"  # a panic that is not the race


def _boot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, consoles: list[str], accel: str) -> tuple[dict[str, Any], int]:
    """measure() one cell whose first len(consoles) boots fail with these console logs, the next one succeeds."""
    calls = 0

    def run_agent(kernel: Path, rundir: Path, job: Any, *, guest: vm.Guest, log: Path, accel: str, sim: Any = None) -> Any:
        nonlocal calls
        calls += 1
        if calls <= len(consoles):
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(consoles[calls - 1])
            raise InfraError("the guest ended (status 255) without a result: Kernel panic - not syncing: Fatal exception in interrupt")
        return fake_boot.fake_run_agent(kernel, rundir, job, guest=guest, log=log, accel=accel, sim=sim)

    monkeypatch.setattr(vm, "run_agent", run_agent)
    image = tmp_path / "bzImage"
    image.write_bytes(b"k" * 100)
    how = bench.BootSpec({"micro": workload("micro")}, 1, vm.Guest(), accel, None)
    step = {"round": 0, "kernel": "vanilla", "workload": "micro"}
    return bench.measure(image, tmp_path / "boot", step, "key", how), calls


def test_the_text_patching_race_is_booted_once_more(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, calls = _boot(tmp_path, monkeypatch, [OOPS.read_text()], "tcg")
    assert calls == 2
    assert out["sample"]["values"] == [100.0]
    assert out["sample"]["retried"] == ["Oops: int3 (QEMU TCG racing the kernel's live text patching): console.log.int3"]
    assert (tmp_path / "boot" / "console.log.int3").read_text() == OOPS.read_text()  # the failed boot's log kept
    assert "fake boot" in (tmp_path / "boot" / "console.log").read_text()


def test_a_clean_boot_records_no_retry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, calls = _boot(tmp_path, monkeypatch, [], "tcg")
    assert calls == 1 and out["sample"]["retried"] == []


@pytest.mark.parametrize("consoles, accel, boots", [
    ([PANIC], "tcg", 1),                                   # another panic: the kernel's, not the emulator's
    ([OOPS.read_text()], "kvm", 1),                        # under KVM the CPU runs the patched text itself
    ([OOPS.read_text(), OOPS.read_text()], "tcg", 2),      # once more, not forever
])
def test_other_failures_fail_the_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, consoles: list[str], accel: str,
                                      boots: int) -> None:
    out, calls = _boot(tmp_path, monkeypatch, consoles, accel)
    assert calls == boots
    assert "sample" not in out and out["error"].startswith("the guest ended (status 255)")
