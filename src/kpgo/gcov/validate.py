"""Match a profile's .gcda files to the instrumented build's .gcno files.

API
    check_profile(src, build) -> dict

For each .gcda, the .gcno at the same relative path in the build directory must have: the same stamp, the same
functions (ident, line checksum, CFG checksum) and, per function, as many arc counters as it has arcs off the
spanning tree. Status: matched; stale (the .gcno exists but disagrees: the profile is from another build or the
build changed); missing (no .gcno: the object is not in this build, or it was built without instrumentation).
Stricter than GCC: -fprofile-use never compares the stamp (coverage.cc's read_counts_file folds it into a generation
count); it looks each function up by ident and checks its checksums and counter count, so it still reads the
unchanged functions of a stale file and drops, with a "coverage mismatch" warning, those that changed.
The .gcno says nothing of value counters; "values" counts them by kind (as `kpgo profile stats` does), with how many
sites (or counters) lie in matched files, the ones GCC will read.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from kpgo import inputs
from kpgo.errors import UserError
from kpgo.gcov import ident
from kpgo.gcov.gcda import ARCS, DAMAGED_GCNO_HINT, TAG_FUNCTION, Gcda, GcovFormatError, counter_tag
from kpgo.gcov.gcno import Gcno, parse_gcno
from kpgo.gcov.profile import gcda_list, read_profile_file, value_counters_of


def function_signature(g: Gcda) -> list[tuple[int, int, int, int]]:
    """(ident, lineno_checksum, cfg_checksum, arc counters) of each function with data, in file order."""
    out: list[tuple[int, int, int, int]] = []
    tags = g.tags.tolist()
    offs = g.offsets.tolist()
    lengths = g.lengths.tolist()
    arcs = counter_tag(ARCS)
    unit = g.layout.unit
    cur: list[int] | None = None
    for i, tag in enumerate(tags):
        if tag == TAG_FUNCTION:
            if cur is not None:
                out.append((cur[0], cur[1], cur[2], cur[3]))
            a, b = offs[i], offs[i + 1]
            cur = g.payload[a : a + 3].tolist() + [0] if b - a >= 3 else None
        elif tag == arcs and cur is not None:
            n = ((1 << 32) - lengths[i]) // unit if lengths[i] >= 1 << 31 else offs[i + 1] - offs[i]
            cur[3] += n // 2
    if cur is not None:
        out.append((cur[0], cur[1], cur[2], cur[3]))
    return out


def compare_to_gcno(g: Gcda, notes: Gcno) -> str | None:
    """Why g does not match notes, or None when it does."""
    if g.stamp != notes.stamp:
        return f"stamp {g.stamp:#x} differs from the .gcno's {notes.stamp:#x} (profile of another build)"
    if g.version != notes.version:
        return f"gcov version {g.version_text} differs from the .gcno's {notes.version_text}"
    by_ident = {f.ident: f for f in notes.functions}
    for fid, lcs, ccs, n in function_signature(g):
        f = by_ident.get(fid)
        if f is None:
            return f"function id {fid} is not in the .gcno"
        if f.lineno_checksum != lcs:
            return f"function {f.name or fid}: line checksum differs"
        if f.cfg_checksum != ccs:
            return f"function {f.name or fid}: CFG checksum differs"
        if f.n_counters != n:
            return f"function {f.name or fid}: {n} arc counters, the .gcno has {f.n_counters}"
    return None


GCC_READS = ("read", "moved", "dropped", "absent")


def gcc_reads(g: Gcda, notes: Gcno) -> dict[str, list[int]]:
    """What GCC's -fprofile-use does with each function of g when it compiles the source `notes` was made from, as
    coverage.cc decides it (each function looked up by ident; the stamp is never compared): "read" (checksums and arc
    counter count agree), "moved" (read, only its line checksum differs: a "source locations ... have changed"
    warning), "dropped" (CFG checksum or counter count differs: a coverage-mismatch warning, its counts unused),
    "absent" (no function of that ident: never looked up). Per status: [functions, sum of their arc counters].
    g as kpgo installs it: check_profile re-keys a profile of a tree at another path first (kpgo.gcov.ident)."""
    by_ident = {f.ident: f for f in notes.functions}
    out = {s: [0, 0] for s in GCC_READS}
    for fr in g.functions():
        if fr.ident is None:
            continue
        arcs = fr.counters.get(ARCS)
        n, weight = (0, 0) if arcs is None else (len(arcs), int(arcs.sum()))
        f = by_ident.get(fr.ident)
        status = ("absent" if f is None else "dropped" if f.cfg_checksum != fr.cfg_checksum or f.n_counters != n
                  else "moved" if f.lineno_checksum != fr.lineno_checksum else "read")
        out[status][0] += 1
        out[status][1] += weight
    return out


def has_gcno(build: Path) -> bool:
    """Whether any .gcno is under build (the walk stops at the first)."""
    for _root, _dirs, files in os.walk(build):
        if any(f.endswith(".gcno") for f in files):
            return True
    return False


def check_profile(src: Path, build: Path) -> dict[str, Any]:
    """Returns {"total": {files, matched, stale, missing}, "directories": {dir: counts}, "problems": [...],
    "gcno_without_gcda": n, "gcc": {read|moved|dropped|absent: {functions, arcs_sum}}}."""
    src, build = Path(src), Path(build)
    if not build.is_dir():
        raise UserError(f"build directory {build} does not exist", "give the instrumented kernel's build directory")
    if not has_gcno(build):
        # Every file would be "missing": the answer to a wrong --build, not to a wrong profile.
        raise UserError(f"{build} holds no .gcno files, so it is not an instrumented build",
                        "give the build directory of `kpgo build --variant instrumented` the profile was collected from")
    rels = gcda_list(src)
    dirs: dict[str, dict[str, int]] = defaultdict(lambda: {"files": 0, "matched": 0, "stale": 0, "missing": 0})
    problems: list[dict[str, str]] = []
    total = {"files": 0, "matched": 0, "stale": 0, "missing": 0}
    seen: set[str] = set()
    gcc = {s: [0, 0] for s in GCC_READS}  # what -fprofile-use of this profile on the build's source does per function
    # as kpgo's build gives it: re-keyed when the build compiled the tree at another path than the profile's kernel
    root = ident.build_source(build)
    rk = ident.profile_rekey(src, Path(root)) if root is not None else None
    rekeyer = ident.Rekeyer(rk, [Path(r) for r in rels]) if rk is not None else None
    values: dict[str, dict[str, int]] = {}
    matched_values: dict[str, dict[str, int]] = {}
    for rel in rels:
        g = read_profile_file(src, rel)
        value_counters_of(g, values)
        note_rel = str(rel)[: -len(".gcda")] + ".gcno"
        seen.add(note_rel)
        note_path = os.path.join(build, note_rel)
        status, reason = "matched", ""
        data = inputs.read_bytes_if_present(note_path, DAMAGED_GCNO_HINT)
        if data is None:
            status, reason = "missing", "no .gcno in the build directory"
        else:
            try:
                notes = parse_gcno(data, note_path)
                why = compare_to_gcno(g, notes)
                for s, (n, w) in gcc_reads(rekeyer.apply(g, rel)[0] if rekeyer is not None else g, notes).items():
                    gcc[s][0] += n
                    gcc[s][1] += w
            except GcovFormatError as e:
                why = f"unreadable .gcno ({e.problem})"
            if why:
                status, reason = "stale", why
        d = os.path.dirname(str(rel)) or "."
        for bucket in (dirs[d], total):
            bucket["files"] += 1
            bucket[status] += 1
        if status != "matched":
            problems.append({"file": str(rel), "status": status, "reason": reason})
        else:
            value_counters_of(g, matched_values)
    extra = 0
    for root, _dirs, files in os.walk(build):
        for fname in files:
            if fname.endswith(".gcno"):
                rel_note = os.path.relpath(os.path.join(root, fname), build)
                if rel_note not in seen:
                    extra += 1
    return {
        "profile": str(src),
        "build": str(build),
        "total": total,
        "directories": dict(sorted(dirs.items())),
        "problems": problems,
        "gcno_without_gcda": extra,
        "all_matched": total["matched"] == total["files"],
        # function by function, as GCC reads the profile when it compiles this build's source (gcc_reads; the
        # functions of missing files are not counted): {status: {"functions", "arcs_sum"}}
        "gcc": {s: {"functions": n, "arcs_sum": w} for s, (n, w) in gcc.items()},
        "rekeyed_from": rk.old_root if rk is not None else None,  # the tree the profile's kernel compiled, when not the build's
        "values": {kind: {**v, "in_matched_files": matched_values.get(kind, {}).get("sites" if "sites" in v else "counters", 0)}
                   for kind, v in sorted(values.items())},
    }


__all__ = ["check_profile", "compare_to_gcno", "function_signature", "gcc_reads", "has_gcno"]
