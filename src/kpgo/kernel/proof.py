"""Proof that GCC used the profile, object by object.

A changed binary proves nothing: -fprofile-use changes code through the flags it implies even
when GCC ignores every .gcda (it does so, silently, for files without the object summary).
So the optimized build runs with -fdump-ipa-profile, and for each object whose .gcda holds
non-zero counters we read GCC's own verdict from the dump: "Read edge ... count" /
"edge counts read" when it used the counters, "Profile info is missing; giving up" when not."""

from __future__ import annotations

import re
from pathlib import Path

from kpgo import atomic
from kpgo.errors import InfraError
from kpgo.gcov.gcda import ARCS, read_gcda

THRESHOLD = 0.95

_FUNC = re.compile(r"^;; Function ", re.M)
_READ = re.compile(r"^(\d+) edge counts read", re.M)
_GIVEUP = "Profile info is missing; giving up"


def _dump_for(out: Path, rel_gcda: Path) -> Path | None:
    d = out / rel_gcda.parent
    stem = rel_gcda.name[: -len(".gcda")]
    hits = sorted(d.glob(f"{stem}.c.*i.profile"))
    return hits[0] if hits else None


def check(out: Path, profile: Path) -> dict:
    """Per object: non-empty profile? dump found? functions read / given up. Removes the dumps."""
    objects: dict[str, dict] = {}
    for src in sorted(profile.rglob("*.gcda")):
        rel = src.relative_to(profile)
        arcs = int(read_gcda(src).counters(ARCS).sum())
        dump = _dump_for(out, rel)
        # kernel/gcov/* and the like exist only in the instrumented kernel: no object, nothing to use.
        built = (out / rel.with_suffix(".o")).exists()
        row: dict = {"arcs_sum": arcs, "built": built, "dump": dump is not None}
        if dump is not None:
            text = dump.read_text(errors="replace")
            row["functions"] = len(_FUNC.findall(text))
            row["functions_read"] = sum(1 for m in _READ.finditer(text) if int(m.group(1)) > 0)
            row["functions_giving_up"] = text.count(_GIVEUP)
            row["used"] = row["functions_read"] > 0 and row["functions_giving_up"] == 0
        else:
            row["used"] = False
        objects[str(rel.with_suffix(".o"))] = row
    for dump in out.rglob("*i.profile"):
        dump.unlink()
    nonempty = [r for r in objects.values() if r["arcs_sum"] > 0 and r["built"]]
    not_built = sorted(k for k, r in objects.items() if r["arcs_sum"] > 0 and not r["built"])
    used = [r for r in nonempty if r["used"]]
    ratio = len(used) / len(nonempty) if nonempty else 0.0
    result = {
        "method": "gcc -fdump-ipa-profile: functions whose edge counts were read vs 'giving up'",
        "objects_with_profile": len(objects),
        "objects_nonempty": len(nonempty),
        "objects_used": len(used),
        "profiled_but_not_built": not_built,
        "ratio": round(ratio, 4),
        "threshold": THRESHOLD,
        "functions_read": sum(r.get("functions_read", 0) for r in objects.values()),
        "functions_giving_up": sum(r.get("functions_giving_up", 0) for r in objects.values()),
        "ok": bool(nonempty) and ratio >= THRESHOLD,
    }
    atomic.write_json(out / "proof.json", {"summary": result, "objects": objects})
    return result


def enforce(summary: dict, out: Path) -> None:
    if summary["ok"]:
        return
    n, u = summary["objects_nonempty"], summary["objects_used"]
    hint = "did you run `kpgo profile fix` on it? (the kernel's .gcda lack the object summary GCC needs)"
    if summary["functions_giving_up"] == 0:
        hint = "the profile may come from another build; check with `kpgo profile check`"
    raise InfraError(
        f"GCC used the profile in only {u} of {n} objects with a non-empty profile ({summary['ratio']:.0%} < {THRESHOLD:.0%}); details in {out / 'proof.json'}",
        hint,
    )
