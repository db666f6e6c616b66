"""The plugin's report: every closed window's counters, checked as they are read, and the
front-end stall estimate made from one side's counters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kpgo.errors import InfraError

# 3: taken_branches per side, itlb_kpage defaults to 2 MiB; 4: indirect_branches per side; 5: itlb_4k_* (the iTLB
# again with all code on 4 KiB pages)
REPORT_FORMAT = 5
COUNTERS = ("insns", "l1i_accesses", "l1i_misses", "itlb_accesses", "itlb_misses", "taken_branches", "indirect_branches",
            "itlb_4k_accesses", "itlb_4k_misses")
# Assumed front-end stall per simulated miss, in core cycles, for a current x86 core (docs/SIM.md,
# "Front-end cost"): an L1i miss served from L2, an iTLB miss served from the second-level TLB.
STALL_L1I_CYCLES = 14.0
STALL_ITLB_CYCLES = 14.0


def read_windows(path: Path) -> list[dict[str, Any]]:
    """Every closed window of the report, in order. Each has "user", "kernel" and "total" (each
    with insns, blocks, l1i_accesses, l1i_misses, itlb_accesses, itlb_misses, taken_branches, indirect_branches,
    itlb_4k_accesses, itlb_4k_misses),
    "seconds" (host time the window was open), "index", "kernel_insn_share", "duplicate_opens"
    and "per_vcpu" (a "user" and a "kernel" of the same counters per vCPU)."""
    hint = "see the guest's console log; if the plugin was changed, rebuild it with `.venv/bin/python -m kpgo.sim`"
    try:
        report = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InfraError(f"the simulator wrote no report {path} (the QEMU plugin did not load or QEMU did not exit cleanly)", hint) from None
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise InfraError(f"the simulator report {path} is unreadable or corrupt ({str(e).splitlines()[0][:120]})", hint) from None
    problem = _report_problem(report)
    if problem:
        raise InfraError(f"the simulator report {path} is corrupt: {problem}", hint)
    return list(report["windows"])


def _report_problem(report: Any) -> str | None:
    if not isinstance(report, dict) or report.get("tool") != "kpgosim":
        return "not a kpgosim report"
    fmt = report.get("format")
    if fmt != REPORT_FORMAT:
        age = "an older" if isinstance(fmt, int) and fmt < REPORT_FORMAT else "another"
        return (f"report format {fmt} from {age} kpgosim, this kpgo reads format {REPORT_FORMAT} "
                f"(rebuild the plugin with `.venv/bin/python -m kpgo.sim` and measure again)")
    windows = report.get("windows")
    if not isinstance(windows, list):
        return "no windows list"
    for i, w in enumerate(windows):
        if not isinstance(w, dict) or not isinstance(w.get("seconds"), (int, float)):
            return f"window {i + 1} has no seconds"
        for side in ("user", "kernel", "total"):
            missing = _missing_counters(w.get(side))
            if missing:
                return f"window {i + 1} lacks {side} counters ({missing})"
        per_vcpu = w.get("per_vcpu", [])
        if not isinstance(per_vcpu, list):
            return f"window {i + 1} has a per_vcpu that is not a list"
        for v in per_vcpu:
            for side in ("user", "kernel"):
                missing = _missing_counters(v.get(side) if isinstance(v, dict) else None)
                if missing:
                    return f"window {i + 1} lacks {side} counters of a vCPU ({missing})"
    return None


def _missing_counters(c: Any) -> str | None:
    """The first of COUNTERS that `c` lacks (or holds as other than a count), or None."""
    if not isinstance(c, dict):
        return "none at all"
    for k in COUNTERS:
        v = c.get(k)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            return k
    return None


def frontend_stall_cycles(side_counters: dict) -> float:
    """Estimated front-end stall cycles of one side's counters (a window's "user", "kernel" or
    "total"): L1i misses × STALL_L1I_CYCLES + iTLB misses × STALL_ITLB_CYCLES. A model with fixed
    penalties (docs/SIM.md), for comparing kernels, not a prediction of any CPU's cycles."""
    return side_counters["l1i_misses"] * STALL_L1I_CYCLES + side_counters["itlb_misses"] * STALL_ITLB_CYCLES


def clean_report(path: Path) -> None:
    """Remove a report (and a stale temporary) before a boot writes a new one."""
    for p in (Path(path), Path(f"{path}.tmp")):
        p.unlink(missing_ok=True)
