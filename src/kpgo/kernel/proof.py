"""Proof that GCC used the profile, object by object.

A changed binary proves nothing: -fprofile-use changes code through the flags it implies even
when GCC ignores every .gcda (it does so, silently, for files without the object summary).
So the optimized build runs with -fdump-ipa-profile, and for each object whose .gcda holds
non-zero counters we read GCC's own verdict from the dump: "Read edge ... count" /
"edge counts read" when it used the counters, "Profile info is missing; giving up" when not.
"edge counts read" is said of a function GCC found no profile for too (its counts are then all 0, and
-Wmissing-profile, silenced in the kernel build, would say so), so the proof also adds up the counts GCC says it read
and compares them with the profile's arc counters: the share of the profile's weight GCC read, which a profile keyed
for another source path (kpgo.gcov.ident) shows as missing.

Value profiles (docs/VALUES.md) are proven the same way, from what GCC says it did: the ipa-profile dump (with
-optimized) names each value transform it applied ("Transformation done: div/mod by constant 7", "single value 16
stringop for BUILT_IN_MEMCPY") and each indirect call it will promote ("Indirect call -> direct call ... => f"
with the site's counts); the profile_estimate dump says which of those became speculative direct calls, and
which targets it could not promote because they are defined in another object (GCC finds a target by its
profile id among the functions of the unit it compiles: without LTO a call into another object stays indirect)."""

from __future__ import annotations

import re
from pathlib import Path

from kpgo import atomic
from kpgo.analysis.values import CALL, GUARD, OTHER, dominant_sites, promotions_in_vmlinux
from kpgo.errors import InfraError
from kpgo.gcov.gcda import ARCS, read_gcda

THRESHOLD = 0.95
# The share of the profile's arc counts GCC must read. Not 1: GCC inlines always-inline helpers before it reads the
# profile, so their counts are never read even when everything else is (the syscall entry path's
# syscall_enter_from_user_mode, exit_to_user_mode, ...: 4.0% of apache's server profile, in a build from the
# profile's own tree as in a re-keyed one; re-keyed server builds read 93-98%). A profile GCC cannot find for the
# static functions reads about a third.
COUNTS_THRESHOLD = 0.8

_FUNC = re.compile(r"^;; Function ", re.M)
_READ = re.compile(r"^(\d+) edge counts read", re.M)
_EDGE = re.compile(r"^Read edge from \d+ to \d+, count:(-?\d+)", re.M)
_GIVEUP = "Profile info is missing; giving up"
_FUNC_NAME = re.compile(r"^;; Function (\S+)", re.M)
_TRANSFORM = re.compile(r"optimized: Transformation done: (div/mod by constant|mod power of 2|mod subtract|single value \d+ stringop)")
# The site's counter line comes just before: "Indirect call counter all: 800000, 1 values: [70510028:800000]."
_IC_DIRECT = re.compile(r"^Indirect call counter all: (-?\d+), \d+ values: \[-?\d+:(-?\d+)[^\n]*\n"
                        r"[^\n]*optimized: Indirect call -> direct call \S+ => (\S+) \(will resolve by ipa-profile\)", re.M)
_TRAINED = re.compile(r"^(\d+) indirect calls trained", re.M)
# GCC prints the id with %i: half of all ids are negative. One line per tracked target, not per call site.
_NOT_FOUND = re.compile(r"^Function with profile-id -?\d+ not found", re.M)
_SPECULATIVE = re.compile(r"^Indirect call -> speculative call (\S+)/\d+ => (\S+)/\d+", re.M)
VALUE_KINDS = ("indirect_calls_trained", "indirect_calls_promoted", "indirect_targets_elsewhere", "divmod", "stringop")
TOP_SITES = 30  # the hottest promoted call sites kept in proof.json


def _transform_kind(text: str) -> str:
    return "stringop" if text.startswith("single value") else "divmod"


def value_transforms(profile_dump: str, estimate_dump: str, obj: str) -> tuple[dict[str, int], list[dict]]:
    """The value transforms of one object: counts by kind and its promoted indirect call sites (caller, target,
    calls to the target and at the site), from its two dumps."""
    counts = dict.fromkeys(VALUE_KINDS, 0)
    for m in _TRANSFORM.finditer(profile_dump):
        counts[_transform_kind(m.group(1))] += 1
    counts["indirect_calls_trained"] = sum(int(m.group(1)) for m in _TRAINED.finditer(estimate_dump))
    counts["indirect_targets_elsewhere"] = len(_NOT_FOUND.findall(estimate_dump))
    promoted = {(m.group(1), m.group(2)) for m in _SPECULATIVE.finditer(estimate_dump)}
    counts["indirect_calls_promoted"] = len(_SPECULATIVE.findall(estimate_dump))
    sites = []
    heads = [(m.start(), m.group(1)) for m in _FUNC_NAME.finditer(profile_dump)]
    for m in _IC_DIRECT.finditer(profile_dump):
        caller = next((name for at, name in reversed(heads) if at < m.start()), "?")
        target = m.group(3)
        sites.append({"object": obj, "caller": caller, "target": target, "count": int(m.group(2)), "all": int(m.group(1)),
                      "promoted": (caller, target) in promoted})
    return counts, sites


def format_values(values: dict | None) -> str:
    """The value-transform line of `kpgo build`'s output and the summary (`values`: the proof's, None when the
    profile holds arc counters only)."""
    if values is None:
        return "value profiles: none (the profile holds arc counters only; an instrumented build with --values records them)"
    t = values["totals"]
    kept = f", {t['indirect_calls_promoted_in_vmlinux']} of them still in vmlinux" if "indirect_calls_promoted_in_vmlinux" in t else ""
    if "dominant_sites_elsewhere" in t:
        elsewhere = (f"{t['dominant_sites_elsewhere']} of {t['dominant_sites']} calls with a dominant target call into another object, "
                     f"out of GCC's reach without LTO")
    else:  # a build recorded before kpgo counted sites: GCC's "not found" lines, one per tracked target
        elsewhere = f"{t['indirect_targets_elsewhere']} tracked targets in another object, out of GCC's reach without LTO"
    return (f"value profiles: {t['indirect_calls_promoted']} of {t['indirect_calls_trained']} profiled indirect calls promoted to direct "
            f"calls{kept} ({elsewhere}); {t['divmod']} divisions/modulos and {t['stringop']} string operations specialized")


def _dump_for(out: Path, rel_gcda: Path, name: str = "profile") -> Path | None:
    d = out / rel_gcda.parent
    stem = rel_gcda.name[: -len(".gcda")]
    hits = sorted(d.glob(f"{stem}.c.*i.{name}"))
    return hits[0] if hits else None


def check(out: Path, profile: Path, counts_gate: bool = True) -> dict:
    """Per object: non-empty profile? dump found? functions read / given up, counts read. Removes the dumps.
    counts_gate: the build needs COUNTS_THRESHOLD of the profile's counts read too (not for a profile of another release
    used as it is, `--stale-profile`, whose changed functions GCC drops by design: the share is then reported only)."""
    objects: dict[str, dict] = {}
    totals = dict.fromkeys(VALUE_KINDS, 0)
    sites: list[dict] = []
    has_values = False  # any value counter in the profile (an instrumented build with --values)
    for src in sorted(profile.rglob("*.gcda")):
        rel = src.relative_to(profile)
        gcda = read_gcda(src)
        arcs = int(gcda.counters(ARCS).sum())
        has_values = has_values or bool(gcda.counter_kinds_present() - {ARCS})
        dump = _dump_for(out, rel)
        # kernel/gcov/* and the like exist only in the instrumented kernel: no object, nothing to use.
        built = (out / rel.with_suffix(".o")).exists()
        row: dict = {"arcs_sum": arcs, "built": built, "dump": dump is not None}
        if dump is not None:
            text = dump.read_text(errors="replace")
            row["functions"] = len(_FUNC.findall(text))
            row["functions_read"] = sum(1 for m in _READ.finditer(text) if int(m.group(1)) > 0)
            row["functions_giving_up"] = text.count(_GIVEUP)
            row["arcs_read"] = sum(int(m.group(1)) for m in _EDGE.finditer(text))
            row["used"] = row["functions_read"] > 0 and row["functions_giving_up"] == 0
            estimate = _dump_for(out, rel, "profile_estimate")
            counts, found = value_transforms(text, estimate.read_text(errors="replace") if estimate else "", str(rel.with_suffix(".o")))
            if any(counts.values()):
                row["values"] = counts
                for k, v in counts.items():
                    totals[k] += v
            sites += found
        else:
            row["used"] = False
        objects[str(rel.with_suffix(".o"))] = row
    for pattern in ("*i.profile", "*i.profile_estimate"):
        for dump in out.rglob(pattern):
            dump.unlink()
    nonempty = [r for r in objects.values() if r["arcs_sum"] > 0 and r["built"]]
    not_built = sorted(k for k, r in objects.items() if r["arcs_sum"] > 0 and not r["built"])
    used = [r for r in nonempty if r["used"]]
    ratio = len(used) / len(nonempty) if nonempty else 0.0
    weight = sum(r["arcs_sum"] for r in nonempty)
    weight_read = sum(min(r.get("arcs_read", 0), r["arcs_sum"]) for r in nonempty) / weight if weight else 0.0
    result = {
        "method": "gcc -fdump-ipa-profile: functions whose edge counts were read vs 'giving up', and the counts read vs the profile's",
        "objects_with_profile": len(objects),
        "objects_nonempty": len(nonempty),
        "objects_used": len(used),
        "profiled_but_not_built": not_built,
        "ratio": round(ratio, 4),
        "threshold": THRESHOLD,
        "counts_threshold": COUNTS_THRESHOLD,
        "functions_read": sum(r.get("functions_read", 0) for r in objects.values()),
        "functions_giving_up": sum(r.get("functions_giving_up", 0) for r in objects.values()),
        "weight_read": round(weight_read, 4),
        "counts_gate": counts_gate,
        "ok": bool(nonempty) and ratio >= THRESHOLD and (weight_read >= COUNTS_THRESHOLD or not counts_gate),
    }
    if has_values:
        promoted = sorted((s for s in sites if s["promoted"]), key=lambda s: -s["count"])
        if (out / "vmlinux").is_file():  # what the linked kernel kept of each promotion (docs/VALUES.md)
            for s, seen in zip(promoted, promotions_in_vmlinux(out / "vmlinux", promoted)):
                s["in_vmlinux"] = seen
            totals["indirect_calls_promoted_in_vmlinux"] = sum(s["in_vmlinux"] in (CALL, GUARD) for s in promoted)
        dominant = dominant_sites(profile, None)
        totals["dominant_sites"] = len(dominant)
        totals["dominant_sites_elsewhere"] = sum(s.where == OTHER for s in dominant)
        result["values"] = {"totals": totals, "hot_promoted_sites": promoted[:TOP_SITES],
                            "method": "gcc -fdump-ipa-profile-optimized (transforms done, promotion candidates) and "
                                      "-fdump-ipa-profile_estimate (speculative direct calls produced, targets not found)"}
    atomic.write_json(out / "proof.json", {"summary": result, "objects": objects})
    return result


def enforce(summary: dict, out: Path) -> None:
    if summary["ok"]:
        return
    n, u = summary["objects_nonempty"], summary["objects_used"]
    if summary["ratio"] >= THRESHOLD:
        raise InfraError(f"GCC read only {summary['weight_read']:.1%} of the profile's arc counts (< {COUNTS_THRESHOLD:.0%}): it found no profile "
                         f"for the other functions; details in {out / 'proof.json'}",
                         "the profile may be of another build or tree; check with `kpgo profile check`")
    hint = "did you run `kpgo profile fix` on it? (the kernel's .gcda lack the object summary GCC needs)"
    if summary["functions_giving_up"] == 0:
        hint = "the profile may come from another build; check with `kpgo profile check`"
    raise InfraError(
        f"GCC used the profile in only {u} of {n} objects with a non-empty profile ({summary['ratio']:.0%} < {THRESHOLD:.0%}); details in {out / 'proof.json'}",
        hint,
    )
