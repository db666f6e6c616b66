"""Similarity of execution profiles (numpy only, no I/O): the characterization of "One Profile Fits All".

Inputs are matrices with one row per profile over the same items (functions, branch arcs, two-way branches) of one
build. Definitions (docs/PROFILES.md states them for users):

    cosine(a, b) = a.b / (|a| |b|)                       1.0 when both vectors are zero, 0.0 when only one is
    taken probability of a two-way branch i in profile a:  p_a(i) = taken_a(i) / executed_a(i)
    D(a, b) = two-way branches executed at least once in both a and b;  d_i = p_a(i) - p_b(i), i in D
    L0 = |{i in D : |d_i| > threshold}| / |D|      share of branches whose bias moved by more than the threshold
    L1 = sum_i |d_i| / |D|                          mean absolute change of the taken probability
    L2 = sqrt(sum_i d_i^2 / |D|)                    root mean square change
All three lie in [0, 1]; 0 on the diagonal. With D empty they are NaN (nothing to compare).
"""

from __future__ import annotations

import numpy as np

DEFAULT_L0_THRESHOLD = 0.01


def cosine_matrix(x: np.ndarray, chunk: int = 1 << 16) -> np.ndarray:
    """Pairwise cosine similarity of the rows of x (profiles x items). Memory: x plus one column chunk."""
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    # Scale each row by its largest magnitude first: kernel counts reach 1e12 and their squares would lose
    # precision. The Gram matrix is accumulated over column chunks (no full-size temporary).
    peak = np.maximum(x.max(axis=1, initial=0.0), -x.min(axis=1, initial=0.0)) if x.size else np.zeros(n)
    scale = np.divide(1.0, peak, out=np.zeros_like(peak), where=peak > 0)[:, None]
    gram = np.zeros((n, n))
    for a in range(0, x.shape[1], chunk):
        y = x[:, a : a + chunk] * scale
        gram += y @ y.T
    norms = np.sqrt(np.diag(gram))
    denom = np.outer(norms, norms)
    out = np.divide(gram, denom, out=np.zeros_like(gram), where=denom > 0)
    zero = norms == 0
    out[np.ix_(zero, zero)] = 1.0
    np.fill_diagonal(out, 1.0)
    return np.clip(out, -1.0, 1.0)


def taken_probabilities(taken: np.ndarray, executed: np.ndarray) -> np.ndarray:
    """p = taken / executed per profile and branch; NaN where the branch did not execute."""
    taken = np.asarray(taken, dtype=np.float64)
    executed = np.asarray(executed, dtype=np.float64)
    p = np.full(taken.shape, np.nan)
    np.divide(taken, executed, out=p, where=executed > 0)
    return p


def taken_norms(
    taken: np.ndarray, executed: np.ndarray, threshold: float = DEFAULT_L0_THRESHOLD
) -> dict[str, np.ndarray]:
    """Pairwise L0/L1/L2 of taken-probability differences over branches executed in both profiles.

    Returns matrices l0, l1, l2 (float, NaN where no branch is shared) and common (int: |D| per pair)."""
    p = taken_probabilities(taken, executed)
    n = p.shape[0]
    l0 = np.zeros((n, n))
    l1 = np.zeros((n, n))
    l2 = np.zeros((n, n))
    common = np.zeros((n, n), dtype=np.int64)
    ok = ~np.isnan(p)
    for i in range(n):
        for j in range(n):
            both = ok[i] & ok[j]
            m = int(both.sum())
            common[i, j] = m
            if m == 0:
                l0[i, j] = l1[i, j] = l2[i, j] = np.nan
                continue
            if i == j:
                continue
            d = np.abs(p[i, both] - p[j, both])
            l0[i, j] = np.count_nonzero(d > threshold) / m
            l1[i, j] = d.sum() / m
            l2[i, j] = np.sqrt((d * d).sum() / m)
    return {"l0": l0, "l1": l1, "l2": l2, "common": common}
