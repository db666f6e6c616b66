"""kpgo's QEMU plugin in real TCG guests on the session's tiny vanilla kernel (no extra kernel
build): exact user instruction counts for a program of known footprint, the kernel/user split
for a syscall-heavy and a compute-only program, L1i misses for code larger than the cache, taken
branches of loops, straight-line code split into many blocks and rep strings, and one real
workload through vm.run_agent, with a window per measured run and with a window per load step. Three boots: the
probes on one vCPU with the guest's clock on the instruction count (icount), the workload twice on two with the host's."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from kpgo import sim, vm, workloads
from kpgo.guest import contract

pytestmark = pytest.mark.vm

REPO = Path(__file__).resolve().parent.parent
PROBE = REPO / "tests" / "data" / "sim_probe.c"
GUEST = vm.Guest(cpus=2, memory="1G", timeout=600)
# The probes run on one vCPU, where the guest's clock follows the instruction count (icount, the default for one vCPU).
PROBE_GUEST = vm.Guest(cpus=1, memory="1G", timeout=600)

# Probe runs, in order; each is one window. Measured on the tiny kernel: the loop windows'
# kernel share 0.005-0.009 (timer interrupts), getppid's 0.98 (~224 kernel insns per call),
# bigcode's user L1i misses 1029 per sweep of 1024 lines, the loop's 2 in all.
LOOP = (1_000_000, 3_000_000)
SYSCALLS = (20_000, 60_000)
BIGCODE = 200  # 200 sweeps of 64 KiB: ~3.3 M insns, ~205k L1i line accesses
STRAIGHT = 200  # 200 sweeps of 80 KiB of 5-byte instructions, most page boundaries inside one
REP = 1_000_000  # rep stosb of 1 MiB: a TCG block per byte
# User taken branches interrupts may add to a probe window: one landing after a block that would have
# fallen through turns it into a taken branch. Timer ticks follow the guest's clock, which under icount
# runs 2^shift ns per instruction (0.13-0.38 guest s for the loop windows: 25-30 ticks at HZ=250 added
# 25); IRQ_SLACK covers the rest (measured: 0-5 per window without icount).
IRQ_SLACK = 10
# One window each, in this order; then the agent-like empty window (probe_windows).
RUNS = ([("loop", n) for n in LOOP] + [("syscalls", n) for n in SYSCALLS] + [("bigcode", BIGCODE)]
        + [("straight", STRAIGHT), ("rep", REP), ("empty", 0)])


@pytest.fixture(scope="session")
def tiny_kernel(request: pytest.FixtureRequest, test_dir: Path) -> Path:
    """bzImage of the tiny vanilla kernel that tests/conftest.py's tiny_run builds; when it is
    already in the test directory (the usual case) it is used as it is, else tiny_run makes it."""
    info = test_dir / "run-tiny" / "builds" / "vanilla" / "build.json"
    if not (info.is_file() and json.loads(info.read_text()).get("ok")):
        request.getfixturevalue("tiny_run")
    return Path(json.loads(info.read_text())["bzImage"])


@pytest.fixture(scope="session")
def accel(tiny_kernel: Path) -> str:
    return vm.accelerator(tiny_kernel)


@pytest.fixture(scope="session")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built on the host; the guest sees the host's file system.
    out = tmp_path_factory.mktemp("sim-probe") / "sim_probe"
    subprocess.run(["gcc", "-O2", "-static", "-Wall", "-o", out, PROBE], check=True)
    return out


@pytest.fixture(scope="session")
def probe_windows(tiny_kernel: Path, accel: str, probe: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    d = tmp_path_factory.mktemp("sim-probe-boot")
    runs = RUNS
    # Output to a guest file, shown at the end: the console relay (virtme-ng-init, a user process)
    # would otherwise run during the next window; the window is system-wide.
    # Last window: an empty one opened and closed the way the guest agent does (Python's
    # subprocess running kpgo-window), i.e. the fixed cost the agent adds to each measured run.
    window = sim.build_window_tool()
    agent_like = f"python3 -c 'import subprocess as s; s.run([\"{window}\", \"open\"]); s.run([\"{window}\", \"close\"])'"
    cmd = ("set -e; " + "; ".join(f"{probe} {mode} {n} >>/tmp/sim-probe.out" for mode, n in runs)
           + f"; {agent_like}; {window} close; {window} open; cat /tmp/sim-probe.out; echo sim-probes-done")
    t = time.monotonic()
    res = vm.run_command(tiny_kernel, cmd, guest=PROBE_GUEST, log=d / "console.log", accel=accel, sim=sim.SimConfig(), report=d / "sim.json")
    print(f"\nsim probe boot: {time.monotonic() - t:.1f} s (guest, {len(runs)} windows); console {d / 'console.log'}")
    assert "sim-probes-done" in res.output, res.output[-2000:]
    windows = sim.read_windows(d / "sim.json")
    assert len(windows) == len(runs) + 1
    # Then a stray close, and an open left open: written at QEMU's exit, outside "windows".
    report = json.loads((d / "sim.json").read_text())
    assert report["stray_closes"] == 1 and report["open_window"]["closed"] is False
    assert report["segments"] <= report["translations"]  # retranslated code reuses its segments
    # Each probe run's own clock (CLOCK_MONOTONIC around its work), beside its window.
    clocks = [float(line.rsplit("=", 1)[1]) for line in res.output.splitlines() if line.startswith("sim_probe ") and "guest_seconds=" in line]
    assert len(clocks) == len(runs)
    for w, c in zip(windows, clocks):
        w["guest_seconds"] = c
    for (mode, n), w in zip(runs + [("agent-like empty window", 0)], windows):
        print(f"  {mode} {n}: user {w['user']['insns']} kernel {w['kernel']['insns']} share {w['kernel_insn_share']:.4f} "
              f"user l1i {w['user']['l1i_misses']}/{w['user']['l1i_accesses']} taken user {w['user']['taken_branches']}"
              f"/{w['user']['blocks']} blocks kernel {w['kernel']['taken_branches']}/{w['kernel']['blocks']} "
              f"{w['seconds']:.3f} s (host) {w.get('guest_seconds', 0):.4f} s (guest)")
    return windows


@pytest.fixture(scope="session")
def timer_hz(tiny_kernel: Path) -> int:
    """The tiny kernel's CONFIG_HZ (its build directory holds the bzImage under arch/x86/boot)."""
    config = (tiny_kernel.parents[3] / ".config").read_text()
    return int(next(line.split("=")[1] for line in config.splitlines() if line.startswith("CONFIG_HZ=")))


def slack(w: dict, hz: int) -> int:
    """The taken branches interrupts may add to window w: one per timer tick of its guest time (10% over the
    probe's own reading, which leaves out its start), and IRQ_SLACK for the others."""
    return IRQ_SLACK + int(1.1 * w.get("guest_seconds", 0) * hz) + 1


def window_of(windows: list[dict], mode: str, n: int | None = None) -> dict:
    """The window of the probe run `mode n` (n may be left out for a mode run once)."""
    return windows[[m for m, _ in RUNS].index(mode) if n is None else RUNS.index((mode, n))]


def test_known_footprint_gives_exact_user_instructions(probe_windows: list[dict], timer_hz: int) -> None:
    a, b = probe_windows[0], probe_windows[1]
    assert a["closed"] and b["closed"] and a["index"] == 1 and b["index"] == 2
    # 4 per iteration, plus the open marker and one mov; the close marker is not counted.
    assert a["user"]["insns"] == 4 * LOOP[0] + 2
    assert b["user"]["insns"] == 4 * LOOP[1] + 2
    assert b["user"]["insns"] - a["user"]["insns"] == 4 * (LOOP[1] - LOOP[0])
    big = probe_windows[4]
    assert big["user"]["insns"] == 16386 * BIGCODE + 2
    # Instructions crossing page boundaries (QEMU's page-crossing quirk): each counted once; an
    # interrupt between the two blocks of one leaves it counted twice.
    straight = window_of(probe_windows, "straight")
    assert 16386 * STRAIGHT + 2 <= straight["user"]["insns"] <= 16386 * STRAIGHT + 2 + slack(straight, timer_hz)


def test_kernel_user_split(probe_windows: list[dict]) -> None:
    compute, sys1, sys2 = probe_windows[1], probe_windows[2], probe_windows[3]
    # getppid in a loop: almost all instructions are the kernel's, and they grow with the calls.
    for w, n in ((sys1, SYSCALLS[0]), (sys2, SYSCALLS[1])):
        assert w["kernel_insn_share"] > 0.8
        assert w["user"]["insns"] == 4 * n + 2
    per_call = (sys2["kernel"]["insns"] - sys1["kernel"]["insns"]) / (SYSCALLS[1] - SYSCALLS[0])
    assert 0.9 < per_call / (sys1["kernel"]["insns"] / SYSCALLS[0]) < 1.1
    assert 50 < per_call < 5000  # a syscall entry/exit and getppid: a few hundred instructions
    # A compute loop: the kernel runs only timer interrupts.
    assert compute["kernel_insn_share"] < 0.05


def test_l1i_misses_follow_the_code_footprint(probe_windows: list[dict]) -> None:
    tiny, big = probe_windows[1]["user"], probe_windows[4]["user"]
    assert tiny["l1i_accesses"] >= LOOP[1] and tiny["l1i_misses"] < 20
    # 64 KiB swept cyclically through a 32 KiB LRU cache: every line misses every sweep (the
    # accesses that hit are the second fetch of a line split between two translated blocks).
    lines = 64 * 1024 // 64
    assert BIGCODE * lines <= big["l1i_misses"] <= 1.05 * BIGCODE * lines
    assert big["l1i_misses"] / big["l1i_accesses"] > 0.8
    assert big["itlb_accesses"] > 0 and big["itlb_misses"] < big["itlb_accesses"]


def test_taken_branches_of_known_code(probe_windows: list[dict], timer_hz: int) -> None:
    """User taken branches: a loop's back edge is taken every iteration but the last; straight-line
    code split into blocks by page and block-size limits falls through; TCG's block per rep
    iteration is no branch. The fixed overhead of a window is measured by an empty one."""
    empty = window_of(probe_windows, "empty")
    assert empty["user"]["insns"] == 1 and empty["user"]["taken_branches"] == 0  # the open marker alone
    overhead = empty["user"]["taken_branches"]
    for n in LOOP:  # one block of 4 instructions
        w = window_of(probe_windows, "loop", n)
        assert n - 1 <= w["user"]["taken_branches"] - overhead <= n - 1 + slack(w, timer_hz)
    for n in SYSCALLS:  # each syscall enters the kernel, each jnz but the last jumps back
        w = window_of(probe_windows, "syscalls", n)
        assert 2 * n - 1 <= w["user"]["taken_branches"] - overhead <= 2 * n - 1 + slack(w, timer_hz)
        assert w["kernel"]["taken_branches"] >= n  # at least each return to user space
    for mode, sweeps, blocks_per_sweep in (("bigcode", BIGCODE, 32), ("straight", STRAIGHT, 40)):
        w = window_of(probe_windows, mode)
        # 64 KiB (80 KiB) run as 100+ blocks per sweep, yet only the back edge is taken.
        assert w["user"]["blocks"] >= blocks_per_sweep * sweeps
        assert sweeps - 1 <= w["user"]["taken_branches"] - overhead <= sweeps - 1 + slack(w, timer_hz)
    w = window_of(probe_windows, "rep")
    assert w["user"]["blocks"] >= REP and w["user"]["taken_branches"] - overhead <= slack(w, timer_hz)
    for w in probe_windows:  # each block execution branches at most once
        for side in ("user", "kernel", "total"):
            assert w[side]["taken_branches"] <= w[side]["blocks"]
        assert w["total"]["taken_branches"] == w["user"]["taken_branches"] + w["kernel"]["taken_branches"]
        assert sum(v[side]["taken_branches"] for v in w["per_vcpu"] for side in ("user", "kernel")) == w["total"]["taken_branches"]
    # The compute loop's kernel side: timer interrupts only (measured: ~540 taken branches a tick).
    w = window_of(probe_windows, "loop", LOOP[1])
    assert w["kernel"]["taken_branches"] < 2000 * (1 + w["guest_seconds"] * timer_hz)


def test_guest_clock_follows_the_instruction_count(probe_windows: list[dict]) -> None:
    """Under the default icount (QEMU -icount shift=5, one vCPU) the guest's clock advances 32 ns per
    instruction while it runs, whatever the host's speed: the compute loop's own clock reading matches its
    window's instruction count (the window also holds the probe's start and exit, a few percent). With the
    guest clock on the host's, the same reading is the host's time, which follows TCG's speed instead
    (measured: 0.02-0.11 s of host time for these windows' 0.13-0.40 s of guest time)."""
    shift = sim.SimConfig().icount
    assert shift is not None
    for n in LOOP:
        w = window_of(probe_windows, "loop", n)
        ns_per_insn = w["guest_seconds"] * 1e9 / w["total"]["insns"]
        assert 0.85 * 2**shift <= ns_per_insn <= 1.01 * 2**shift, (n, ns_per_insn, w["seconds"])


def test_empty_window_costs_little(probe_windows: list[dict]) -> None:
    """What opening and closing a window from Python adds to each measured run: the exit of
    kpgo-window open, the fork/exec of kpgo-window close (measured: ~0.5 M kernel and ~0.1 M user instructions)."""
    empty = probe_windows[-1]
    assert empty["closed"] and 0 < empty["kernel"]["insns"] < 10_000_000 and empty["user"]["insns"] < 5_000_000


def short_micro(windows: str) -> contract.Workload:
    """micro's syscall, pipe and fork steps at half their counts: a short window."""
    wl = workloads.load("micro", ["procs=1", "syscall_ops=160", "pipe_ops=112000", "fork_ops=240"])
    return replace(wl, load=tuple(s for s in wl.load if s.name in ("syscall", "pipe", "fork")), windows=windows)


def test_workload_windows_through_the_agent(tiny_kernel: Path, accel: str, tmp_path: Path) -> None:
    wl = short_micro("run")  # one window per measured run, as every workload but micro has
    job = contract.Job(mode="bench", workload=wl, runs=2)
    t = time.monotonic()
    result = vm.run_agent(tiny_kernel, tmp_path / "guest", job, guest=GUEST, log=tmp_path / "console.log", accel=accel, sim=sim.SimConfig())
    print(f"\nsim workload boot: {time.monotonic() - t:.1f} s; console {tmp_path / 'console.log'}")
    runs, windows = result.runs, result.sim
    assert len(windows) == len(runs) == 2
    for r, w in zip(runs, windows):
        print(f"  ops {r.ops:.0f} seconds {r.seconds} kernel insns/op {w['kernel']['insns'] / r.ops:.0f} "
              f"taken/op {w['kernel']['taken_branches'] / r.ops:.0f} share {w['kernel_insn_share']:.3f} window {w['seconds']:.2f} s")
        assert w["closed"] and w["kernel"]["insns"] > 0 and w["user"]["insns"] > 0
        for side in ("user", "kernel"):  # real code: branches taken, at most one per block
            assert 0 < w[side]["taken_branches"] <= w[side]["blocks"]
        assert r.ops > 0
        # `ops` is the exact count stress-ng reports (its bogo ops); the time x rate estimate beside it is the sum
        # over steps of seconds x rate, each step one part here.
        assert r.ops_method == "count"
        assert r.ops_estimate == pytest.approx(sum(r.step_seconds[k] * v for k, v in r.parts.items()), rel=0.02)
        assert w["kernel_insn_share"] > 0.3  # stress-ng's syscall/pipe/fork stressors live in the kernel
        assert w["seconds"] >= r.seconds * 0.9  # the window spans the load steps
        assert w["icount"] is None  # two vCPUs: the guest's clock is the host's (SimConfig.for_guest)
    assert [w["index"] for w in windows] == [1, 2]


def test_workload_windows_per_step_through_the_agent(tiny_kernel: Path, accel: str, tmp_path: Path) -> None:
    """micro as it is (windows = "step"): a window around each load step, in order, each divided by its own step's
    count; the boot's figure is the geometric mean of the steps' (kpgo.bench.sim_per_op)."""
    from kpgo import bench

    wl = short_micro("step")
    job = contract.Job(mode="bench", workload=wl, runs=2)
    result = vm.run_agent(tiny_kernel, tmp_path / "guest", job, guest=GUEST, log=tmp_path / "console.log", accel=accel, sim=sim.SimConfig())
    runs, windows = result.runs, result.sim
    assert windows is not None and len(windows) == 6 and [w["index"] for w in windows] == list(range(1, 7))
    steps = [r.step_ops for r in runs]
    assert steps == [{"syscall": 160.0, "pipe": 112000.0, "fork": 240.0}] * 2  # stress-ng's counts: exactly the ones asked
    per = bench.sim_steps(windows, steps)
    for name, figs in per.items():
        print(f"  {name}: kernel insns/op {figs['kernel_insns_per_op']:,.0f} L1i misses/op {figs['kernel_l1i_misses_per_op']:,.1f} "
              f"taken/op {figs['kernel_taken_branches_per_op']:,.0f}")
    for w, r in zip(windows, [r for r in runs for _ in range(3)]):
        assert w["closed"] and w["kernel"]["insns"] > 0 and w["seconds"] <= r.seconds
    # a fork costs far more kernel work than a pipe write/read: a pooled count would be the mix's, not either's
    assert per["fork"]["kernel_insns_per_op"] > 20 * per["pipe"]["kernel_insns_per_op"]
    boot = bench.sim_per_op(windows, [r.ops for r in runs], step_ops=steps)
    assert min(f["kernel_insns_per_op"] for f in per.values()) < boot["kernel_insns_per_op"] < max(f["kernel_insns_per_op"] for f in per.values())
