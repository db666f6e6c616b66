"""One-line statements of how numbers were measured, from the results' measurement, host and design (kpgo.records).

Every table and figure carries one: a TCG wall-clock ratio and a KVM one mean different things."""

from __future__ import annotations

from typing import Any

from kpgo.records import Measurement, Results, Run
from kpgo.report import present

ACCELERATORS = {
    "kvm": "KVM",
    "tcg": "QEMU TCG (software emulation)",
    "none": "bare metal",
    "bare-metal": "bare metal",
    "host": "bare metal",
}


def accelerator(res: Results | None, run: Run | None = None) -> str:
    """'KVM', 'QEMU TCG (software emulation)', 'bare metal' or 'unknown accelerator'."""
    for a in (res and res.measurement.accelerator, res and res.host and res.host.accelerator, run and run.host and run.host.accelerator):
        if a:
            return named(a)
    return "unknown accelerator"


def named(accel: str) -> str:
    """An accelerator as recorded ("tcg") as the report names it."""
    return ACCELERATORS.get(accel.lower(), accel)


def short_accelerator(res: Results | None, run: Run | None = None) -> str:
    return accelerator(res, run).split(" (")[0]


def guests(res: Results | None, run: Run | None = None, accel: str | None = None) -> str:
    """'in guests under KVM' or 'on bare metal': the results' accelerator, or `accel` as named()."""
    a = accel or accelerator(res, run)
    return "on bare metal" if a == "bare metal" else f"in guests under {a}"


def under(res: Results | None, run: Run | None = None) -> str:
    """'under QEMU TCG', 'under KVM' or 'on bare metal' (short, for alt texts)."""
    a = short_accelerator(res, run)
    return "on bare metal" if a == "bare metal" else f"under {a}"


def design_brief(res: Results) -> str:
    d = res.design
    r = "?" if d.runs_per_boot is None else d.runs_per_boot
    warm = ", warm-up discarded" if d.warmup_per_boot is not False else ""
    unit = "boot" if d.unit_of_replication is None else d.unit_of_replication
    return f"{present.boots_text(d.boots_per_kernel, d.boots_by_workload)} × {r} run(s) per boot{warm}; unit of replication: {unit}"


def wall(res: Results, run: Run | None = None) -> str:
    clock = res.measurement.clock or "wall-clock"
    cpu = (res.host and res.host.cpu) or (run and run.host and run.host.cpu) or "unknown CPU"
    return (f"Measured: {clock} throughput of each workload's load generator {guests(res, run)} on {cpu}; "
            f"{design_brief(res)}; {present.interval_text(res)}.")


def sim_model(m: Measurement) -> str:
    """The simulated caches as a phrase, from the sim settings recorded with the results."""
    s = m.sim or {}
    parts = []
    if s.get("l1i_size"):
        parts.append(f"L1i {_bytes(s['l1i_size'])} {s.get('l1i_assoc', '?')}-way, {s.get('l1i_line', '?')} B lines")
    if s.get("itlb_entries"):
        pages = f", {_bytes(s['itlb_page'])} pages" if s.get("itlb_page") else ""
        kpages = f" ({_bytes(s['itlb_kpage'])} kernel pages)" if s.get("itlb_kpage") not in (None, s.get("itlb_page")) else ""
        parts.append(f"iTLB {s['itlb_entries']} entries {s.get('itlb_assoc', '?')}-way{pages}{kpages}")
    if s.get("warm"):
        parts.append("simulated also between windows, so each window starts warm")
    if s.get("icount") is not None:
        host = sorted(w for w, v in m.icount.items() if v is None)
        parts.append(f"guest clock from the instruction count ({2 ** s['icount']} ns each, QEMU -icount shift={s['icount']})"
                     + (f", except on the host's clock for {', '.join(host)} (more than one vCPU)" if host else ""))
    elif "icount" in s:
        parts.append("guest clock on the host's (icount off)")
    return "; ".join(parts) or "settings not recorded"


def ops_how(res: Results) -> str:
    """How the per-operation divisor was obtained, from the methods recorded with the results."""
    methods = {m for ms in (res.measurement.ops_methods or {}).values() for m in ms}
    if methods == {"count"}:
        return "the exact operation count each load generator reports or runs"
    if "count" in methods:
        return "exact operation counts where the generator reports them, else each load step's time × rate (per workload in results.json)"
    return "operations estimated from each load step's time and rate"


def sim(res: Results, run: Run | None = None) -> str:
    return (f"Measured: simulated counters (not wall-clock) — guest instructions and misses of a simulated {sim_model(res.measurement)}, "
            f"counted by kpgo's QEMU plugin over the measured window, per operation ({ops_how(res)}; docs/SIM.md), {guests(res, run)}; "
            f"{design_brief(res)}; {present.interval_text(res)}.")


def has_sim(res: Results | None) -> bool:
    return res is not None and res.has_sim


def _bytes(n: Any) -> str:
    try:
        n = int(n)
    except (TypeError, ValueError):
        return str(n)
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"
