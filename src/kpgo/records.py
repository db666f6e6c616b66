"""What kpgo's stages hand each other through files, as typed records (the host-guest files are kpgo.guest.contract):

    Build     build.json        kpgo build -> the run and its studies (proof, sizes, times)
    Proof     a build's proof   build.json and run.json: did GCC read the profile, object by object
    Profile   profile.json      kpgo collect, profile fix, profile merge -> the run's cache checks, the report
    Results   results.json      kpgo bench -> the run's summary, the studies, the report (with Stat, WorkloadResults,
                                Sample, Design, Measurement, KernelEntry)
    Run       run.json          kpgo run -> kpgo study, the report (with Host, KernelInfo, RunBuild, RunWorkload)

Each record has one constructor from the file's JSON, `from_json(data, path)`, which checks the data against the
file's shape here (kpgo.inputs shapes: the one home of what kpgo reads of each file) and builds the record; `read`
reads the file through kpgo.inputs first. A key older kpgo versions did not write is an Optional field, None (or
empty) when absent, which readers treat as they treated the missing key. The writers still write dicts, so the
files keep their format byte for byte; each record keeps the dict it was read from as `raw`, for what is passed on
whole (report.json's data, the bench's own functions over its results). No third-party imports at load: the
report's presentation layer, which the bench's terminal tables use, imports this module."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kpgo import inputs
from kpgo.errors import UserError

# -- shapes: what kpgo reads of each file (optional keys, "?", are those older kpgo versions did not write) -------------

NUM = (float, None)  # a statistic: null where it cannot be formed (one boot, a zero baseline)
STAT = {"mean?": NUM, "sd?": NUM, "cv?": NUM, "n?": int, "ratio?": NUM, "speedup?": NUM, "ci_low?": NUM, "ci_high?": NUM,
        "ci_includes_1?": (bool, None), "ci_method?": (str, None), "workloads?": [str]}
SAMPLE = {"kernel": str, "workload": str, "mean": float, "values?": [float], "round?": int, "cell_key?": str,
          "sim_per_op?": ({str: float}, None), "sim?": ([dict], None), "ops?": [NUM], "kernel_share?": [NUM], "host?": (dict, None)}
DESIGN = {"order?": str, "order_name?": str, "seed?": (int, None), "boots_per_kernel?": int, "boots_by_workload?": {str: int},
          "runs_per_boot?": int, "warmup_per_boot?": bool,
          "unit_of_replication?": str, "interval?": str, "sequence?": [{"kernel": str, "workload": str, "round?": int}]}
RESULTS_SHAPE = {
    "schema": int, "baseline": str,
    "kernels?": {str: {"build_dir?": (str, None), "kernel_release?": (str, None), "variant?": (str, None), "flags?": ([str], None)}},
    "workloads": {str: {"summary": [{"kernel": str, **STAT}], "unit?": str, "higher_is_better?": bool, "params?": dict,
                        "kernels?": [str], "sim?": ({str: {str: STAT}}, None)}},
    "samples?": [SAMPLE], "failed?": [dict], "design?": DESIGN, "host?": {str: (str, float, None)}, "hosts?": ({str: dict}, list),
    "measurement?": {"accelerator?": (str, None), "clock?": (str, None), "sim?": ({str: (float, bool, None)}, None), "headline?": (str, None),
                     "ops_methods?": ({str: [str]}, None), "icount?": ({str: (int, None)}, None)},
    "geomean?": {str: STAT}, "sim_geomean?": ({str: {str: STAT}}, None), "sim_own_geomean?": ({str: STAT}, None), "note?": (str, None),
}
RESULTS_SCHEMAS = (2, 3)  # 2: restated on reading (kpgo.bench.restate)
PROOF_SHAPE = {"ok?": bool, "ratio?": NUM, "threshold?": NUM, "objects_used?": int, "objects_nonempty?": int, "functions_read?": int,
               "functions_giving_up?": int, "weight_read?": NUM, "method?": str, "profiled_but_not_built?": [str], "values?": (dict, None)}
RUN_SHAPE = {
    "request?": dict, "host?": dict, "kernel?": {str: (str, None)}, "phases_seconds?": {str: float}, "total_seconds?": NUM, "studies?": [str],
    "builds?": {str: {"release?": (str, None), "seconds?": NUM, "sizes?": {str: (int, None)}}},
    "workloads?": {str: {"params?": dict, "unit?": str, "client?": (str, None), "proof?": PROOF_SHAPE,
                        "profile?": {"collected?": {"files?": (int, None), "arcs_sum?": (int, None), "throughput?": NUM, "gcov_version?": (str, None)}}}},
    "universal?": {str: {"proof?": PROOF_SHAPE}},
    # the layout and clang studies' kernels as their build.json has them; the variability study's second kernels
    "layout?": {str: {"proof?": (dict, None), "bolt?": (dict, None), "order?": (dict, None)}},
    "clang?": {str: {"proof?": (dict, None)}},
    "variability?": dict,
}
# What kpgo reads of a build.json (kpgo.kernel.kbuild.build writes it); other keys are passed on as they are.
BUILD_SHAPE = {"ok": bool, "key": str, "variant": str, "kernel_release": str, "build_dir?": str, "config_name?": (str, None),
               "config_hash?": str, "gcc?": str, "gcov?": bool, "kcflags?": [str], "sizes?": dict, "seconds?": dict, "proof?": dict,
               "bolt?": (dict, None), "order?": (dict, None)}
# What kpgo reads of a profile.json (kpgo collect, profile fix and merge write it): the collection it describes, or a
# merged profile's inputs. Other keys are kept and passed on untouched.
PROFILE_SHAPE = {"kind?": str, "config_name?": (str, None), "kernel_release?": (str, None), "build_key?": str, "collected_at?": str,
                 "accelerator?": (str, None), "workload?": ({"client?": (str, None), "params?": dict}, str, None),
                 "fixed?": {"runs?": int}, "merged?": {"inputs?": [{"profile?": dict}]}, "gcda_read_first?": ([int], None),
                 # a gcov collection's figures (files: a count; a branch profile's: its files' sizes) and a branch profile's vmlinux
                 "files?": (int, dict, None), "arcs_sum?": (int, None), "throughput?": NUM, "gcov_version?": (str, None), "build_id?": (str, None),
                 "thunks?": [{"kind": str, "start": str, "end": str}]}


def _num(x: Any) -> float | None:
    return None if x is None else float(x)


def _opt_int(x: Any) -> int | None:
    return None if x is None else int(x)


# -- results.json ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stat:
    """One statistic of results.json: a summary row (a kernel on a workload: mean, sd, cv, n, its ratio to the
    baseline and the speedup), a simulated metric of a kernel (mean, sd, ratio) or a geometric mean (its ratio or
    speedup and the workloads it is over). The interval's verdict: ci_includes_1 (a row without it shows no
    difference, as kpgo.report.present marks it)."""

    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    ci_includes_1: bool | None = True
    ci_method: str | None = None
    mean: float | None = None
    sd: float | None = None
    cv: float | None = None
    n: int | None = None
    speedup: float | None = None  # summary rows and geometric means of speedups
    kernel: str | None = None  # summary rows
    workloads: tuple[str, ...] = ()  # geometric means
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Stat:
        return cls(_num(d.get("ratio")), _num(d.get("ci_low")), _num(d.get("ci_high")), d.get("ci_includes_1", True), d.get("ci_method"),
                   _num(d.get("mean")), _num(d.get("sd")), _num(d.get("cv")), _opt_int(d.get("n")), _num(d.get("speedup")),
                   d.get("kernel"), tuple(d.get("workloads") or ()), d)

    def as_speedup(self) -> Stat:
        """The same statistic with `ratio` meaning the speedup (> 1 better), whichever of the two the bench filled."""
        s = self.speedup if "speedup" in self.raw else self.ratio
        return replace(self, ratio=s, raw={**self.raw, "ratio": s})

    @property
    def missing(self) -> bool:
        """No ratio to show (none recorded, or NaN)."""
        return self.ratio is None or math.isnan(self.ratio)


@dataclass(frozen=True)
class WorkloadResults:
    """One workload of a bench: each kernel's summary row, and its simulated metrics (metric -> Stat) where counted."""

    name: str
    unit: str | None
    higher_is_better: bool | None
    params: dict[str, Any] | None
    kernels: tuple[str, ...]
    summary: tuple[Stat, ...]
    sim: dict[str, dict[str, Stat]]  # kernel -> metric -> Stat; empty without simulated counters
    raw: dict[str, Any] = field(compare=False, repr=False)

    @classmethod
    def from_json(cls, name: str, d: dict[str, Any]) -> WorkloadResults:
        sim = {k: {m: Stat.from_json(s) for m, s in ms.items()} for k, ms in (d.get("sim") or {}).items()}
        return cls(name, d.get("unit"), d.get("higher_is_better"), d.get("params"), tuple(d.get("kernels") or ()),
                   tuple(Stat.from_json(r) for r in d["summary"]), sim, d)

    def row(self, kernel: str) -> Stat | None:
        """The kernel's summary row, None when it was not measured on this workload."""
        return next((r for r in self.summary if r.kernel == kernel), None)

    def rows_by_kernel(self) -> dict[str, Stat]:
        return {str(r.kernel): r for r in self.summary}


@dataclass(frozen=True)
class Sample:
    """One boot's sample: its kernel, workload, round and mean, the simulated per-op figures, the kernel's CPU share
    and, on a cluster, the host it ran on."""

    kernel: str
    workload: str
    mean: float
    round: int | None
    sim_per_op: dict[str, float] | None
    host: dict[str, Any] | None
    raw: dict[str, Any] = field(compare=False, repr=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Sample:
        return cls(d["kernel"], d["workload"], float(d["mean"]), d.get("round"), d.get("sim_per_op"), d.get("host"), d)


@dataclass(frozen=True)
class Design:
    """The bench's design as recorded (every key optional: older benches wrote fewer)."""

    order: str | None = None
    order_name: str | None = None
    seed: int | None = None
    boots_per_kernel: int | None = None  # rounds; with --precision, of the workloads given the most
    runs_per_boot: int | None = None
    warmup_per_boot: bool | None = None
    unit_of_replication: str | None = None
    interval: str | None = None
    boots: int = 0  # the length of the recorded sequence
    boots_by_workload: dict[str, int] = field(default_factory=dict)  # with --precision's added rounds
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Design:
        return cls(d.get("order"), d.get("order_name"), d.get("seed"), d.get("boots_per_kernel"), d.get("runs_per_boot"),
                   d.get("warmup_per_boot"), d.get("unit_of_replication"), d.get("interval"), len(d.get("sequence") or ()),
                   dict(d.get("boots_by_workload") or {}), d)


@dataclass(frozen=True)
class Measurement:
    """How the bench measured: the accelerator, the clock, the simulator's settings (None: no simulated counters),
    which metric leads, how operations were counted per workload."""

    accelerator: str | None = None
    clock: str | None = None
    sim: dict[str, Any] | None = None  # kpgo.sim.SimConfig's settings as recorded
    headline: str | None = None  # "simulated" or "wall-clock"; None: recorded before it was written
    ops_methods: dict[str, list[str]] | None = None  # workload -> how its operations were counted
    icount: dict[str, Any] = field(default_factory=dict)  # workload -> the icount shift, None on the host's clock
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Measurement:
        return cls(d.get("accelerator"), d.get("clock"), d.get("sim"), d.get("headline"), d.get("ops_methods"), d.get("icount") or {}, d)


@dataclass(frozen=True)
class Host:
    """The machine a bench or run was measured on (kpgo.host)."""

    cpu: str | None = None
    accelerator: str | None = None
    qemu: str | None = None
    host_kernel: str | None = None
    gcc: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> Host | None:
        if not d:
            return None
        cpu, accel, qemu, kernel, gcc = (None if d.get(k) is None else str(d[k]) for k in ("cpu", "accelerator", "qemu", "host_kernel", "gcc"))
        return cls(cpu, accel, qemu, kernel, gcc, d)


@dataclass(frozen=True)
class KernelEntry:
    """A kernel of a bench: where it was built, its release, variant and the compiler flags beyond -O2 and the profile's."""

    build_dir: str | None = None
    kernel_release: str | None = None
    variant: str | None = None
    flags: list[str] | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> KernelEntry:
        return cls(d.get("build_dir"), d.get("kernel_release"), d.get("variant"), d.get("flags"), d)


@dataclass(frozen=True)
class Results:
    """A bench's results.json (schema 3, or 2 restated by kpgo.bench.restate as it is read)."""

    schema: int
    baseline: str
    kernels: dict[str, KernelEntry]
    workloads: dict[str, WorkloadResults]
    samples: tuple[Sample, ...]
    design: Design
    measurement: Measurement
    host: Host | None
    hosts: dict[str, dict[str, Any]]  # on a cluster: node id -> hostname, rounds, boots
    geomean: dict[str, Stat]  # kernel -> geometric mean of its speedups
    sim_geomean: dict[str, dict[str, Stat]]  # kernel -> simulated metric -> geometric mean
    note: str | None
    raw: dict[str, Any] = field(compare=False, repr=False)  # restated: what kpgo.bench's own functions take

    HINT = "re-run the bench that wrote it (`kpgo run` or `kpgo bench`; finished boots are reused)"

    @classmethod
    def from_json(cls, d: dict[str, Any], path: str | os.PathLike[str]) -> Results:
        if d.get("schema") not in RESULTS_SCHEMAS:
            raise UserError(f"{os.fspath(path)} has schema {d.get('schema', 1)}; the report reads schema {' or '.join(map(str, RESULTS_SCHEMAS))}",
                            "re-run `kpgo run` (or `kpgo bench`) with this kpgo; finished boots are reused")
        inputs.check(d, RESULTS_SHAPE, path, cls.HINT)
        from kpgo import bench  # numpy and scipy: only once there are results to read

        d = bench.restate(d)
        hosts = d.get("hosts") or {}
        return cls(
            d["schema"], d["baseline"], {k: KernelEntry.from_json(v) for k, v in (d.get("kernels") or {}).items()},
            {n: WorkloadResults.from_json(n, w) for n, w in d["workloads"].items()},
            tuple(Sample.from_json(s) for s in d.get("samples") or ()), Design.from_json(d.get("design") or {}),
            Measurement.from_json(d.get("measurement") or {}), Host.from_json(d.get("host")), hosts if isinstance(hosts, dict) else {},
            {k: Stat.from_json(g) for k, g in (d.get("geomean") or {}).items()},
            {k: {m: Stat.from_json(s) for m, s in g.items()} for k, g in (d.get("sim_geomean") or {}).items()},
            None if d.get("note") is None else str(d["note"]), d)

    @classmethod
    def read(cls, path: Path, what: str) -> Results | None:
        """The results.json at path, None when nothing is there; anything unusable is a UserError naming it."""
        d = inputs.read_json(path, f"re-run the step that writes {what}", dict, missing_ok=True)
        return None if d is None else cls.from_json(d, path)

    @property
    def has_sim(self) -> bool:
        return any(w.sim for w in self.workloads.values())

    def sim_own_geomean(self) -> dict[str, Stat]:
        """Per headline simulated metric, the geometric mean of each app-specific kernel's ratio on its own workload:
        as recorded, else computed (kpgo.bench.own_sim_geomean)."""
        from kpgo import bench

        geo = self.raw.get("sim_own_geomean") or bench.own_sim_geomean(self.raw)
        return {k: Stat.from_json(g) for k, g in geo.items()}


# -- build.json and its proof ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proof:
    """Whether GCC read the profile (kpgo.kernel.proof): the objects with a non-empty profile whose counts it read,
    their share, the threshold a build must reach, the functions read and given up, and the value transforms."""

    ok: bool | None = None
    ratio: float | None = None
    threshold: float | None = None
    objects_used: int | None = None
    objects_nonempty: int | None = None
    functions_read: int | None = None
    functions_giving_up: int | None = None
    method: str | None = None
    profiled_but_not_built: tuple[str, ...] = ()
    values: dict[str, Any] | None = None  # kpgo.kernel.proof's value transforms; None without value profiles
    weight_read: float | None = None  # the share of the profile's arc counts GCC read (None: a proof made before kpgo counted it)
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Proof:
        values = d.get("values")
        return cls(d.get("ok"), _num(d.get("ratio")), _num(d.get("threshold")), d.get("objects_used"), d.get("objects_nonempty"),
                   d.get("functions_read"), d.get("functions_giving_up"), d.get("method"), tuple(d.get("profiled_but_not_built") or ()),
                   values if isinstance(values, dict) else None, _num(d.get("weight_read")), d)


@dataclass(frozen=True)
class Build:
    """A finished build's build.json (kpgo.kernel.kbuild.build writes it)."""

    ok: bool
    key: str
    variant: str
    kernel_release: str
    build_dir: str | None
    sizes: dict[str, Any]  # kpgo.kernel.codesize's sizes (functions_size, text_span, ...), as recorded
    seconds: dict[str, float]  # "total" and the steps'
    proof: Proof | None  # builds with a profile
    bolt: dict[str, Any] | None = None  # a bolt variant's report (kpgo.kernel.bolt.check), as recorded
    order: dict[str, Any] | None = None  # an order variant's check (kpgo.kernel.order.check), as recorded
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, d: dict[str, Any], path: str | os.PathLike[str]) -> Build:
        inputs.check(d, BUILD_SHAPE, path, "build it again with `kpgo build` (or the run that made it)")
        proof = d.get("proof")
        return cls(d["ok"], d["key"], d["variant"], d["kernel_release"], d.get("build_dir"), d.get("sizes") or {},
                   d.get("seconds") or {}, Proof.from_json(proof) if isinstance(proof, dict) else None, d.get("bolt"), d.get("order"), d)

    @classmethod
    def of(cls, out: Path, d: dict[str, Any]) -> Build:
        """The record of the build.json a build in OUT wrote (kpgo.kernel.kbuild.build hands it back as a dict)."""
        return cls.from_json(d, Path(out) / "build.json")


# -- profile.json ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Collected:
    """A collection's figures as its profile.json records them and run.json keeps them: .gcda files, counter sum,
    throughput, gcov version."""

    files: int | None = None
    arcs_sum: int | None = None
    throughput: float | None = None
    gcov_version: str | None = None


@dataclass(frozen=True)
class Profile:
    """A profile directory's profile.json: the build it was collected from, when, under which accelerator and workload
    parameters, what `kpgo profile fix` did and a merge's inputs. Empty (every field None) where there is none."""

    build_key: str | None = None
    collected_at: str | None = None
    accelerator: str | None = None
    params: dict[str, Any] | None = None  # the workload's parameters
    client: str | None = None  # where the load generator ran ("host"; None or "guest": in the guest)
    fixed: dict[str, Any] | None = None  # kpgo profile fix's record (runs, sum_max, left_out)
    merged: dict[str, Any] | None = None  # kpgo profile merge's record (inputs, normalize)
    # how many files the snapshot read first (the guest agent's snapshot_order); None: collected before 2026-11-28, when
    # each file read counted in the files read after it
    read_first: list[int] | None = None
    collected: Collected = Collected()  # a gcov collection's figures (as recorded: run.json passes them on)
    build_id: str | None = None  # a branch profile's: the vmlinux its records are of
    # a branch profile's thunks, each branch through one recorded as the branch it stands for (kpgo.branches.thunk_ranges);
    # None: recorded before 2026-11-28, when a call through a retpoline was a call of the thunk
    thunks: list[dict[str, str]] | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, d: dict[str, Any], path: str | os.PathLike[str]) -> Profile:
        inputs.check(d, PROFILE_SHAPE, path, "repair or remove it (`kpgo collect` and `kpgo profile fix` write it)")
        wl = d.get("workload")
        wl = wl if isinstance(wl, dict) else {}
        files = d.get("files")  # a branch profile's is a map of its files' sizes, not a count
        collected = Collected(files if isinstance(files, int) else None, d.get("arcs_sum"), d.get("throughput"), d.get("gcov_version"))
        return cls(d.get("build_key"), d.get("collected_at"), d.get("accelerator"), wl.get("params"), wl.get("client"), d.get("fixed"),
                   d.get("merged"), d.get("gcda_read_first"), collected, d.get("build_id"), d.get("thunks"), d)

    @classmethod
    def of(cls, out: Path, d: dict[str, Any]) -> Profile:
        """The record of the profile.json a step wrote in OUT (kpgo.collect hands it back as a dict)."""
        return cls.from_json(d, Path(out) / "profile.json")

    @classmethod
    def read(cls, directory: Path, strict: bool = True) -> Profile:
        """The profile.json of a profile directory (an empty record when there is none). Not strict (a run's own
        profiles, whose step is done again when its record is unusable): empty for an unusable one too."""
        from kpgo.gcov.profile import read_profile_json  # the reader of the file (numpy: only once a profile is read)

        d = read_profile_json(directory, strict)
        return cls.from_json(d, Path(directory) / "profile.json") if d else cls()


# -- run.json -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelInfo:
    """The run's kernel: its base configuration's name, version and source."""

    config: str | None = None
    version: str | None = None
    source: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class RunBuild:
    """A build as run.json keeps it: its time, sizes and release."""

    seconds: float | None  # as recorded (an int stays one: report.json passes it on)
    sizes: dict[str, int | None]
    release: str | None
    raw: dict[str, Any] = field(compare=False, repr=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunBuild:
        return cls(d.get("seconds"), d.get("sizes") or {}, d.get("release"), d)


@dataclass(frozen=True)
class RunWorkload:
    """A workload of the run: its parameters and unit, where its client ran, its profile and the proof of its kernel."""

    params: dict[str, Any] | None
    unit: str | None
    client: str | None
    collected: Collected
    proof: Proof | None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunWorkload:
        c = (d.get("profile") or {}).get("collected") or {}
        proof = d.get("proof")
        return cls(d.get("params"), d.get("unit"), d.get("client"),
                   Collected(c.get("files"), c.get("arcs_sum"), _num(c.get("throughput")), c.get("gcov_version")),
                   Proof.from_json(proof) if isinstance(proof, dict) else None)


@dataclass(frozen=True)
class LayoutBuild:
    """A layout kernel as run.json keeps it: its GCC proof (PGO stacks), BOLT's record (kpgo.kernel.bolt.check) and the
    function order's (kpgo.kernel.order), each None where the kernel has none."""

    proof: dict[str, Any] | None
    bolt: dict[str, Any] | None
    order: dict[str, Any] | None


@dataclass(frozen=True)
class Run:
    """A run's run.json (kpgo.pipeline writes it): the request, the kernel, the host, each build, each workload with
    its profile and proof, the universal kernels' proofs, the phases' times."""

    request: dict[str, Any] | None  # kpgo.pipeline.RunOptions.from_json reads it
    host: Host | None
    kernel: KernelInfo
    studies: tuple[str, ...]
    builds: dict[str, RunBuild]
    workloads: dict[str, RunWorkload]
    universal: dict[str, Proof | None]
    phases_seconds: dict[str, float]
    total_seconds: float | None
    raw: dict[str, Any] = field(compare=False, repr=False)
    layout: dict[str, LayoutBuild] = field(default_factory=dict)  # the layout study's kernels, by label
    clang: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # the clang study's kernels: label -> its proof (kpgo.afdo)
    similarity: str | None = None  # the variability study's similarity.json, relative to the run directory

    HINT = "re-run `kpgo run --dir RUN_DIR` to rewrite it (cached steps are kept)"

    @classmethod
    def from_json(cls, d: dict[str, Any], path: str | os.PathLike[str], hint: str = HINT) -> Run:
        inputs.check(d, RUN_SHAPE, path, hint)
        k = d.get("kernel") or {}
        uni = {n: Proof.from_json(u["proof"]) if isinstance(u, dict) and isinstance(u.get("proof"), dict) else None
               for n, u in (d.get("universal") or {}).items()}
        request = d.get("request")
        return cls(request if isinstance(request, dict) else None, Host.from_json(d.get("host")),
                   KernelInfo(k.get("config"), k.get("version"), k.get("source"), k), tuple(d.get("studies") or ()),
                   {b: RunBuild.from_json(v) for b, v in (d.get("builds") or {}).items()},
                   {n: RunWorkload.from_json(w) for n, w in (d.get("workloads") or {}).items()}, uni,
                   d.get("phases_seconds") or {}, _num(d.get("total_seconds")), d,
                   {n: LayoutBuild(v.get("proof"), v.get("bolt"), v.get("order")) for n, v in (d.get("layout") or {}).items()},
                   {n: v.get("proof") for n, v in (d.get("clang") or {}).items()},
                   sim if isinstance(sim := (d.get("variability") or {}).get("similarity"), str) else None)

    @classmethod
    def read(cls, path: Path, hint: str = HINT) -> Run | None:
        """The run.json at path, None when nothing is there."""
        d = inputs.read_json(path, hint, dict, missing_ok=True)
        return None if d is None else cls.from_json(d, path, hint)

    def proofs(self) -> dict[str, Proof]:
        """Every optimized build's proof: the app-specific kernels' (by workload), then the universal kernels'."""
        own = {n: w.proof for n, w in self.workloads.items() if w.proof is not None}
        return own | {n: p for n, p in self.universal.items() if p is not None}
