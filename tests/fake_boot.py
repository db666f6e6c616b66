"""A stand-in for a guest boot (no QEMU), for the fast tests of `kpgo bench` with and without --cluster.

install() replaces kpgo.vm.run_agent with fake_run_agent: in this process, or in every Ray worker of a test's job
(ray.init(runtime_env={"worker_process_setup_hook": "fake_boot.install"}), with this directory on the workers'
PYTHONPATH). A fake boot writes a console log and a guest file, waits KPGO_FAKE_BOOT_SECONDS (default 0) so a test
can act during it, and returns one run per measured run whose value is the kernel image's size: two kernels differ,
and every boot of a kernel gives the same figure, unless KPGO_FAKE_BOOT_SPREAD gives it a spread: then each boot its own
figure, drawn from the boot (its directory's name, which names its round, workload and kernel) and the kernel's size, so
a boot gives the same figure wherever it runs (this machine, a cluster node) and however often. A fake collection
(a job of mode collect) also writes the guest's gcda.tar: the .gcda files under KPGO_FAKE_GCDA (a profile directory the test made with GCC), the way the agent
snapshots the kernel's; a workload whose name starts with "broken" fails in the guest after its console log, one whose
name starts with "quiet" has a tenth of the spread."""

from __future__ import annotations

import os
import random
import tarfile
import time
from pathlib import Path
from typing import Any

from kpgo import vm
from kpgo.errors import InfraError
from kpgo.guest import contract

SECONDS = "KPGO_FAKE_BOOT_SECONDS"
SPREAD = "KPGO_FAKE_BOOT_SPREAD"  # cv of a normal boot-to-boot spread of the figure (default 0: every boot the same)
GCDA = "KPGO_FAKE_GCDA"


def fake_run_agent(kernel: Path, rundir: Path, job: contract.Job, *, guest: vm.Guest, log: Path, accel: str,
                   sim: Any = None) -> contract.Result:
    rundir.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"fake boot of {kernel} under {accel}\n")
    (rundir / "load-0.txt").write_text(f"{job.workload.name}\n")
    time.sleep(float(os.environ.get(SECONDS, "0")))
    if job.workload.name.startswith("broken"):
        raise InfraError(f"workload {job.workload.name} failed in the guest (load): a fake failure")
    if job.mode == "collect":
        with tarfile.open(rundir / "gcda.tar", "w") as tar:
            tar.add(os.environ[GCDA], arcname=".")
    value = float(kernel.stat().st_size)
    spread = float(os.environ.get(SPREAD, "0")) / (10 if job.workload.name.startswith("quiet") else 1)
    if spread:  # boot-to-boot spread: not the paths, which differ between a bench here and a node's task
        value *= 1 + spread * random.Random(f"{kernel.stat().st_size}:{rundir.parent.name}").gauss(0.0, 1.0)
    run = contract.Run(value=value, parts={"fake": value}, secondary={}, seconds=1.0, step_seconds={}, ops=value,
                       ops_method="count", ops_estimate=value, kernel_share=0.5, cpu_ticks={})
    return contract.Result(ok=True, mode=job.mode, kernel="6.12.0-fake", runs=[run] * job.runs,
                           gcda_read_first=[0, 0] if job.mode == "collect" else None)


def install() -> None:
    vm.run_agent = fake_run_agent  # type: ignore[assignment]
