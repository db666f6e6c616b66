"""Statistics on known data."""

from __future__ import annotations

import math

from kpgo import stats


def test_describe() -> None:
    d = stats.describe([9.0, 10.0, 11.0])
    assert d["n"] == 3 and d["mean"] == 10.0 and math.isclose(d["sd"], 1.0) and math.isclose(d["cv"], 0.1)


def test_ratio_ci_separates_clear_difference() -> None:
    base = [100.0, 101.0, 99.0, 100.5, 99.5]
    fast = [110.0, 111.0, 109.0, 110.5, 109.5]
    r, lo, hi = stats.ratio_ci(base, fast)
    assert math.isclose(r, 1.1, rel_tol=1e-9)
    assert 1.0 < lo < r < hi < 1.2


def test_ratio_ci_includes_one_for_noise() -> None:
    base = [100.0, 90.0, 110.0, 95.0, 105.0]
    same = [104.0, 92.0, 108.0, 97.0, 99.0]
    r, lo, hi = stats.ratio_ci(base, same)
    assert lo < 1.0 < hi


def test_ratio_ci_needs_two_samples() -> None:
    r, lo, hi = stats.ratio_ci([100.0], [110.0])
    assert math.isclose(r, 1.1) and math.isnan(lo) and math.isnan(hi)
