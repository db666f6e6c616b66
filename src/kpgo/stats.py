"""Statistics for A/B/n kernel comparisons (numpy and scipy, no I/O).

Samples are per boot (the mean of that boot's measured runs): boots are the independent unit, since a boot fixes
memory layout, page placement and the like. The kernels were booted separately, not in pairs, so a ratio compares
two independent samples.

The interval of a ratio of means is Welch's t interval on its logarithm: log(mean(o)/mean(b)) with the delta-method
standard error sqrt(s_o²/(n_o·m_o²) + s_b²/(n_b·m_b²)) and Welch–Satterthwaite degrees of freedom. A geometric mean
over workloads averages the logs; its variance is the mean of theirs over W², its degrees of freedom Satterthwaite's
over all the kernels' boots. Why this and not the percentile bootstrap kpgo used before: at 2–6 boots a side the
bootstrap covers the true ratio 60–88% of the time, not 95%, while this interval holds 93–98% from 2 boots under
normal and skewed noise (tests/test_stats.py runs the coverage simulation; its table is in docs/EVALUATION.md).
Below 2 boots on a side there is no variance to estimate: kpgo then gives the range of the ratio (smallest over
largest to largest over smallest) and calls it that, never a CI."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

LEVEL = 0.95
WELCH = "welch-t-log"  # ci_method of a ratio or geometric mean with an interval
RANGE = "range"  # ci_method below MIN_BOOTS on a side: smallest to largest ratio the boots allow, not a CI
MIN_BOOTS = 2
METHOD_TEXT = "Welch t interval on the log ratio over boots"  # how tables and captions name WELCH
RANGE_TEXT = "the range of the boots' ratios (fewer than 2 boots on a side: no interval)"


def describe(samples: Sequence[float]) -> dict[str, float]:
    a = np.asarray(samples, dtype=float)
    mean = float(a.mean())
    sd = float(a.std(ddof=1)) if len(a) > 1 else 0.0
    return {"n": len(a), "mean": mean, "sd": sd, "cv": sd / mean if mean else 0.0}


def _log_terms(base: Sequence[float], other: Sequence[float]) -> tuple[float, list[tuple[float, int]]]:
    """log(mean(other)/mean(base)) and the two (variance term, boots) pairs of its delta-method variance."""
    b = np.asarray(base, dtype=float)
    o = np.asarray(other, dtype=float)
    mb, mo = float(b.mean()), float(o.mean())
    if mb <= 0 or mo <= 0:
        return math.nan, []
    terms = [(float(x.var(ddof=1)) / (len(x) * m * m) if len(x) > 1 else 0.0, len(x)) for x, m in ((b, mb), (o, mo))]
    return math.log(mo / mb), terms


def _welch(center: float, terms: list[tuple[float, int]], scale: float, level: float) -> tuple[float, float, float]:
    """exp(center ± t·se) with se² = scale²·Σ var and Satterthwaite's degrees of freedom (inf when no spread)."""
    var = sum(v for v, _ in terms)
    if var <= 0:  # every boot counted the same: the interval is the point
        return math.exp(center), math.exp(center), math.inf
    df = var * var / sum(v * v / (n - 1) for v, n in terms)
    half = float(scipy_stats.t.ppf(0.5 + level / 2, df)) * scale * math.sqrt(var)
    return math.exp(center - half), math.exp(center + half), df


def _range(base: Sequence[float], other: Sequence[float]) -> tuple[float, float]:
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(min(other) / max(base)), float(max(other) / min(base))


def ratio_interval(base: Sequence[float], other: Sequence[float], level: float = LEVEL) -> dict[str, Any]:
    """mean(other)/mean(base), its interval (Welch's from MIN_BOOTS boots a side, else the range) and the method."""
    with np.errstate(divide="ignore", invalid="ignore"):  # a count 0 on the baseline (indirect branches under retpolines)
        point = float(np.mean(other) / np.mean(base))
    if len(base) == 0 or len(other) == 0 or math.isnan(point) or math.isinf(point):
        return {"ratio": point, "ci_low": math.nan, "ci_high": math.nan, "ci_method": None, "df": None}
    if min(len(base), len(other)) < MIN_BOOTS:
        lo, hi = _range(base, other)
        return {"ratio": point, "ci_low": lo, "ci_high": hi, "ci_method": RANGE, "df": None}
    center, terms = _log_terms(base, other)
    if math.isnan(center):  # a zero mean: no logarithm
        return {"ratio": point, "ci_low": math.nan, "ci_high": math.nan, "ci_method": None, "df": None}
    lo, hi, df = _welch(center, terms, 1.0, level)
    return {"ratio": point, "ci_low": lo, "ci_high": hi, "ci_method": WELCH, "df": df}


def geomean_interval(pairs: Sequence[tuple[Sequence[float], Sequence[float]]], level: float = LEVEL) -> dict[str, Any]:
    """The geometric mean over workloads of mean(other)/mean(base) (one (base, other) pair of per-boot values each),
    with Welch's interval on the mean log ratio; the geometric mean of the workloads' ranges when a workload has fewer
    than MIN_BOOTS boots on a side."""
    nan = {"ratio": math.nan, "ci_low": math.nan, "ci_high": math.nan, "ci_method": None, "df": None}
    if not pairs:
        return nan
    each = [_log_terms(b, o) for b, o in pairs]
    if any(math.isnan(c) for c, _ in each):
        return nan
    center = sum(c for c, _ in each) / len(each)
    point = math.exp(center)
    if any(min(len(b), len(o)) < MIN_BOOTS for b, o in pairs):
        ranges = [_range(b, o) for b, o in pairs]
        lo = math.exp(sum(math.log(r[0]) for r in ranges) / len(ranges))
        hi = math.exp(sum(math.log(r[1]) for r in ranges) / len(ranges))
        return {"ratio": point, "ci_low": lo, "ci_high": hi, "ci_method": RANGE, "df": None}
    lo, hi, df = _welch(center, [t for _, ts in each for t in ts], 1.0 / len(each), level)
    return {"ratio": point, "ci_low": lo, "ci_high": hi, "ci_method": WELCH, "df": df}


def includes_one(lo: float, hi: float) -> bool:
    """True when the interval does not exclude 1.0 (also when there is none): stored with each ratio as ci_includes_1,
    it is what kpgo.report.present marks with '*'."""
    return not (lo > 1 or hi < 1)


def _record(r: dict[str, Any]) -> dict[str, Any]:
    # A range is no CI: it never says a difference was shown.
    shown = r["ci_method"] == WELCH and not includes_one(r["ci_low"], r["ci_high"])
    return {**r, "ci_includes_1": not shown}


def ratio_record(base: Sequence[float], other: Sequence[float]) -> dict[str, Any]:
    """The one record of a ratio kpgo stores (results.json, studies): mean(other)/mean(base), its interval, the
    method (ci_method: WELCH or RANGE), Welch's degrees of freedom and the flag."""
    return _record(ratio_interval(base, other))


def geomean_record(pairs: Sequence[tuple[Sequence[float], Sequence[float]]]) -> dict[str, Any]:
    """The same record for a geometric mean of ratios over workloads (see geomean_interval)."""
    return _record(geomean_interval(pairs))


def half_width(rec: dict[str, Any]) -> float:
    """An interval's half-width relative to its ratio ((high − low) / 2 / ratio): what `--precision` compares with
    its target; inf when there is no interval (a range counts as none)."""
    if rec.get("ci_method") != WELCH:
        return math.inf
    r, lo, hi = rec.get("ratio"), rec.get("ci_low"), rec.get("ci_high")
    if r is None or lo is None or hi is None or not all(math.isfinite(x) for x in (r, lo, hi)) or r <= 0:
        return math.inf
    return (hi - lo) / 2 / r


# -- coverage: how often the interval holds the true ratio --------------------------------------------------------

NOISE = ("normal", "skewed", "bimodal")


def _noise(shape: str, rng: np.random.Generator, size: tuple[int, int]) -> np.ndarray:
    """Zero-mean, unit-sd boot-to-boot noise: normal; skewed (a centred gamma of shape 2, skewness 1.4); bimodal (a
    boot lands in the upper mode 3 times in 10, as micro's boots did)."""
    if shape == "normal":
        return rng.standard_normal(size)
    if shape == "skewed":
        return (rng.gamma(2.0, 1.0, size) - 2.0) / math.sqrt(2.0)
    if shape == "bimodal":
        upper = rng.random(size) < 0.3
        x = np.where(upper, 0.7, -0.3) / math.sqrt(0.21) + 0.3 * rng.standard_normal(size)
        return x / math.sqrt(1 + 0.09)
    raise ValueError(f"noise shape {shape!r}")


def coverage(n: int, shape: str, *, cv_base: float = 0.02, cv_other: float = 0.05, true_ratio: float = 0.95,
             workloads: int = 1, trials: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Simulate `trials` benches of n boots a side (each boot's value = its kernel's mean × (1 + cv × noise)) and
    return how often ratio_record's interval (geomean_record's over `workloads` workloads) holds the true ratio, and
    the median relative half-width."""
    rng = np.random.default_rng(seed)
    hits, widths = 0, []
    for _ in range(trials):
        pairs = [(100.0 * (1 + cv_base * _noise(shape, rng, (1, n))[0]),
                  100.0 * true_ratio * (1 + cv_other * _noise(shape, rng, (1, n))[0])) for _ in range(workloads)]
        rec = ratio_record(*pairs[0]) if workloads == 1 else geomean_record(pairs)
        hits += rec["ci_low"] <= true_ratio <= rec["ci_high"]
        widths.append(half_width(rec))
    return hits / trials, float(np.median(widths))
