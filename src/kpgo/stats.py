"""Statistics for A/B/n kernel comparisons (numpy, no I/O).

Samples are per boot (the mean of that boot's measured runs): boots are the independent unit,
since a boot fixes memory layout, page placement and the like. Ratio CIs bootstrap whole boots."""

from __future__ import annotations

import numpy as np


def describe(samples: list[float]) -> dict[str, float]:
    a = np.asarray(samples, dtype=float)
    mean = float(a.mean())
    sd = float(a.std(ddof=1)) if len(a) > 1 else 0.0
    return {"n": len(a), "mean": mean, "sd": sd, "cv": sd / mean if mean else 0.0}


def ratio_ci(base: list[float], other: list[float], *, level: float = 0.95, resamples: int = 10000, seed: int = 1) -> tuple[float, float, float]:
    """mean(other)/mean(base) and its percentile-bootstrap CI, resampling boots within each kernel."""
    b = np.asarray(base, dtype=float)
    o = np.asarray(other, dtype=float)
    point = float(o.mean() / b.mean())
    if len(b) < 2 or len(o) < 2:
        return point, float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    bm = b[rng.integers(0, len(b), size=(resamples, len(b)))].mean(axis=1)
    om = o[rng.integers(0, len(o), size=(resamples, len(o)))].mean(axis=1)
    r = om / bm
    lo, hi = np.quantile(r, [(1 - level) / 2, 1 - (1 - level) / 2])
    return point, float(lo), float(hi)
