"""Benchmark N kernels × M workloads in one interleaved design.

A cell is (kernel, workload); one boot measures one cell (warm-up discarded, then RUNS measured
runs). Every round boots each cell once, in a fresh random order per round (randomized blocks,
seeded and recorded) or alternating A B / B A; drift over time then spreads over all kernels
instead of biasing one. Per cell: mean, sd, cv over boots; per workload the ratio of each kernel
to the baseline with a 95% interval over whole boots (kpgo.stats); per kernel the geometric mean of its
speedups across workloads with its CI. With simulated counters (`sim`), each boot also carries
per-operation kernel/user instruction, L1i-miss and iTLB-miss figures from the QEMU plugin.

Each boot's sample is kept (OUT/boots/ROUND-WORKLOAD-KERNEL/sample.json) with the key of its cell
(kernel build, workload spec, runs, simulator settings) and the bench's set of cells (its block, _block_id): an
interrupted bench resumes and more boots add rounds, but a bench whose kernels or workloads changed is measured
again whole, so that every ratio comes from one interleaved design. OUT/results.json holds the
design, host facts, every raw sample and the summaries, so a report can be regenerated from it.

Where the boots run is a Runner: Here (this process, one boot after another), or with --cluster
the one of the cluster the command hands in (kpgo.remote.Remote; kpgo.cluster's, which boots each
as a Ray task, each round whole on one node, and returns the samples for this process to write).
Both do each boot with measure()."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import platform
import random
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from kpgo import atomic, host, inputs, stats, vm, workloads
from kpgo import sim as simulator
from kpgo.errors import InfraError, KpgoError, UserError
from kpgo.guest import contract
from kpgo.kernel import kbuild
from kpgo.progress import fmt_secs, say
from kpgo.remote import Remote
from kpgo.report import present

TCG_NOTE = (
    "Guests ran under QEMU TCG (software emulation): wall-clock timings there do not show what code layout "
    "does on a real CPU; treat throughput ratios as indicative only."
)
SIM_NOTE = (
    "Simulated counters: guest instructions and simulated L1i/iTLB misses counted by kpgo's QEMU plugin in the "
    "measured window, per operation (docs/SIM.md); deterministic up to interrupts and scheduling, unlike TCG timings."
)
SIM_SIDES = ("kernel", "user")
SIM_COUNTS = ("insns", "l1i_misses", "itlb_misses", "taken_branches", "indirect_branches", "itlb_4k_misses")
SIM_DERIVED = ("fetch_bytes", "stall_cycles")  # l1i accesses x line size; front-end stall estimate (docs/SIM.md)
SIM_METRICS = tuple(f"{s}_{c}_per_op" for s in SIM_SIDES for c in SIM_COUNTS + SIM_DERIVED) + ("kernel_insn_share", "kernel_l1i_share", "kernel_itlb_share")
# What a user asks first of a kernel under simulation: how much less work per operation it does.
SIM_HEADLINE = ("kernel_insns_per_op", "kernel_l1i_misses_per_op", "kernel_taken_branches_per_op")
ORDERS = ("random", "abba")
INTERVAL_TEXT = (f"95% {stats.METHOD_TEXT}; with fewer than {stats.MIN_BOOTS} boots on a side, the range of the ratio, "
                 "not an interval (docs/EVALUATION.md)")
BENCH_MARKS = ("results.json", "boots", "plan.json")  # what a bench directory holds (older ones have no lock or plan)
SIM_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class SimChoice:
    """Whether boots count simulated events: "on", "off", or "auto" (the default): on exactly when the
    guests run under TCG, where wall-clock cannot show what code layout does, off under KVM."""

    mode: str = "auto"
    config: Any = None  # kpgo.sim.SimConfig; None: its defaults

    def resolve(self, accel: str) -> Any:
        """The SimConfig to measure with under `accel`, or None."""
        if self.mode not in SIM_MODES:
            raise ValueError(f"simulation mode {self.mode!r}")
        if self.mode == "off" or (self.mode == "auto" and accel == "kvm"):
            return None
        return self.config if self.config is not None else simulator.SimConfig()


@dataclass(frozen=True)
class Kernel:
    label: str
    build_dir: Path


@dataclass(frozen=True)
class Design:
    boots: int = 3  # rounds; with precision, the first rounds before any is added
    runs: int = 1
    order: str = "random"
    seed: int | None = None  # None: reuse the seed of an earlier bench in the same directory, or draw one
    precision: float | None = None  # add rounds until every cell's interval half-width (relative) is at most this
    max_boots: int = 10  # with precision: rounds at most
    max_time: float | None = None  # with precision: seconds of booting at most (a round is begun only if it fits)


def parse_kernel_arg(text: str) -> Kernel:
    label, sep, path = text.partition("=")
    if not sep:
        path, label = text, Path(text).name
    if not vm.SHAREABLE.fullmatch(label) or "/" in label or label.strip() != label or not label:
        # The label names each boot's directory, which virtme-ng shares with the guest.
        raise UserError(f"--kernel {text}: the label {label!r} is not a name of letters, digits and _ + . -",
                        "write --kernel LABEL=BUILD_DIR, e.g. --kernel pgo=builds/optimized")
    return Kernel(label, Path(path).resolve())


def host_facts(accel: str) -> dict:
    return {"cpu": host.cpu_model(), "accelerator": accel, "qemu": host.qemu_version(), "host_kernel": platform.release(), "gcc": kbuild.gcc_version()}


def plan(cells: list[tuple[str, str]], boots: int, order: str, seed: int,
         partial: dict[int, list[str]] | None = None) -> list[dict[str, Any]]:
    """The boot sequence: `boots` rounds, each holding every cell once, except a round in `partial` (added by
    --precision), which holds every cell of the workloads it names."""
    rng = random.Random(seed)
    partial = partial or {}
    seq = []
    for i in range(boots):
        row = [c for c in cells if i not in partial or c[1] in partial[i]]
        if order == "random":
            rng.shuffle(row)
        elif i % 2:
            row.reverse()
        seq += [{"round": i, "kernel": k, "workload": w} for k, w in row]
    return seq


SHARE_COUNTS = (("insn", "insns"), ("l1i", "l1i_misses"), ("itlb", "itlb_misses"))  # kernel_<short>_share of <count>
SHARE_METRICS = tuple(f"kernel_{short}_share" for short, _ in SHARE_COUNTS)


def _window_per_op(w: dict, ops: float, line: int) -> dict[str, float]:
    """One window's counters divided by the operations it held, and the kernel's shares of its events."""
    if ops <= 0:
        raise InfraError("a measured run or step has no operation count, so counters cannot be given per operation", "see the boot's result.json")
    d = {f"{s}_{c}_per_op": w[s][c] / ops for s in SIM_SIDES for c in SIM_COUNTS}
    for s in SIM_SIDES:
        d[f"{s}_fetch_bytes_per_op"] = w[s]["l1i_accesses"] * line / ops
        d[f"{s}_stall_cycles_per_op"] = simulator.frontend_stall_cycles(w[s]) / ops
    d.update(_shares(w))
    return d


def _shares(w: dict) -> dict[str, float]:
    out: dict[str, float] = {}
    for short, c in SHARE_COUNTS:
        total = w["kernel"][c] + w["user"][c]
        out[f"kernel_{short}_share"] = w["kernel"][c] / total if total else math.nan
    return out


def _mean_of(per: list[dict[str, float]]) -> dict[str, float]:
    return {m: sum(d[m] for d in per) / len(per) for m in SIM_METRICS}


def _geomean(values: list[float]) -> float:
    """Each value weighs the same whatever its scale (a fork costs a thousand get* calls); a zero makes it zero, which
    the summaries then leave out as they leave out any zero count."""
    if any(v <= 0 for v in values):
        return 0.0
    return math.exp(sum(math.log(v) for v in values) / len(values))


def sim_steps(windows: list[dict], step_ops: list[dict[str, float]], line: int = 64) -> dict[str, dict[str, float]]:
    """Per-operation figures of each load step of one boot measured with a window per step (the workload's
    `windows = "step"`): each step's window divided by that step's own operation count, averaged over the runs.
    `step_ops`: each measured run's step counts (contract.Run.step_ops), in the order the windows were opened."""
    if len(windows) != sum(len(r) for r in step_ops):
        raise InfraError(f"the simulator reported {len(windows)} window(s) for {sum(len(r) for r in step_ops)} load step(s) in "
                         f"{len(step_ops)} measured run(s)", "see the boot's console log and sim.json")
    per: dict[str, list[dict[str, float]]] = {}
    it = iter(windows)
    for run in step_ops:
        for name, ops in run.items():
            per.setdefault(name, []).append(_window_per_op(next(it), ops, line))
    return {name: _mean_of(ds) for name, ds in per.items()}


def sim_per_op(windows: list[dict], ops_per_run: list[float], line: int = 64, step_ops: list[dict[str, float]] | None = None) -> dict[str, float]:
    """Per-operation counter figures of one boot: each measured run's window divided by that run's
    operation count (its `ops`: exact where the generator reports or fixes it, else time x rate; the run's
    `ops_method` says which, docs/SIM.md), averaged over the runs. `line`: the simulated L1i line size.

    With a window per load step (`step_ops` given, see sim_steps) each per-op figure is the geometric mean over the
    steps of the step's own figure, so that every step weighs the same whatever its number of operations; the kernel's
    shares stay those of all the run's events (its windows summed), as one window around the run would give them."""
    if step_ops is not None:
        if len(step_ops) != len(ops_per_run):
            raise InfraError(f"{len(step_ops)} runs' step counts for {len(ops_per_run)} measured run(s)", "see the boot's result.json")
        steps = sim_steps(windows, step_ops, line)
        out = {m: _geomean([d[m] for d in steps.values()]) for m in SIM_METRICS if m not in SHARE_METRICS}
        it = iter(windows)
        runs = [_summed([next(it) for _ in r]) for r in step_ops]
        shares = [_shares(w) for w in runs]
        return {m: out[m] if m in out else sum(d[m] for d in shares) / len(shares) for m in SIM_METRICS}
    if len(windows) != len(ops_per_run):
        raise InfraError(f"the simulator reported {len(windows)} window(s) for {len(ops_per_run)} measured run(s)", "see the boot's console log and sim.json")
    return _mean_of([_window_per_op(w, ops, line) for w, ops in zip(windows, ops_per_run)])


def _summed(windows: list[dict]) -> dict[str, dict[str, int]]:
    """The counters of several windows added up, per side."""
    return {s: {c: sum(w[s][c] for w in windows) for c in simulator.COUNTERS} for s in SIM_SIDES}


def step_spread(samples: list[dict]) -> dict[str, dict[str, dict[str, dict[str, dict[str, float]]]]]:
    """workload -> kernel -> load step -> headline metric -> its n, mean, sd and cv over boots, for the samples with
    per-step figures (`sim_steps`, a workload with a window per step): how far each step's own per-op figure moves
    from boot to boot, which the geometric mean over the steps hides."""
    per: dict[str, dict[str, dict[str, dict[str, list[float]]]]] = {}
    for s in samples:
        for name, figs in (s.get("sim_steps") or {}).items():
            cell = per.setdefault(s["workload"], {}).setdefault(s["kernel"], {}).setdefault(name, {})
            for m in SIM_HEADLINE:
                if m in figs:
                    cell.setdefault(m, []).append(figs[m])
    return {w: {k: {name: {m: stats.describe(v) for m, v in ms.items()} for name, ms in steps.items()} for k, steps in ks.items()}
            for w, ks in per.items()}


def add_step_spread(results: dict) -> None:
    """step_spread of the results' samples, as `step_spread` of each workload in results["workloads"] (its kernels
    in its order)."""
    for n, by_kernel in step_spread(results["samples"]).items():
        w = results["workloads"].get(n)
        if w is not None:
            w["step_spread"] = {k: by_kernel[k] for k in w["kernels"] if k in by_kernel}


def step_spread_lines(results: dict) -> list[str]:
    """The terminal table of each workload's step_spread: per step, the baseline's kernel instructions per operation
    and, per kernel, the cv over boots of the three headline metrics."""
    lines: list[str] = []
    for n, w in results["workloads"].items():
        spread = w.get("step_spread")
        if not spread:
            continue
        kernels = list(spread)
        names = list(dict.fromkeys(name for k in kernels for name in spread[k]))
        base = spread.get(results["baseline"]) or spread[kernels[0]]
        boots = max(d["n"] for k in kernels for ms in spread[k].values() for d in ms.values())
        lines += ["", f"{n}: boot-to-boot spread per load step (its own window and count; up to {boots} boots): cv over boots of kernel "
                  "instructions / L1i misses / taken branches per operation of the step",
                  f"  {'step':<12} {'insns/op':>12} " + " ".join(f"{k[:26]:>26}" for k in kernels)]
        for name in names:
            mean = (base.get(name) or {}).get("kernel_insns_per_op")
            cells = ["/".join(f"{d[m]['cv']:.1%}" if m in d else "–" for m in SIM_HEADLINE) for d in (spread[k].get(name) or {} for k in kernels)]
            lines.append(f"  {name:<12} {format(mean['mean'], ',.0f') if mean else '–':>12} " + " ".join(f"{c:>26}" for c in cells))
    return lines


def _cell_key(build: dict, workload: contract.Workload, runs: int, sim: Any, data: str = "tmpfs") -> str:
    sim_key = {**asdict(sim), "report_format": simulator.REPORT_FORMAT} if sim else None  # a new counter set measures again
    # to_json: the workload file's validated dict, which the key has hashed since the first bench
    cell = {"kernel": build["key"], "workload": workload.to_json(), "runs": runs, "sim": sim_key}
    if data != "tmpfs":  # another place for the data is another measurement; on tmpfs the key is as it always was
        cell["data"] = data
    text = json.dumps(cell, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _block_id(cell_keys: Iterable[str]) -> str:
    """What a round compares: its set of cells (their keys). Each round boots every cell once in random order, so
    host drift spreads over all kernels; a boot kept from a bench of another set of cells (a kernel added, rebuilt,
    a workload added) ran in another block, possibly hours earlier under other host load, which moves even the
    simulated per-operation counts (timer interrupts per operation follow the emulator's speed: docs/EVALUATION.md).
    Such boots are measured again; an interrupted bench of the same cells, or one given more boots, keeps its boots."""
    return hashlib.sha256(json.dumps(sorted(set(cell_keys))).encode()).hexdigest()[:16]


PLAN = "plan.json"
SAMPLE_SHAPE = {"cell_key": str, "kernel": str, "workload": str, "mean": float, "values": [float], "block?": str}  # what is reused of a boot


def _earlier_plan(out: Path) -> dict[str, Any]:
    """What an earlier bench in `out` planned: its plan.json (written before its first boot), or for a bench of before
    plan.json its results.json's design; {} when there is none or it cannot be read."""
    for name, shape in ((PLAN, {"seed": int}), ("results.json", {"design": {"seed": int}})):
        try:
            d = inputs.read_json(out / name, "", shape, missing_ok=True)
        except UserError:  # unusable: the plan is made afresh, as for a new bench
            continue
        if d is not None:
            return d if name == PLAN else d["design"]
    return {}


def _seed(out: Path, design: Design) -> int:
    if design.seed is not None:
        return design.seed
    earlier = _earlier_plan(out).get("seed")
    return earlier if isinstance(earlier, int) else random.SystemRandom().randrange(1 << 31)


def _write_plan(out: Path, seed: int, design: Design, cells: list[tuple[str, str]], block: str, rounds: int,
                partial: dict[int, list[str]]) -> None:
    """The plan, before the boots it names: an interrupted bench resumes the same order (plan() gives round i the same
    order whatever the rounds after it), and a bench adding rounds for --precision records each before booting it,
    with the workloads it holds."""
    atomic.write_json(out / PLAN, {"seed": seed, "order": design.order, "block": block, "rounds": rounds,
                                   "partial": {str(i): w for i, w in sorted(partial.items())},
                                   "cells": [list(c) for c in cells], "precision": design.precision,
                                   "max_boots": design.max_boots, "max_time": design.max_time})


def _earlier_partial(earlier: dict[str, Any], names: list[str], first: int, rounds: int) -> dict[int, list[str]]:
    """The added rounds of an earlier plan that this bench keeps (from round `first` on, below `rounds`), each with its
    workloads among `names`; a plan that cannot be read so gives none (its rounds are whole)."""
    got = earlier.get("partial")
    if not isinstance(got, dict):
        return {}
    out = {}
    for i, wls in got.items():
        if isinstance(i, str) and i.isdigit() and first <= int(i) < rounds and isinstance(wls, list):
            out[int(i)] = [n for n in names if n in wls]
    return out


def _boots_of(out: Path, steps: list[dict[str, Any]], keys: dict[tuple[str, str], str], block: str) -> tuple[list[Boot], int]:
    """The Boot of each step, with the sample an earlier bench left for it if its cell and block match, and how many
    samples of another block (another set of cells) were found and set aside."""
    boots, other_block = [], 0
    for step in steps:
        bootdir = out / "boots" / f"{step['round']:02d}-{step['workload']}-{step['kernel']}"
        key = keys[(step["kernel"], step["workload"])]
        try:  # an unusable sample (a FIFO, a cut file) is measured again, like a missing one
            rec = inputs.read_json(bootdir / "sample.json", "", SAMPLE_SHAPE, missing_ok=True)
        except UserError:
            rec = None
        ok = isinstance(rec, dict) and rec.get("cell_key") == key
        # A boot of a different set of cells ran in another block, at another time: not comparable (see _block_id).
        if ok and rec.get("block", block) != block:
            ok, other_block = False, other_block + 1
        boots.append(Boot(step, bootdir, key, rec if ok else None, block))
    return boots, other_block


def wide_cells(results: dict[str, Any], metric: str, target: float) -> list[dict[str, Any]]:
    """The cells (a kernel on a workload, against the baseline) whose interval on `metric` (a simulated per-op metric,
    or "speedup") is wider than ±target relative to the ratio, with their half-widths (inf: no interval yet). A ratio
    that cannot be formed (a count of 0 on the baseline) cannot narrow and is left out."""
    out = []
    for n, w in results["workloads"].items():
        rows = {r["kernel"]: r for r in w["summary"]} if metric == "speedup" else {k: m.get(metric) or {} for k, m in (w["sim"] or {}).items()}
        for label, rec in rows.items():
            if label == results["baseline"] or not isinstance(rec.get("ratio"), float) or not math.isfinite(rec["ratio"]):
                continue
            h = stats.half_width(rec)
            if h > target:
                out.append({"kernel": label, "workload": n, "half_width": h, "n": rec.get("n")})
    return out


@dataclass
class Boot:
    """One boot of the plan: a cell in a round, the directory its sample and outputs go to, the cell's key, and the
    sample an earlier bench left for it with the same key (None: it is to be booted)."""

    step: dict[str, Any]
    bootdir: Path
    key: str
    kept: dict | None = None
    block: str = ""  # _block_id of the bench's cells, stored with the sample

    @property
    def cell(self) -> tuple[int, str, str]:
        return self.step["round"], self.step["kernel"], self.step["workload"]


@dataclass(frozen=True)
class BootSpec:
    """What every boot of a bench is measured with besides its kernel (a cluster sends it to the nodes once)."""

    workloads: dict[str, contract.Workload]
    runs: int
    guest: vm.Guest
    accel: str
    sim: Any  # kpgo.sim.SimConfig, or None


def measure(image: Path, workdir: Path, step: dict[str, Any], key: str, how: BootSpec) -> dict[str, Any]:
    """One boot of one cell: the same work whether this process does it or a task on a cluster node. The guest's
    files and the console log go to workdir. Returns {"sample": its record} or, when the boot fails, {"error",
    "hint", "exit_code"} (a failing cell does not stop the others); either names the machine ("host")."""
    job = contract.Job(mode="bench", workload=how.workloads[step["workload"]], runs=how.runs)
    sim = how.sim
    extra = {"sim": sim} if sim is not None else {}
    log = workdir / "console.log"
    retried: list[str] = []
    try:
        while True:
            try:
                result = vm.run_agent(image, workdir / "guest", job, guest=how.guest, log=log, accel=how.accel, **extra)
                break
            except KpgoError:
                # The TCG text-patching race (vm.TEXT_PATCH_RACE) strikes in the window too (up to a quarter of micro's
                # boots on the server kernel): boot once more rather than fail the cell; the kernel is not at fault.
                if retried or not vm.text_patch_race(log, how.accel):
                    raise
                kept = log.with_name(log.name + ".int3")
                log.replace(kept)
                why = f"{vm.TEXT_PATCH_RACE} (QEMU TCG racing the kernel's live text patching)"
                retried.append(f"{why}: {kept.name}")
                say(f"bench: {step['kernel']} on {step['workload']}: the guest died of {why}; console log kept as {kept}; booting once more")
        runs = result.runs
        values = [r.value for r in runs]
        ops = [r.ops for r in runs]
        steps = [r.step_ops for r in runs] if job.workload.windows == "step" else None
        rec = {
            **step, "cell_key": key, "finished_at": time.time(), "values": values, "mean": sum(values) / len(values),
            "parts": [r.parts for r in runs], "secondary": [r.secondary for r in runs],
            "kernel_share": [r.kernel_share for r in runs], "ops": ops,
            "ops_method": [r.ops_method for r in runs], "ops_estimate": [r.ops_estimate for r in runs],
            "sim": result.sim, "sim_per_op": sim_per_op(result.sim or [], ops, sim.l1i_line, steps) if sim is not None else None,
            # a window per load step: each step's own per-op figures (sim_per_op is their geometric mean)
            "step_ops": [r.step_ops for r in runs],
            "sim_steps": sim_steps(result.sim or [], steps, sim.l1i_line) if sim is not None and steps is not None else None,
            "timings": result.timings, "placement": result.placement, "sim_boot": result.sim_boot,
            "mitigations": result.mitigations, "build_id": result.build_id, "host": host.identity(), "retried": retried,
        }
    except KpgoError as e:
        return {"error": e.message, "hint": e.hint, "exit_code": e.exit_code, "host": host.identity()}
    return {"sample": rec}


class Progress:
    """The bench's lines on the terminal: each boot as it starts, with the time left estimated from the boots
    finished so far, and each failure."""

    def __init__(self, total: int, rounds: int) -> None:
        self.total, self.rounds = total, rounds
        self.started = self.finished = 0
        self.number: dict[tuple[int, str, str], int] = {}
        self.t0 = time.monotonic()

    def start(self, b: Boot, where: str = "") -> None:
        self.started += 1
        self.number[b.cell] = self.started
        elapsed = time.monotonic() - self.t0
        eta = f", ~{fmt_secs(elapsed / self.finished * (self.total - self.finished))} left" if self.finished else ""
        say(f"bench: boot {self.started}/{self.total}: {b.step['kernel']} on {b.step['workload']} "
            f"(round {b.step['round'] + 1}/{self.rounds}){where}{eta}")

    def done(self, b: Boot, error: str | None) -> None:
        self.finished += 1
        if error is not None:
            say(f"bench: boot {self.number.get(b.cell, '?')}/{self.total}: {b.step['kernel']} on {b.step['workload']} FAILED: {error}")


class Runner(Protocol):
    """Where the boots run: in this process (Here), or as tasks on a Ray cluster (kpgo.cluster.BenchOnCluster)."""

    def prepare(self, builds: dict[str, tuple[Path, str]], wls: list[contract.Workload], choice: SimChoice) -> tuple[str, Any]:
        """Before any boot: the accelerator and the SimConfig (or None) the boots use. builds: label -> (build
        directory, build key)."""
        ...

    def run(self, boots: list[Boot], how: BootSpec, progress: Progress) -> Iterator[tuple[Boot, dict[str, Any]]]:
        """Boot what the plan needs (at least every boot without a kept sample); yield each with measure()'s outcome,
        its outputs in its bootdir."""
        ...

    def facts(self, samples: list[dict]) -> tuple[dict[str, Any], dict[str, Any]]:
        """After the boots, given the bench's samples: what results.json records of the machines (at least "host"),
        and what its design adds."""
        ...


class Here:
    """Every boot in this process, one after another, in the plan's order (no --cluster)."""

    def __init__(self) -> None:
        self.dirs: dict[str, Path] = {}
        self.accel = ""

    def prepare(self, builds: dict[str, tuple[Path, str]], wls: list[contract.Workload], choice: SimChoice) -> tuple[str, Any]:
        self.dirs = {label: d for label, (d, _) in builds.items()}
        # A plugin sees only TCG-translated code: simulated boots run under TCG even where KVM works.
        probed = "tcg" if choice.mode == "on" else vm.accelerator(kbuild.image(next(iter(self.dirs.values()))))
        sim = choice.resolve(probed)
        self.accel = "tcg" if sim is not None else probed
        return self.accel, sim

    def run(self, boots: list[Boot], how: BootSpec, progress: Progress) -> Iterator[tuple[Boot, dict[str, Any]]]:
        for b in boots:
            if b.kept is None:
                progress.start(b)
                yield b, measure(kbuild.image(self.dirs[b.step["kernel"]]), b.bootdir, b.step, b.key, how)

    def facts(self, samples: list[dict]) -> tuple[dict[str, Any], dict[str, Any]]:
        return {"host": host_facts(self.accel)}, {}


@contextlib.contextmanager
def _runner(cluster: Remote | None) -> Iterator[Runner]:
    if cluster is None:
        yield Here()
        return
    with cluster.bench_runner() as runner:  # (imports Ray: only with --cluster)
        yield runner


def _keep(b: Boot, outcome: dict[str, Any], samples: dict[tuple[int, str, str], dict], failures: dict[tuple[int, str, str], dict],
          progress: Progress) -> None:
    """A boot's outcome, wherever it ran: its sample.json, or its failed.json (a failed cell has no sample, so a rerun
    boots it again). A cell booted a second time (its round moved whole to another host) replaces what it had."""
    if "sample" in outcome:
        rec = {**outcome["sample"], "block": b.block}
        (b.bootdir / "failed.json").unlink(missing_ok=True)
        atomic.write_json(b.bootdir / "sample.json", rec)
        samples[b.cell] = rec
        failures.pop(b.cell, None)
        progress.done(b, None)
        return
    fail = {**b.step, "cell_key": b.key, "error": outcome["error"], "hint": outcome["hint"], "exit_code": outcome["exit_code"],
            "host": outcome.get("host"), "console_log": str(b.bootdir / "console.log"), "boot_dir": str(b.bootdir),
            "failed_at": time.time()}
    atomic.write_json(b.bootdir / "failed.json", fail)
    if samples.pop(b.cell, None) is not None:
        # Another host's sample of a round that has moved: kept aside, so that a rerun does not count it.
        with contextlib.suppress(FileNotFoundError):
            (b.bootdir / "sample.json").replace(b.bootdir / "sample.superseded.json")
    failures[b.cell] = fail
    progress.done(b, outcome["error"])


def bench(
    kernels: list[Kernel],
    wls: list[contract.Workload],
    out: Path,
    *,
    design: Design,
    guest: vm.Guest,
    cells: list[tuple[str, str]] | None = None,
    sim: Any = None,
    cluster: Remote | None = None,
) -> dict:
    """Measure `cells` (default: every kernel on every workload); kernels[0] is the baseline and must be
    measured on every workload. `sim`: a kpgo.sim.SimConfig to count simulated CPU events, a SimChoice (auto:
    simulated under TCG only), or None. `cluster`: a Ray address (or auto, local) to boot on as Ray tasks, each
    round on one node (docs/SCALE.md); None: every boot in this process, and Ray is never imported."""
    if not kernels or not wls:
        raise UserError("bench needs a kernel and a workload", "pass --kernel LABEL=BUILD_DIR (two or more to compare them)")
    if len({k.label for k in kernels}) != len(kernels):
        raise UserError("kernel labels must be distinct", "name them with LABEL=BUILD_DIR")
    if design.boots < 1 or design.runs < 1:
        raise UserError("--boots and --runs must be at least 1", "fix the option")
    if design.order not in ORDERS:
        raise UserError(f"unknown order {design.order!r}", f"use one of {', '.join(ORDERS)}")
    if design.precision is not None:
        if not 0 < design.precision < 1:
            raise UserError(f"--precision {design.precision}: a half-width relative to the ratio, between 0 and 1", "e.g. --precision 0.015 for ±1.5%")
        if design.boots < stats.MIN_BOOTS or design.max_boots < design.boots:
            raise UserError(f"--precision needs --boots of at least {stats.MIN_BOOTS} (an interval needs them) and --max-boots of at "
                            f"least --boots (here {design.boots} and {design.max_boots})", "fix --boots or --max-boots")
        if design.max_time is not None and design.max_time <= 0:
            raise UserError("--max-time must be positive", "e.g. --max-time 6h")
    base = kernels[0].label
    names = [w.name for w in wls]
    cells = cells or [(k.label, n) for n in names for k in kernels]
    missing = [n for n in names if (base, n) not in cells]
    if missing:
        raise UserError(f"the baseline kernel {base} is not measured on {', '.join(missing)}", "every workload needs the baseline")
    builds: dict[str, dict] = {}
    for k in kernels:
        builds[k.label] = kbuild.load_build(k.build_dir, "build it with `kpgo build`")
        workloads.check_kernel([w for w in wls if (k.label, w.name) in cells], k.build_dir, disk=guest.data == "disk")
    by_name = {w.name: w for w in wls}
    choice = sim if isinstance(sim, SimChoice) else SimChoice("on" if sim is not None else "off", sim)
    with _runner(cluster) as runner, contextlib.ExitStack() as held:
        accel, sim = runner.prepare({k.label: (k.build_dir, str(builds[k.label]["key"])) for k in kernels}, wls, choice)
        atomic.check_resumable(out, "bench directory", BENCH_MARKS, "-o")
        held.enter_context(atomic.exclusive(out, "bench directory"))  # creates it; one writer: two would boot the same cells
        seed = _seed(out, design)
        keys = {c: _cell_key(builds[c[0]], by_name[c[1]], design.runs, sim, guest.data) for c in cells}
        block = _block_id(keys.values())
        rounds = design.boots
        partial: dict[int, list[str]] = {}  # the rounds --precision added for some workloads only
        earlier = _earlier_plan(out)
        if design.precision is not None and earlier.get("block") == block and earlier.get("seed") == seed:
            rounds = max(rounds, min(int(earlier.get("rounds") or 0), design.max_boots))  # where the interrupted one was
            partial = _earlier_partial(earlier, names, design.boots, rounds)
        boots: list[Boot] = []
        samples: dict[tuple[int, str, str], dict] = {}
        failures: dict[tuple[int, str, str], dict] = {}
        spec = BootSpec(by_name, design.runs, guest, accel, sim)
        t0, booted = time.monotonic(), 0
        precision: dict[str, Any] | None = None
        while True:
            _write_plan(out, seed, design, cells, block, rounds, partial)
            seq = plan(cells, rounds, design.order, seed, partial)
            new, other_block = _boots_of(out, seq[len(boots):], keys, block)
            if other_block:
                say(f"bench: the kernels or workloads of the bench in {out} changed since its {other_block} earlier boots: every "
                    "cell is measured again, so that every ratio comes from one interleaved design")
            kept = {b.cell: b.kept for b in new if b.kept is not None}
            if kept:
                say(f"bench: {len(kept)} of {len(new)} boots kept from an earlier bench in {out}")
            boots += new
            samples |= kept
            for b in boots:  # what this invocation measured counts as kept when rounds are added (a cluster's rounds)
                b.kept = samples.get(b.cell)
            todo = [b for b in boots if b.cell not in failures]  # a boot failed here is retried by the next command
            progress = Progress(sum(b.kept is None for b in todo), rounds)
            for b, outcome in runner.run(todo, spec, progress):
                _keep(b, outcome, samples, failures, progress)
                booted += 1
            if design.precision is None:
                break
            got = [samples[b.cell] for b in boots if b.cell in samples]
            metric = SIM_HEADLINE[0] if sim is not None else "speedup"
            wide = wide_cells(summarize(kernels, wls, cells, got, base), metric, design.precision)
            # The next round holds every cell of the workloads with a wide cell: each workload's kernels stay
            # compared within the same rounds, and a workload already narrow enough costs no more boots.
            again = [n for n in names if any(c["workload"] == n for c in wide)]
            nxt = [c for c in cells if c[1] in again]
            took = time.monotonic() - t0
            next_round = took / booted * len(nxt) if booted else 0.0
            stop = ("met" if not wide else "max_boots" if rounds >= design.max_boots
                    else "max_time" if design.max_time is not None and took + next_round > design.max_time else None)
            if stop is not None:
                precision = {"target": design.precision, "metric": metric, "rounds": rounds, "max_boots": design.max_boots,
                             "max_time": design.max_time, "stopped": stop, "wide": wide}
                break
            worst = max(wide, key=lambda c: c["half_width"])
            say(f"bench: {len(wide)} cell(s) wider than ±{design.precision:.1%} on {metric} after {rounds} round(s) (widest: "
                f"{worst['kernel']} on {worst['workload']} ±{worst['half_width']:.1%}): adding round {rounds + 1} "
                + ("of every cell" if len(nxt) == len(cells) else f"of {', '.join(again)} ({len(nxt)} of {len(cells)} cells)"))
            if len(nxt) < len(cells):
                partial[rounds] = again
            rounds += 1
        got = [samples[b.cell] for b in boots if b.cell in samples]  # in the plan's order
        machines, placed = runner.facts(got)
    results = summarize(kernels, wls, cells, got, base)
    results["failed"] = list(failures.values())
    results |= {
        "schema": 3,
        "design": {
            "order": "randomized blocks (a fresh random order of all cells per round)" if design.order == "random" else "alternating A B … / … B A per round",
            "order_name": design.order, "seed": seed, "boots_per_kernel": rounds,
            "boots_by_workload": {n: len({s["round"] for s in seq if s["workload"] == n}) for n in names},  # as planned
            "runs_per_boot": design.runs,
            "warmup_per_boot": True, "unit_of_replication": "boot", "sequence": seq, "interval": INTERVAL_TEXT,
            "precision": precision, **placed,
        },
        "measurement": {"accelerator": accel, "clock": "wall-clock", "sim": asdict(sim) if sim is not None else None, "sim_mode": choice.mode,
                        "data": guest.data,  # where each workload's run directory was: tmpfs or disk (vm.Guest)
                        "headline": "simulated" if sim is not None else "wall-clock",
                        "placement": {w: next((s["placement"] for s in got if s["workload"] == w and s.get("placement")), None) for w in names},
                        "ops_methods": {w: sorted({m for s in got if s["workload"] == w for m in s.get("ops_method") or ["estimate"]}) for w in names},
                        # the icount shift each workload's windows ran under (None: the host's clock; SimConfig.for_guest)
                        "icount": {w: next((win.get("icount") for s in got if s["workload"] == w for win in s.get("sim") or []), None)
                                   for w in names} if sim is not None else None},
        "kernels": {k.label: {"build_dir": str(k.build_dir), "variant": builds[k.label]["variant"],
                              "kernel_release": builds[k.label]["kernel_release"], "flags": kbuild.extra_flags(builds[k.label]),
                              "mitigations": next((s["mitigations"] for s in got if s["kernel"] == k.label and s.get("mitigations")), None)}
                    for k in kernels},
        **machines,
        "note": (TCG_NOTE if accel == "tcg" else "Guests ran under KVM.") + (" " + SIM_NOTE if sim is not None else ""),
    }
    atomic.write_json(out / "results.json", results)
    return results


def raise_if_failed(results: dict, where: Path) -> None:
    """After the tables are out: a bench with failed boots exits non-zero, naming them."""
    failed = results.get("failed") or []
    if failed:
        cells = sorted({f"{f['kernel']} on {f['workload']}" for f in failed})
        total = len(results["design"]["sequence"])
        raise InfraError(f"{len(failed)} of {total} boots failed ({', '.join(cells)}; first: {failed[0]['error']})",
                         f"the other cells are in {where / 'results.json'}; run the same command again to retry only the failed boots")


def summarize(kernels: list[Kernel], wls: list[contract.Workload] | list[Measured], cells: list[tuple[str, str]], samples: list[dict], base: str) -> dict:
    """Per workload and kernel: describe, speedup vs the baseline with CI, simulated figures; per kernel the
    geometric mean of speedups. Speedup = ratio of means oriented so that > 1 is better."""
    by_cell: dict[tuple[str, str], list[dict]] = {}
    for s in sorted(samples, key=lambda s: s["round"]):
        by_cell.setdefault((s["kernel"], s["workload"]), []).append(s)
    out: dict[str, Any] = {"baseline": base, "workloads": {}, "samples": samples}
    pairs: dict[str, list[tuple[list[float], list[float]]]] = {}
    geo_names: dict[str, list[str]] = {}
    for w in wls:
        n = w.name
        # A cell whose every boot failed has no sample (it is listed in results["failed"]); without the
        # baseline's samples a workload has no ratios at all, so it is left out of the summaries.
        labels = [k.label for k in kernels if (k.label, n) in cells and by_cell.get((k.label, n))]
        if base not in labels:
            continue
        b = [s["mean"] for s in by_cell[(base, n)]]
        rows: list[dict[str, Any]] = []
        simrows: dict[str, dict[str, dict[str, Any]]] = {}
        for label in labels:
            o = [s["mean"] for s in by_cell[(label, n)]]
            pair = (b, o) if w.higher_is_better else (o, b)
            rec = stats.ratio_record(*pair)
            rows.append({"kernel": label, **stats.describe(o), **rec, "speedup": rec["ratio"]})
            if label != base:
                pairs.setdefault(label, []).append(pair)
                geo_names.setdefault(label, []).append(n)
            if all(s.get("sim_per_op") for s in by_cell[(label, n)] + by_cell[(base, n)]):
                simrows[label] = {}
                # a bench of an older simulator counted fewer metrics (restate() reads such results.json)
                for m in (m for m in SIM_METRICS if all(m in s["sim_per_op"] for s in by_cell[(label, n)] + by_cell[(base, n)])):
                    sb = [s["sim_per_op"][m] for s in by_cell[(base, n)]]
                    so = [s["sim_per_op"][m] for s in by_cell[(label, n)]]
                    simrows[label][m] = {**stats.describe(so), **stats.ratio_record(sb, so)}
        out["workloads"][n] = {
            "params": w.params, "unit": w.unit, "higher_is_better": w.higher_is_better, "kernels": labels,
            "summary": rows, "sim": simrows or None,
        }
    add_step_spread(out)  # per load step, for workloads with a window per step
    out["sim_geomean"] = {}
    simulated = {lb for w in out["workloads"].values() for lb in (w["sim"] or {}) if lb != base}
    for label in [k.label for k in kernels if k.label in simulated]:  # in the kernels' order: the same results.json every time
        out["sim_geomean"][label] = {}
        for m in SIM_HEADLINE + tuple(x for x in SIM_METRICS if x not in SIM_HEADLINE and "share" not in x):
            sp, used = [], []
            for n, w in out["workloads"].items():
                if m in ((w["sim"] or {}).get(label) or {}):
                    sp.append(([s["sim_per_op"][m] for s in by_cell[(base, n)]], [s["sim_per_op"][m] for s in by_cell[(label, n)]]))
                    used.append(n)
            if not sp or any(min(sum(b), sum(o)) <= 0 for b, o in sp):
                continue  # a zero count (user iTLB misses, say) has no geometric mean
            out["sim_geomean"][label][m] = _geomean_row(sp, used)
    out["sim_own_geomean"] = own_sim_geomean(out)
    out["sim_boot"] = boot_cost(samples, base, [k.label for k in kernels])
    out["geomean"] = {}
    for label, ps in pairs.items():
        rec = stats.geomean_record(ps)
        out["geomean"][label] = {"speedup": rec.pop("ratio"), **rec, "workloads": geo_names[label]}
    return out


@dataclass(frozen=True)
class Measured:
    """What summarize() reads of a workload: a contract.Workload, or this when only a results.json is at hand."""

    name: str
    unit: str
    higher_is_better: bool
    params: dict[str, Any]


def restate(results: dict[str, Any]) -> dict[str, Any]:
    """A results.json of schema 2, whose intervals were percentile bootstraps (too narrow at a few boots:
    docs/EVALUATION.md), with every ratio's interval computed again from its samples by kpgo.stats; the design says
    so. Schema 3 results are returned as they are."""
    if results.get("schema") != 2:
        return results
    base = results["baseline"]
    labels = [base, *(k for k in results["kernels"] if k != base)]
    wls = [Measured(n, w["unit"], bool(w["higher_is_better"]), w.get("params") or {}) for n, w in results["workloads"].items()]
    cells = sorted({(s["kernel"], s["workload"]) for s in results["samples"]})
    again = summarize([Kernel(k, Path(k)) for k in labels], wls, cells, results["samples"], base)
    design = {**results["design"], "interval": INTERVAL_TEXT,
              "restated": "intervals computed again from the samples; the bench itself gave percentile-bootstrap CIs"}
    return {**results, **again, "schema": 3, "design": design}


def own_sim_geomean(results: dict) -> dict[str, dict[str, Any]]:
    """Per headline simulated metric: the geometric mean over workloads of the app-specific kernel's ratio
    to the baseline on its own workload (optimized-W on W), with its interval, and the workloads used."""
    own = {n: f"optimized-{n}" for n in results["workloads"]}
    return {k: g for k in SIM_HEADLINE if (g := geomean_of(results, own, k))}


def geomean_of(results: dict, labels: dict[str, str], metric: str) -> dict[str, Any] | None:
    """The geometric mean over workloads of kernel labels[W]'s ratio to the baseline on W, in `metric`: a simulated
    per-op count (ratio < 1: fewer events) or "speedup" (wall-clock, ratio > 1: faster), with its interval and
    the workloads that had samples on both sides; None if none had."""
    pairs, used = [], []
    for n, label in labels.items():
        pair = boot_pair(results, n, results["baseline"], label, metric)
        if pair is not None:
            pairs.append(pair)
            used.append(n)
    if not pairs or any(min(sum(x), sum(y)) <= 0 for x, y in pairs):
        return None  # nothing measured, or a zero count, which has no geometric mean
    return _geomean_row(pairs, used)


def boot_pair(results: dict, workload: str, ref: str, label: str, metric: str) -> tuple[list[float], list[float]] | None:
    """The boots of `ref` and of `label` on `workload` in `metric` (a simulated per-op count, or "speedup": their
    throughput), ordered as kpgo.stats takes them, so that mean(second) / mean(first) is the ratio shown (a count: < 1
    fewer events; speedup: > 1 faster, whichever way the workload's unit goes); None unless both were measured."""
    samples = [x for x in results.get("samples", []) if x["workload"] == workload]
    if metric == "speedup":
        a, b = ([x["mean"] for x in samples if x["kernel"] == k] for k in (ref, label))
        hib = (results["workloads"].get(workload) or {}).get("higher_is_better", True)
        pair = (a, b) if hib else (b, a)
    else:
        a, b = ([x["sim_per_op"][metric] for x in samples if x["kernel"] == k and metric in (x.get("sim_per_op") or {})] for k in (ref, label))
        pair = (a, b)
    return pair if a and b else None


BOOT_COUNTS = ("insns", "l1i_misses", "taken_branches")


def boot_cost(samples: list[dict], base: str, labels: list[str]) -> dict[str, dict[str, Any]]:
    """With --sim-opt boot=on: per kernel, the guest's kernel-mode events from power-on to the agent's start (a path
    no workload profile covers). Each workload's boots are compared with the baseline's boots of the same workload,
    since the guest differs between workloads (vCPUs, the clock, a NIC) and a kernel of one workload would otherwise
    be set against the baseline's mix of guests: the ratio is the geometric mean over the workloads both booted, with
    its interval; mean and sd pool the kernel's boots. Empty without boot windows."""
    cell: dict[tuple[str, str], list[dict]] = {}  # (kernel, workload) -> its boots' kernel-mode counts
    for s in samples:
        if s.get("sim_boot"):
            cell.setdefault((s["kernel"], s["workload"]), []).append(s["sim_boot"]["kernel"])
    if not any(k == base for k, _ in cell):
        return {}
    out: dict[str, dict[str, Any]] = {}
    for label in labels:
        mine = sorted(n for k, n in cell if k == label)
        if not mine:
            continue
        both = [n for n in mine if (base, n) in cell]
        out[label] = {}
        for c in BOOT_COUNTS:
            pairs = [([float(w[c]) for w in cell[base, n]], [float(w[c]) for w in cell[label, n]]) for n in both]
            out[label][c] = {**stats.describe([float(w[c]) for n in mine for w in cell[label, n]]), **_geomean_row(pairs, both)}
    return out


def _geomean_row(pairs: list[tuple[list[float], list[float]]], workloads: list[str]) -> dict[str, Any]:
    """A simulated metric's geometric-mean ratio over `workloads` (one (baseline, kernel) pair of per-boot values
    each) with its interval, as sim_geomean and sim_own_geomean store it."""
    return {**stats.geomean_record(pairs), "workloads": workloads}


SHARES = ("kernel_insn_share", "kernel_l1i_share", "kernel_itlb_share")


def kernel_share(res: dict) -> dict[str, dict[str, Any]]:
    """Per workload on the baseline: the kernel's share of busy guest CPU time (/proc/stat; each boot's runs
    averaged first, the boot being the unit) with its sd over boots, and when simulated the kernel's share of
    instructions, L1i misses and iTLB misses (None where not measured)."""
    base = res["baseline"]
    table: dict[str, dict[str, Any]] = {}
    for n, w in res["workloads"].items():
        per_boot = []
        for s in res.get("samples") or []:
            v = s.get("kernel_share") if s.get("kernel") == base and s.get("workload") == n else None
            vals = [float(x) for x in (v if isinstance(v, list) else [v]) if isinstance(x, (int, float)) and x == x]
            if vals:
                per_boot.append(sum(vals) / len(vals))
        d = stats.describe(per_boot) if per_boot else None
        sim = (w.get("sim") or {}).get(base) or {}
        table[n] = {
            "cpu_time": d["mean"] if d else None, "cpu_time_sd": d["sd"] if d and d["n"] > 1 else None, "boots": len(per_boot),
            **{k: (sim.get(k) or {}).get("mean") for k in SHARES},
        }
    return table


def _sim_cell(m: dict, is_base: bool) -> str:
    """Mean per op, and for other kernels the ratio to the baseline with its CI (< 1: fewer events)."""
    if is_base:
        return f"{m['mean']:,.1f}"
    return f"{m['mean']:,.1f} ×{present.ratio_ci(m, pad=True)}"


def _speedup_cols(row: dict, key: str, is_base: bool) -> str:
    """A speedup and its CI in two right-aligned columns, the mark hanging after them (none for the baseline)."""
    if is_base:
        return f"{present.ratio(row[key]):>7} {'':>18} "
    return f"{present.ratio(row[key]):>7} {present.ci(row['ci_low'], row['ci_high'], row.get('ci_method')):>18}{present.mark(row, pad=True)}"


def hosts_line(results: dict) -> str:
    """On a cluster: how many hosts measured, and which rounds each (a round is a block on one host)."""
    hosts = results.get("hosts") or {}
    moved = len((results["design"].get("hosts") or {}).get("moved") or [])
    each = "; ".join(f"{h.get('hostname', '?')} [{node[:8]}] ({h.get('cpu_model', '?')}): round(s) {', '.join(str(r + 1) for r in h['rounds'])}"
                     for node, h in hosts.items())
    return (f"on {len(hosts)} host(s) of a Ray cluster, each round whole on one host (a block: every kernel compared within a host)"
            f"{f', {moved} round(s) moved' if moved else ''}: {each}")


def precision_line(p: dict[str, Any]) -> str:
    """What --precision did: met, or which cells stopped wider than the target and why."""
    head = f"precision ±{p['target']:.1%} on {p['metric']}: "
    if p["stopped"] == "met":
        return head + f"every cell within it after {p['rounds']} round(s)"
    cap = f"--max-boots {p['max_boots']}" if p["stopped"] == "max_boots" else f"--max-time {fmt_secs(p['max_time'])}"
    cells = ", ".join(f"{c['kernel']} on {c['workload']} " + (f"±{c['half_width']:.1%}" if math.isfinite(c["half_width"]) else "(no interval)")
                      for c in p["wide"])
    return head + f"stopped at {cap} after {p['rounds']} round(s) with {len(p['wide'])} cell(s) wider: {cells}"


def format_table(results: dict) -> str:
    """The terminal tables. With simulated counters they lead (the headline metric where guests run
    under TCG) and wall-clock follows, labelled indicative under TCG."""
    d = results["design"]
    base = results["baseline"]
    tcg = results.get("measurement", {}).get("accelerator") == "tcg"
    wall = "wall-clock (TCG: indicative only)" if tcg else "wall-clock"
    lines = [
        f"{present.boots_text(d['boots_per_kernel'], d.get('boots_by_workload'))} × {d['runs_per_boot']} run(s) after a warm-up; "
        f"order: {d['order']} (seed {d['seed']}); baseline {base}; {present.interval_text(results)}",
    ]
    if d.get("precision"):
        lines.append(precision_line(d["precision"]))
    if results.get("hosts"):
        lines.append(hosts_line(results))
    methods = results.get("measurement", {}).get("ops_methods") or {}
    for n, w in results["workloads"].items():
        if w.get("sim"):
            how = "/".join(methods.get(n) or ["estimate"])
            lines += ["", f"{n}: simulated per operation (ops: {how}); ×ratio to {base}, < 1 = fewer events",
                      f"  {'kernel':<22} " + " ".join(f"{present.metric_title(k, short=True):>36}" for k in SIM_HEADLINE) + f" {'kernel share':>13}"]
            for label, m in w["sim"].items():
                cols = [_sim_cell(m[k], label == base) if k in m else "–" for k in SIM_HEADLINE]
                lines.append(f"  {label:<22} " + " ".join(f"{c:>36}" for c in cols) + f" {m['kernel_insn_share']['mean']:>13.1%}")
        lines += ["", f"{n}: {wall}, {w['unit']}; speedup > 1 is better",
                  f"  {'kernel':<22} {'mean':>12} {'sd':>10} {'cv':>6}  {'speedup [95% CI]':>26}"]
        for s in w["summary"]:
            lines.append(f"  {s['kernel']:<22} {s['mean']:>12.1f} {s['sd']:>10.1f} {s['cv']:>6.1%}  {_speedup_cols(s, 'ratio', s['kernel'] == base)}")
    if results.get("sim_geomean"):
        lines += ["", "geometric mean across workloads, simulated per operation (×ratio to the baseline [95% CI])"]
        for label, g in results["sim_geomean"].items():
            cells = [f"{present.metric_title(k, short=True)} ×{present.ratio_ci(g[k])}" for k in SIM_HEADLINE if k in g]
            lines.append(f"  {label:<22} " + ";  ".join(cells) + f"  over {len(next(iter(g.values()))['workloads']) if g else 0} workload(s)")
    if results.get("sim_boot"):
        lines += ["", f"boot, power-on to the agent (simulated, kernel mode; mean of a kernel's boots; ×ratio to {base}'s boots "
                  "of the same workloads, geometric mean)"]
        for label, b in results["sim_boot"].items():
            cells = [f"{c.replace('_', ' ')} {b[c]['mean'] / 1e6:,.1f} M"
                     + ("" if label == base else f" ×{present.ratio_ci(b[c])}")
                     for c in BOOT_COUNTS]
            lines.append(f"  {label:<22} " + ";  ".join(cells) + f"  ({b['insns']['n']} boots)")
    if results.get("failed"):
        lines += ["", f"FAILED boots ({len(results['failed'])}; these cells have no sample from them — run the same command again to retry only these):"]
        for f in results["failed"]:
            lines.append(f"  {f['kernel']} on {f['workload']} (round {f['round'] + 1}): {f['error']} — console log: {f['console_log']}")
    if results["geomean"]:
        lines += ["", f"geometric mean of speedups across workloads, {wall}"]
        for label, g in results["geomean"].items():
            lines.append(f"  {label:<22} {_speedup_cols(g, 'speedup', False)}  over {len(g['workloads'])} workload(s)")
    lines += step_spread_lines(results)
    lines += ["", present.footnote(), results["note"]]
    return "\n".join(lines)
