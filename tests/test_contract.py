"""The contract between host and guest (kpgo.guest.contract): the job and the result round-trip through
their JSON; the guest agent reads the one and writes the other on the host's Python as it does in a guest
(a subprocess, with `mount` faked so that nothing is mounted here); any exception in the agent comes back
with its phase; vm.run_agent's error says why a host client failed. No guest is booted."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from conftest import workload
from kpgo import client, proc, vm, workloads
from kpgo.errors import InfraError
from kpgo.guest import contract

AGENT = Path(vm.AGENT)


def one_step(step: dict[str, Any]) -> contract.Workload:
    """A workload of one load step, nothing else to start."""
    return workload("tiny", aggregate="hmean", load=[{"name": "x", **step}])


RATE = {"argv": ["echo", "rate 5 ops 10"], "metric": r"rate (?P<value>[0-9.]+)", "ops": r"ops (?P<value>[0-9]+)"}


def test_job_round_trip_keeps_the_wire_format() -> None:
    wl = one_step(RATE)
    host = contract.Client(where="host", rundir="/r/client", control_port=7399, guest_addr="10.0.2.15", gateway="10.0.2.2")
    job = contract.Job(mode="collect", workload=wl, runs=2, build_dir="/b", sim=True, sim_boot=False, client=host, tools_dir="/t")
    data = json.loads(json.dumps(job.to_json()))
    assert data == {"mode": "collect", "workload": wl.to_json(), "runs": 2, "build_dir": "/b", "sim": True, "sim_boot": False,
                    "client": {"where": "host", "rundir": "/r/client", "control_port": 7399, "guest_addr": "10.0.2.15",
                               "gateway": "10.0.2.2"}, "tools_dir": "/t"}
    assert contract.Job.from_json(data) == job
    plain = contract.Job(mode="bench", workload=wl)  # no simulator, no host client: their keys are absent, as before
    assert plain.to_json() == {"mode": "bench", "workload": wl.to_json(), "runs": 1, "tools_dir": ""}
    assert contract.Job.from_json(plain.to_json()) == plain


def test_result_round_trip_leaves_unset_fields_out() -> None:
    run = contract.Run(value=5.0, parts={"x": 5.0}, secondary={}, seconds=0.1, step_seconds={"x": 0.1}, ops=10.0,
                       ops_method="count", ops_estimate=0.5, kernel_share=None, cpu_ticks={"user": 1, "kernel": 0, "idle": 3})
    result = contract.Result(ok=True, mode="bench", kernel="6.1.0", timings={"total": 0.2}, runs=[run], env={"HOME": "/h", "TMPDIR": "/t"})
    data = json.loads(json.dumps(result.to_json()))
    assert list(data) == ["ok", "mode", "kernel", "timings", "runs", "env"]
    assert data["runs"][0]["kernel_share"] is None  # a value, not an unset field
    assert contract.Result.from_json(data) == result
    failed = contract.Result(ok=False, mode="bench", kernel="6.1.0", error="boom", phase="load", output_tail="")
    assert contract.Result.from_json(failed.to_json()) == failed and failed.to_json()["output_tail"] == ""


@pytest.fixture
def host_env(tmp_path: Path) -> dict[str, str]:
    """The environment the agent runs in here: a `mount` that does nothing first on PATH (the tests
    run as root, and the agent mounts a tmpfs for its run dir), and its temporary files under tmp_path."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "mount").write_text("#!/bin/sh\nexit 0\n")
    (fake / "mount").chmod(0o755)
    return {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "TMPDIR": str(tmp_path)}


def run_agent_here(job: contract.Job, rundir: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], contract.Result]:
    rundir.mkdir()
    (rundir / "job.json").write_text(json.dumps(job.to_json()))
    cp = subprocess.run([sys.executable, str(AGENT), str(rundir / "job.json")], capture_output=True, text=True, env=env, timeout=120)
    return cp, contract.Result.from_json(json.loads((rundir / "result.json").read_text()))


def test_agent_runs_a_job_and_writes_its_result(tmp_path: Path, host_env: dict[str, str]) -> None:
    cp, result = run_agent_here(contract.Job(mode="bench", workload=one_step(RATE), runs=2), tmp_path / "guest", host_env)
    assert cp.returncode == 0 and "kpgo-agent: ok" in cp.stdout, cp.stdout + cp.stderr
    assert result.ok and result.mode == "bench" and result.error is None and len(result.runs) == 2
    assert [(r.value, r.parts, r.ops, r.ops_method) for r in result.runs] == [(5.0, {"x": 5.0}, 10.0, "count")] * 2
    assert set(result.timings) == {"ready", "prepare", "warmup", "total"}
    assert result.env is not None and Path(result.env["HOME"]).is_relative_to(tmp_path)


@pytest.mark.parametrize(("step", "error", "output"), [
    # the agent's own Failure, as before: its message and the step's output
    ({"argv": ["sh", "-c", "echo no luck; exit 3"], "metric": "x"}, "load step x failed with status 3", "no luck"),
    # anything else: named by its type, its traceback as the output (a metric regex without a value group)
    ({"argv": ["echo", "rate 5"], "metric": r"rate (?P<v>[0-9]+)"}, "IndexError: no such group", "in parse_step"),
], ids=["failure", "unexpected"])
def test_agent_reports_any_exception_with_its_phase(tmp_path: Path, host_env: dict[str, str], step: dict, error: str, output: str) -> None:
    cp, result = run_agent_here(contract.Job(mode="bench", workload=one_step(step)), tmp_path / "guest", host_env)
    assert cp.returncode == 1 and f"kpgo-agent: error: {error}" in cp.stdout, cp.stdout + cp.stderr
    assert not result.ok and result.phase == "load" and result.error == error
    assert result.output_tail is not None and output in result.output_tail
    assert "Traceback" not in cp.stdout and ("Traceback" in cp.stderr) == (error.startswith("IndexError"))  # whole in the console


def fake_boot(env: dict[str, str]) -> Any:
    """proc.run for vm.run_agent without a guest: the command vng would run in the guest (the agent on
    its job) runs here."""
    def run(argv: list[str | Path], *, log: Path, **_: Any) -> proc.Result:
        argv = [str(a) for a in argv]
        cp = subprocess.run(["sh", "-c", argv[argv.index("--exec") + 1]], capture_output=True, text=True, env=env, timeout=120)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(cp.stdout + cp.stderr)
        return proc.Result(argv, cp.returncode, cp.stdout + cp.stderr, 0.0, False)
    return run


def test_run_agent_writes_the_job_and_reads_the_result(tmp_path: Path, host_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proc, "run", fake_boot(host_env))
    kernel = tmp_path / "bzImage"
    kernel.write_bytes(b"not booted")
    job = contract.Job(mode="bench", workload=one_step(RATE))
    result = vm.run_agent(kernel, tmp_path / "guest", job, guest=vm.Guest(), log=tmp_path / "console.log", accel="tcg")
    assert json.loads((tmp_path / "guest" / "job.json").read_text()) == {**job.to_json(), "tools_dir": str(vm.tools_dir())}
    assert result.ok and result.runs[0].value == 5.0 and result.placement == client.Placement("none", 2).as_json()
    # result.json holds the same result, without what the host adds
    assert contract.Result.from_json(json.loads((tmp_path / "guest" / "result.json").read_text())) == replace(result, placement=None)


def test_run_agent_names_an_unexpected_exception_and_its_phase(tmp_path: Path, host_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(proc, "run", fake_boot(host_env))
    kernel = tmp_path / "bzImage"
    kernel.write_bytes(b"not booted")
    job = contract.Job(mode="bench", workload=one_step({"argv": ["echo", "rate 5"], "metric": r"rate (?P<v>[0-9]+)"}))
    with pytest.raises(InfraError) as e:
        vm.run_agent(kernel, tmp_path / "guest", job, guest=vm.Guest(), log=tmp_path / "console.log", accel="tcg")
    assert e.value.message == "workload tiny failed in the guest (load): IndexError: no such group"
    assert "output| IndexError: no such group" in capsys.readouterr().err  # the traceback's tail, in place


def test_host_client_error_is_in_run_agents_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host client could not reach the agent: the error run_agent raises says so, beside the guest's side."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    wl = workloads.load_many("redis", [f"port={port}"], "host")[0]
    control_ports: list[int] = []

    def refused(self: client.HostClient) -> socket.socket:
        raise ConnectionRefusedError(111, "Connection refused")

    def guest_without_client(argv: list[str | Path], *, log: Path, on_line: Any = None, **_: Any) -> proc.Result:
        net = on_line.__self__  # the HostClient serving this boot
        control_ports.append(net.control_port)
        on_line(client.CONTROL_READY)  # the agent listens: the host client tries to connect
        deadline = time.monotonic() + 10
        while net.error is None and time.monotonic() < deadline:
            time.sleep(0.05)
        failed = contract.Result(ok=False, mode="bench", kernel="6.1.0", error="the host client did not connect to the control port within 120 s",
                                 phase="host client", output_tail="")
        (tmp_path / "guest" / "result.json").write_text(json.dumps(failed.to_json()))
        log.write_text("")
        return proc.Result([str(a) for a in argv], 1, "", 0.0, False)

    monkeypatch.setattr(client.HostClient, "_connect", refused)
    monkeypatch.setattr(proc, "run", guest_without_client)
    kernel = tmp_path / "bzImage"
    kernel.write_bytes(b"not booted")
    with pytest.raises(InfraError) as e:
        vm.run_agent(kernel, tmp_path / "guest", contract.Job(mode="bench", workload=wl), guest=vm.Guest(), log=tmp_path / "console.log", accel="tcg")
    assert e.value.message.startswith("workload redis failed in the guest (host client): the host client did not connect to the control port within 120 s; ")
    assert e.value.message.endswith(f"; the host client: could not reach the guest agent's control port through 127.0.0.1:{control_ports[0]}: "
                                    "[Errno 111] Connection refused")
