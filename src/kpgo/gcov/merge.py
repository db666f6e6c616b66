"""N-way weighted merge of profiles of one build (a "universal" profile), like `gcov-tool merge -w` for any number
of inputs, in one process or as a tree of partial merges (kpgo.cluster runs the steps below as Ray tasks).

API
    parse_weights(text, n) -> list[float]
    merge_profiles(dirs, dst, weights=None, normalize=False, runs=None, strict=False) -> dict
  the steps, for a tree of partial merges of the same plan (merge_profiles is all of them in one process):
    check_request(dirs, dst, weights) -> weights   refuse a bad request before any work
    input_totals(dirs) -> list[int]                 arc totals (for --normalize)
    make_plan(dirs, weights, normalize, runs, strict, totals) -> Plan
    Template.load(dir)                              the first input, every step's frame of reference
    fold_inputs(plan, lo, hi) -> Partial            inputs lo..hi-1 folded together
    combine(plan, partials) -> Partial              partials of disjoint inputs, in any grouping
    slow_files(template, partial) -> list[str]      files merged per file (then fold_files, combine_files)
    finish(plan, template, partial, files, dst)     write the output (atomic); merge_profiles' result

Counter kinds merge by their own rule (as libgcov merges them):
    arcs, interval, pow2, average     weighted sum, exact, rounded once to the nearest integer (see Arith)
    ior, conditions                   bitwise OR of the inputs with a non-zero weight
    time_profiler                     smallest non-zero value (first-execution order) of those inputs
    single, topn, indirect_call       refused: value profiles (-fprofile-generate), not what the kernel records
With normalize, input i is first scaled by max_j(T_j) / T_i, where T_i is its total arc count, so that every input
has the same total; then weights apply. Scaling up (never down) keeps small counts from rounding to zero.
Every rule is associative and commutative, and the sums are kept exactly, so any grouping of the inputs into
partial merges gives the same bytes as one merge of all of them.

How: the first input is read whole into one buffer and indexed at once (kpgo.gcov.gcda.index_image); the output is
its bytes with the merged counters written in place. Each other input is read whole, matched to it with one
vectorized comparison per profile, and its counters are folded into one accumulator per rule. Files that do not take
this path (see the comment above fold_files) are merged per file with a full parse, by the same accumulators.
Memory: the first input, the accumulators and the one input being read, whatever the number of inputs. With
--normalize the inputs are read twice (totals first).
"""


from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
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


# -- exact weighted sums ---------------------------------------------------------------------------------------

_MASK = np.uint64(0xFFFFFFFF)
_U64_MAX = np.uint64(np.iinfo(np.uint64).max)


@dataclass(frozen=True)
class Arith:
    """How the weighted sums of one merge are kept (chosen from all its factors, so every step of a tree agrees).

    frac_bits None (every factor an integer): uint64 sums, exact; past 2^64 they wrap, as libgcov's do.
    Otherwise: every factor is a binary fraction p / 2^k (a float is one), so Σ fᵢ·vᵢ is exactly A / 2^frac_bits
    for the integer A = Σ (fᵢ·2^frac_bits)·vᵢ. A is kept in `limbs` 32-bit digits, each in a uint64 lane so that
    carries can wait, and rounded once at the end to the nearest integer (ties to even). Integers add up the same
    in any order and grouping, which is what lets a tree of partial merges give the serial result bit for bit: a
    float64 sum rounds every partial sum, and its result depends on how the inputs were grouped."""

    frac_bits: int | None
    limbs: int = 0

    @staticmethod
    def of(factors: Sequence[float]) -> Arith:
        if all(float(f).is_integer() for f in factors):
            return Arith(None)
        ratios = [float(f).as_integer_ratio() for f in factors]
        bits = max(q.bit_length() - 1 for _, q in ratios)
        top = max(p << (bits - q.bit_length() + 1) for p, q in ratios)
        # A < (largest scaled factor) · 2^64 · (number of inputs); one digit more takes the last carry.
        width = top.bit_length() + 64 + len(factors).bit_length()
        return Arith(bits, -(-width // 32) + 1)

    def scaled(self, f: float) -> int:
        """f · 2^frac_bits, an exact integer."""
        assert self.frac_bits is not None
        p, q = float(f).as_integer_ratio()
        return p << (self.frac_bits - q.bit_length() + 1)


def _carry(acc: np.ndarray) -> None:
    """Propagate the carries of fixed-point digits (shape (limbs, n)) so that each is below 2^32."""
    for k in range(len(acc) - 1):
        acc[k + 1] += acc[k] >> np.uint64(32)
        acc[k] &= _MASK


def _bits(acc: np.ndarray, lo: int) -> np.ndarray:
    """Bits lo..lo+63 of carried digits as uint64 (the bits above are dropped: see _any_bits)."""
    k, s = divmod(lo, 32)
    out = np.zeros(acc.shape[1], dtype=np.uint64)
    for d in range(3):
        shift = 32 * d - s
        if k + d >= len(acc) or shift >= 64:
            break
        part = acc[k + d]
        out |= part << np.uint64(shift) if shift >= 0 else part >> np.uint64(-shift)
    return out


def _any_bits(acc: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Whether any of bits lo..hi-1 of carried digits is set."""
    out = np.zeros(acc.shape[1], dtype=bool)
    for k in range(lo // 32, min(len(acc), -(-hi // 32))):
        a, b = max(lo - 32 * k, 0), min(hi - 32 * k, 32)
        out |= (acc[k] & np.uint64(((1 << b) - 1) ^ ((1 << a) - 1))) != 0
    return out


def _round_fixed(acc: np.ndarray, frac_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """A / 2^frac_bits rounded to the nearest integer, ties to even, and where that is 2^64 or more."""
    _carry(acc)
    q = _bits(acc, frac_bits)
    over = _any_bits(acc, frac_bits + 64, 32 * len(acc))
    half = _any_bits(acc, frac_bits - 1, frac_bits)
    up = half & (_any_bits(acc, 0, frac_bits - 1) | ((q & np.uint64(1)) == 1))
    over |= up & (q == _U64_MAX)
    return q + up.astype(np.uint64), over


class Accumulator:
    """The merge rules: n counters of one rule folded over the inputs, add() by add(), as libgcov merges them.

    sum: weighted sum, kept as Arith says; ior: bitwise OR; min_nonzero: the smallest non-zero value (0 means "not
    run": the earliest first-execution order among the runs that saw it). An input of factor 0 does not take part.
    strict: a sum past GCOV_MAX is an error naming the file of that counter, path_of(counter) (uint64 arithmetic
    would wrap around silently). state() is what a partial merge hands on; merge(state) folds one in."""

    BIG = _U64_MAX

    def __init__(self, rule: str, n: int, arith: Arith, strict: bool, path_of: Callable[[int], str]) -> None:
        self.rule, self.arith, self.strict, self.path_of = rule, arith, strict, path_of
        self.fixed = rule == "sum" and arith.frac_bits is not None
        self.pending = 0  # additions since the carries were propagated (fixed point)
        self.acc: np.ndarray
        if self.fixed:
            self.acc = np.zeros((arith.limbs, n), dtype=np.uint64)
        elif rule in ("sum", "ior"):
            self.acc = np.zeros(n, dtype=np.uint64)
        else:
            self.acc = np.full(n, self.BIG, dtype=np.uint64)

    def add(self, v: np.ndarray, f: float, sel: np.ndarray | None = None) -> None:
        """Fold in the values v of one input with factor f, at the counters sel (bool mask; None: all)."""
        if not f:
            return
        if self.fixed:
            self._add_fixed(v, self.arith.scaled(f), sel)
            return
        acc = self.acc if sel is None else self.acc[sel]
        if self.rule == "sum":
            if self.strict:
                # acc stays <= GCOV_MAX, so GCOV_MAX - acc cannot wrap.
                over = v > (np.uint64(GCOV_MAX) - acc) // np.uint64(int(f))
                if over.any():
                    k = int(np.argmax(over))
                    raise _overflow_error(self.path_of(k if sel is None else int(np.flatnonzero(sel)[k])))
            acc += v * np.uint64(int(f))
        elif self.rule == "ior":
            acc |= v
        else:
            np.minimum(acc, np.where(v == 0, self.BIG, v), out=acc)
        if sel is not None:
            self.acc[sel] = acc

    def _add_fixed(self, v: np.ndarray, w: int, sel: np.ndarray | None) -> None:
        # w·v digit by digit: each product of a 32-bit digit of w and a 32-bit half of v fits in 64 bits; its two
        # halves go to two digits of A, so a digit grows by less than 2^34 per addition (carried every 2^28).
        acc = self.acc if sel is None else self.acc[:, sel]
        digits = []
        while w:
            digits.append(np.uint64(w & 0xFFFFFFFF))
            w >>= 32
        for a, h in enumerate((v & _MASK, v >> np.uint64(32))):
            if a and not h.any():
                continue  # counters below 2^32: almost all
            for j, d in enumerate(digits):
                if d:
                    p = h * d
                    acc[a + j] += p & _MASK
                    acc[a + j + 1] += p >> np.uint64(32)
        if sel is not None:
            self.acc[:, sel] = acc
        self.pending += 1
        if self.pending >= 1 << 28:
            _carry(self.acc)
            self.pending = 0

    def state(self) -> np.ndarray:
        """The accumulated state, as merge() takes it (the BIG marker of min_nonzero kept)."""
        if self.fixed and self.pending:
            _carry(self.acc)
            self.pending = 0
        return self.acc

    def merge(self, state: np.ndarray) -> None:
        """Fold in the state() of an accumulator of the same counters over other inputs."""
        if self.fixed:
            self.acc += state  # carried digits: one more addition below 2^34
            self.pending += 1
        elif self.rule == "sum":
            self.add(state, 1)
        elif self.rule == "ior":
            self.acc |= state
        else:
            np.minimum(self.acc, state, out=self.acc)

    def result(self) -> np.ndarray:
        if self.fixed:
            assert self.arith.frac_bits is not None
            values, over = _round_fixed(self.acc, self.arith.frac_bits)
            if self.strict and (bad := over | (values > np.uint64(GCOV_MAX))).any():
                raise _overflow_error(self.path_of(int(np.argmax(bad))))
            values[over] = _U64_MAX  # saturates, where libgcov's float would
            return values
        if self.rule == "min_nonzero":
            return np.where(self.acc == self.BIG, np.uint64(0), self.acc)
        return self.acc


# -- the plan: what every step of one merge shares -------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    dirs: list[str]  # where the steps read the inputs
    names: list[str]  # the inputs as the user gave them (str of the Path): profile.json names them so
    weights: list[float]
    scales: list[float]
    factors: list[float]  # weight · scale
    normalize: bool
    runs: int | None  # the output's runs (None: the sum of the inputs')
    strict: bool
    arith: Arith


def check_request(dirs: Sequence[Path], dst: Path, weights: list[float] | None) -> list[float]:
    """The weights as floats (default all 1), or a one-line error before any work."""
    if not dirs:
        raise UserError("no profiles to merge", "give one or more profile directories")
    weights = [float(w) for w in weights] if weights is not None else [1.0] * len(dirs)
    if len(weights) != len(dirs):
        raise UserError(f"{len(weights)} weights for {len(dirs)} profiles", "give one weight per input")
    check_output(dst, inputs=dirs)
    return weights


def input_totals(dirs: Sequence[str], template: Template | None = None) -> list[int]:
    """Total arc count of each input (the template's index reused for dirs[0] when given)."""
    totals = []
    for i, d in enumerate(dirs):
        idx = template.index if i == 0 and template is not None else index_image(read_image(d, _rels_or_fail(d)))
        totals.append(_arc_total(idx))
        del idx
    return totals


def make_plan(dirs: Sequence[Path | str], weights: list[float], normalize: bool, runs: int | None, strict: bool,
              totals: list[int] | None, names: Sequence[Path | str] | None = None) -> Plan:
    """The factors of the inputs (totals: input_totals, needed with normalize). names: the inputs as the user gave
    them, when dirs are other paths to them (absolute, for steps that run elsewhere)."""
    paths = [str(Path(d)) for d in dirs]
    shown = [str(Path(d)) for d in names] if names is not None else paths
    if normalize:
        assert totals is not None
        for d, tot in zip(shown, totals):
            if tot == 0:
                raise UserError(f"{d}: the profile has no counts, cannot --normalize it", "drop it or give weight 0")
        target = max(totals)
        scales = [target / tot for tot in totals]
    else:
        scales = [1.0] * len(paths)
    factors = [w * s for w, s in zip(weights, scales)]
    return Plan(paths, shown, list(weights), scales, factors, normalize, runs, strict, Arith.of(factors))


# -- whole-profile merge ---------------------------------------------------------------------------------------
#
# The first input is read and indexed as one image (kpgo.gcov.gcda.index_image); it is the template: the output is
# its bytes with the merged counters written in place. Every other input is read as one image and matched to it file
# by file with one vectorized comparison (same size, same header, record headers and function records); its counters
# are then gathered from the same positions and folded into one accumulator per merge rule. Memory: the template, the
# accumulators and the one input being read - not the number of inputs times the profile.


@dataclass(eq=False)
class _Group:
    """The counter slots of one merge rule in the template's fast files (lo: their low words, fid: their files),
    and their accumulator."""

    arcs: bool
    lo: np.ndarray
    fid: np.ndarray
    acc: Accumulator


def _slots(t: Index) -> tuple[list[tuple[str, np.ndarray, np.ndarray]], np.ndarray]:
    """The counter slots of the template's fast files by merge group (name, low words, files), and the files with
    counters that cannot be merged (left to the per-file merge, which names them)."""
    ver = t.version[t.rec_fid]
    unmergeable = np.zeros(t.n, dtype=bool)
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
                unmergeable[t.rec_fid[recs]] = True
                continue
            name = "arcs" if tag == ARCS_TAG else rule
            by_rule[name] = by_rule[name] | recs if name in by_rule else recs
    slots = []
    for name in ("arcs", "sum", "ior", "min_nonzero"):
        if name in by_rule:
            lo, fid = t.counter_slots(by_rule[name])
            slots.append((name, lo, fid))
    return slots, unmergeable


def _rule(group: str) -> str:
    return "sum" if group == "arcs" else group


@dataclass(eq=False)
class Template:
    """The first input, read and indexed: every step of a merge reads it, to place counters by its slots."""

    rels: list[str]
    index: Index
    slow: np.ndarray  # per file: merged per file whatever the other inputs hold (not in the kernel's shape, or
    #                   counters that cannot be merged)
    slots: list[tuple[str, np.ndarray, np.ndarray]]
    spos: np.ndarray
    sfid: np.ndarray

    @staticmethod
    def load(src: str) -> Template:
        rels = _rels_or_fail(src)
        t = index_image(read_image(src, rels))
        slots, unmergeable = _slots(t)
        spos, sfid = t.structure_positions()
        return Template(rels, t, ~t.fast | unmergeable, slots, spos, sfid)

    def path_of(self, group: int) -> Callable[[int], str]:
        """The file of a counter slot of one group (for errors)."""
        fid = self.slots[group][2]
        return lambda slot: self.index.image.path(int(fid[slot]))

    def groups(self, arith: Arith, strict: bool) -> list[_Group]:
        return [_Group(name == "arcs", lo, fid, Accumulator(_rule(name), len(lo), arith, strict, self.path_of(g)))
                for g, (name, lo, fid) in enumerate(self.slots)]


def _lazy_path(plan: Plan, group: int) -> Callable[[int], str]:
    """path_of for a step that does not hold the template: read only when an error must name a file."""
    return lambda slot: Template.load(plan.dirs[0]).path_of(group)(slot)


@dataclass
class InputInfo:
    """What the output's profile.json says of one input, gathered where the input is read."""

    index: int
    files: int
    extra: list[str]  # files not in the template
    unmatched: list[str]  # files the template's slots did not take (merged per file; counted there)
    total: int  # arc total over the other files
    runs: int
    profile: dict[str, Any]


@dataclass(eq=False)
class Partial:
    """Some inputs of one plan folded together: the state of each group's accumulator, the template files that must
    be merged per file, and the inputs' InputInfo. Partials of disjoint inputs combine in any grouping."""

    rules: list[str]
    sums: list[np.ndarray]
    slow: np.ndarray
    inputs: list[InputInfo]


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


def fold_inputs(plan: Plan, lo: int, hi: int, template: Template | None = None) -> Partial:
    """Inputs lo..hi-1 folded into the template's slots (the template is read unless given). A file that some input
    holds in another layout is marked slow: its counters here are then ignored and fold_files merges it."""
    tpl = template or Template.load(plan.dirs[0])
    t = tpl.index
    groups = tpl.groups(plan.arith, plan.strict)
    slow = tpl.slow.copy()
    usable = ~tpl.slow
    names = set(tpl.rels)
    infos = []
    for i in range(lo, hi):
        d = plan.dirs[i]
        if i == 0:
            img, rels = t.image, tpl.rels
            held, ok, off = np.ones(t.n, dtype=bool), usable, np.zeros(t.n, dtype=np.int64)
        else:
            rels = _rels_or_fail(d)
            img = read_image(d, rels)
            held, ok, off = _match(t, tpl.spos, tpl.sfid, usable, img)
            slow |= held & ~ok
        total = 0
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
            g.acc.add(v, plan.factors[i], sel_)
            if g.arcs and len(v):
                # Per file, as the per-file merge counts a file's arcs.
                starts = np.flatnonzero(np.r_[True, fid[1:] != fid[:-1]])
                total = sum(np.add.reduceat(v, starts).tolist())
        extra = [r for r in rels if r not in names]
        unmatched = [t.image.rels[k] for k in np.flatnonzero(held & ~ok).tolist()] + extra
        first = parse_gcda(img.file_bytes(0), os.path.join(d, rels[0]))
        infos.append(InputInfo(i, len(rels), extra, unmatched, total, _input_runs(Path(d), first),
                               read_profile_json(Path(d))))
        del img
    return Partial([g.acc.rule for g in groups], [g.acc.state() for g in groups], slow, infos)


def combine(plan: Plan, parts: Iterable[Partial]) -> Partial:
    """Partials of disjoint inputs folded into one, one at a time (memory: the result and one partial)."""
    accs: list[Accumulator] = []
    rules: list[str] = []
    slow = np.zeros(0, dtype=bool)
    inputs: list[InputInfo] = []
    for p in parts:
        if not accs:
            rules, slow = p.rules, p.slow.copy()
            accs = [Accumulator(r, s.shape[-1], plan.arith, plan.strict, _lazy_path(plan, g))
                    for g, (r, s) in enumerate(zip(p.rules, p.sums))]
        else:
            slow |= p.slow
        inputs += p.inputs
        for a, s in zip(accs, p.sums):
            a.merge(s)
    return Partial(rules, [a.state() for a in accs], slow, sorted(inputs, key=lambda i: i.index))


def slow_files(template: Template, part: Partial) -> list[str]:
    """The files fold_files merges: not in the template, or marked slow by some input."""
    where = template.index.image.index_of()
    rels = set(template.rels).union(*(i.extra for i in part.inputs))
    return sorted(r for r in rels if r not in where or part.slow[where[r]])


# -- per-file merge ---------------------------------------------------------------------------------------------
#
# A file that does not take the path above (not in the first input, fails the whole-profile check, differs in
# layout in some input, or carries counters that cannot be merged) is merged on its own: read from every input
# holding it, parsed, checked against the first input's copy (any problem is a one-line error naming the file),
# and folded by the same accumulators, one per counter kind.


@dataclass(eq=False)
class FilePart:
    """One file merged over some inputs: the copy of the first of them (the template of the output file), and the
    state of each counter kind's accumulator."""

    first: int
    model: Gcda
    kinds: list[int]
    sums: list[np.ndarray]


@dataclass(eq=False)
class Files:
    parts: dict[str, FilePart]
    totals: dict[int, int]  # input -> arc total of its unmatched files


def _same_build(rel: str, a: Gcda, da: str, b: Gcda, db: str) -> None:
    if b.stamp != a.stamp:
        raise UserError(f"{rel}: profiles from different builds (stamp {a.stamp:#x} in {da}, {b.stamp:#x} in {db})",
                        "merge only profiles collected from the same instrumented build")
    if b.version != a.version:
        raise UserError(f"{rel}: gcov versions differ ({a.version_text} in {da}, {b.version_text} in {db})",
                        "merge only profiles of one build")
    why = _same_structure(a, b)
    if why:
        raise UserError(f"{rel}: {why} in {da} and {db}", "merge only profiles collected from the same instrumented build")


def _file_accs(plan: Plan, rel: str, part: FilePart) -> list[Accumulator]:
    path = os.path.join(plan.dirs[part.first], rel)
    accs = []
    for kind in part.kinds:
        rule = rule_of(part.model.layout, kind)
        if rule is None:
            raise UserError(f"{path}: cannot merge '{part.model.layout.kind_name(kind)}' counters",
                            "value profiles (-fprofile-generate) are not supported; kpgo merges -fprofile-arcs profiles")
        accs.append(Accumulator(rule, part.model.counter_count(kind), plan.arith, plan.strict, lambda _: path))
    return accs


def fold_files(plan: Plan, rels: Sequence[str], lo: int, hi: int, unmatched: Sequence[Sequence[str]]) -> Files:
    """The files rels merged over inputs lo..hi-1; unmatched[i - lo]: input i's files whose arcs count here."""
    want = set(rels)
    parts: dict[str, FilePart] = {}
    accs: dict[str, list[Accumulator]] = {}
    totals: dict[int, int] = {}
    for i in range(lo, hi):
        d = plan.dirs[i]
        count = set(unmatched[i - lo])
        total = 0
        for rel in (r for r in _rels_or_fail(d) if r in want) if want else ():
            path = os.path.join(d, rel)
            g = parse_gcda(read_file(path), path)
            p = parts.get(rel)
            if p is None:
                parts[rel] = p = FilePart(i, g, sorted(g.counter_kinds_present()), [])
                accs[rel] = _file_accs(plan, rel, p)
            else:
                _same_build(rel, p.model, plan.dirs[p.first], g, d)
            for kind, acc in zip(p.kinds, accs[rel]):
                v = g.counters(kind)
                acc.add(v, plan.factors[i])
                if kind == ARCS and rel in count and len(v):
                    total += int(v.sum(dtype=np.uint64))
        totals[i] = total
    for rel, p in parts.items():
        p.sums = [a.state() for a in accs[rel]]
    return Files(parts, totals)


def combine_files(plan: Plan, parts: Iterable[Files]) -> Files:
    """Per-file merges of disjoint inputs folded into one; each file keeps the copy of its first input."""
    out: dict[str, FilePart] = {}
    accs: dict[str, list[Accumulator]] = {}
    totals: dict[int, int] = {}
    for f in parts:
        totals.update(f.totals)
        for rel, p in f.parts.items():
            have = out.get(rel)
            if have is None:
                out[rel] = have = FilePart(p.first, p.model, p.kinds, [])
                accs[rel] = _file_accs(plan, rel, have)
            else:
                a, b = (have, p) if have.first < p.first else (p, have)
                _same_build(rel, a.model, plan.dirs[a.first], b.model, plan.dirs[b.first])
                have.first, have.model = a.first, a.model
            for acc, s in zip(accs[rel], p.sums):
                acc.merge(s)
    for rel, p in out.items():
        p.sums = [a.state() for a in accs[rel]]
    return Files(out, totals)


def _file_output(plan: Plan, rel: str, part: FilePart) -> tuple[Gcda, int]:
    """The merged file (without its summary) and its largest arc counter."""
    out, top = part.model, 0
    for kind, acc, s in zip(part.kinds, _file_accs(plan, rel, part), part.sums):
        acc.merge(s)
        values = acc.result()
        if kind == ARCS and len(values):
            top = int(values.max())
        out = out.with_counters(kind, values)
    return out, top


# -- the output ---------------------------------------------------------------------------------------------------

def finish(plan: Plan, template: Template, part: Partial, files: Files, dst: Path) -> dict[str, Any]:
    """Write the merge of every input (part and files cover them all) to dst, atomically; the result of
    merge_profiles."""
    t = template.index
    infos = part.inputs
    assert [i.index for i in infos] == list(range(len(plan.dirs)))
    rels = sorted(set(template.rels).union(*(i.extra for i in infos)))
    merged: dict[str, Gcda] = {}
    global_max = 0
    for rel, fp in files.parts.items():
        merged[rel], top = _file_output(plan, rel, fp)
        global_max = max(global_max, top)
    out_totals = [i.total + files.totals.get(i.index, 0) for i in infos]

    out_words = t.image.words.copy()
    for g, ((name, lo, fid), rule, state) in enumerate(zip(template.slots, part.rules, part.sums)):
        acc = Accumulator(rule, len(lo), plan.arith, plan.strict, template.path_of(g))
        acc.merge(state)
        values = acc.result()
        del acc
        if name == "arcs":
            live = values[~part.slow[fid]]
            if len(live):
                global_max = max(global_max, int(live.max()))
        store_counters(out_words, lo, values)
        del values

    in_runs = [i.runs for i in infos]
    total_runs = plan.runs if plan.runs is not None else sum(r for r, w in zip(in_runs, plan.weights) if w)
    total_runs = max(1, min(total_runs, 0xFFFFFFFF))
    sum_max = min(global_max, 0xFFFFFFFF)
    missing = {d: len(rels) - i.files for d, i in zip(plan.names, infos) if i.files < len(rels)}
    info = {
        "merged": {
            "inputs": [
                {"path": d, "weight": w, "scale": s, "factor": f, "total_arcs": tot, "runs": r, "profile": i.profile}
                for d, w, s, f, tot, r, i in zip(plan.names, plan.weights, plan.scales, plan.factors, out_totals, in_runs, infos)
            ],
            "normalize": plan.normalize,
            "runs": total_runs,
            "sum_max": sum_max,
            "max_counter": global_max,
            "files": len(rels),
            "missing": missing,
        }
    }
    buf = memoryview(out_words.view(np.uint8))  # type: ignore[arg-type]  # numpy declares __buffer__ only for Python >= 3.12
    writer = SummaryWriter(t, buf, total_runs, sum_max)
    where = t.image.index_of()

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
        "inputs": list(plan.names),
        "weights": plan.weights,
        "scales": plan.scales,
        "factors": plan.factors,
        "totals": out_totals,
        "runs": total_runs,
        "sum_max": sum_max,
        "max_counter": global_max,
        "missing": missing,
    }


def merge_profiles(
    dirs: Sequence[Path | str], dst: Path, weights: list[float] | None = None, normalize: bool = False,
    runs: int | None = None, strict: bool = False,
) -> dict[str, Any]:
    """Merge profiles of the same build into dst (atomic), in this process. Returns stats: files, inputs, weights,
    scales, factors, totals, runs, sum_max, missing (files absent per input). With strict (`kpgo profile merge`), a
    merged counter past 2^63-1 (GCC reads counters as signed) is an error naming the file; without, sums wrap
    (integer factors) or saturate (fractional ones) as libgcov's would."""
    paths = [Path(d) for d in dirs]
    dst = Path(dst)
    weights = check_request(paths, dst, weights)
    template = Template.load(str(paths[0]))
    totals = input_totals([str(d) for d in paths], template) if normalize else None
    plan = make_plan(paths, weights, normalize, runs, strict, totals)
    part = fold_inputs(plan, 0, len(paths), template)
    rels = slow_files(template, part)
    files = fold_files(plan, rels, 0, len(paths), [i.unmatched for i in part.inputs])
    return finish(plan, template, part, files, dst)


def _arc_total(idx: Index) -> int:
    """Total arc count of a profile (fast files at once, the others one by one)."""
    lo, _ = idx.counter_slots(idx.rec_tag == ARCS_TAG)
    total = _exact_sum(counter_values(idx.image.words, lo))
    for k in idx.slow():
        v = idx.gcda(k).counters(ARCS)
        total += int(v.sum(dtype=np.uint64)) if len(v) else 0
    return total
