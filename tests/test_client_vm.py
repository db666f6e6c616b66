"""`--client host` for real: the tiny kernel boots with a virtio NIC, redis serves in the guest and
redis-benchmark runs on the host against the forwarded 127.0.0.1 port, pinned to its own core."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import kpgo
from kpgo import vm, workloads
from kpgo.errors import InfraError
from kpgo.gcov.gcda import ARCS, read_gcda
from kpgo.guest import contract

pytestmark = pytest.mark.vm

# passt carries redis; QEMU's slirp, which mysql needs (it speaks first), stalled here at 24 or more
# concurrent connections (docs/WORKLOADS.md): redis runs with more than that.
CLIENTS = 32


def arcs(profile: Path, rel: str) -> int:
    return int(read_gcda(profile / rel).counters(ARCS).sum())


def test_host_client_profile_holds_the_nic_path(tiny_run: Path, all_profiles: dict[str, Path], test_dir: Path) -> None:
    """The host client's profile (the tiny run's redis: the host is the default placement) runs through
    virtio-net and not the loopback device; a guest client's the other way round."""
    import shutil

    host = all_profiles["redis"]
    meta = json.loads((host / "profile.json").read_text())
    assert meta["workload"]["client"] == "host" and meta["throughput"] > 0
    pl = meta["placement"]
    assert pl["client"] == "host" and pl["forwarded"] == [6379] and pl["vcpus"] >= 1
    assert (host / "log" / "client.log").read_text().count("redis-benchmark") == 2  # warm-up and load ran on the host
    out = test_dir / "collect-redis-guest"
    shutil.rmtree(out, ignore_errors=True)
    res = kpgo("collect", tiny_run / "builds" / "instrumented", "--workload", "redis", "--client", "guest",
               "--set", "redis.requests=10000", "--set", f"redis.clients={CLIENTS}", "-o", out)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "(client on the host)" not in res.stderr
    guest = json.loads((out / "profile.json").read_text())
    assert guest["workload"].get("client", "guest") == "guest" and guest["placement"]["client"] == "guest"
    assert arcs(host, "drivers/net/virtio_net.gcda") > 100_000 and arcs(out, "drivers/net/virtio_net.gcda") == 0
    assert arcs(out, "drivers/net/loopback.gcda") > 100_000 and arcs(host, "drivers/net/loopback.gcda") < arcs(out, "drivers/net/loopback.gcda") / 100


def test_host_client_bench_with_simulated_counters_and_boot(tiny_run: Path, test_dir: Path) -> None:
    import shutil

    out = test_dir / "bench-redis-host"
    shutil.rmtree(out, ignore_errors=True)
    res = kpgo("bench", "--kernel", f"vanilla={tiny_run / 'builds' / 'vanilla'}", "--workload", "redis,mysql", "--client", "host", "--boots", "1",
               "--sim", "--sim-opt", "boot=on", "--set", "redis.requests=10000", "--set", f"redis.clients={CLIENTS}",
               "--set", "mysql.duration=4", "--set", "mysql.warmup_duration=2", "-o", out)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads((out / "results.json").read_text())
    placement = r["measurement"]["placement"]
    assert placement["redis"]["client"] == placement["mysql"]["client"] == "host"
    assert placement["redis"]["network"] == "passt" and placement["mysql"]["network"] == "slirp"  # mysql greets first
    [my] = [s for s in r["samples"] if s["workload"] == "mysql"]
    assert my["mean"] > 0 and my["sim_per_op"]["kernel_insns_per_op"] > 1000
    assert not subprocess.run(["pgrep", "-x", "passt"], capture_output=True).stdout  # passt ends with its boot
    [s] = [s for s in r["samples"] if s["workload"] == "redis"]
    assert s["ops_method"] == ["count"] and s["ops"] == [20000.0]  # -n 10000 for each of set, get: exact
    assert s["sim_per_op"]["kernel_insns_per_op"] > 1000
    assert s["sim_boot"]["kernel"]["insns"] > 10_000_000  # power-on to the agent: the kernel's boot
    assert "boot, power-on to the agent" in res.stdout


def test_server_that_never_comes_up_ends_cleanly(tiny_run: Path, tmp_path: Path) -> None:
    """The server fails before the handshake: one error naming the phase, the guest shut down (no QEMU
    left), the logs kept."""
    wl = workloads.load_many("redis", client="host")[0]
    assert wl.server is not None
    wl = replace(wl, server=replace(wl.server, argv=("false",)))
    kernel = tiny_run / "builds" / "vanilla" / "arch" / "x86" / "boot" / "bzImage"
    rundir = tmp_path / "guest"
    with pytest.raises(InfraError) as e:
        vm.run_agent(kernel, rundir, contract.Job(mode="bench", workload=wl, runs=1), guest=vm.Guest(timeout=600), log=tmp_path / "console.log", accel="tcg")
    assert "(server start)" in e.value.message and "before it was ready" in e.value.message
    assert (tmp_path / "console.log").is_file() and json.loads((rundir / "result.json").read_text())["phase"] == "server start"
    left = subprocess.run(["pgrep", "-f", str(rundir)], capture_output=True, text=True).stdout.split()
    assert not left, f"processes outlived the guest: {left}"
