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

Counter kinds merge by their own rule (as libgcov merges them, gcov-counter.def):
    arcs, interval, pow2, average     weighted sum, exact, rounded once to the nearest integer (see Arith)
    ior, conditions                   bitwise OR of the inputs with a non-zero weight
    time_profiler                     smallest non-zero value (first-execution order) of those inputs
    topn, indirect_call (GCC >= 11)   top-N sites, libgcov's __gcov_merge_topn: totals and the counts of equal values
                                      summed (weighted, exact), values in order of first appearance, at most 32 a site
                                      (TopnAccumulator; docs/PROFILES.md "Value counters" for gcov-tool's own -w)
    single (GCC 9), topn and indirect_call of GCC 10: fixed-size value sites, refused with the file named
With normalize, input i is first scaled by max_j(T_j) / T_i, where T_i is its total arc count, so that every input
has the same total; then weights apply (to value counters as to arcs). Scaling up (never down) keeps small counts
from rounding to zero. Every rule is associative and commutative, and the sums are kept exactly, so any grouping of
the inputs into partial merges gives the same bytes as one merge of all of them.

How: the first input is read whole into one buffer and indexed at once (kpgo.gcov.gcda.index_image); the output is
its bytes with the merged counters written in place. Each other input is read whole, matched to it with one
vectorized comparison per profile, and its counters are folded into one accumulator per rule. Files with top-N sites
change size with their values: they are matched by record (the input is indexed too) and rebuilt around the merged
sites. Files that do not take this path (see the comment above fold_files) are merged per file with a full parse, by
the same accumulators.
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
    TOPN_MAX_VALUES,
    Gcda,
    Image,
    Index,
    Layout,
    SiteChain,
    Sites,
    SummaryWriter,
    _ranges,
    counter_kind,
    counter_tag,
    counter_values,
    index_image,
    parse_gcda,
    read_sites,
    store_counters,
    summary_record,
)
from kpgo.gcov.image import read_file, read_image
from kpgo.gcov.profile import GCOV_MAX, PROFILE_JSON, _exact_sum, _rels_or_fail, read_profile_json, write_tree

RULES = {
    "arcs": "sum", "interval": "sum", "pow2": "sum", "average": "sum",
    "ior": "ior", "conditions": "ior", "time_profiler": "min_nonzero",
}


def rule_of(layout: Layout, kind: int) -> str | None:
    """The merge rule of a counter kind in a layout: a RULES rule, "topn" for top-N sites (GCC >= 11), None for the
    value counters of GCC 9 and 10 (fixed-size "single" and top-N sites), which kpgo does not merge."""
    if kind in layout.topn_kinds:
        return "topn"
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
    """What must agree between inputs of one build: record tags (summary aside), counter counts per record (sites
    per record for top-N records, whose lengths vary with the values they hold), and the function records'
    identifiers and checksums."""
    lengths = g.lengths.astype(np.int64)
    negative = lengths >= 1 << 31
    units = np.where(negative, ((1 << 32) - lengths) // g.layout.unit, np.diff(g.offsets))
    for kind in g.layout.topn_kinds:
        sel = np.flatnonzero(g.tags == counter_tag(kind))
        if len(sel):
            units[sel] = g.sites(kind).per_record
    keep = g.tags != TAG_OBJECT_SUMMARY
    tags = g.tags[keep]
    units = units[keep]
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
            # limbs: for the digits of top-N counts (TopnAccumulator), which are kept as digits with any factor.
            width = max(int(f) for f in factors).bit_length() + 64 + len(factors).bit_length()
            return Arith(None, -(-width // 32) + 1)
        ratios = [float(f).as_integer_ratio() for f in factors]
        bits = max(q.bit_length() - 1 for _, q in ratios)
        top = max(p << (bits - q.bit_length() + 1) for p, q in ratios)
        # A < (largest scaled factor) · 2^64 · (number of inputs); one digit more takes the last carry.
        width = top.bit_length() + 64 + len(factors).bit_length()
        return Arith(bits, -(-width // 32) + 1)

    def scaled(self, f: float) -> int:
        """f · 2^frac_bits, an exact integer (f itself when every factor is an integer)."""
        if self.frac_bits is None:
            return int(f)
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


def _digits(v: np.ndarray, w: int, limbs: int) -> np.ndarray:
    """w·v (uint64 v, integer w >= 0) as `limbs` carried 32-bit digits in uint64 lanes, shape (limbs, len(v))."""
    out = np.zeros((limbs, len(v)), dtype=np.uint64)
    ws = []
    while w:
        ws.append(np.uint64(w & 0xFFFFFFFF))
        w >>= 32
    for a, h in enumerate((v & _MASK, v >> np.uint64(32))):
        for j, d in enumerate(ws):
            if d:
                p = h * d
                out[a + j] += p & _MASK
                out[a + j + 1] += p >> np.uint64(32)
    _carry(out)
    return out


class TopnAccumulator:
    """Top-N sites (topn and indirect_call, GCC >= 11) merged by libgcov's rule, __gcov_merge_topn: the totals of a
    site add up, and so do the counts of a value it holds in several inputs; a value new to the site is appended
    after those seen before. Weighted as the sums are: totals and counts times the factor, values and the number of
    pairs never (docs/PROFILES.md says what gcov-tool merge -w does instead). Exact, independent of how the inputs
    are grouped, and settled once, in result():

    - each (site, value) is one row holding its weighted count (digits, as Arith keeps sums, then rounded once) and
      an order key: the first input it came from and its place in that input's list (input·64 + place), which is
      GCC's order for a merge of the inputs one after the other;
    - a site left with more than TOPN_MAX_VALUES values keeps those with the largest counts (ties: the earlier) and
      its total turns negative, GCC's mark of a site that lost values; so does a site negative in any input (the
      magnitudes of the totals add up).

    GCC itself, once a site holds 32 values, evicts as it merges (the least frequent loses one; a new value takes its
    place when that leaves it rarer than the new one): the result depends on the order of the merges, and no rule
    can both equal it and be associative. Below that limit the result is GCC's, byte for byte.

    An input of factor 0 does not take part (its values are not added). state() is what a partial merge hands on;
    merge(state) folds one in."""

    def __init__(self, n: int, arith: Arith, strict: bool, path_of: Callable[[int], str]) -> None:
        self.n, self.arith, self.strict, self.path_of = n, arith, strict, path_of
        self.totals = Accumulator("sum", n, arith, strict, path_of)
        self.dropped = np.zeros(n, dtype=bool)
        self.sid = np.zeros(0, dtype=np.int64)
        self.value = np.zeros(0, dtype=np.uint64)
        self.key = np.zeros(0, dtype=np.int64)
        self.count = np.zeros((arith.limbs, 0), dtype=np.uint64)
        self.pending: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.waiting = 0  # rows in pending

    def add_sites(self, sids: np.ndarray, sites: Sites, f: float, index: int) -> None:
        """Fold in the sites of input `index` with factor f: sites' site i is this accumulator's site sids[i]
        (sids ascending)."""
        if not f or not len(sids):
            return
        mag, neg = sites.magnitude()
        sel = np.zeros(self.n, dtype=bool)
        sel[sids] = True
        self.totals.add(mag, f, sel)
        self.dropped[sids[neg]] = True
        if len(sites.values):
            n = sites.n
            place = np.arange(len(sites.values), dtype=np.int64) - np.repeat(sites.first[:-1], n)
            self._pend(np.repeat(sids, n), sites.values, index * 64 + place,
                       _digits(sites.counts, self.arith.scaled(f), self.arith.limbs))

    def _pend(self, sid: np.ndarray, value: np.ndarray, key: np.ndarray, count: np.ndarray) -> None:
        self.pending.append((sid, value, key, count))
        self.waiting += len(sid)
        if self.waiting > max(len(self.sid), 1 << 16):
            self._reduce()

    def _reduce(self) -> None:
        """Rows of one (site, value) folded into one: counts summed, the smallest key kept."""
        if not self.pending:
            return
        parts = [(self.sid, self.value, self.key, self.count), *self.pending]
        self.pending, self.waiting = [], 0
        sid = np.concatenate([p[0] for p in parts])
        value = np.concatenate([p[1] for p in parts])
        key = np.concatenate([p[2] for p in parts])
        count = np.concatenate([p[3] for p in parts], axis=1)
        order = np.lexsort((key, value, sid))
        sid, value, key, count = sid[order], value[order], key[order], count[:, order]
        starts = np.flatnonzero(np.r_[True, (sid[1:] != sid[:-1]) | (value[1:] != value[:-1])])
        if len(starts) < len(sid):
            count = np.add.reduceat(count, starts, axis=1)
            _carry(count)
            sid, value, key = sid[starts], value[starts], key[starts]
        self.sid, self.value, self.key, self.count = sid, value, key, count

    def state(self) -> tuple[np.ndarray, ...]:
        self._reduce()
        return self.totals.state(), self.dropped, self.sid, self.value, self.key, self.count

    def merge(self, state: tuple[np.ndarray, ...]) -> None:
        totals, dropped, sid, value, key, count = state
        self.totals.merge(totals)
        self.dropped |= dropped
        if len(sid):
            self._pend(sid, value, key, count)

    def result(self, per_record: np.ndarray | None = None) -> Sites:
        """The merged sites (per_record: how the sites fall into records, for Gcda.with_sites)."""
        self._reduce()
        mag = self.totals.result()
        count = self.count.copy()
        if self.arith.frac_bits is None:
            _carry(count)
            q, over = _bits(count, 0), _any_bits(count, 64, 32 * len(count))
        else:
            q, over = _round_fixed(count, self.arith.frac_bits)
        if self.strict and (bad := over | (q > np.uint64(GCOV_MAX))).any():
            raise _overflow_error(self.path_of(int(self.sid[int(np.argmax(bad))])))
        if self.arith.frac_bits is not None:
            q[over] = _U64_MAX  # saturates, as the sums do (integer factors wrap, as libgcov's would)
        sid, key = self.sid, self.key
        # At most TOPN_MAX_VALUES a site: the largest counts, then the earlier; then in order of first appearance.
        by_rank = np.lexsort((key, ~q, sid))
        s = sid[by_rank]
        starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]]) if len(s) else np.zeros(0, dtype=np.int64)
        rank = np.arange(len(s)) - np.repeat(starts, np.diff(np.r_[starts, len(s)]))
        kept = by_rank[rank < TOPN_MAX_VALUES]
        kept = kept[np.lexsort((key[kept], sid[kept]))]
        neg = self.dropped | (np.bincount(sid, minlength=self.n) > TOPN_MAX_VALUES)
        first = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(np.bincount(sid[kept], minlength=self.n), out=first[1:])
        return Sites(total=np.where(neg, ~mag + np.uint64(1), mag), first=first, values=self.value[kept], counts=q[kept],
                     per_record=np.zeros(0, dtype=np.int64) if per_record is None else per_record)

    def dropped_sites(self) -> int:
        """Sites whose total is negative in the result (values lost, here or before)."""
        self._reduce()
        return int((self.dropped | (np.bincount(self.sid, minlength=self.n) > TOPN_MAX_VALUES)).sum())


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
#
# Files with top-N sites (value profiles, GCC >= 11) change size with the values they hold, so they are matched by
# record instead: the other input is indexed too, and a file matches when it has the same header, the same records
# (tags, lengths of the other records, function records) and as many sites in each top-N record. Its plain counters
# are then gathered from its own record positions into the same accumulators, and its sites into one
# TopnAccumulator over all sites of the template; the output file is rebuilt around the merged sites.


@dataclass(eq=False)
class _Group:
    """The counter slots of one merge rule in the template's fast files (lo: their low words, fid: their files),
    and their accumulator. vslot: the slots in files with top-N sites, found in an input by their record vrec (its
    position in the template plus vdelta)."""

    arcs: bool
    lo: np.ndarray
    fid: np.ndarray
    acc: Accumulator
    vslot: np.ndarray
    vrec: np.ndarray
    vdelta: np.ndarray


def _slots(t: Index) -> tuple[list[tuple[str, np.ndarray, np.ndarray]], np.ndarray, np.ndarray]:
    """The counter slots of the template's fast files by merge group (name, low words, files), the files with
    counters that cannot be merged (left to the per-file merge, which names them), and the top-N records."""
    ver = t.version[t.rec_fid]
    unmergeable = np.zeros(t.n, dtype=bool)
    topn = np.zeros(len(t.rec_tag), dtype=bool)
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
            if rule == "topn":
                topn |= recs
                continue
            name = "arcs" if tag == ARCS_TAG else rule
            by_rule[name] = by_rule[name] | recs if name in by_rule else recs
    slots = []
    for name in ("arcs", "sum", "ior", "min_nonzero"):
        if name in by_rule:
            lo, fid = t.counter_slots(by_rule[name])
            slots.append((name, lo, fid))
    return slots, unmergeable, topn


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
    topn: np.ndarray  # per record: a top-N record (GCC >= 11)
    vfile: np.ndarray  # per file: holds top-N sites (and is not slow): matched by record
    site_rec: np.ndarray  # the record of each top-N site of the vfiles (the TopnAccumulator's sites, in order)
    site_pos: np.ndarray  # and where it starts, and its number of values
    site_n: np.ndarray
    rec_site: np.ndarray  # per record: its first site (index into site_rec)

    @staticmethod
    def load(src: str) -> Template:
        rels = _rels_or_fail(src)
        t = index_image(read_image(src, rels))
        slots, unmergeable, topn = _slots(t)
        spos, sfid = t.structure_positions()
        slow = ~t.fast | unmergeable
        vsite = np.flatnonzero(~slow[t.rec_fid[t.site_rec]])
        site_rec = t.site_rec[vsite]
        vfile = np.zeros(t.n, dtype=bool)
        vfile[t.rec_fid[site_rec]] = True
        rec_site = np.searchsorted(site_rec, np.arange(len(t.rec_pos))) if len(site_rec) else np.zeros(0, dtype=np.int64)
        return Template(rels, t, slow, slots, spos, sfid, topn, vfile, site_rec, t.site_pos[vsite], t.site_n[vsite],
                        rec_site)

    def path_of(self, group: int) -> Callable[[int], str]:
        """The file of a counter slot of one group (for errors)."""
        fid = self.slots[group][2]
        return lambda slot: self.index.image.path(int(fid[slot]))

    def site_path(self, site: int) -> str:
        return self.index.image.path(int(self.index.rec_fid[self.site_rec[site]]))

    def groups(self, arith: Arith, strict: bool) -> list[_Group]:
        out = []
        t = self.index
        for g, (name, lo, fid) in enumerate(self.slots):
            vslot = np.flatnonzero(self.vfile[fid]) if self.vfile.any() else np.zeros(0, dtype=np.int64)
            vrec = np.searchsorted(t.rec_pos, lo[vslot], side="right") - 1
            out.append(_Group(name == "arcs", lo, fid, Accumulator(_rule(name), len(lo), arith, strict, self.path_of(g)),
                              vslot, vrec, lo[vslot] - t.rec_pos[vrec]))
        return out

    def topn_acc(self, arith: Arith, strict: bool) -> TopnAccumulator:
        return TopnAccumulator(len(self.site_rec), arith, strict, self.site_path)


def _lazy_path(plan: Plan, group: int) -> Callable[[int], str]:
    """path_of for a step that does not hold the template: read only when an error must name a file."""
    return lambda slot: Template.load(plan.dirs[0]).path_of(group)(slot)


def _lazy_site_path(plan: Plan) -> Callable[[int], str]:
    return lambda site: Template.load(plan.dirs[0]).site_path(site)


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
    """Some inputs of one plan folded together: the state of each group's accumulator and of the top-N sites'
    accumulator, the template files that must be merged per file, and the inputs' InputInfo. Partials of disjoint
    inputs combine in any grouping."""

    rules: list[str]
    sums: list[np.ndarray]
    slow: np.ndarray
    inputs: list[InputInfo]
    topn: tuple[np.ndarray, ...] | None = None


def _match(t: Index, spos: np.ndarray, sfid: np.ndarray, usable: np.ndarray, img: Image
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Which template files `img` holds (present), which of them share the template's layout (ok), the word
    offset from the template file to img's copy (off), and img's file of each template file (-1: none)."""
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
    return present, ok, off, j


def _match_values(tpl: Template, x: Index, j: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which of the template's files with top-N sites the indexed input x holds in the same shape: its copy (j) is on
    the fast path, with the same header words, the same number of records, the same tags, the same lengths but for
    the top-N records, the same function records and as many sites in each top-N record. Returns that (per template
    file) and, per template record, x's record (-1 where the file does not match)."""
    t = tpl.index
    rec_map = np.full(len(t.rec_pos), -1, dtype=np.int64)
    ok = np.zeros(t.n, dtype=bool)
    files = np.flatnonzero(tpl.vfile & (j >= 0))
    jj = j[files]
    count = np.diff(t.rec_first)[files]
    keep = x.fast[jj] & (np.diff(x.rec_first)[jj] == count)
    for w in range(3):  # magic, version, stamp
        keep &= x.image.words[x.image.wstart[jj] + w] == t.image.words[t.image.wstart[files] + w]
    files, jj, count = files[keep], jj[keep], count[keep]
    trec = _ranges(t.rec_first[files], count)
    xrec = _ranges(x.rec_first[jj], count)
    rfile = np.repeat(np.arange(len(files)), count)
    bad = t.rec_tag[trec] != x.rec_tag[xrec]
    topn = tpl.topn[trec]
    bad |= ~topn & (t.rec_len[trec] != x.rec_len[xrec])
    tsites = np.bincount(t.site_rec, minlength=len(t.rec_pos))
    xsites = np.bincount(x.site_rec, minlength=len(x.rec_pos))
    bad |= topn & (tsites[trec] != xsites[xrec])
    func = np.flatnonzero((t.rec_tag[trec] == TAG_FUNCTION) & ~bad)
    flen = t.rec_len[trec[func]]
    tpos = _ranges(t.rec_pos[trec[func]] + 2, flen)
    xpos = _ranges(x.rec_pos[xrec[func]] + 2, flen)
    fbad = np.repeat(func, flen)[t.image.words[tpos] != x.image.words[xpos]]
    bad[fbad] = True
    good = np.ones(len(files), dtype=bool)
    good[rfile[bad]] = False
    ok[files[good]] = True
    take = good[rfile]
    rec_map[trec[take]] = xrec[take]
    return ok, rec_map


def _input_sites(tpl: Template, x: Index, vok: np.ndarray, rec_map: np.ndarray) -> tuple[np.ndarray, Sites]:
    """The sites of the matched files of input x, as the template's sites sids."""
    t = tpl.index
    sids = np.flatnonzero(vok[t.rec_fid[tpl.site_rec]])
    trec = tpl.site_rec[sids]
    xrec = rec_map[trec]
    xsite = np.searchsorted(x.site_rec, xrec) + (sids - tpl.rec_site[trec])
    chain = SiteChain(x.site_pos[xsite], np.zeros(len(xsite), dtype=np.int64), x.site_n[xsite], {})
    return sids, read_sites(x.image.words, chain, 0)


def fold_inputs(plan: Plan, lo: int, hi: int, template: Template | None = None) -> Partial:
    """Inputs lo..hi-1 folded into the template's slots (the template is read unless given). A file that some input
    holds in another layout is marked slow: its counters here are then ignored and fold_files merges it."""
    tpl = template or Template.load(plan.dirs[0])
    t = tpl.index
    groups = tpl.groups(plan.arith, plan.strict)
    topn = tpl.topn_acc(plan.arith, plan.strict) if len(tpl.site_rec) else None
    slow = tpl.slow.copy()
    usable = ~tpl.slow
    values = bool(tpl.vfile.any())
    names = set(tpl.rels)
    infos = []
    for i in range(lo, hi):
        d = plan.dirs[i]
        rec_map = None
        rec_pos = np.zeros(0, dtype=np.int64)
        if i == 0:
            img, rels = t.image, tpl.rels
            held, ok, off = np.ones(t.n, dtype=bool), usable, np.zeros(t.n, dtype=np.int64)
            if topn is not None:
                sids = np.arange(len(tpl.site_rec))
                chain = SiteChain(tpl.site_pos, sids, tpl.site_n, {})
                topn.add_sites(sids, read_sites(t.image.words, chain, 0), plan.factors[i], i)
        else:
            rels = _rels_or_fail(d)
            img = read_image(d, rels)
            held, ok, off, j = _match(t, tpl.spos, tpl.sfid, usable & ~tpl.vfile, img)
            if values:
                x = index_image(img)
                vok, rec_map = _match_values(tpl, x, j)
                ok |= vok
                if topn is not None:
                    sids, sites = _input_sites(tpl, x, vok, rec_map)
                    topn.add_sites(sids, sites, plan.factors[i], i)
                rec_pos = x.rec_pos
                del x
            slow |= held & ~ok
        total = 0
        for g in groups:
            sel = ok[g.fid]
            if rec_map is not None and len(g.vslot) and len(rec_pos):
                pos = g.lo + off[g.fid]
                pos[g.vslot] = rec_pos[np.maximum(rec_map[g.vrec], 0)] + g.vdelta
            else:
                pos = None
            if sel.all():
                sel_ = None
                v = counter_values(img.words, g.lo + off[g.fid] if pos is None else pos)
                fid = g.fid
            else:
                sel_ = sel
                fid = g.fid[sel]
                v = counter_values(img.words, g.lo[sel] + off[fid] if pos is None else pos[sel])
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
    return Partial([g.acc.rule for g in groups], [g.acc.state() for g in groups], slow, infos,
                   topn.state() if topn is not None else None)


def combine(plan: Plan, parts: Iterable[Partial]) -> Partial:
    """Partials of disjoint inputs folded into one, one at a time (memory: the result and one partial)."""
    accs: list[Accumulator] = []
    topn: TopnAccumulator | None = None
    rules: list[str] = []
    slow = np.zeros(0, dtype=bool)
    inputs: list[InputInfo] = []
    first = True
    for p in parts:
        if first:
            first = False
            rules, slow = p.rules, p.slow.copy()
            accs = [Accumulator(r, s.shape[-1], plan.arith, plan.strict, _lazy_path(plan, g))
                    for g, (r, s) in enumerate(zip(p.rules, p.sums))]
            if p.topn is not None:
                topn = TopnAccumulator(len(p.topn[1]), plan.arith, plan.strict, _lazy_site_path(plan))
        else:
            slow |= p.slow
        inputs += p.inputs
        for a, s in zip(accs, p.sums):
            a.merge(s)
        if topn is not None and p.topn is not None:
            topn.merge(p.topn)
    return Partial(rules, [a.state() for a in accs], slow, sorted(inputs, key=lambda i: i.index),
                   topn.state() if topn is not None else None)


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
    sums: list[Any]  # each kind's accumulator state (an array; a tuple for top-N sites)


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


def _file_accs(plan: Plan, rel: str, part: FilePart) -> list[Accumulator | TopnAccumulator]:
    path = os.path.join(plan.dirs[part.first], rel)
    accs: list[Accumulator | TopnAccumulator] = []
    for kind in part.kinds:
        rule = rule_of(part.model.layout, kind)
        if rule is None:
            raise UserError(f"{path}: cannot merge '{part.model.layout.kind_name(kind)}' counters of GCC "
                            f"{part.model.layout.major} (fixed-size value sites)",
                            "kpgo merges the value profiles of GCC 11 and later (top-N sites), and arc profiles of any GCC")
        if rule == "topn":
            accs.append(TopnAccumulator(len(part.model.sites(kind)), plan.arith, plan.strict, lambda _: path))
        else:
            accs.append(Accumulator(rule, part.model.counter_count(kind), plan.arith, plan.strict, lambda _: path))
    return accs


def fold_files(plan: Plan, rels: Sequence[str], lo: int, hi: int, unmatched: Sequence[Sequence[str]]) -> Files:
    """The files rels merged over inputs lo..hi-1; unmatched[i - lo]: input i's files whose arcs count here."""
    want = set(rels)
    parts: dict[str, FilePart] = {}
    accs: dict[str, list[Accumulator | TopnAccumulator]] = {}
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
                if isinstance(acc, TopnAccumulator):
                    sites = g.sites(kind)
                    acc.add_sites(np.arange(len(sites)), sites, plan.factors[i], i)
                    continue
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
    accs: dict[str, list[Accumulator | TopnAccumulator]] = {}
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
        if isinstance(acc, TopnAccumulator):
            out = out.with_sites(kind, acc.result(part.model.sites(kind).per_record))
            continue
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
    value_sites = [0, 0]  # top-N sites in the output, and those with a negative total (values lost)
    for rel, fp in files.parts.items():
        for kind in fp.kinds:
            if fp.model.is_topn(kind):
                _, neg = merged[rel].sites(kind).magnitude()
                value_sites[0] += len(neg)
                value_sites[1] += int(neg.sum())

    in_runs = [i.runs for i in infos]
    total_runs = plan.runs if plan.runs is not None else sum(r for r, w in zip(in_runs, plan.weights) if w)
    total_runs = max(1, min(total_runs, 0xFFFFFFFF))
    sum_max = min(global_max, 0xFFFFFFFF)
    rebuilt = _value_files(plan, template, part, out_words, total_runs, sum_max, value_sites) \
        if len(template.site_rec) else {}
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
            "value_sites": {"sites": value_sites[0], "dropped": value_sites[1]},
        }
    }
    buf = memoryview(out_words.view(np.uint8))  # type: ignore[arg-type]  # numpy declares __buffer__ only for Python >= 3.12
    writer = SummaryWriter(t, buf, total_runs, sum_max)
    where = t.image.index_of()

    def items() -> Iterator[tuple[str, Any]]:
        for rel in rels:
            m = merged.get(rel)
            if m is not None:
                yield rel, m.with_summary(total_runs, sum_max).to_bytes()
            else:
                yield rel, rebuilt.get(rel) or writer.pieces(where[rel])

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
        "value_sites": {"sites": value_sites[0], "dropped": value_sites[1]},
    }


def _value_files(plan: Plan, template: Template, part: Partial, out_words: np.ndarray, runs: int, sum_max: int,
                 value_sites: list[int]) -> dict[str, bytes]:
    """The output bytes of the template's files with top-N sites that were not merged per file: each file's words
    with the merged counters in place (out_words), its object summaries replaced by one after the header (as
    SummaryWriter writes the others), and each top-N record rebuilt around its merged sites."""
    t = template.index
    acc = template.topn_acc(plan.arith, plan.strict)
    assert part.topn is not None
    acc.merge(part.topn)
    sites = acc.result()
    del acc
    site_file = t.rec_fid[template.site_rec]
    live = ~part.slow[site_file]
    value_sites[0] += int(live.sum())
    value_sites[1] += int((sites.magnitude()[1] & live).sum())
    words, start = sites.words()  # all sites at once; a record's sites are consecutive
    nsites = np.bincount(template.site_rec, minlength=len(t.rec_pos))
    files = template.vfile & ~part.slow
    special = np.flatnonzero(files[t.rec_fid] & ((template.topn & (nsites > 0)) | (t.rec_tag == TAG_OBJECT_SUMMARY)))
    bounds = np.searchsorted(t.rec_fid[special], np.arange(t.n + 1)).tolist()
    records = {u: summary_record(u, runs, sum_max) for u in (1, 4)}
    img = t.image
    out: dict[str, bytes] = {}
    for k in np.flatnonzero(files).tolist():
        ws, hw, unit = int(img.wstart[k]), int(t.hw[k]), int(t.unit[k])
        pieces = [out_words[ws : ws + hw], records[unit]]
        pos = ws + hw
        for r in special[bounds[k] : bounds[k + 1]].tolist():
            at = int(t.rec_pos[r])
            pieces.append(out_words[pos:at])
            pos = at + 2 + int(t.rec_len[r])
            if t.rec_tag[r] == TAG_OBJECT_SUMMARY:
                continue
            s0 = int(template.rec_site[r])
            new = words[start[s0] : start[s0 + nsites[r]]]
            pieces += [np.array([t.rec_tag[r], len(new) * unit], dtype=np.uint32), new]
        pieces.append(out_words[pos : ws + int(img.size[k]) // 4])
        out[img.rels[k]] = np.concatenate(pieces).astype("<u4", copy=False).tobytes()
    return out


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
