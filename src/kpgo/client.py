"""The host side of a workload whose load generator runs on the host (`--client host`).

The guest serves through its virtio-net device on a user-mode network that forwards the workload's
ports from the host's 127.0.0.1 only (and one more port for a control connection): passt, connected
by QEMU's `-netdev stream`, or QEMU's own slirp for a server that speaks first. slirp's forwarding
socket listens with a backlog of 1, so under TCG with 24 or more clients connecting at once it
stalls; passt does not, but Debian 12's passt (2023-03) acknowledges the guest's SYN-ACK of a
forwarded connection only when the host side sends, so a server that greets first (MySQL) never
completes the handshake through it (docs/WORKLOADS.md, "Which user-mode network").

The guest agent stays in charge of the run exactly as with a guest client (server start, warm-up,
counter reset, simulator window, parsing): for each client step it sends the filled command line
over the control connection, this module runs it on the host (pinned to its own core) and answers
with its exit status and output. The handshake needs no guessed sleeps: the host connects once the
agent prints CONTROL_READY on the console, and the agent waits for that connection.

Protocol (one JSON object per line): host → {"op": "hello"} answered by agent → {"op": "hello"}; then
agent → {"op": "run", "argv": [...], "timeout": s, "what": str} answered by {"status": int, "output": str,
"timed_out": bool}; agent → {"op": "bye"} at the end."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

from kpgo import atomic, proc
from kpgo.errors import UserError
from kpgo.guest import contract

GUEST_ADDR = "10.0.2.15"  # the guest's address on its NIC (QEMU user networking's, kept with passt)
GATEWAY = "10.0.2.2"  # the host as the guest sees it: forwarded connections come from here
CONTROL_PORT = 7399  # the agent's control port inside the guest
CONTROL_READY = "kpgo-agent: control ready"
HELLO_SECONDS = 30  # from the host's connect to the agent's hello (a TCG guest accepting under load)
PLACEMENTS = ("guest", "host")


def has_client(workload: contract.Workload) -> bool:
    """A workload whose load generator can run outside the guest: a server with client steps."""
    return workload.server is not None and any(s.client for s in workload.warmup + workload.load)


def placement_of(workload: contract.Workload) -> str:
    """'host', 'guest', or 'none' (no client: micro and the embedded databases)."""
    return workload.client if has_client(workload) else "none"


def forwarded_ports(workload: contract.Workload) -> list[int]:
    """The guest ports the host client reaches: those named in the server's readiness probe."""
    from kpgo.guest.agent import fill

    assert workload.server is not None, "only a workload with a server has a host client (has_client)"
    _, _, port = fill(workload.server.ready_tcp, workload.params).rpartition(":")
    if not port.isdigit() or not 1 <= int(port) <= 65535 or int(port) == CONTROL_PORT:
        raise UserError(f"{workload.name}: port {port} cannot be forwarded from the host (1-65535, not {CONTROL_PORT})",
                        f"choose another with --set {workload.name}.port=N")
    return [int(port)]


def network_of(workload: contract.Workload) -> str:
    """The host client's user-mode network (module docstring): slirp for a server that speaks first, else passt."""
    assert workload.server is not None, "only a workload with a server has a host client (has_client)"
    return "slirp" if workload.server.speaks_first else "passt"


def check_host(workloads: list[contract.Workload]) -> None:
    """What the host clients of these workloads need on this host (the driver's, or a cluster node's): their network
    program and their forwarded ports."""
    for w in workloads:
        if placement_of(w) == "host":
            check_network(w)
            check_ports_free(w)


def check_network(workload: contract.Workload) -> None:
    """passt must be installed where the workload's host client needs it."""
    if network_of(workload) == "passt" and proc.which("passt") is None:
        raise UserError(f"the host client of {workload.name} needs passt (the guest's network on the host), which is not installed",
                        "apt-get install passt (or run `make setup`), or run the client in the guest with --client guest")


def check_ports_free(workload: contract.Workload) -> None:
    """The forwarded ports must be free on the host's 127.0.0.1, or QEMU would fail to start. Free as a listener sees
    it: connections of an earlier boot that linger in TIME_WAIT (ab's closed connections, for a minute) do not stop
    passt or slirp, which listen with SO_REUSEADDR, so they do not stop the next boot either."""
    for port in forwarded_ports(workload):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                raise UserError(f"port {port} on the host's 127.0.0.1 is in use, and the host client of {workload.name} reaches the guest there",
                                f"stop what listens on it, or choose another port with --set {workload.name}.port=N") from None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Placement:
    """Where the guest's vCPUs and the host's load generator run (recorded with every result)."""

    client: str  # host | guest | none
    vcpus: int
    qemu_cpus: tuple[int, ...] | None = None  # host cores QEMU is pinned to (None: not pinned)
    client_cpus: tuple[int, ...] | None = None  # the load generator's and passt's cores
    forwarded: tuple[int, ...] = ()
    network: str | None = None  # the guest's user-mode network with a host client: passt, or slirp (network_of)

    def as_json(self) -> dict:
        return asdict(self)


def plan(workload: contract.Workload, cpus: int | None) -> Placement:
    """vCPUs and pinning. A host client competes with the guest's vCPUs for the host's cores: it gets
    the last core to itself and QEMU the others, with one vCPU per remaining core unless --cpus says."""
    where = placement_of(workload)
    if where != "host":
        return Placement(where, cpus or 2)
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return Placement(where, cpus or 1, forwarded=tuple(forwarded_ports(workload)), network=network_of(workload))
    return Placement(where, cpus or len(cores) - 1, tuple(cores[:-1]), tuple(cores[-1:]), tuple(forwarded_ports(workload)), network_of(workload))


class HostClient:
    """Serves one guest's client steps for the length of one boot (a thread beside the guest)."""

    def __init__(self, workload: contract.Workload, placement: Placement, workdir: Path, log: Path) -> None:
        self.workload = workload
        self.placement = placement
        self.workdir = workdir  # the client's run dir on the host (its files, HOME, TMPDIR)
        self.log = log
        self.control_port = _free_port()
        self.ready = threading.Event()
        self.stopped = threading.Event()
        self.error: str | None = None
        self._thread: threading.Thread | None = None
        # passt's socket: in a private directory outside the run dir (a path under /root is closed to
        # the user passt switches to when started as root) and short enough for a UNIX socket name.
        self._sockdir = atomic.scratch_dir(Path(tempfile.gettempdir()) / "kpgo-net")
        self.socket = self._sockdir / "passt.sock"
        self._passt: proc.Service | None = None

    def qemu_opts(self) -> str:
        """vng's --qemu-opts value: a virtio NIC on a stream to passt, or on slirp with restrict=on (the guest
        reaches nothing outside) and hostfwd rules bound to 127.0.0.1."""
        nic = "-device virtio-net-pci,netdev=kpgonet"
        if self.placement.network == "slirp":
            fwd = [f"hostfwd=tcp:127.0.0.1:{p}-{GUEST_ADDR}:{p}" for p in self.placement.forwarded]
            fwd.append(f"hostfwd=tcp:127.0.0.1:{self.control_port}-{GUEST_ADDR}:{CONTROL_PORT}")
            return f"-netdev user,id=kpgonet,restrict=on,{','.join(fwd)} {nic}"
        return f"-netdev stream,id=kpgonet,server=off,addr.type=unix,addr.path={self.socket} {nic}"

    def passt_argv(self) -> list[str]:
        """passt forwarding from the host's 127.0.0.1 only, IPv4 TCP only: no DHCP, DNS, NDP, UDP or ICMP.
        The guest's only route is to GATEWAY, which passt maps to the host's loopback (the agent opens
        no connection: it only accepts)."""
        fwd = [f"127.0.0.1/{p}" for p in self.placement.forwarded] + [f"127.0.0.1/{self.control_port}:{CONTROL_PORT}"]
        argv = ["passt", "--foreground", "--quiet", "--socket", str(self.socket), "--address", GUEST_ADDR, "--gateway", GATEWAY,
                "--ipv4-only", "--no-udp", "--no-icmp", "--no-dhcp", "--no-ndp", "--no-dhcpv6", "--no-ra", "--dns", "none", "--search", "none"]
        for spec in fwd:
            argv += ["--tcp-ports", spec]
        return proc.pinned(argv, self.placement.client_cpus)

    def _start_network(self) -> None:
        """passt for one boot, listening on its socket before QEMU connects to it (slirp is QEMU's own)."""
        if self.placement.network != "passt":
            return
        if os.geteuid() == 0:  # passt refuses to stay root: it becomes nobody, who must be able to bind here
            nobody = pwd.getpwnam("nobody")
            os.chown(self._sockdir, nobody.pw_uid, nobody.pw_gid)
        self.socket.unlink(missing_ok=True)
        self._passt = proc.Service(self.passt_argv(), log=self.log.with_name("passt.log"), ready=(self.socket.exists, 10),
                                   what="passt (the guest's network on the host)")

    def job(self) -> contract.Client:
        """What the agent needs: where the client's files are on the host."""
        return contract.Client(where="host", rundir=str(self.workdir), control_port=CONTROL_PORT, guest_addr=GUEST_ADDR, gateway=GATEWAY)

    def prepare(self) -> None:
        """The workload's files (configs the generators read, e.g. memslap.cnf) in the host's run dir."""
        from kpgo.guest.agent import write_files

        for sub in ("", ".home", ".tmp"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        write_files(self.workload.files, dict(self.workload.params, rundir=str(self.workdir), listen="127.0.0.1", cpus=self.placement.vcpus))

    def on_console(self, line: str) -> None:
        if CONTROL_READY in line:
            self.ready.set()

    def start(self) -> None:
        """Serve one boot (again after a boot that panicked: same ports, fresh state)."""
        self.ready.clear()
        self.stopped.clear()
        self.error = None
        self._start_network()
        self._thread = threading.Thread(target=self._serve, name="kpgo-host-client", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.ready.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._passt is not None:
            if not self._passt.alive() and self.error is None:
                self.error = f"passt ended during the boot (log: {self._passt.log})"
            self._passt.stop()

    def close(self) -> None:
        """After the last boot: passt's socket directory goes."""
        shutil.rmtree(self._sockdir, ignore_errors=True)

    def _serve(self) -> None:
        self.ready.wait()
        if self.stopped.is_set():
            return
        try:
            sock, f = self._connect()
        except OSError as e:
            self.error = f"could not reach the guest agent's control port through 127.0.0.1:{self.control_port}: {e}"
            return
        with sock, f:
            for line in f:
                msg = json.loads(line)
                if msg.get("op") != "run":
                    return
                f.write(json.dumps(self._run(msg)) + "\n")
                f.flush()

    def _connect(self) -> tuple[socket.socket, TextIO]:
        """A control connection the agent answered. passt accepts on the host before the guest does, so
        a connection counts once the agent answers the host's hello; one the guest never took is retried."""
        last: OSError | None = None
        for _ in range(20):
            try:
                s = socket.create_connection(("127.0.0.1", self.control_port), timeout=HELLO_SECONDS)
                f = s.makefile("rw", encoding="utf-8", newline="\n")
                try:
                    f.write(json.dumps({"op": "hello"}) + "\n")
                    f.flush()
                    hello = f.readline()
                    if hello and json.loads(hello).get("op") == "hello":
                        s.settimeout(None)
                        return s, f
                    last = OSError("the connection ended before the agent's hello")
                except (OSError, ValueError) as e:
                    last = OSError(f"no hello from the agent ({e})")
                f.close()
                s.close()
            except OSError as e:
                last = e
            if self.stopped.wait(0.5):
                break
        raise last or OSError("stopped")

    def _run(self, msg: dict) -> dict:
        env = {"HOME": str(self.workdir / ".home"), "TMPDIR": str(self.workdir / ".tmp")}
        try:
            res = proc.run(proc.pinned(msg["argv"], self.placement.client_cpus), log=self.log, cwd=self.workdir, env=env,
                           timeout=float(msg["timeout"]), check=False, what=msg.get("what"))
        except Exception as e:  # a missing program or the like: the agent reports it as the step's failure
            return {"status": 127, "output": str(e), "timed_out": False}
        return {"status": res.returncode, "output": res.output, "timed_out": res.timed_out}
