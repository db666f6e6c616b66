"""One-line statements of how numbers were measured, from results' "measurement", "host" and "design" keys.

Every table and figure carries one: a TCG wall-clock ratio and a KVM one mean different things."""

from __future__ import annotations

from typing import Any

from kpgo.report import present

ACCELERATORS = {
    "kvm": "KVM",
    "tcg": "QEMU TCG (software emulation)",
    "none": "bare metal",
    "bare-metal": "bare metal",
    "host": "bare metal",
}


def accelerator(res: dict[str, Any] | None, run: dict[str, Any] | None = None) -> str:
    """'KVM', 'QEMU TCG (software emulation)', 'bare metal' or 'unknown accelerator'."""
    for src in ((res or {}).get("measurement"), (res or {}).get("host"), (run or {}).get("host")):
        a = (src or {}).get("accelerator")
        if a:
            return ACCELERATORS.get(str(a).lower(), str(a))
    return "unknown accelerator"


def short_accelerator(res: dict[str, Any] | None, run: dict[str, Any] | None = None) -> str:
    return accelerator(res, run).split(" (")[0]


def guests(res: dict[str, Any] | None, run: dict[str, Any] | None = None) -> str:
    a = accelerator(res, run)
    return "on bare metal" if a == "bare metal" else f"in guests under {a}"


def under(res: dict[str, Any] | None, run: dict[str, Any] | None = None) -> str:
    """'under QEMU TCG', 'under KVM' or 'on bare metal' (short, for alt texts)."""
    a = short_accelerator(res, run)
    return "on bare metal" if a == "bare metal" else f"under {a}"


def design_brief(res: dict[str, Any]) -> str:
    d = res.get("design") or {}
    b, r = d.get("boots_per_kernel", "?"), d.get("runs_per_boot", "?")
    warm = ", warm-up discarded" if d.get("warmup_per_boot", True) else ""
    return f"{b} boots per kernel and workload × {r} run(s) per boot{warm}; unit of replication: {d.get('unit_of_replication', 'boot')}"


def wall(res: dict[str, Any], run: dict[str, Any] | None = None) -> str:
    clock = (res.get("measurement") or {}).get("clock") or "wall-clock"
    cpu = (res.get("host") or {}).get("cpu") or ((run or {}).get("host") or {}).get("cpu") or "unknown CPU"
    return (f"Measured: {clock} throughput of each workload's load generator {guests(res, run)} on {cpu}; "
            f"{design_brief(res)}; {present.interval_text(res)}.")


def sim_model(res: dict[str, Any]) -> str:
    """The simulated caches as a phrase, from the sim settings recorded with the results."""
    s = (res.get("measurement") or {}).get("sim") or {}
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
        clocks = (res.get("measurement") or {}).get("icount") or {}
        host = sorted(w for w, v in clocks.items() if v is None)
        parts.append(f"guest clock from the instruction count ({2 ** s['icount']} ns each, QEMU -icount shift={s['icount']})"
                     + (f", except on the host's clock for {', '.join(host)} (more than one vCPU)" if host else ""))
    elif "icount" in s:
        parts.append("guest clock on the host's (icount off)")
    return "; ".join(parts) or "settings not recorded"


def ops_how(res: dict[str, Any]) -> str:
    """How the per-operation divisor was obtained, from the methods recorded with the results."""
    methods = {m for ms in ((res.get("measurement") or {}).get("ops_methods") or {}).values() for m in ms}
    if methods == {"count"}:
        return "the exact operation count each load generator reports or runs"
    if "count" in methods:
        return "exact operation counts where the generator reports them, else each load step's time × rate (per workload in results.json)"
    return "operations estimated from each load step's time and rate"


def sim(res: dict[str, Any], run: dict[str, Any] | None = None) -> str:
    return (f"Measured: simulated counters (not wall-clock) — guest instructions and misses of a simulated {sim_model(res)}, "
            f"counted by kpgo's QEMU plugin over the measured window, per operation ({ops_how(res)}; docs/SIM.md), {guests(res, run)}; "
            f"{design_brief(res)}; {present.interval_text(res)}.")


def has_sim(res: dict[str, Any] | None) -> bool:
    return res is not None and any((w.get("sim") or {}) for w in res["workloads"].values())


def _bytes(n: Any) -> str:
    try:
        n = int(n)
    except (TypeError, ValueError):
        return str(n)
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"
