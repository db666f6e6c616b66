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
from kpgo.gcov.gcda import ARCS, TAG_FUNCTION, TAG_OBJECT_SUMMARY, Gcda
from kpgo.gcov.profile import MANIFEST, gcda_list, read_manifest, read_profile_file, write_tree

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
        for d, ls in zip(dirs, lists):
            t = 0
            for rel in ls:
                v = read_profile_file(d, rel).counters(ARCS)
                t += int(v.sum(dtype=np.uint64)) if len(v) else 0
            if t == 0:
                raise UserError(f"{d}: the profile has no counts, cannot --normalize it", "drop it or give weight 0")
            totals.append(t)
        target = max(totals)
        scales = [target / t for t in totals]
    else:
        scales = [1.0] * len(dirs)
    factors = [w * s for w, s in zip(weights, scales)]

    merged: list[tuple[Path, Gcda]] = []
    global_max = 0
    firsts: list[Gcda | None] = [None] * len(dirs)
    out_totals = [0] * len(dirs)
    for rel in rels:
        inputs: list[tuple[int, Gcda]] = []
        for i, d in enumerate(dirs):
            if rel in present[i]:
                g = read_profile_file(d, rel)
                if firsts[i] is None:
                    firsts[i] = g
                inputs.append((i, g))
        t_idx, template = inputs[0]
        for i, g in inputs[1:]:
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
        out = template
        fac = [factors[i] for i, _ in inputs]
        for kind in sorted(template.counter_kinds_present()):
            name = template.layout.kind_name(kind)
            rule = RULES.get(name)
            if rule is None:
                raise UserError(
                    f"{dirs[t_idx] / rel}: cannot merge '{name}' counters",
                    "value profiles (-fprofile-generate) are not supported; kpgo merges -fprofile-arcs profiles",
                )
            arrays = [g.counters(kind) for _, g in inputs]
            if kind == ARCS:
                for (i, _), v in zip(inputs, arrays):
                    out_totals[i] += int(v.sum(dtype=np.uint64)) if len(v) else 0
            values = _merge_kind(rule, arrays, fac)
            if kind == ARCS and len(values):
                global_max = max(global_max, int(values.max()))
            out = out.with_counters(kind, values)
        merged.append((rel, out))

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
        write_tree(tmp, ((rel, g.with_summary(total_runs, sum_max).to_bytes()) for rel, g in merged))
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
