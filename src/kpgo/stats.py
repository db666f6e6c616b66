"""Statistics for A/B/n kernel comparisons (numpy, no I/O).

Samples are per boot (the mean of that boot's measured runs): boots are the independent unit,
since a boot fixes memory layout, page placement and the like. Ratio CIs bootstrap whole boots,
each kernel's boots resampled on their own (the kernels were booted separately, not in pairs)."""

from __future__ import annotations

from typing import Any

import numpy as np

RESAMPLES = 10000
LEVEL = 0.95


def describe(samples: list[float]) -> dict[str, float]:
    a = np.asarray(samples, dtype=float)
    mean = float(a.mean())
    sd = float(a.std(ddof=1)) if len(a) > 1 else 0.0
    return {"n": len(a), "mean": mean, "sd": sd, "cv": sd / mean if mean else 0.0}


def ratio_resamples(base: list[float], other: list[float], rng: np.random.Generator, resamples: int = RESAMPLES) -> np.ndarray | None:
    """Bootstrap distribution of mean(other)/mean(base), or None with fewer than two boots on a side."""
    b = np.asarray(base, dtype=float)
    o = np.asarray(other, dtype=float)
    if len(b) < 2 or len(o) < 2:
        return None
    bm = b[rng.integers(0, len(b), size=(resamples, len(b)))].mean(axis=1)
    om = o[rng.integers(0, len(o), size=(resamples, len(o)))].mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):  # a count that is 0 on the baseline has no ratio: NaN, quietly
        return om / bm


def interval(dist: np.ndarray | None, level: float = LEVEL) -> tuple[float, float]:
    """Percentile interval of a bootstrap distribution; NaNs when there is none."""
    if dist is None:
        return float("nan"), float("nan")
    lo, hi = np.quantile(dist, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def ratio_ci(base: list[float], other: list[float], *, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 1) -> tuple[float, float, float]:
    """mean(other)/mean(base) and its percentile-bootstrap CI, resampling boots within each kernel."""
    with np.errstate(divide="ignore", invalid="ignore"):  # e.g. kernel indirect branches under retpolines: 0 on both
        point = float(np.mean(other) / np.mean(base))
    lo, hi = interval(ratio_resamples(base, other, np.random.default_rng(seed), resamples), level)
    return point, lo, hi


def includes_one(lo: float, hi: float) -> bool:
    """True when the CI does not exclude 1.0 (also when there is no CI): stored with each ratio as ci_includes_1, it is
    what kpgo.report.present marks with '*'."""
    return not (lo > 1 or hi < 1)


def ratio_record(base: list[float], other: list[float]) -> dict[str, Any]:
    """The one record of a ratio kpgo stores (results.json, studies): mean(other)/mean(base), its CI and the flag."""
    r, lo, hi = ratio_ci(base, other)
    return {"ratio": r, "ci_low": lo, "ci_high": hi, "ci_includes_1": includes_one(lo, hi)}


def geomean_record(pairs: list[tuple[list[float], list[float]]]) -> dict[str, Any]:
    """The same record for a geometric mean of ratios over workloads (see geomean_ci)."""
    g, lo, hi = geomean_ci(pairs)
    return {"ratio": g, "ci_low": lo, "ci_high": hi, "ci_includes_1": includes_one(lo, hi)}


def geomean_ci(pairs: list[tuple[list[float], list[float]]], *, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 1) -> tuple[float, float, float]:
    """Geometric mean over workloads of mean(other)/mean(base), with a CI from resampling each workload's
    boots independently and taking the geometric mean of the resampled ratios (one draw per workload per
    bootstrap replicate). NaN CI if any workload has fewer than two boots on a side."""
    if not pairs:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    dists = [ratio_resamples(b, o, rng, resamples) for b, o in pairs]
    with np.errstate(divide="ignore", invalid="ignore"):  # a workload whose baseline count is 0 makes it NaN, quietly
        point = float(np.exp(np.mean([np.log(np.mean(o) / np.mean(b)) for b, o in pairs])))
        if any(d is None for d in dists):
            return point, float("nan"), float("nan")
        logs = np.mean([np.log(d) for d in dists if d is not None], axis=0)
    lo, hi = interval(np.exp(logs), level)
    return point, lo, hi
