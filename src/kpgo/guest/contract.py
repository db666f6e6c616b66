"""The contract between kpgo on the host and its agent in the guest: the job the host writes
(job.json in the shared run directory), the workload it carries, and the result the agent writes
back (result.json).

kpgo.vm builds the Job and reads the Result; the guest agent reads the Job and builds the Result;
both go through these classes and nothing else touches the JSON. Stdlib only and no kpgo imports:
the agent runs as a plain script under the guest's python3 and loads this file by path. The JSON
keys are the field names; fields left unset (None) are not written.

A Workload is built by kpgo.workloads from a workload file once the file is validated (the rules
live there, not here); its to_json gives back that validated dict, key for key."""

from __future__ import annotations

from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from typing import Any, TypeVar

STEP_KINDS = ("setup", "prepare", "warmup", "load")  # a workload's step lists, in the order the agent runs them
# How a simulated boot cuts its measured time into windows: one per measured run (all load steps together), or one
# per load step (each expanded step, e.g. tcp-4), so that each step's counters are divided by that step's own count.
WINDOWS = ("run", "step")


def _default(f: Field[Any]) -> Any:
    """A field's default; MISSING for a required field."""
    return f.default_factory() if f.default_factory is not MISSING else f.default


def _plain(value: Any) -> Any:
    """A field's value as JSON data: parts by their own to_json, tuples as the lists the file had."""
    if isinstance(value, _Part):
        return value.to_json()
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


P = TypeVar("P", bound="_Part")


@dataclass(frozen=True)
class _Part:
    """A workload or a part of one. Its JSON is the validated dict it was built from, since bench cell keys hash
    that dict (kpgo.bench): a field at its default is left out, as the file left the key out (an empty list or
    table written out in a file is the same workload, and is left out too)."""

    def to_json(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) != _default(f)}

    @classmethod
    def from_json(cls: type[P], data: dict[str, Any]) -> P:
        """A part without parts of its own: its lists (argv) become tuples."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


@dataclass(frozen=True)
class Step(_Part):
    """One command of a workload: setup, prepare, warm-up or load (docs/WORKLOADS.md, "Writing a workload")."""

    name: str
    argv: tuple[str, ...]  # templates: {param}, {rundir}, {tools}, {cpus}, {listen}, {each}
    each: str | None = None  # a parameter of comma-separated values: the step runs once per value, bound to {each}
    client: bool = False  # drives the server: runs on the host with a host client
    timeout: float | None = None  # seconds; None: the agent's default
    metric: str | None = None  # load steps: regex with a `value` group (and a `name` group for several parts)
    ops: str | None = None  # regex of the operation count the generator reports
    ops_per_part: str | int | None = None  # or the fixed count it runs per part (a template)
    secondary: dict[str, str] = field(default_factory=dict)  # figure -> regex


@dataclass(frozen=True)
class Server(_Part):
    """The workload's server, started after the setup steps and left running until the end."""

    argv: tuple[str, ...]
    ready_tcp: str  # HOST:PORT (a template) that accepts once the server is ready
    ready_timeout: float | None = None  # seconds; None: the agent's default
    speaks_first: bool = False  # sends before the client on a new connection (MySQL's greeting): kpgo.client picks its network


@dataclass(frozen=True)
class File(_Part):
    """A file written into the run directory before anything starts (its text from workloads/data/ when the file names a source)."""

    path: str  # relative to the run directory (a template)
    text: str  # a template


@dataclass(frozen=True)
class Build(_Part):
    """A helper program kpgo compiles on the host at install (kpgo.workloads.install)."""

    output: str
    source: str  # in workloads/tools/
    argv: tuple[str, ...]  # with {output} and {source}


@dataclass(frozen=True)
class Paper(_Part):
    """The published setting the workload scales down (shown by `kpgo workloads list`)."""

    params: str
    source: str | None = None


@dataclass(frozen=True)
class Workload(_Part):
    """One workload (docs/WORKLOADS.md). `params` stays a plain dict: it is data the templates read, and
    kpgo.workloads.load_many writes the --set overrides into it (each load builds its own)."""

    name: str
    description: str
    unit: str
    higher_is_better: bool
    aggregate: str  # hmean, geomean, mean or sum over the parts of all load steps
    params: dict[str, Any]
    load: tuple[Step, ...]
    packages: tuple[str, ...] = ()  # Debian packages
    kernel_config: tuple[str, ...] = ()  # kernel options it cannot run without (SYSVIPC)
    paper: Paper | None = None
    files: tuple[File, ...] = ()
    server: Server | None = None
    build: tuple[Build, ...] = ()
    setup: tuple[Step, ...] = ()
    prepare: tuple[Step, ...] = ()
    warmup: tuple[Step, ...] = ()
    # Where the load generator runs. Written only when "host", so every key derived from a workload with the
    # client in the guest is the one it was before host clients existed.
    client: str = "guest"
    # Simulator windows (WINDOWS): "step" when the load steps are unlike operations whose counts must not be pooled
    # (micro's stressors); written only then, so the keys of every other workload stay as they were.
    windows: str = "run"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Workload:
        one: dict[str, type[_Part]] = {"paper": Paper, "server": Server}
        many: dict[str, type[_Part]] = {"files": File, "build": Build, **dict.fromkeys(STEP_KINDS, Step)}
        d: dict[str, Any] = {}
        for key, value in data.items():
            if key in one:
                d[key] = one[key].from_json(value)
            elif key in many:
                d[key] = tuple(many[key].from_json(v) for v in value)
            elif key == "params":
                d[key] = dict(value)  # its own: overrides go into it
            else:
                d[key] = tuple(value) if isinstance(value, list) else value  # packages, kernel_config
        return cls(**d)


@dataclass(frozen=True)
class Client:
    """Where the agent reaches the host's load generator (kpgo.client.HostClient)."""

    where: str  # "host"
    rundir: str  # the client's run dir on the host, in place of the guest's for client steps
    control_port: int  # the agent listens here; passt forwards it from the host
    guest_addr: str
    gateway: str  # the host as the guest sees it (the forwarded connections' source)


@dataclass(frozen=True)
class Job:
    mode: str  # "collect" (gcov counters reset after the warm-up, snapshot after the load) or "bench"
    workload: Workload
    runs: int = 1  # measured runs
    build_dir: str | None = None  # collect: the kernel's build directory, the prefix of its gcov tree
    sim: bool = False  # each measured run in its own window of kpgo's QEMU plugin
    sim_boot: bool = False  # the plugin's first window is open from power-on: the agent closes it at once
    client: Client | None = None  # the load generator runs on the host
    tools_dir: str = ""  # kpgo's helper programs (kpgo-window, leveldb-bench)
    data: str = "tmpfs"  # the run directory: on a tmpfs, or ("disk") on the ext4 file system of the guest's one disk

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.mode, "workload": self.workload.to_json(), "runs": self.runs}
        if self.build_dir is not None:
            out["build_dir"] = self.build_dir
        if self.sim:  # the keys a simulated boot's job has always had, and only it
            out.update(sim=True, sim_boot=self.sim_boot)
        if self.client is not None:
            out["client"] = asdict(self.client)
        out["tools_dir"] = self.tools_dir
        if self.data != "tmpfs":  # a job on tmpfs reads as it always has
            out["data"] = self.data
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        client = data.get("client")
        return cls(**dict(data, workload=Workload.from_json(data["workload"]), client=Client(**client) if client else None))


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
    # Each expanded load step's operations (its count, or its estimate where it has none), in the order the steps
    # ran: with per-step windows (Workload.windows "step") the run's windows follow this order, one per step.
    step_ops: dict[str, float] = field(default_factory=dict)


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
    # the files a read of themselves changes and those a read of the gcov tree changes, read first (agent.snapshot_order)
    gcda_read_first: list[int] | None = None
    error: str | None = None  # on failure: what failed, in which phase, the tails of its output and the server's log
    phase: str | None = None
    output_tail: str | None = None
    server_log_tail: str | None = None
    placement: dict[str, Any] | None = None  # kpgo.client.Placement.as_json
    sim_boot: dict[str, Any] | None = None  # the simulator's window from power-on to the agent's start
    sim: list[dict[str, Any]] | None = None  # the simulator's windows, one per run (per load step of each run with "step" windows)
    gcov_values: dict[str, int] | None = None  # collect on a value-profiled kernel: its top-N node pool (debugfs gcov_values)
    mitigations: dict[str, str] | None = None  # the guest kernel's Spectre/Meltdown/... state (sysfs cpu/vulnerabilities)
    build_id: str | None = None  # the running kernel's GNU build id (/sys/kernel/notes): which vmlinux booted
    rundir_fs: str | None = None  # the run directory's file system and source as /proc/mounts has it ("ext4 /dev/vda")

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def window_count(self, windows: str) -> int:
        """The simulator windows its measured runs opened under Workload.windows `windows`: one per run, or one per
        load step of each run."""
        return sum(len(r.step_ops) for r in self.runs) if windows == "step" else len(self.runs)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Result:
        return cls(**dict(data, runs=[Run(**r) for r in data["runs"]]))
