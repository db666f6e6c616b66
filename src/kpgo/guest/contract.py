"""The contract between kpgo on the host and its agent in the guest: the job the host writes
(job.json in the shared run directory) and the result the agent writes back (result.json).

kpgo.vm builds the Job and reads the Result; the guest agent reads the Job and builds the Result;
both go through these classes and nothing else touches the JSON. Stdlib only and no kpgo imports:
the agent runs as a plain script under the guest's python3 and loads this file by path. The JSON
keys are the field names; fields left unset (None) are not written."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Client:
    """Where the agent reaches the host's load generator (kpgo.client.HostClient)."""

    where: str  # "host"
    rundir: str  # the client's run dir on the host, in place of the guest's for client steps
    control_port: int  # the agent listens here; QEMU forwards it from the host
    guest_addr: str


@dataclass(frozen=True)
class Job:
    mode: str  # "collect" (gcov counters reset after the warm-up, snapshot after the load) or "bench"
    workload: dict[str, Any]  # the workload's spec (kpgo.workloads)
    runs: int = 1  # measured runs
    build_dir: str | None = None  # collect: the kernel's build directory, the prefix of its gcov tree
    sim: bool = False  # each measured run in its own window of kpgo's QEMU plugin
    sim_boot: bool = False  # the plugin's first window is open from power-on: the agent closes it at once
    client: Client | None = None  # the load generator runs on the host
    tools_dir: str = ""  # kpgo's helper programs (kpgo-window, leveldb-bench)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.mode, "workload": self.workload, "runs": self.runs}
        if self.build_dir is not None:
            out["build_dir"] = self.build_dir
        if self.sim:  # the keys a simulated boot's job has always had, and only it
            out.update(sim=True, sim_boot=self.sim_boot)
        if self.client is not None:
            out["client"] = asdict(self.client)
        out["tools_dir"] = self.tools_dir
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        client = data.get("client")
        return cls(**dict(data, client=Client(**client) if client else None))


@dataclass
class Run:
    """One measured run: every load step once (the agent's measured_run says how each figure is made)."""

    value: float  # the workload's metric, aggregated over the parts
    parts: dict[str, float]
    secondary: dict[str, float]
    seconds: float
    step_seconds: dict[str, float]
    ops: float  # operations done, what simulated counters are divided by
    ops_method: str  # count, estimate or mixed
    ops_estimate: float
    kernel_share: float | None  # the kernel's share of busy guest CPU time
    cpu_ticks: dict[str, int]


@dataclass
class Result:
    """What one boot returns. The agent fills it as the run goes (result.json holds what it reached);
    kpgo.vm.run_agent adds the host's side of the same boot (the fields after server_log_tail)."""

    ok: bool
    mode: str
    kernel: str  # the guest's kernel release
    timings: dict[str, float] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)
    env: dict[str, str] | None = None  # HOME and TMPDIR of every step
    gcda_files: int | None = None  # collect
    gcda_bytes: int | None = None
    error: str | None = None  # on failure: what failed, in which phase, the tails of its output and the server's log
    phase: str | None = None
    output_tail: str | None = None
    server_log_tail: str | None = None
    placement: dict[str, Any] | None = None  # kpgo.client.Placement.as_json
    sim_boot: dict[str, Any] | None = None  # the simulator's window from power-on to the agent's start
    sim: list[dict[str, Any]] | None = None  # the simulator's windows, one per run

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Result:
        return cls(**dict(data, runs=[Run(**r) for r in data["runs"]]))
