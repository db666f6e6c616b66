"""What the simulator models: the L1 instruction cache and iTLB geometry, checked and turned into
the plugin's arguments."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kpgo.errors import UserError

_SUFFIX = {"": 1, "k": 1 << 10, "m": 1 << 20}


BOOLS = ("warm", "boot")
QEMU_ONLY = ("icount",)  # settings for QEMU itself, not the plugin
ICOUNT_MAX = 10  # QEMU's largest icount shift (2^10 ns per instruction)


@dataclass(frozen=True)
class SimConfig:
    """The simulated L1 instruction cache and iTLB. The defaults are of the order of current x86
    cores (32 KiB 8-way 64-byte lines; 64-entry 4-way iTLB) but model no particular CPU.
    itlb_page is the page size for user code, itlb_kpage for kernel code: 2 MiB by default,
    because x86-64 kernels map their text with 2 MiB pages (docs/SIM.md); itlb_kpage=4k models
    kernel code on 4 KiB pages. warm=True keeps simulating outside the windows (slower there) so
    a window starts warm. boot=True adds a window from power-on to the guest agent's start (firmware,
    decompressor, kernel init, virtme's init: the cost of booting, on paths no workload profile sees).
    icount=N ties the guest's clock to its instruction count (QEMU -icount shift=N: 2^N ns per
    instruction), so ticks and timers fall at the same instructions whatever the host's speed and the
    per-operation counts repeat (docs/SIM.md "Guest time"); None lets the guest clock follow the host's."""

    l1i_size: int = 32768
    l1i_assoc: int = 8
    l1i_line: int = 64
    itlb_entries: int = 64
    itlb_assoc: int = 4
    itlb_page: int = 4096
    itlb_kpage: int = 2 << 20
    warm: bool = False
    boot: bool = False
    icount: int | None = 5

    def __post_init__(self) -> None:
        for name in BOOLS:
            v = getattr(self, name)
            if v in (0, 1) and not isinstance(v, bool):
                object.__setattr__(self, name, bool(v))  # --sim-opt warm=1 arrives as an int
        problem = self.problem()
        if problem:
            raise UserError(f"simulated cache: {problem}",
                            "sets (size / (line × ways), entries / ways), lines and pages must be powers of two, e.g. the defaults "
                            "l1i_size=32768 l1i_assoc=8 l1i_line=64 itlb_entries=64 itlb_assoc=4")

    def problem(self) -> str | None:
        """The first thing the plugin would refuse (it checks the same), or None."""
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in BOOLS:
                if not isinstance(v, bool):
                    return f"{f.name} must be true or false, not {v!r}"
            elif f.name == "icount":
                if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= ICOUNT_MAX):
                    return f"icount must be a shift from 0 to {ICOUNT_MAX} (2^N ns per instruction) or off, not {v!r}"
            elif isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                return f"{f.name} must be a positive integer, not {v!r}"
        for name in ("l1i_line", "itlb_page", "itlb_kpage"):
            if not _pow2(getattr(self, name)):
                return f"{name}={getattr(self, name)} is not a power of two"
        for name in ("l1i_assoc", "itlb_assoc"):
            if getattr(self, name) > 64:
                return f"{name}={getattr(self, name)} is above 64 ways"
        way = self.l1i_line * self.l1i_assoc
        if self.l1i_size % way or not _pow2(self.l1i_size // way):
            return f"l1i_size={self.l1i_size} over {self.l1i_assoc} ways of {self.l1i_line}-byte lines is not a power-of-two number of sets"
        if self.itlb_entries % self.itlb_assoc or not _pow2(self.itlb_entries // self.itlb_assoc):
            return f"itlb_entries={self.itlb_entries} over {self.itlb_assoc} ways is not a power-of-two number of sets"
        return None

    @classmethod
    def parse(cls, text: str) -> SimConfig:
        """'l1i_size=16k,itlb_kpage=2M,icount=off' (comma-separated KEY=VALUE, k/M suffixes) over the defaults."""
        known = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for item in filter(None, (t.strip() for t in text.split(","))):
            key, sep, value = item.partition("=")
            if not sep or key not in known:
                raise UserError(f"simulator setting '{item}' is not KEY=VALUE with a known KEY", f"keys: {', '.join(sorted(known))}")
            if key in BOOLS:
                values[key] = value.lower() in ("1", "true", "yes", "on")
                continue
            if key == "icount" and value.strip().lower() in ("off", "none", "no", "false"):
                values[key] = None
                continue
            m = re.fullmatch(r"([0-9]+)([kKmM]?)", value.strip())
            if not m:
                raise UserError(f"simulator setting '{item}': not a number", "use an integer, optionally with a k or M suffix")
            values[key] = int(m[1]) * _SUFFIX[m[2].lower()]
        return cls(**values)

    def plugin_arg(self, out: Path) -> str:
        """The plugin's arguments, as they follow the library in `-plugin LIB,ARGS`."""
        out = Path(out).resolve()
        if "," in str(out):
            raise UserError(f"the simulator report path {out} contains a comma, which QEMU's option syntax splits on",
                            "use a run directory without commas")
        args = [f"out={out}"] + [f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self) if f.name not in BOOLS + QEMU_ONLY]
        args.append(f"warm={'on' if self.warm else 'off'}")
        args.append(f"always={'on' if self.boot else 'off'}")  # the plugin opens its first window at start-up
        return ",".join(args)

    def for_guest(self, vcpus: int) -> SimConfig:
        """The settings a guest of `vcpus` vCPUs runs with: icount for one vCPU only. QEMU runs all vCPUs of an icount
        guest on one thread, taking turns, and a vCPU spinning on another's progress (an IPI's answer, a lock) holds
        the thread for its turn; 2-vCPU guests hung in stress-ng's fork stressor (2 of 6 boots of the tiny kernel),
        as others found on x86-64 (docs/SIM.md, *Guest time*)."""
        return self if vcpus == 1 or self.icount is None else dataclasses.replace(self, icount=None)

    def qemu_args(self) -> str:
        """QEMU's own options for this setting, beside the plugin. sleep=on: an idle guest's clock follows the host's
        (a guest waiting for its network client does not stall); align=off: no throttling to real time."""
        return "" if self.icount is None else f"-icount shift={self.icount},sleep=on,align=off"


def _pow2(v: int) -> bool:
    return v > 0 and not v & (v - 1)


# One stack sampled every this many recorded taken branches (docs/SIM.md, "Branch records": chosen from the
# measured file size, recording cost and agreement with the exact records).
BRANCH_PERIOD = 1024
BRANCH_SIDES = ("kernel", "user")


@dataclass(frozen=True)
class BranchConfig:
    """What the plugin records as branch records (kpgo.branches reads them): the side whose taken branches count
    (the kernel's, or the user's for user-mode QEMU tests), a 32-entry stack sampled every `period` of them, the
    bounds of the plugin's tables per vCPU (distinct edges, and distinct ranges, each at most `entries`; distinct
    stacks at most `stacks`; beyond them a new key is counted as lost, not stored), and the build id of the binary
    the addresses belong to. Kept apart from SimConfig: a bench cell's key is SimConfig's fields."""

    side: str = "kernel"
    period: int = BRANCH_PERIOD
    entries: int = 1 << 20
    stacks: int = 1 << 16
    build_id: str = ""
    thunks: tuple[tuple[str, int, int], ...] = ()  # (thunk or return_thunk, start, end): kpgo.branches.thunk_ranges

    def __post_init__(self) -> None:
        problem = None
        if self.side not in BRANCH_SIDES:
            problem = f"side must be kernel or user, not {self.side!r}"
        for name, top in (("period", 1 << 40), ("entries", 1 << 28), ("stacks", 1 << 24)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= top:
                problem = f"{name} must be an integer from 1 to {top}, not {v!r}"
        if not re.fullmatch(r"([0-9a-f]{2}){0,64}", self.build_id):
            problem = f"build id {self.build_id!r} is not lowercase hex of at most 64 bytes"
        if problem:
            raise UserError(f"branch records: {problem}", "e.g. --branch-period 4096")

    def plugin_arg(self, out: Path) -> str:
        """The plugin's branch arguments, to follow SimConfig.plugin_arg in `-plugin LIB,ARGS`."""
        out = Path(out).resolve()
        if "," in str(out):
            raise UserError(f"the branch records path {out} contains a comma, which QEMU's option syntax splits on",
                            "use an output directory without commas")
        args = [f"branches={out}", f"branch_side={self.side}", f"branch_period={self.period}",
                f"branch_entries={self.entries}", f"branch_stacks={self.stacks}"]
        args += [f"{kind}={lo:x}-{hi:x}" for kind, lo, hi in self.thunks]
        return ",".join(args + ([f"build_id={self.build_id}"] if self.build_id else []))
