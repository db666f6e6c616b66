#!/usr/bin/env python3
"""How often kpgo's 95% interval holds the true ratio, by boots per kernel (prints a Markdown table; not a test).
docs/EVALUATION.md has what it printed; tests/test_stats.py checks the same simulation at fewer trials.

    .venv/bin/python benchmarks/interval_coverage.py [--trials 4000]

Each simulated bench draws n boots a side, value = kernel mean × (1 + cv × noise), true ratio 0.95, cv 2% on the
baseline and 5% on the other kernel (unequal spread, as a kernel with more variable boots has), noise normal, skewed
or bimodal (kpgo.stats.coverage). Columns: kpgo's interval on one workload's ratio (kpgo.stats.ratio_record) and on a
geometric mean over four workloads (geomean_record), and for comparison the percentile bootstrap kpgo used before
(10 000 resamples of each kernel's boots; its ratio of resampled means), with the interval's median half-width."""

from __future__ import annotations

import argparse

import numpy as np

from kpgo import stats


def bootstrap_coverage(n: int, shape: str, trials: int, seed: int = 0) -> float:
    """The percentile bootstrap of kpgo before 2026-11 (resamples, ratio of resampled means), same draws as coverage()."""
    rng = np.random.default_rng(seed)
    boot = np.random.default_rng(seed + 1)
    hits = 0
    for _ in range(trials):
        b = 100.0 * (1 + 0.02 * stats._noise(shape, rng, (1, n))[0])
        o = 95.0 * (1 + 0.05 * stats._noise(shape, rng, (1, n))[0])
        dist = o[boot.integers(0, n, (2000, n))].mean(axis=1) / b[boot.integers(0, n, (2000, n))].mean(axis=1)
        lo, hi = np.quantile(dist, [0.025, 0.975])
        hits += lo <= 0.95 <= hi
    return hits / trials


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=4000)
    a = ap.parse_args()
    print("| noise | boots a side | Welch t, one workload (half-width) | Welch t, geomean of 4 | percentile bootstrap (before) |")
    print("|---|---:|---:|---:|---:|")
    for shape in stats.NOISE:
        for n in range(2, 11):
            c1, w1 = stats.coverage(n, shape, trials=a.trials)
            c4, _ = stats.coverage(n, shape, trials=a.trials // 4, workloads=4)
            cb = bootstrap_coverage(n, shape, a.trials // 4)
            print(f"| {shape} | {n} | {c1:.3f} (±{w1:.1%}) | {c4:.3f} | {cb:.3f} |", flush=True)


if __name__ == "__main__":
    main()
