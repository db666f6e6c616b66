"""Port a profile from one instrumented build to another (`kpgo profile port`): a point release changes a few
functions, and GCC drops the profile of every function whose checksums changed (-Wcoverage-mismatch).

Each .gcda of the profile must match the old build's .gcno (stamp, function ids, checksums, counters: the profile
really is of that build). Its functions are then matched to the new build's .gcno of the same path, by name, then
(a function renamed but otherwise equal) by both checksums and the same arcs, and each becomes one of:

    kept     both checksums and the arcs equal: the counters as they are
    carried  the CFG checksum and the arcs equal, the line checksum not (the function moved, or its first line
             changed): the counters as they are, under the new build's id and checksums
    mapped   the CFG changed: old blocks mapped to new ones by their source lines (through a diff of the two source
             files when both can be read; else relative to the function's start and to its end, where the two agree)
             and by structure (a mapped block's single successor to the other's), then new arc counts that conserve flow and come as close as they can to the
             mapped blocks' and arcs' old counts (a linear program; the entry count weighs most, branches that nothing
             tells apart are split evenly); the counters are those of the new arcs off the spanning tree
    dropped  no function of that name; or the mapped blocks hold less than MIN_MATCHED of the function's old block
             counts, or the counts the program found miss the old ones by more than MAX_RESIDUAL of them, or a count
             came out negative: GCC then estimates the function as it does any function without a profile

Weight is the sum of a function's arc counters in the old profile (what `kpgo profile stats` sums). Objects only in
the old build are dropped; objects only in the new build are "new" (no weight). An object whose functions are all
kept (with the same ids) is copied whole, value counters included, with the new stamp; any other object is written
with arc counters only (value counters of a changed object are not ported: their sites are not in the .gcno).
Every output file has one object summary (runs as in the input, sum_max the largest ported arc counter), so the
output is ready for `kpgo build --profile`.

API
    port_profile(src, old_build, new_build, dst) -> dict     the port report (also in dst/profile.json "ported")
    report_lines(report, limit) -> list[str]                 the report as a readable table
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kpgo import inputs
from kpgo.atomic import check_output, output_dir
from kpgo.errors import UserError
from kpgo.gcov import flow
from kpgo.gcov.gcda import ARCS, TAG_FUNCTION, Gcda, counter_tag
from kpgo.gcov.gcno import ARC_ON_TREE, Gcno, GcnoFunction, read_gcno
from kpgo.gcov.profile import PROFILE_JSON, _rels_or_fail, is_apparatus, read_profile_file, read_profile_json, write_tree
from kpgo.gcov.validate import compare_to_gcno, has_gcno

MIN_MATCHED = 0.5  # share of the old block counts the mapped blocks must hold
MAX_RESIDUAL = 0.25  # largest miss of the mapped counts, as a share of them
ENTRY_WEIGHT = 10.0  # the entry count (how often the function is called) matters most: callers did not change
SPLIT_WEIGHT = 0.01  # a tie-breaker only: split a branch evenly when no mapped count says otherwise

STATUSES = ("kept", "carried", "mapped", "dropped")
BUILD_FIELDS = ("kernel_release", "config_name", "config_hash", "build_dir", "gcc")
BUILD_SHAPE = {"kernel_release?": (str, None), "config_name?": (str, None), "config_hash?": (str, None), "build_dir?": (str, None),
               "gcc?": (str, None), "key?": (str, None), "gcov?": (bool, None)}
PROFILE_HINT = "give --from the instrumented build the profile was collected from (`kpgo profile check PROFILE --build DIR` says which files match)"


@dataclass
class Ported:
    """One old function's fate: its status, old weight, new counters (None when dropped) and why."""

    name: str
    old_ident: int
    status: str
    weight: int
    counters: np.ndarray | None
    new: GcnoFunction | None
    reason: str = ""


def _sum(v: np.ndarray) -> int:
    return int(sum(int(x) for x in v.tolist()))


def _arcs(fn: GcnoFunction) -> tuple[tuple[int, int, int], ...]:
    return tuple(zip(fn.arc_src.tolist(), fn.arc_dst.tolist(), fn.arc_flags.tolist()))


# -- block mapping ---------------------------------------------------------------------------------------------

def _succ(fn: GcnoFunction) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in range(max(fn.n_blocks, 2))]
    for s, d in zip(fn.arc_src.tolist(), fn.arc_dst.tolist()):
        out[s].append(d)
    return out


def _pred(fn: GcnoFunction) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in range(max(fn.n_blocks, 2))]
    for s, d in zip(fn.arc_src.tolist(), fn.arc_dst.tolist()):
        out[d].append(s)
    return out


LineMap = dict[int, int]  # old line -> new line of a function's source file, where the two versions' text agrees


def line_map(old_text: str, new_text: str) -> LineMap:
    """Old line -> new line of the lines two versions of a file share, aligned as diff aligns them."""
    a, b = old_text.splitlines(), new_text.splitlines()
    out: LineMap = {}
    for blk in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks():
        for i in range(blk.size):
            out[blk.a + i + 1] = blk.b + i + 1
    return out


Key = tuple[tuple[str, int], ...]


def _align(old: GcnoFunction, new: GcnoFunction, okey: Any, nkey: Any) -> dict[int, int]:
    """Old block -> new block by keys made of their locations, aligned in source order as a diff aligns lines."""
    ol, nl = old.block_lines or [], new.block_lines or []

    def order(fn: GcnoFunction, lines: list[list[tuple[str, int]]]) -> list[int]:
        return sorted((b for b in range(2, fn.n_blocks) if b < len(lines) and lines[b]), key=lambda b: (min(x[1] for x in lines[b]), b))

    ob, nb = order(old, ol), order(new, nl)
    ok: list[Key] = [tuple(okey(loc) for loc in ol[b]) for b in ob]
    nk: list[Key] = [tuple(nkey(loc) for loc in nl[b]) for b in nb]
    out: dict[int, int] = {}
    for blk in difflib.SequenceMatcher(None, ok, nk, autojunk=False).get_matching_blocks():
        for i in range(blk.size):
            out[ob[blk.a + i]] = nb[blk.b + i]
    return out


def _relative(fn: GcnoFunction, base: int) -> Any:
    """A location's key: lines of the function's own file relative to base, others (inlined headers) as they are."""
    return lambda loc: ("", loc[1] - base) if loc[0] == fn.source else loc


def map_blocks(old: GcnoFunction, new: GcnoFunction, lines: LineMap | None = None) -> dict[int, int]:
    """Old block -> new block: ENTRY and EXIT; blocks by their source lines; then single successors and
    predecessors of mapped blocks (structure).

    With the two versions of the source (lines: their line map), an old block's lines are taken to the new file's
    and must equal a new block's (a changed line maps nowhere). Without them, lines relative to the function's start
    and, apart, to its end (code inserted in the middle shifts what follows it), kept where the two agree or only
    one maps the block: an inserted `if` can sit where the old one sat relative to the start, and the old one where
    it sat relative to the end, and numbers alone cannot tell."""
    m: dict[int, int] = {0: 0, 1: 1}
    if lines is not None:
        own_old, own_new = old.source, new.source
        found = _align(old, new, lambda loc: ("", lines.get(loc[1], -loc[1])) if loc[0] == own_old else loc,
                       lambda loc: ("", loc[1]) if loc[0] == own_new else loc)
        m.update(found)
    else:
        by_start = _align(old, new, _relative(old, old.start_line), _relative(new, new.start_line))
        by_end = _align(old, new, _relative(old, old.end_line), _relative(new, new.end_line))
        claimed = Counter(list(by_start.values()) + [v for k, v in by_end.items() if by_start.get(k) != v])
        for b in sorted(set(by_start) | set(by_end)):
            s, e = by_start.get(b), by_end.get(b)
            target = s if e is None or s == e else e if s is None else None
            if target is not None and claimed[target] == 1:
                m[b] = target
    # Structure: a mapped block's only successor (predecessor) maps to the other's, while both are free.
    osu, nsu, opr, npr = _succ(old), _succ(new), _pred(old), _pred(new)
    changed = True
    while changed:
        changed = False
        taken = set(m.values())
        for a, b in list(m.items()):
            for onext, nnext in ((osu[a], nsu[b]), (opr[a], npr[b])):
                if len(onext) == 1 and len(nnext) == 1 and onext[0] not in m and nnext[0] not in taken:
                    m[onext[0]] = nnext[0]
                    taken.add(nnext[0])
                    changed = True
    return m


def _solve(fn: GcnoFunction, counters: np.ndarray) -> tuple[list[int], list[int]] | None:
    """All arc counts and block counts of a function from its counters (kpgo's flow solver); None if unsolvable."""
    expr = flow.solve_function(fn)
    if expr is None:
        return None
    arcs = [flow.evaluate(e, counters) for e in expr]
    blocks = [flow.evaluate(e, counters) for e in flow.block_counts(fn, expr)]
    return arcs, blocks


def map_counters(old: GcnoFunction, counters: np.ndarray, new: GcnoFunction, lines: LineMap | None = None) -> tuple[np.ndarray | None, str]:
    """Counters for the new CFG from the old one's, or None and why not (see the module's doc)."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    solved = _solve(old, counters)
    if solved is None:
        return None, "the old CFG cannot be solved for its arc counts"
    old_arcs, old_blocks = solved
    bmap = map_blocks(old, new, lines)
    total = sum(old_blocks[b] for b in range(2, old.n_blocks))
    held = sum(old_blocks[b] for b in bmap if b >= 2)
    if total and held < MIN_MATCHED * total:
        return None, f"the mapped blocks hold {held / total:.0%} of its block counts (< {MIN_MATCHED:.0%})"
    n = max(new.n_blocks, 2)
    src, dst = new.arc_src.tolist(), new.arc_dst.tolist()
    m = len(src)
    # Targets: (arcs summed, count, weight). The entry count; each mapped block's count; each arc between mapped
    # blocks that was an arc before.
    targets: list[tuple[list[int], float, float]] = []
    out_of = [[a for a in range(m) if src[a] == b] for b in range(n)]
    into = [[a for a in range(m) if dst[a] == b] for b in range(n)]
    targets.append((out_of[0], float(old_blocks[0]), ENTRY_WEIGHT))
    for ob, nb in bmap.items():
        if ob >= 2 and into[nb]:
            targets.append((into[nb], float(old_blocks[ob]), 1.0))
    old_arc_count: dict[tuple[int, int], int] = {}
    for a, (s, d) in enumerate(zip(old.arc_src.tolist(), old.arc_dst.tolist())):
        old_arc_count[(s, d)] = old_arc_count.get((s, d), 0) + old_arcs[a]
    inv = {nb: ob for ob, nb in bmap.items()}
    for a in range(m):
        key = (inv.get(src[a], -1), inv.get(dst[a], -1))
        if key in old_arc_count:
            targets.append(([a], float(old_arc_count[key]), 1.0))
    # Tie-breakers: the two ways out of a two-way branch differ as little as the targets allow.
    splits = [out_of[b] for b in range(2, n) if len(out_of[b]) == 2]
    nt, ns = len(targets), len(splits)
    nvar = m + 2 * nt + 2 * ns
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    rhs: list[float] = []
    r = 0
    for b in range(2, n):  # conservation: what enters a block leaves it
        if not into[b] and not out_of[b]:
            continue
        rows += [r] * (len(into[b]) + len(out_of[b]))
        cols += into[b] + out_of[b]
        vals += [1.0] * len(into[b]) + [-1.0] * len(out_of[b])
        rhs.append(0.0)
        r += 1
    cost = np.zeros(nvar)
    for t, (arcs, count, w) in enumerate(targets):  # sum(arcs) - p + q = count
        rows += [r] * len(arcs)
        cols += arcs
        vals += [1.0] * len(arcs)
        rows += [r, r]
        cols += [m + 2 * t, m + 2 * t + 1]
        vals += [-1.0, 1.0]
        rhs.append(count)
        cost[m + 2 * t : m + 2 * t + 2] = w
        r += 1
    for s, (a1, a2) in enumerate(splits):  # x1 - x2 - p + q = 0
        base = m + 2 * nt + 2 * s
        rows += [r, r, r, r]
        cols += [a1, a2, base, base + 1]
        vals += [1.0, -1.0, -1.0, 1.0]
        rhs.append(0.0)
        cost[base : base + 2] = SPLIT_WEIGHT
        r += 1
    a_eq = coo_matrix((vals, (rows, cols)), shape=(r, nvar)).tocsr()
    res = linprog(cost, A_eq=a_eq, b_eq=np.array(rhs), bounds=(0, None), method="highs")
    if res.status != 0:
        return None, f"no consistent counts ({res.message})"
    x = res.x
    miss = sum(abs(x[m + 2 * t] - x[m + 2 * t + 1]) for t in range(nt))
    mapped = sum(c for _, c, _ in targets[1:])
    if mapped and miss > MAX_RESIDUAL * mapped:
        return None, f"the consistent counts miss the mapped ones by {miss / mapped:.0%} (> {MAX_RESIDUAL:.0%})"
    counted = np.flatnonzero((new.arc_flags & ARC_ON_TREE) == 0)
    values = np.rint(x[counted]).astype(np.int64)
    check = _solve(new, values.astype(np.uint64))
    if check is None:
        return None, "the new CFG cannot be solved for its arc counts"
    if min(check[0], default=0) < 0:
        return None, "a count came out negative after rounding"
    return values.astype(np.uint64), f"{len(bmap) - 2} of {old.n_blocks - 2} blocks mapped"


# -- one object ----------------------------------------------------------------------------------------------------

def _key(fn: GcnoFunction) -> str:
    return fn.name or f"#{fn.ident}"


Sources = Callable[[GcnoFunction, GcnoFunction], "LineMap | None"]


def source_lines(old: Gcno, new: Gcno) -> Sources:
    """The line map of a function's two source files, found from each .gcno's directory (cwd) and the function's
    file, when both can be read; None otherwise (the port then maps by line numbers alone). Each pair is read once."""
    cache: dict[tuple[str, str], LineMap | None] = {}

    def read(cwd: str | None, name: str | None) -> str | None:
        if not name:
            return None
        path = os.path.join(cwd or "", name)
        if not os.path.isfile(path):
            return None
        try:
            return inputs.read_text(path, "the port reads the source to map blocks by their lines")
        except UserError:
            return None

    def get(of: GcnoFunction, nf: GcnoFunction) -> LineMap | None:
        key = (os.path.join(old.cwd or "", of.source or ""), os.path.join(new.cwd or "", nf.source or ""))
        if key not in cache:
            a, b = read(old.cwd, of.source), read(new.cwd, nf.source)
            cache[key] = line_map(a, b) if a is not None and b is not None else None
        return cache[key]

    return get


def port_functions(g: Gcda, old: Gcno, new: Gcno, sources: Sources | None = None) -> list[Ported]:
    """The fate of each function of g (a .gcda matching `old`) in `new` (sources: see source_lines)."""
    by_ident = {f.ident: f for f in old.functions}
    named: dict[str, list[GcnoFunction]] = {}
    for f in new.functions:
        named.setdefault(_key(f), []).append(f)
    used: set[int] = set()
    out: list[Ported] = []
    pending: list[tuple[GcnoFunction, np.ndarray, int]] = []
    for fr in g.functions():
        if fr.ident is None:
            continue
        of = by_ident[fr.ident]
        c = fr.counters.get(ARCS, np.zeros(0, dtype=np.uint64))
        cands = [f for f in named.get(_key(of), []) if id(f) not in used]
        if not cands:
            pending.append((of, c, len(out)))
            out.append(Ported(_key(of), of.ident, "dropped", _sum(c), None, None, "not in the new build"))
            continue
        nf = cands[0]
        used.add(id(nf))
        out.append(_port_one(of, c, nf, sources))
    # Renamed but otherwise equal: the same checksums and arcs, one candidate only.
    free = [f for f in new.functions if id(f) not in used]
    for of, c, i in pending:
        same = [f for f in free if f.lineno_checksum == of.lineno_checksum and f.cfg_checksum == of.cfg_checksum and _arcs(f) == _arcs(of)]
        if len(same) == 1:
            free.remove(same[0])
            out[i] = Ported(_key(of), of.ident, "kept", _sum(c), c, same[0], f"renamed to {_key(same[0])}")
    return out


def _port_one(of: GcnoFunction, c: np.ndarray, nf: GcnoFunction, sources: Sources | None) -> Ported:
    w = _sum(c)
    if of.cfg_checksum == nf.cfg_checksum and _arcs(of) == _arcs(nf):
        status = "kept" if of.lineno_checksum == nf.lineno_checksum else "carried"
        return Ported(_key(of), of.ident, status, w, c, nf, "" if status == "kept" else "lines moved")
    lines = sources(of, nf) if sources is not None else None
    how = "by the source's diff, " if lines is not None else "by line numbers (no source), "
    counters, why = map_counters(of, c, nf, lines)
    return Ported(_key(of), of.ident, "mapped" if counters is not None else "dropped", w, counters, nf, "CFG changed: " + how + why)


def build_gcda(template: Gcda, stamp: int, functions: list[tuple[GcnoFunction, np.ndarray]]) -> Gcda:
    """A .gcda in template's layout with one FUNCTION record (the new build's id and checksums) and one arc
    counter record per function, in the order given."""
    unit = template.layout.unit
    tags: list[int] = []
    lengths: list[int] = []
    parts: list[np.ndarray] = []
    for fn, c in functions:
        tags += [TAG_FUNCTION, counter_tag(ARCS)]
        lengths += [3 * unit, 2 * len(c) * unit]
        parts.append(np.array([fn.ident, fn.lineno_checksum, fn.cfg_checksum], dtype=np.uint32))
        words = np.zeros(2 * len(c), dtype=np.uint32)
        c = np.asarray(c, dtype=np.uint64)
        words[0::2] = (c & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        words[1::2] = (c >> np.uint64(32)).astype(np.uint32)
        parts.append(words)
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in parts], out=offsets[1:])
    payload = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)
    return dataclasses.replace(template, stamp=stamp, tags=np.array(tags, dtype=np.uint32), lengths=np.array(lengths, dtype=np.uint32),
                               offsets=offsets, payload=payload, trailer=np.zeros(0, dtype=np.uint32))


# -- the whole profile -----------------------------------------------------------------------------------------

def _instrumented(build: Path, option: str) -> None:
    if not build.is_dir():
        what = f"is {inputs.kind(build)}" if build.exists() else "does not exist"
        raise UserError(f"{option} {build} {what}, so it is not an instrumented build", "give the build directory of `kpgo build --variant instrumented`")
    if not has_gcno(build):
        raise UserError(f"{option} {build} holds no .gcno files, so it is not an instrumented build",
                        "give the build directory of `kpgo build --variant instrumented`")


def _gcno_rels(build: Path) -> list[str]:
    out = []
    for root, _dirs, files in os.walk(build):
        for f in files:
            if f.endswith(".gcno"):
                out.append(os.path.relpath(os.path.join(root, f), build))
    return sorted(out)


def _build_record(build: Path) -> dict[str, Any]:
    """What the build's build.json says of it (none for a build kpgo did not make)."""
    rec = inputs.read_json(build / "build.json", "repair or remove it (`kpgo build` writes it)", BUILD_SHAPE, missing_ok=True)
    return rec if isinstance(rec, dict) else {}


def _empty_row() -> dict[str, Any]:
    return {"weight": 0, **dict.fromkeys(STATUSES, 0), "mapped_to": 0, "functions": dict.fromkeys(STATUSES, 0)}


def _add(row: dict[str, Any], p: Ported) -> None:
    row["weight"] += p.weight
    row[p.status] += p.weight
    row["functions"][p.status] += 1
    if p.status == "mapped" and p.counters is not None:
        row["mapped_to"] += _sum(p.counters)


def port_profile(src: Path, old_build: Path, new_build: Path, dst: Path, use_source: bool = True) -> dict[str, Any]:
    """Port the profile src of old_build to new_build, into dst (see the module's doc). Returns the report.
    use_source: map changed functions' blocks through a diff of their two source files, where both can be read."""
    src, old_build, new_build, dst = Path(src), Path(old_build), Path(new_build), Path(dst)
    _instrumented(old_build, "--from")
    _instrumented(new_build, "--to")
    check_output(dst, inputs=[src, old_build, new_build])
    every = _rels_or_fail(src)
    rels = [r for r in every if not is_apparatus(r)]
    info = read_profile_json(src)
    old_rec, new_rec = _build_record(old_build), _build_record(new_build)
    objects: dict[str, dict[str, Any]] = {}
    total = _empty_row()
    changed: list[dict[str, Any]] = []
    written: list[tuple[str, Gcda]] = []
    runs = 1
    seen: set[str] = set()
    for rel in rels:
        stem = rel[: -len(".gcda")]
        g = read_profile_file(src, Path(rel))
        old_path = old_build / (stem + ".gcno")
        if not os.path.lexists(old_path):
            raise UserError(f"{src} is not a profile of {old_build}: {rel} has no .gcno there", PROFILE_HINT)
        old = read_gcno(old_path, lines=True)
        why = compare_to_gcno(g, old)
        if why:
            raise UserError(f"{src} is not a profile of {old_build}: {rel}: {why}", PROFILE_HINT)
        if g.summary is not None:
            runs = max(runs, g.summary.runs)
        row = objects[stem + ".o"] = _empty_row()
        new_path = new_build / (stem + ".gcno")
        seen.add(stem + ".gcno")
        if not new_path.exists():
            row["status"] = "dropped"
            names = {f.ident: _key(f) for f in old.functions}
            for fr in g.functions():
                if fr.ident is not None:
                    p = Ported(names[fr.ident], fr.ident, "dropped", _sum(fr.counters.get(ARCS, np.zeros(0, dtype=np.uint64))), None, None,
                               "object not in the new build")
                    _add(row, p)
                    _add(total, p)
            continue
        new = read_gcno(new_path, lines=True)
        if new.version != g.version:
            raise UserError(f"{new_path}: gcov version {new.version_text}, the profile's is {g.version_text}: the builds were compiled by different GCCs",
                            "port between builds of one compiler (GCC ignores a profile of another version)")
        ported = port_functions(g, old, new, source_lines(old, new) if use_source else None)
        row["status"] = "ported"
        for p in ported:
            _add(row, p)
            _add(total, p)
            if p.status != "kept":
                changed.append({"object": stem + ".o", "function": p.name, "status": p.status, "weight": p.weight, "reason": p.reason})
        whole = all(p.status == "kept" and p.new is not None and p.new.ident == p.old_ident for p in ported)
        if whole:  # unchanged: the file as it is (value counters too), under the new build's stamp
            written.append((rel, dataclasses.replace(g, stamp=new.stamp)))
        else:
            keep = {id(p.new): p.counters for p in ported if p.counters is not None and p.new is not None}
            fns = [(f, keep[id(f)]) for f in new.functions if id(f) in keep]
            written.append((rel, build_gcda(g, new.stamp, fns)))
    fresh = [r for r in _gcno_rels(new_build) if r not in seen and not is_apparatus(r)]
    sum_max = 0
    for _rel, out in written:
        c = out.counters(ARCS)
        if len(c):
            sum_max = max(sum_max, int(c.max()))
    sum_max = min(sum_max, 0xFFFFFFFF)
    report: dict[str, Any] = {
        "profile": str(src), "from": str(old_build), "to": str(new_build),
        "total": {**total, "objects": {"ported": sum(1 for r in objects.values() if r["status"] == "ported"),
                                       "dropped": sum(1 for r in objects.values() if r["status"] == "dropped"), "new": len(fresh)}},
        "objects": dict(sorted(objects.items())),
        "new_objects": [r[: -len(".gcno")] + ".o" for r in fresh],
        "functions": sorted(changed, key=lambda f: (-f["weight"], f["object"], f["function"])),
        "left_out": [r for r in every if is_apparatus(r)],
        "summary": {"runs": runs, "sum_max": sum_max},
        "rules": {"min_matched": MIN_MATCHED, "max_residual": MAX_RESIDUAL, "entry_weight": ENTRY_WEIGHT, "split_weight": SPLIT_WEIGHT},
    }

    def items() -> Iterator[tuple[str, bytes]]:
        for rel, out in written:
            yield rel, out.with_summary(runs, sum_max).to_bytes()

    with output_dir(dst) as tmp:
        write_tree(tmp, items())
        record: dict[str, Any] = {"kind": info.get("kind", "kernel-gcov-profile")}
        for k in BUILD_FIELDS:  # the new build's, so that `kpgo build` takes it for a profile of that kernel
            if new_rec.get(k) is not None:
                record[k] = new_rec[k]
        if new_rec.get("key"):
            record["build_key"] = new_rec["key"]
        for k in ("workload", "throughput", "accelerator"):
            if k in info:
                record[k] = info[k]
        record["fixed"] = {"runs": runs, "sum_max": sum_max, "source": "kpgo profile port"}
        record["ported"] = {"profile": info, "source": str(src), "from_build": str(old_build), "to_build": str(new_build),
                            "from_release": old_rec.get("kernel_release"), "to_release": new_rec.get("kernel_release"), "report": report}
        (tmp / PROFILE_JSON).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return report


# -- the readable table ------------------------------------------------------------------------------------------

def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else "    -"


def report_lines(report: dict[str, Any], limit: int = 20) -> list[str]:
    t = report["total"]
    head = f"{'object':<40} {'weight':>14} {'kept':>7} {'carried':>7} {'mapped':>7} {'dropped':>7}"
    lines = [head]

    def row(name: str, r: dict[str, Any]) -> str:
        return (f"{name[-40:]:<40} {r['weight']:>14,} " + " ".join(f"{_pct(r[s], r['weight']):>7}" for s in STATUSES))

    touched = [(k, r) for k, r in report["objects"].items() if r["weight"] != r["kept"] or r["status"] != "ported"]
    touched.sort(key=lambda kr: -(kr[1]["weight"] - kr[1]["kept"]))
    for k, r in touched[:limit]:
        lines.append(row(k + (" (not in the new build)" if r["status"] == "dropped" else ""), r))
    if len(touched) > limit:
        lines.append(f"... {len(touched) - limit} more changed objects (--json)")
    lines.append(f"unchanged objects: {len(report['objects']) - len(touched)}")
    lines.append(row("total", t))
    f = t["functions"]
    o = t["objects"]
    lines.append(f"functions: {f['kept']} kept, {f['carried']} carried (lines moved), {f['mapped']} mapped (CFG changed), "
                 f"{f['dropped']} dropped; objects: {o['ported']} ported, {o['dropped']} only in the old build, {o['new']} only in the new")
    if t["mapped"]:
        lines.append(f"mapped functions: old weight {t['mapped']:,}, ported as {t['mapped_to']:,}")
    for fn in report["functions"][:limit]:
        if fn["status"] in ("mapped", "dropped"):
            lines.append(f"  {fn['status']:<8} {fn['object']}: {fn['function']} (weight {fn['weight']:,}): {fn['reason']}")
    return lines
