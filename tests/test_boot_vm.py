"""A guest that does not start kpgo's agent in time is killed and booted once more, then the boot fails with one
line naming the start deadline, long before the whole guest timeout (vm.Guest.start_timeout). Under TCG a boot
hangs now and then (a vCPU whose timer never fires: RCU stall reports, then silence); before the deadline
existed such a boot cost the full 900 s. Two short boots of the tiny kernel."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conftest import workload
from kpgo import vm
from kpgo.errors import InfraError
from kpgo.guest import contract
from kpgo.kernel import kbuild

pytestmark = pytest.mark.vm


def test_a_boot_without_the_agent_in_time_is_retried_then_fails(tiny_run: Path, tmp_path: Path) -> None:
    kernel = kbuild.image(tiny_run / "builds" / "vanilla")
    job = contract.Job(mode="bench", workload=workload("never"))
    guest = vm.Guest(start_timeout=1.0)  # no kernel reaches the agent in 1 s, so every boot counts as hung
    log = tmp_path / "console.log"
    t0 = time.monotonic()
    with pytest.raises(InfraError, match=r"did not start kpgo's agent within 1 s, twice") as e:
        vm.run_agent(kernel, tmp_path / "guest", job, guest=guest, log=log, accel=vm.accelerator(kernel))
    assert time.monotonic() - t0 < 120, "the start deadline, not the guest timeout, ended the boots"
    assert str(log) in (e.value.hint or "")
    assert log.with_name(log.name + ".stalled").is_file() and log.is_file()  # both boots' consoles kept
