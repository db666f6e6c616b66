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

How: the first input is read whole into one buffer and indexed at once (kpgo.gcov.gcda.index_image); the output is
its bytes with the merged counters written in place. Each other input is read whole, matched to it with one
vectorized comparison per profile, and its counters are folded into one accumulator per rule. Files that do not take
this path (see the comment above _merge_one) are merged per file with a full parse, by the same accumulators.
Memory: the first input, the accumulators and the one input being read - about three times one profile, whatever the
number of inputs. With --normalize the inputs are read twice (totals first).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kpgo.atomic import check_output, output_dir
from kpgo.errors import UserError
from kpgo.gcov.gcda import (
    ARCS,
    ARCS_TAG,
    KNOWN_TAGS,
    TAG_FUNCTION,
    TAG_OBJECT_SUMMARY,
    Gcda,
    Image,
    Index,
    Layout,
    SummaryWriter,
    counter_kind,
    counter_values,
    index_image,
    parse_gcda,
    store_counters,
)
from kpgo.gcov.image import read_file, read_image
from kpgo.gcov.profile import GCOV_MAX, PROFILE_JSON, _exact_sum, _rels_or_fail, read_profile_json, write_tree

RULES = {
    "arcs": "sum", "interval": "sum", "pow2": "sum", "average": "sum",
    "ior": "ior", "conditions": "ior", "time_profiler": "min_nonzero",
}


def rule_of(layout: Layout, kind: int) -> str | None:
    """The merge rule of a counter kind in a layout; None for the kinds kpgo does not merge (value profiles)."""
    return RULES.get(layout.kind_name(kind))


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
    fixed = read_profile_json(src).get("fixed")
    if isinstance(fixed, dict) and isinstance(fixed.get("runs"), int) and fixed["runs"] > 0:
        return int(fixed["runs"])
    if first is not None and first.summary is not None and first.summary.runs > 0:
        return first.summary.runs
    return 1


def _overflow_error(path: str) -> UserError:
    return UserError(f"{path}: a merged counter exceeds 2^63-1, the largest count GCC reads (an input holds an "
                     "impossible count, or the weights are too large)",
                     "check the inputs with `kpgo profile stats`, or give smaller --weights")


def _round_u64(acc: np.ndarray) -> np.ndarray:
    """Float sums to counters: rounded to the nearest integer, saturating at 2**64 - 1."""
    r = np.rint(acc)
    over = r >= 2.0**64
    if over.any():
        r[over] = 0.0
        out = r.astype(np.uint64)
        out[over] = np.iinfo(np.uint64).max
        return out
    return r.astype(np.uint64)


class Accumulator:
    """The merge rules: n counters of one rule folded over the inputs, add() by add(), as libgcov merges them.

    sum: weighted sum, in uint64 when every factor is an integer (exact), else in float64 rounded at the end;
    ior: bitwise OR; min_nonzero: the smallest non-zero value (0 means "not run": the earliest first-execution
    order among the runs that saw it). An input of factor 0 does not take part. strict: a sum past GCOV_MAX is an
    error naming the file of that counter, path_of(counter) (uint64 arithmetic would wrap around silently)."""

    BIG = np.uint64(np.iinfo(np.uint64).max)

    def __init__(self, rule: str, n: int, exact: bool, strict: bool, path_of: Callable[[int], str]) -> None:
        self.rule, self.exact, self.strict, self.path_of = rule, exact, strict, path_of
        self.acc: np.ndarray
        if rule == "sum":
            self.acc = np.zeros(n, dtype=np.uint64 if exact else np.float64)
        elif rule == "ior":
            self.acc = np.zeros(n, dtype=np.uint64)
        else:
            self.acc = np.full(n, self.BIG, dtype=np.uint64)

    def add(self, v: np.ndarray, f: float, sel: np.ndarray | None = None) -> None:
        """Fold in the values v of one input with factor f, at the counters sel (bool mask; None: all)."""
        if not f:
            return
        acc = self.acc if sel is None else self.acc[sel]
        if self.rule == "sum":
            if self.exact:
                if self.strict:
                    # acc stays <= GCOV_MAX, so GCOV_MAX - acc cannot wrap.
                    over = v > (np.uint64(GCOV_MAX) - acc) // np.uint64(int(f))
                    if over.any():
                        k = int(np.argmax(over))
                        raise _overflow_error(self.path_of(k if sel is None else int(np.flatnonzero(sel)[k])))
                acc += v * np.uint64(int(f))
            else:
                acc += v.astype(np.float64) * f
        elif self.rule == "ior":
            acc |= v
        else:
            np.minimum(acc, np.where(v == 0, self.BIG, v), out=acc)
        if sel is not None:
            self.acc[sel] = acc

    def result(self) -> np.ndarray:
        if self.rule == "sum" and not self.exact:
            if self.strict and (over := self.acc >= 2.0**63).any():  # 2^63: the first float above GCOV_MAX
                raise _overflow_error(self.path_of(int(np.argmax(over))))
            return _round_u64(self.acc)
        if self.rule == "min_nonzero":
            return np.where(self.acc == self.BIG, np.uint64(0), self.acc)
        return self.acc


# -- whole-profile merge ---------------------------------------------------------------------------------------
#
# The first input is read and indexed as one image (kpgo.gcov.gcda.index_image); it is the template: the output is
# its bytes with the merged counters written in place. Every other input is read as one image and matched to it file
# by file with one vectorized comparison (same size, same header, record headers and function records); its counters
# are then gathered from the same positions and folded into one accumulator per merge rule. Memory: the template, the
# accumulators and the one input being read - not the number of inputs times the profile.
#
# A file that does not take this path (not in the first input, fails the whole-profile check, differs in layout
# in some input, carries counters that cannot be merged, or a case where the per-file integer/float choice of
# the sum could differ) is merged on its own by the per-file code below, which reads it from every input, parses
# it and reports any problem with a one-line error naming the file.


def _merge_one(rel: str, dirs: list[Path], present: list[set[str]], factors: list[float], strict: bool = False
               ) -> tuple[Gcda, int, list[tuple[int, int]]]:
    """Merge one file across the inputs holding it (full parse). Returns the output model (without the summary),
    its largest merged arc counter and (input, arc total) per input."""
    raw: list[tuple[int, bytes]] = []
    for i, d in enumerate(dirs):
        if rel in present[i]:
            raw.append((i, read_file(os.path.join(d, rel))))
    t_idx, t_data = raw[0]
    t_path = os.path.join(dirs[t_idx], rel)
    template = parse_gcda(t_data, t_path)
    kinds = sorted(template.counter_kinds_present())
    rules = []
    for kind in kinds:
        rule = rule_of(template.layout, kind)
        if rule is None:
            raise UserError(
                f"{t_path}: cannot merge '{template.layout.kind_name(kind)}' counters",
                "value profiles (-fprofile-generate) are not supported; kpgo merges -fprofile-arcs profiles",
            )
        rules.append(rule)
    per_kind: list[list[np.ndarray]] = [[template.counters(k)] for k in kinds]
    for i, data in raw[1:]:
        g = parse_gcda(data, os.path.join(dirs[i], rel))
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
    exact = all(float(f).is_integer() for f in fac)
    arc_totals: list[tuple[int, int]] = []
    top = 0
    for kind, rule, arrays in zip(kinds, rules, per_kind):
        if kind == ARCS:
            arc_totals = [(i, int(v.sum(dtype=np.uint64)) if len(v) else 0) for (i, _), v in zip(raw, arrays)]
        acc = Accumulator(rule, len(arrays[0]), exact, strict, lambda _: t_path)
        for v, f in zip(arrays, fac):
            acc.add(v, f)
        values = acc.result()
        if kind == ARCS and len(values):
            top = int(values.max())
        out = out.with_counters(kind, values)
    return out, top, arc_totals


@dataclass(eq=False)
class _Group:
    """The counter slots of one merge rule in the template's fast files (lo: their low words, fid: their files),
    and their accumulator."""

    arcs: bool
    lo: np.ndarray
    fid: np.ndarray
    acc: Accumulator


def _groups(t: Index, slow: np.ndarray, exact: bool, strict: bool = False) -> list[_Group]:
    """Slots by merge rule; files with counters that cannot be merged are marked slow (the per-file merge then
    names them)."""
    ver = t.version[t.rec_fid]
    by_rule: dict[str, np.ndarray] = {}
    for tag in KNOWN_TAGS.tolist():
        kind = counter_kind(tag)
        if kind is None:
            continue
        is_tag = t.rec_tag == tag
        if not is_tag.any():
            continue
        for version, layout in t.layouts.items():
            recs = is_tag & (ver == version) if len(t.layouts) > 1 else is_tag
            if not recs.any():
                continue
            rule = rule_of(layout, kind)
            if rule is None:
                slow[t.rec_fid[recs]] = True
                continue
            name = "arcs" if tag == ARCS_TAG else rule
            by_rule[name] = by_rule[name] | recs if name in by_rule else recs
    groups = []
    paths = [t.image.path(k) for k in range(t.n)]
    for name in ("arcs", "sum", "ior", "min_nonzero"):
        if name in by_rule:
            lo, fid = t.counter_slots(by_rule[name])

            def path_of(slot: int, fid: np.ndarray = fid) -> str:
                return paths[int(fid[slot])]

            acc = Accumulator("sum" if name == "arcs" else name, len(lo), exact, strict, path_of)
            groups.append(_Group(name == "arcs", lo, fid, acc))
    return groups


def _match(t: Index, spos: np.ndarray, sfid: np.ndarray, usable: np.ndarray, img: Image
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which template files `img` holds (present), which of them share the template's layout (ok), and the word
    offset from the template file to img's copy (off)."""
    where = img.index_of()
    j = np.fromiter((where.get(r, -1) for r in t.image.rels), dtype=np.int64, count=t.n)
    present = j >= 0
    jj = np.where(present, j, 0)
    ok = present & usable & (img.size[jj] == t.image.size)
    off = img.wstart[jj] - t.image.wstart[:-1]
    sel = ok[sfid]
    if sel.all():
        pos, fid = spos, sfid
    else:
        pos, fid = spos[sel], sfid[sel]
    bad = fid[img.words[pos + off[fid]] != t.image.words[pos]]
    ok[bad] = False
    return present, ok, off


def merge_profiles(
    dirs: list[Path], dst: Path, weights: list[float] | None = None, normalize: bool = False, runs: int | None = None,
    strict: bool = False,
) -> dict[str, Any]:
    """Merge profiles of the same build into dst (atomic). Returns stats: files, inputs, weights, scales, factors,
    totals, runs, sum_max, missing (files absent per input). With strict (`kpgo profile merge`), a merged counter
    past 2^63-1 (GCC reads counters as signed) is an error naming the file; without, sums wrap (integer factors) or
    saturate (fractional ones) as libgcov's would."""
    dirs = [Path(d) for d in dirs]
    dst = Path(dst)
    if not dirs:
        raise UserError("no profiles to merge", "give one or more profile directories")
    weights = weights if weights is not None else [1.0] * len(dirs)
    if len(weights) != len(dirs):
        raise UserError(f"{len(weights)} weights for {len(dirs)} profiles", "give one weight per input")
    check_output(dst, inputs=dirs)
    lists = [_rels_or_fail(d) for d in dirs]
    present = [set(ls) for ls in lists]
    rels = sorted(set().union(*present))

    t = index_image(read_image(dirs[0], lists[0]))
    if normalize:
        totals = []
        for i, d in enumerate(dirs):
            idx = t if i == 0 else index_image(read_image(d, lists[i]))
            totals.append(_arc_total(idx))
            del idx
        for d, tot in zip(dirs, totals):
            if tot == 0:
                raise UserError(f"{d}: the profile has no counts, cannot --normalize it", "drop it or give weight 0")
        target = max(totals)
        scales = [target / tot for tot in totals]
    else:
        scales = [1.0] * len(dirs)
    factors = [w * s for w, s in zip(weights, scales)]
    exact = all(float(f).is_integer() for f in factors)

    slow = ~t.fast  # per template file: merged on its own
    if not exact:  # a file some fractional input lacks might be merged exactly per file: leave it to that code
        for i, f in enumerate(factors):
            if not float(f).is_integer():
                slow |= np.fromiter((r not in present[i] for r in t.image.rels), dtype=bool, count=t.n)
    groups = _groups(t, slow, exact, strict)
    spos, sfid = t.structure_positions()
    arc_sums: list[tuple[np.ndarray, np.ndarray]] = []  # per input: (files, arc total of each) over matched files
    first_bytes: list[bytes | None] = []
    for i, d in enumerate(dirs):
        if i == 0:
            img = t.image
            ok = ~slow
            off = np.zeros(t.n, dtype=np.int64)
        else:
            img = read_image(d, lists[i])
            held, ok, off = _match(t, spos, sfid, ~slow, img)
            slow |= held & ~ok
        first_bytes.append(img.file_bytes(0) if img.rels else None)
        files, sums = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint64)
        for g in groups:
            sel = ok[g.fid]
            if sel.all():
                sel_ = None
                v = counter_values(img.words, g.lo + off[g.fid])
                fid = g.fid
            else:
                sel_ = sel
                fid = g.fid[sel]
                v = counter_values(img.words, g.lo[sel] + off[fid])
            g.acc.add(v, factors[i], sel_)
            if g.arcs and len(v):
                starts = np.flatnonzero(np.r_[True, fid[1:] != fid[:-1]])
                files, sums = fid[starts], np.add.reduceat(v, starts)
        arc_sums.append((files, sums))
        del img

    # Files left to the per-file merge: not in the first input, or marked above.
    where = t.image.index_of()
    slow_rels = [r for r in rels if r not in where or slow[where[r]]]
    merged: dict[str, Gcda] = {}
    out_totals = [0] * len(dirs)
    global_max = 0
    for rel in slow_rels:
        merged[rel], top, arc_totals = _merge_one(rel, dirs, present, factors, strict)
        global_max = max(global_max, top)
        for i, s in arc_totals:
            out_totals[i] += s
    for i, (files, sums) in enumerate(arc_sums):
        out_totals[i] += sum(sums[~slow[files]].tolist())
    firsts = [parse_gcda(b, os.path.join(d, ls[0])) if b is not None else None
              for d, ls, b in zip(dirs, lists, first_bytes)]

    out_words = t.image.words.copy()
    while groups:
        g = groups.pop(0)  # its accumulator is freed with it
        values = g.acc.result()
        if g.arcs:
            live = values[~slow[g.fid]]
            if len(live):
                global_max = max(global_max, int(live.max()))
        store_counters(out_words, g.lo, values)
        del g, values

    in_runs = [_input_runs(d, f) for d, f in zip(dirs, firsts)]
    total_runs = runs if runs is not None else sum(r for r, w in zip(in_runs, weights) if w)
    total_runs = max(1, min(total_runs, 0xFFFFFFFF))
    sum_max = min(global_max, 0xFFFFFFFF)
    missing = {str(d): len(rels) - len(p) for d, p in zip(dirs, present) if len(p) < len(rels)}
    info = {
        "merged": {
            "inputs": [
                {"path": str(d), "weight": w, "scale": s, "factor": f, "total_arcs": tot, "runs": r,
                 "profile": read_profile_json(d)}
                for d, w, s, f, tot, r in zip(dirs, weights, scales, factors, out_totals, in_runs)
            ],
            "normalize": normalize,
            "runs": total_runs,
            "sum_max": sum_max,
            "max_counter": global_max,
            "files": len(rels),
            "missing": missing,
        }
    }
    buf = memoryview(out_words.view(np.uint8))  # type: ignore[arg-type]  # numpy declares __buffer__ only for Python >= 3.12
    writer = SummaryWriter(t, buf, total_runs, sum_max)

    def items() -> Iterator[tuple[str, Any]]:
        for rel in rels:
            m = merged.get(rel)
            yield rel, writer.pieces(where[rel]) if m is None else m.with_summary(total_runs, sum_max).to_bytes()

    with output_dir(dst) as tmp:
        write_tree(tmp, items())
        (tmp / PROFILE_JSON).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    buf.release()
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


def _arc_total(idx: Index) -> int:
    """Total arc count of a profile (fast files at once, the others one by one)."""
    lo, _ = idx.counter_slots(idx.rec_tag == ARCS_TAG)
    total = _exact_sum(counter_values(idx.image.words, lo))
    for k in idx.slow():
        v = idx.gcda(k).counters(ARCS)
        total += int(v.sum(dtype=np.uint64)) if len(v) else 0
    return total
