"""Client placement (`--client host`): the load generator on the host, the server in the guest
behind its virtio NIC. Unit checks of the plan and the QEMU command line here; the real guests in
test_client_vm.py."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from conftest import assert_one_line_error, kpgo
from kpgo import client, proc, vm, workloads
from kpgo.errors import UserError

NETWORK = ["apache", "memcached", "mysql", "nginx", "postgresql", "redis"]


def test_only_network_workloads_take_a_host_client() -> None:
    specs = {s.name: s for s in workloads.load_many("all", client="host")}
    assert sorted(n for n, s in specs.items() if client.placement_of(s) == "host") == NETWORK
    assert {client.placement_of(specs[n]) for n in ("micro", "leveldb", "rocksdb")} == {"none"}
    for n in NETWORK:  # the client steps are the warm-up and the measured load, nothing else
        s = specs[n]
        assert all(st.client for kind in ("warmup", "load") for st in getattr(s, kind))
        assert not any(st.client for kind in ("setup", "prepare") for st in getattr(s, kind))
    # guest placement (the default) adds nothing to the spec, so keys derived from it stay as they were
    assert "client" not in workloads.load("redis").to_json()


def test_client_flag_only_on_steps_that_drive_the_server() -> None:
    spec = workloads.load("redis").to_json()
    spec["prepare"] = [{"name": "p", "argv": ["true"], "client": True}]
    assert any("client = true" in p for p in workloads.validate(spec))
    spec = workloads.load("rocksdb").to_json()  # no server to drive (micro's holds kernel state, docs/WORKLOADS.md)
    spec["load"][0]["client"] = True
    assert any("client = true" in p for p in workloads.validate(spec))


def test_forwards_from_127_0_0_1_only(tmp_path: Path) -> None:
    """The command lines: QEMU's NIC on a stream to passt, passt forwarding the workload's port and the
    control port from 127.0.0.1 only, TCP only, pinned beside the client; QEMU on the other cores."""
    wl = workloads.load_many("redis", ["port=6399"], "host")[0]
    placement = client.plan(wl, None)
    net = client.HostClient(wl, placement, tmp_path / "client", tmp_path / "client.log")
    kernel = tmp_path / "bzImage"
    kernel.write_bytes(b"")
    argv = [str(a) for a in vm.vng_argv(kernel, "true", guest=vm.Guest(), accel="tcg", net=net)]
    [opts] = [a for a in argv if a.startswith("--qemu-opts=") and "netdev" in a]
    assert f"-netdev stream,id=kpgonet,server=off,addr.type=unix,addr.path={net.socket} " in opts and "virtio-net-pci" in opts
    assert "hostfwd" not in opts and "-netdev user" not in opts
    passt = net.passt_argv()
    fwds = [passt[i + 1] for i, a in enumerate(passt) if a == "--tcp-ports"]
    assert fwds == ["127.0.0.1/6399", f"127.0.0.1/{net.control_port}:{client.CONTROL_PORT}"]
    for off in ("--no-udp", "--no-icmp", "--no-dhcp", "--ipv4-only"):
        assert off in passt
    assert not any(a in passt for a in ("-u", "--udp-ports", "-T", "-U"))
    if len(os.sched_getaffinity(0)) >= 2:  # QEMU pinned to the cores the client leaves, passt beside the client
        cores = sorted(os.sched_getaffinity(0))
        assert argv[:3] == ["taskset", "-c", ",".join(map(str, cores[:-1]))]
        assert passt[:3] == ["taskset", "-c", str(cores[-1])]
        assert placement.client_cpus == (cores[-1],) and placement.vcpus == len(cores) - 1
        assert argv[argv.index("--cpus") + 1] == str(len(cores) - 1)
    assert placement.network == "passt"
    net.close()


def test_a_missing_program_under_taskset_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pinned program is checked before taskset runs it: without virtme-ng, the boot of a host-client workload is the
    one-line error naming the package (it was taskset's "failed to execute vng" from the guest's end)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: nothing is pinned")
    wl = workloads.load_many("redis", ["port=6399"], "host")[0]
    net = client.HostClient(wl, client.plan(wl, None), tmp_path / "client", tmp_path / "client.log")
    kernel = tmp_path / "bzImage"
    kernel.write_bytes(b"")
    monkeypatch.setattr(proc, "search_path", lambda: "/usr/sbin:/usr/bin:/sbin:/bin")  # where pip never puts vng
    with pytest.raises(UserError) as e:
        vm.vng_argv(kernel, "true", guest=vm.Guest(), accel="tcg", net=net)
    assert "required tool 'vng' not found" in e.value.message and "virtme-ng" in (e.value.hint or "")
    with pytest.raises(UserError, match="'redis-benchmark-x' not found"):
        proc.pinned(["redis-benchmark-x", "-n", "1"], (0,))
    assert proc.pinned(["redis-benchmark-x"], None) == ["redis-benchmark-x"]  # not pinned: run() checks it
    net.close()


def _other_local_address() -> str | None:
    """An address of this host that is not loopback (where a forward bound to 0.0.0.0 would also listen)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing address
        except OSError:
            return None
        addr = s.getsockname()[0]
    return None if addr.startswith("127.") else addr


def test_passt_listens_on_127_0_0_1_only(tmp_path: Path) -> None:
    """The real passt with kpgo's command line (no guest): the forwarded ports accept on 127.0.0.1 and
    nowhere else, and stopping it leaves nothing listening."""
    port = client._free_port()
    wl = workloads.load_many("redis", [f"port={port}"], "host")[0]
    net = client.HostClient(wl, client.plan(wl, None), tmp_path / "client", tmp_path / "client.log")
    net._start_network()
    try:
        for p in (port, net.control_port):
            socket.create_connection(("127.0.0.1", p), timeout=5).close()
            other = _other_local_address()
            if other is not None:
                with pytest.raises(OSError):
                    socket.create_connection((other, p), timeout=5).close()
    finally:
        net.stop()
        net.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    assert not net.socket.parent.exists()


def test_a_server_that_speaks_first_goes_through_slirp(tmp_path: Path) -> None:
    """mysql greets first, which Debian 12's passt cannot forward: QEMU's slirp, restricted, forwarding from 127.0.0.1 only."""
    specs = {s.name: s for s in workloads.load_many("all", client="host") if client.placement_of(s) == "host"}
    assert {n: client.network_of(s) for n, s in specs.items()} == {n: "slirp" if n == "mysql" else "passt" for n in NETWORK}
    wl = specs["mysql"]
    net = client.HostClient(wl, client.plan(wl, None), tmp_path / "client", tmp_path / "client.log")
    opts = net.qemu_opts()
    fwds = [f.split()[0] for f in opts.split(",") if f.startswith("hostfwd=")]
    control = f"hostfwd=tcp:127.0.0.1:{net.control_port}-{client.GUEST_ADDR}:{client.CONTROL_PORT}"
    assert fwds == [f"hostfwd=tcp:127.0.0.1:3307-{client.GUEST_ADDR}:3307", control]
    assert "restrict=on" in opts and "stream" not in opts
    net._start_network()  # nothing to start: slirp is QEMU's own
    assert net._passt is None
    net.close()


def test_missing_passt_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client.proc, "which", lambda tool: None)
    with pytest.raises(UserError, match="the host client of redis needs passt") as e:
        client.check_network(workloads.load_many("redis", client="host")[0])
    assert "apt-get install passt" in str(e.value.hint)
    client.check_network(workloads.load_many("mysql", client="host")[0])  # slirp: passt not needed


def test_guest_placement_keeps_the_command_line() -> None:
    wl = workloads.load("redis")
    assert client.plan(wl, None) == client.Placement("guest", 2)
    assert client.plan(wl, 3).vcpus == 3
    assert client.plan(workloads.load_many("redis", client="host")[0], 1).vcpus == 1  # --cpus wins


def test_busy_host_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(UserError, match=f"port {port} on the host's 127.0.0.1 is in use"):
            client.check_ports_free(workloads.load_many("redis", [f"port={port}"], "host")[0])
        # the command refuses before any build or boot (the build dir need not even exist)
        res = kpgo("collect", tmp_path / "nobuild", "--workload", "redis", "--client", "host", "--set", f"redis.port={port}", "-o", tmp_path / "p")
    assert_one_line_error(res, 1, f"port {port} on the host's 127.0.0.1 is in use", "--set redis.port=N")
    assert not (tmp_path / "p").exists()


def test_connections_left_in_time_wait_do_not_hold_the_port() -> None:
    """After a boot the port's closed connections linger in TIME_WAIT (the server side closed first, as apache's does
    under ab); the next boot's check must pass, as passt's and slirp's listeners (SO_REUSEADDR) would."""
    with socket.socket() as ls:
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", 0))
        ls.listen()
        port = ls.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as c:
            conn, _ = ls.accept()
            conn.close()  # the server side closes first: its end of the connection goes to TIME_WAIT on `port`
            c.recv(1)
    with socket.socket() as probe, pytest.raises(OSError):
        probe.bind(("127.0.0.1", port))  # a plain bind still fails: the case the check must not refuse
    client.check_ports_free(workloads.load_many("redis", [f"port={port}"], "host")[0])


@pytest.mark.parametrize("port", ["0", "70000", str(client.CONTROL_PORT)])
def test_unforwardable_port_is_refused(tmp_path: Path, port: str) -> None:
    res = kpgo("collect", tmp_path / "nobuild", "--workload", "redis", "--client", "host", "--set", f"redis.port={port}", "-o", tmp_path / "p")
    assert_one_line_error(res, 1, f"port {port} cannot be forwarded")


def test_unknown_placement_is_refused(tmp_path: Path) -> None:
    res = kpgo("collect", tmp_path / "nobuild", "--workload", "redis", "--client", "elsewhere", "-o", tmp_path / "p")
    assert res.returncode == 2 and "invalid choice: 'elsewhere'" in res.stderr and "Traceback" not in res.stderr
