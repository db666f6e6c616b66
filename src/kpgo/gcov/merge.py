"""N-way weighted merge of profiles of one build (a "universal" profile), like `gcov-tool merge -w` for any number
of inputs.

API
    parse_weights(text, n) -> list[float]
    merge_profiles(dirs, dst, weights=None, normalize=False, runs=None) -> dict

Counter kinds merge by their own rule (as libgcov merges them):
    arcs, interval, pow2, average     weighted sum (rounded to the nearest integer when a factor is fractional)
    ior, conditions                   bitwise OR of the inputs with a non-zero weight
    time_profiler                     smallest non-zero value (first-execution order) of those inputs
    single, topn, indirect_call       refused: value profiles (-fprofile-generate), not what the kernel records
With normalize, input i is first scaled by max_j(T_j) / T_i, where T_i is its total arc count, so that every input
has the same total; then weights apply. Scaling up (never down) keeps small counts from rounding to zero.

Inputs are read one file at a time across all inputs, so memory is bounded by the size of one profile (the merged
result, kept until the global sum_max is known), not by the number of inputs times it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from kpgo.atomic import output_dir
from kpgo.errors import UserError
from kpgo.gcov.gcda import (
    ARCS, TAG_FUNCTION, TAG_OBJECT_SUMMARY, Gcda, _ranges, counter_tag, parse_gcda, summary_bytes,
)
from kpgo.gcov.profile import MANIFEST, gcda_list, read_manifest, read_profile_file, write_tree
import os

RULES = {
    "arcs": "sum", "interval": "sum", "pow2": "sum", "average": "sum",
    "ior": "ior", "conditions": "ior", "time_profiler": "min_nonzero",
}


def parse_weights(text: str | None, n: int) -> list[float]:
    if text is None or text == "":
        return [1.0] * n
    parts = text.split(",")
    if len(parts) != n:
        raise UserError(f"--weights has {len(parts)} values for {n} profiles", "give one weight per input")
    out = []
    for p in parts:
        try:
            w = float(p)
        except ValueError:
            raise UserError(f"--weights: '{p}' is not a number", "e.g. --weights 1,2,0.5") from None
        if not math.isfinite(w) or w < 0:
            raise UserError(f"--weights: '{p}' must be a finite number >= 0", "e.g. --weights 1,2,0.5")
        out.append(w)
    if not any(out):
        raise UserError("--weights are all zero", "give at least one positive weight")
    return out


def _structure(g: Gcda) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What must agree between inputs of one build: record tags (summary aside), counter counts per record, and the
    function records' identifiers and checksums."""
    keep = g.tags != TAG_OBJECT_SUMMARY
    tags = g.tags[keep]
    lengths = g.lengths[keep].astype(np.int64)
    sizes = np.diff(g.offsets)[keep]
    negative = lengths >= 1 << 31
    units = np.where(negative, ((1 << 32) - lengths) // g.layout.unit, sizes)
    fsel = np.flatnonzero(g.tags == TAG_FUNCTION)
    fpay = [g.payload[g.offsets[i]: g.offsets[i + 1]] for i in fsel.tolist()]
    funcs = np.concatenate(fpay) if fpay else np.zeros(0, dtype=np.uint32)
    return tags, units, funcs


def _same_structure(a: Gcda, b: Gcda) -> str | None:
    ta, ua, fa = _structure(a)
    tb, ub, fb = _structure(b)
    if not np.array_equal(ta, tb):
        return "different records"
    if not np.array_equal(ua, ub):
        return "different counter counts"
    if not np.array_equal(fa, fb):
        return "different function ids or checksums"
    return None


class _FastLayout:
    """Word positions of one template file, to read other inputs of the same build without parsing them: a file
    of the same size whose header, record headers and function records equal the template's has the same layout,
    and its counters sit at the same word positions. (Kernel profiles of one build always qualify.)"""

    def __init__(self, t: Gcda, data: bytes, kinds: list[int]) -> None:
        self.ok = not bool((t.lengths >= 1 << 31).any()) and t.byteorder == "<"
        self.size = len(data)
        if not self.ok:
            return
        self.words = np.frombuffer(data, dtype="<u4")
        hw = t.layout.header_words
        n = len(t.tags)
        sizes = np.diff(t.offsets)
        hp = hw + 2 * np.arange(n, dtype=np.int64) + t.offsets[:-1]
        fsel = np.flatnonzero(t.tags == TAG_FUNCTION)
        fpos = _ranges(hp[fsel] + 2, sizes[fsel])
        self.check = np.concatenate([np.arange(3, dtype=np.int64), hp, hp + 1, fpos])
        self.expect = self.words[self.check]
        self.pos: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for kind in kinds:
            sel = np.flatnonzero(t.tags == counter_tag(kind))
            idx = _ranges(hp[sel] + 2, sizes[sel])
            self.pos[kind] = (idx[0::2], idx[1::2])

    def counters(self, data: bytes, kind: int) -> np.ndarray | None:
        """The counters of `kind` from another input's bytes, or None if its layout differs."""
        if not self.ok or len(data) != self.size:
            return None
        w = np.frombuffer(data, dtype="<u4")
        if not np.array_equal(w[self.check], self.expect):
            return None
        lo, hi = self.pos[kind]
        return w[lo].astype(np.uint64) | (w[hi].astype(np.uint64) << 32)


def _input_runs(src: Path, first: Gcda | None) -> int:
    fixed = read_manifest(src).get("fixed")
    if isinstance(fixed, dict) and isinstance(fixed.get("runs"), int) and fixed["runs"] > 0:
        return int(fixed["runs"])
    if first is not None and first.summary is not None and first.summary.runs > 0:
        return first.summary.runs
    return 1


def _weighted_sum(arrays: list[np.ndarray], factors: list[float]) -> np.ndarray:
    if all(float(f).is_integer() for f in factors):
        acc = np.zeros(len(arrays[0]), dtype=np.uint64)
        for v, f in zip(arrays, factors):
            if f:
                acc += v * np.uint64(int(f))
        return acc
    accf = np.zeros(len(arrays[0]), dtype=np.float64)
    for v, f in zip(arrays, factors):
        if f:
            accf += v.astype(np.float64) * f
    return np.rint(np.minimum(accf, float(np.iinfo(np.uint64).max))).astype(np.uint64)


def _merge_kind(rule: str, arrays: list[np.ndarray], factors: list[float]) -> np.ndarray:
    if rule == "sum":
        return _weighted_sum(arrays, factors)
    live = [v for v, f in zip(arrays, factors) if f]
    if rule == "ior":
        return np.bitwise_or.reduce(live) if live else np.zeros_like(arrays[0])
    # min_nonzero: 0 means "not run"; keep the earliest first-execution order among the runs that saw it.
    big = np.uint64(np.iinfo(np.uint64).max)
    stack = np.stack([np.where(v == 0, big, v) for v in live]) if live else np.full((1, len(arrays[0])), big)
    m = stack.min(axis=0)
    return np.where(m == big, np.uint64(0), m)


def merge_profiles(
    dirs: list[Path], dst: Path, weights: list[float] | None = None, normalize: bool = False, runs: int | None = None
) -> dict[str, Any]:
    """Merge profiles of the same build into dst (atomic). Returns stats: files, inputs, weights, scales, factors,
    totals, runs, sum_max, missing (files absent per input)."""
    dirs = [Path(d) for d in dirs]
    dst = Path(dst)
    if not dirs:
        raise UserError("no profiles to merge", "give one or more profile directories")
    weights = weights if weights is not None else [1.0] * len(dirs)
    if len(weights) != len(dirs):
        raise UserError(f"{len(weights)} weights for {len(dirs)} profiles", "give one weight per input")
    if dst.exists():
        raise UserError(f"output directory {dst} already exists", "choose another -o or remove it")
    lists = [gcda_list(d) for d in dirs]
    present = [set(ls) for ls in lists]
    rels = sorted(set().union(*present))

    totals: list[int] = []
    if normalize:
        totals = [0] * len(dirs)
        for rel in rels:
            fast: _FastLayout | None = None
            for i, d in enumerate(dirs):
                if rel not in present[i]:
                    continue
                with open(os.path.join(d, rel), "rb") as f:
                    data = f.read()
                v = fast.counters(data, ARCS) if fast is not None else None
                if v is None:
                    g = parse_gcda(data, os.path.join(d, rel))
                    v = g.counters(ARCS)
                    if fast is None:
                        fast = _FastLayout(g, data, [ARCS] if ARCS in g.counter_kinds_present() else [])
                        if ARCS not in fast.__dict__.get("pos", {}):
                            fast.ok = False
                totals[i] += int(v.sum(dtype=np.uint64)) if len(v) else 0
        for d, t in zip(dirs, totals):
            if t == 0:
                raise UserError(f"{d}: the profile has no counts, cannot --normalize it", "drop it or give weight 0")
        target = max(totals)
        scales = [target / t for t in totals]
    else:
        scales = [1.0] * len(dirs)
    factors = [w * s for w, s in zip(weights, scales)]

    merged: list[tuple[Path, Gcda, bytes]] = []
    global_max = 0
    firsts: list[Gcda | None] = [None] * len(dirs)
    out_totals = [0] * len(dirs)
    for rel in rels:
        # Template: the first input holding the file, parsed; the others are read through its layout when they
        # share it (no parse), else parsed and checked record by record.
        raw: list[tuple[int, bytes]] = []
        for i, d in enumerate(dirs):
            if rel in present[i]:
                path = os.path.join(d, rel)
                try:
                    with open(path, "rb") as f:
                        raw.append((i, f.read()))
                except OSError as e:
                    raise UserError(f"{path}: cannot read ({e.strerror})", "check the path and permissions") from None
        t_idx, t_data = raw[0]
        template = parse_gcda(t_data, os.path.join(dirs[t_idx], rel))
        if firsts[t_idx] is None:
            firsts[t_idx] = template
        kinds = sorted(template.counter_kinds_present())
        rules = []
        for kind in kinds:
            name = template.layout.kind_name(kind)
            rule = RULES.get(name)
            if rule is None:
                raise UserError(
                    f"{os.path.join(dirs[t_idx], rel)}: cannot merge '{name}' counters",
                    "value profiles (-fprofile-generate) are not supported; kpgo merges -fprofile-arcs profiles",
                )
            rules.append(rule)
        fast = _FastLayout(template, t_data, kinds)
        per_kind: list[list[np.ndarray]] = [[template.counters(k)] for k in kinds]
        for i, data in raw[1:]:
            got = [fast.counters(data, k) for k in kinds] if kinds else [None]
            if kinds and all(v is not None for v in got):
                for lst, v in zip(per_kind, got):
                    lst.append(v)
                if firsts[i] is None:
                    firsts[i] = parse_gcda(data, os.path.join(dirs[i], rel))
                continue
            g = parse_gcda(data, os.path.join(dirs[i], rel))
            if firsts[i] is None:
                firsts[i] = g
            if g.stamp != template.stamp:
                raise UserError(
                    f"{rel}: profiles from different builds (stamp {template.stamp:#x} in {dirs[t_idx]}, "
                    f"{g.stamp:#x} in {dirs[i]})",
                    "merge only profiles collected from the same instrumented build",
                )
            if g.version != template.version:
                raise UserError(f"{rel}: gcov versions differ ({template.version_text} in {dirs[t_idx]}, "
                                f"{g.version_text} in {dirs[i]})", "merge only profiles of one build")
            why = _same_structure(template, g)
            if why:
                raise UserError(f"{rel}: {why} in {dirs[t_idx]} and {dirs[i]}",
                                "merge only profiles collected from the same instrumented build")
            for lst, k in zip(per_kind, kinds):
                lst.append(g.counters(k))
        out = template
        fac = [factors[i] for i, _ in raw]
        # Fast output: the template's bytes with the merged counters written in place (layout unchanged).
        out_words = np.frombuffer(bytearray(t_data), dtype="<u4") if fast.ok else None
        for kind, rule, arrays in zip(kinds, rules, per_kind):
            if kind == ARCS:
                for (i, _), v in zip(raw, arrays):
                    out_totals[i] += int(v.sum(dtype=np.uint64)) if len(v) else 0
            values = _merge_kind(rule, arrays, fac)
            if kind == ARCS and len(values):
                global_max = max(global_max, int(values.max()))
            if out_words is not None:
                lo, hi = fast.pos[kind]
                out_words[lo] = (values & np.uint64(0xFFFFFFFF)).astype(np.uint32)
                out_words[hi] = (values >> np.uint64(32)).astype(np.uint32)
            else:
                out = out.with_counters(kind, values)
        merged.append((Path(rel), out, out_words.tobytes() if out_words is not None else out.to_bytes()))

    in_runs = [_input_runs(d, f) for d, f in zip(dirs, firsts)]
    total_runs = runs if runs is not None else sum(r for r, w in zip(in_runs, weights) if w)
    total_runs = max(1, min(total_runs, 0xFFFFFFFF))
    sum_max = min(global_max, 0xFFFFFFFF)
    missing = {str(d): len(rels) - len(p) for d, p in zip(dirs, present) if len(p) < len(rels)}
    import json

    manifest = {
        "merged": {
            "inputs": [
                {"path": str(d), "weight": w, "scale": s, "factor": f, "total_arcs": t, "runs": r,
                 "profile": read_manifest(d)}
                for d, w, s, f, t, r in zip(dirs, weights, scales, factors, out_totals, in_runs)
            ],
            "normalize": normalize,
            "runs": total_runs,
            "sum_max": sum_max,
            "max_counter": global_max,
            "files": len(rels),
            "missing": missing,
        }
    }
    with output_dir(dst) as tmp:
        write_tree(tmp, ((rel, summary_bytes(g, data, total_runs, sum_max)) for rel, g, data in merged))
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return {
        "files": len(rels),
        "inputs": [str(d) for d in dirs],
        "weights": weights,
        "scales": scales,
        "factors": factors,
        "totals": out_totals,
        "runs": total_runs,
        "sum_max": sum_max,
        "max_counter": global_max,
        "missing": missing,
    }
