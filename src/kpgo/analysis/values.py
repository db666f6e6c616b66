"""Indirect calls of a value profile and what became of them (docs/VALUES.md).

GCC 12 promotes an indirect call to a guarded direct call (`if (fp == f) f(); else fp();`) in ipa-profile
(ipa-profile.cc, `ipa_profile`): every tracked target (value != 0, count > 0) is a candidate with the probability
count/|total|, and a candidate below REG_BR_PROB_BASE / 2 is refused ("Not speculating: probability is too low").
So a site's *dominant* target here is one of at least 50% (kpgo.gcov.profile.ipa_probability, GCC's fixed point).
value-prof.cc's gimple_ic_transform, which GCC <= 10 used with a 75% threshold, only prints "will resolve by
ipa-profile" in GCC 12. GCC finds the target by its profile id among the functions of the unit it compiles, so a
dominant target defined in another object is out of reach without LTO ("Function with profile-id N not found",
which GCC prints once per tracked target, not once per call site).

A target's value is its profile id, which is also the ident of its FUNCTION record in its own object's .gcda (GCC's
default, -fprofile-func-internal-id off): the profile alone says which object defines it. Names come from the
instrumented build's .gcno files.

API
    dominant_sites(profile, notes) -> list[Site]       each indirect-call site with a dominant target, hottest first
    site_summary(sites) -> dict                        counts by where the target lies, and the sites as dicts
    promotions_in_vmlinux(vmlinux, sites) -> list[str] for each promoted site, what the linked kernel shows of it
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

from kpgo import proc
from kpgo.gcov.gcda import read_gcda
from kpgo.gcov.gcno import read_gcno
from kpgo.gcov.image import gcda_rels
from kpgo.gcov.profile import ipa_probability

INDIRECT_CALL = 4  # the counter kind of indirect-call targets (GCC >= 10)
DOMINANT = 5000  # REG_BR_PROB_BASE / 2: ipa-profile's least probability for a speculative call
SAME, OTHER, UNKNOWN = "same object", "another object", "not in the profile"


@dataclass(frozen=True)
class Site:
    object: str  # the caller's object (e.g. fs/read_write.o)
    caller: str  # function name from the .gcno ("ident 0x…" without it)
    target: str
    count: int  # executions that reached the target
    all: int  # executions of the site
    where: str  # SAME, OTHER or UNKNOWN
    target_objects: tuple[str, ...]  # the objects that define a function of the target's profile id


def _sites_of(raw: list[int]) -> list[tuple[int, list[tuple[int, int]]]]:
    out, i = [], 0
    while i + 1 < len(raw):
        total, n = raw[i], raw[i + 1]
        out.append((total, list(zip(raw[i + 2 : i + 2 + 2 * n : 2], raw[i + 3 : i + 3 + 2 * n : 2]))))
        i += 2 + 2 * n
    return out


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _dominant(total: int, pairs: list[tuple[int, int]]) -> tuple[int, int] | None:
    """The target GCC 12 would speculate on (value, count), or None: the largest count with probability >= 50%."""
    every = abs(_signed(total))
    best = max(((v, _signed(c)) for v, c in pairs if v and 0 < _signed(c)), key=lambda p: p[1], default=None)
    if best is None or ipa_probability(best[1], every) < DOMINANT:
        return None
    return best


class _Names:
    """Function names by (object, ident) from the build's .gcno files, read when first asked."""

    def __init__(self, notes: Path | None) -> None:
        self.notes = notes
        self.files: dict[str, dict[int, str]] = {}

    def __call__(self, obj: str, ident: int) -> str:
        if obj not in self.files:
            gcno = self.notes / (obj[: -len(".o")] + ".gcno") if self.notes is not None else None
            self.files[obj] = {f.ident: f.name or "" for f in read_gcno(gcno).functions} if gcno is not None and gcno.is_file() else {}
        return self.files[obj].get(ident) or f"ident 0x{ident:08x}"


def dominant_sites(profile: Path, notes: Path | None) -> list[Site]:
    """Every indirect-call site of `profile` with a dominant target, hottest first; `notes`: the instrumented build
    directory whose .gcno files name the functions (None: functions are named by their ident)."""
    defined: dict[int, list[str]] = {}  # profile id -> objects defining a function of it
    found: list[tuple[str, int, int, int, int]] = []  # object, caller ident, target, count, all
    for rel in gcda_rels(profile):
        obj = rel[: -len(".gcda")] + ".o"
        for f in read_gcda(profile / rel, rel).functions():
            if f.ident is None:
                continue
            defined.setdefault(f.ident, []).append(obj)
            raw = f.counters.get(INDIRECT_CALL)
            if raw is None:
                continue
            for total, pairs in _sites_of(raw.tolist()):
                top = _dominant(total, pairs)
                if top is not None:
                    found.append((obj, f.ident, top[0], top[1], abs(_signed(total))))
    name = _Names(notes)
    out = []
    for obj, caller, target, count, every in found:
        where_defined = defined.get(target, [])
        where = SAME if obj in where_defined else OTHER if where_defined else UNKNOWN
        tname = name(obj if where == SAME else where_defined[0], target) if where_defined else f"profile-id 0x{target:08x}"
        out.append(Site(obj, name(obj, caller), tname, min(count, every), every, where, tuple(sorted(set(where_defined)))))
    return sorted(out, key=lambda s: (-s.count, s.object, s.caller))


def site_summary(sites: list[Site], top: int | None = None) -> dict:
    """Counts of dominant sites by where their target lies, and the sites (the `top` hottest, or all) as dicts."""
    return {"rule": "a target of >= 50% of the site's executions (GCC 12 ipa-profile: REG_BR_PROB_BASE / 2)",
            "sites_with_dominant_target": len(sites),
            "target_in_same_object": sum(s.where == SAME for s in sites),
            "target_in_another_object": sum(s.where == OTHER for s in sites),
            "target_not_in_profile": sum(s.where == UNKNOWN for s in sites),
            "sites": [asdict(s) | {"target_objects": list(s.target_objects)} for s in sites[:top]]}


# -- promoted calls in the linked kernel ----------------------------------------------------------------------------

# What the linked kernel shows of a promoted call site, in the caller's code (and its clones: .constprop, .isra, .part,
# .cold): the direct call or jump to the target, or, when GCC inlined the target after the guard, the target's address
# as an operand (the guard's compare; a caller that also stores the address somewhere would count too). Neither: the
# speculation was undone (GCC's inliner removes speculations it finds useless).
CALL, GUARD, GONE, NO_CALLER = "direct call", "guard only (target inlined)", "gone", "caller not in vmlinux"
_FUNC_SYMBOL = re.compile(r"^([0-9a-f]+) ([0-9a-f]+) [tTwW] (\S+)$", re.M)


def _symbols(vmlinux: Path) -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {}
    for m in _FUNC_SYMBOL.finditer(proc.capture(["nm", "-S", vmlinux], timeout=300)):
        out.setdefault(m.group(3), []).append((int(m.group(1), 16), int(m.group(2), 16)))
    return out


def _named(symbols: dict[str, list[tuple[int, int]]], name: str) -> list[tuple[int, int]]:
    """The ranges of `name` and of GCC's clones of it (name.constprop.0, name.cold, ...)."""
    return [r for sym, ranges in symbols.items() if sym == name or sym.startswith(name + ".") for r in ranges]


def promotions_in_vmlinux(vmlinux: Path, sites: list[dict]) -> list[str]:
    """For each promoted site ({"caller", "target"}), what `vmlinux` shows of it: CALL, GUARD, GONE or NO_CALLER."""
    symbols = _symbols(vmlinux)
    out = []
    for site in sites:
        callers = _named(symbols, site["caller"])
        if not callers:
            out.append(NO_CALLER)
            continue
        target = re.escape(site["target"])
        direct = re.compile(rf"\s(?:call|jmp)\s+[0-9a-f]+ <{target}(?:\.[\w.]+)?>")
        # the guard's operand: an immediate (the kernel's -mcmodel=kernel) or a RIP-relative address objdump names (PIC)
        addressed = re.compile(rf"# [0-9a-f]+ <{target}(?:\.[\w.]+)?>")
        addresses = {f"$0x{a:x}," for a, _ in _named(symbols, site["target"])}
        seen = GONE
        for start, size in callers:
            text = proc.capture(["objdump", "-d", "--no-show-raw-insn", f"--start-address=0x{start:x}", f"--stop-address=0x{start + size:x}",
                                 vmlinux], timeout=300)
            if direct.search(text):
                seen = CALL
                break
            if addressed.search(text) or any(a in text for a in addresses):
                seen = GUARD
        out.append(seen)
    return out
