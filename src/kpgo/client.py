"""The host side of a workload whose load generator runs on the host (`--client host`).

The guest serves through its virtio-net device: QEMU's user-mode network forwards the workload's
ports from the host's 127.0.0.1 only (hostfwd bound to 127.0.0.1, `restrict=on`, so the guest
reaches nothing outside), and one more forwarded port carries a control connection. The guest
agent stays in charge of the run exactly as with a guest client (server start, warm-up, counter
reset, simulator window, parsing): for each client step it sends the filled command line over
the control connection, this module runs it on the host (pinned to its own core) and answers
with its exit status and output. The handshake needs no guessed sleeps: the host connects once
the agent prints CONTROL_READY on the console, and the agent waits for that connection.

Protocol (one JSON object per line): agent → {"op": "run", "argv": [...], "timeout": s, "what": str}
answered by {"status": int, "output": str, "timed_out": bool}; agent → {"op": "bye"} at the end."""

from __future__ import annotations

import json
import os
import socket
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from kpgo import proc
from kpgo.errors import UserError
from kpgo.guest import contract

GUEST_ADDR = "10.0.2.15"  # QEMU user networking's default guest address
CONTROL_PORT = 7399  # the agent's control port inside the guest
CONTROL_READY = "kpgo-agent: control ready"
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


def check_ports_free(workload: contract.Workload) -> None:
    """The forwarded ports must be free on the host's 127.0.0.1, or QEMU would fail to start."""
    for port in forwarded_ports(workload):
        with socket.socket() as s:
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
    client_cpus: tuple[int, ...] | None = None
    forwarded: tuple[int, ...] = ()

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
        return Placement(where, cpus or 1, forwarded=tuple(forwarded_ports(workload)))
    return Placement(where, cpus or len(cores) - 1, tuple(cores[:-1]), tuple(cores[-1:]), tuple(forwarded_ports(workload)))


def pinned(argv: list, cores: tuple[int, ...] | None) -> list:
    return ["taskset", "-c", ",".join(map(str, cores)), *argv] if cores else list(argv)


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

    def qemu_opts(self) -> str:
        """vng's --qemu-opts value: a virtio NIC on a restricted user network forwarding from 127.0.0.1 only."""
        fwd = [f"hostfwd=tcp:127.0.0.1:{p}-{GUEST_ADDR}:{p}" for p in self.placement.forwarded]
        fwd.append(f"hostfwd=tcp:127.0.0.1:{self.control_port}-{GUEST_ADDR}:{CONTROL_PORT}")
        return f"-netdev user,id=kpgonet,restrict=on,{','.join(fwd)} -device virtio-net-pci,netdev=kpgonet"

    def job(self) -> contract.Client:
        """What the agent needs: where the client's files are on the host."""
        return contract.Client(where="host", rundir=str(self.workdir), control_port=CONTROL_PORT, guest_addr=GUEST_ADDR)

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
        self._thread = threading.Thread(target=self._serve, name="kpgo-host-client", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.ready.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _serve(self) -> None:
        self.ready.wait()
        if self.stopped.is_set():
            return
        try:
            sock = self._connect()
        except OSError as e:
            self.error = f"could not reach the guest agent's control port through 127.0.0.1:{self.control_port}: {e}"
            return
        with sock, sock.makefile("rw", encoding="utf-8", newline="\n") as f:
            for line in f:
                msg = json.loads(line)
                if msg.get("op") != "run":
                    return
                f.write(json.dumps(self._run(msg)) + "\n")
                f.flush()

    def _connect(self) -> socket.socket:
        # The agent listens before it prints CONTROL_READY; QEMU's forwarder may still lose the very
        # first SYN while the guest's address is being resolved, so allow a few attempts.
        last: OSError | None = None
        for _ in range(20):
            try:
                s = socket.create_connection(("127.0.0.1", self.control_port), timeout=30)
                s.settimeout(None)
                return s
            except OSError as e:
                last = e
                if self.stopped.wait(0.5):
                    break
        raise last or OSError("stopped")

    def _run(self, msg: dict) -> dict:
        env = {"HOME": str(self.workdir / ".home"), "TMPDIR": str(self.workdir / ".tmp")}
        try:
            res = proc.run(pinned(msg["argv"], self.placement.client_cpus), log=self.log, cwd=self.workdir, env=env,
                           timeout=float(msg["timeout"]), check=False, what=msg.get("what"))
        except Exception as e:  # a missing program or the like: the agent reports it as the step's failure
            return {"status": 127, "output": str(e), "timed_out": False}
        return {"status": res.returncode, "output": res.output, "timed_out": res.timed_out}
