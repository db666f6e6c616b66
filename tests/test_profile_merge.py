"""kpgo profile merge against `gcov-tool merge` on files the real GCC writes at test time."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gcov_fixtures import Profiles, gcc_build, gcda_files, profiles  # noqa: F401
from kpgo.errors import UserError
from kpgo.gcov.gcda import ARCS, parse_gcda
from kpgo.gcov.merge import merge_profiles, parse_weights


def counters(root: Path) -> dict[Path, list[int]]:
    return {rel: parse_gcda((root / rel).read_bytes(), str(rel)).counters(ARCS).tolist() for rel in gcda_files(root)}


def gcov_tool_merge(a: Path, b: Path, out: Path, w: tuple[int, int] = (1, 1)) -> Path:
    subprocess.run(["gcov-tool", "merge", "-o", str(out), "-w", f"{w[0]},{w[1]}", str(a), str(b)],
                   check=True, capture_output=True)
    return out


@pytest.mark.parametrize("w", [(1, 1), (1, 3), (4, 2)])
@pytest.mark.parametrize("shape", ["kernel", "libgcov"])
def test_two_way_equals_gcov_tool(profiles: Profiles, tmp_path: Path, w: tuple[int, int], shape: str) -> None:
    a, b = (profiles.k0, profiles.k2) if shape == "kernel" else (profiles.mode0, profiles.mode2)
    ref = counters(gcov_tool_merge(a, b, tmp_path / "ref", w))
    merge_profiles([a, b], tmp_path / "ours", weights=[float(x) for x in w])
    assert counters(tmp_path / "ours") == ref


def test_n_way_equals_chained_gcov_tool(profiles: Profiles, tmp_path: Path) -> None:
    t = gcov_tool_merge(profiles.k0, profiles.k1, tmp_path / "t", (2, 1))
    ref = counters(gcov_tool_merge(t, profiles.k2, tmp_path / "ref", (1, 3)))
    res = merge_profiles([profiles.k0, profiles.k1, profiles.k2], tmp_path / "ours", weights=[2, 1, 3])
    assert counters(tmp_path / "ours") == ref
    # A correct summary: runs and the largest arc counter of the whole merged profile.
    out = tmp_path / "ours"
    allmax = max(max(v) for v in ref.values() if v)
    for rel in gcda_files(out):
        s = parse_gcda((out / rel).read_bytes(), "x").summary
        assert s is not None and s.sum_max == allmax and s.runs == res["runs"] == 3
    man = json.loads((out / "profile.json").read_text())["merged"]
    assert [i["weight"] for i in man["inputs"]] == [2, 1, 3]
    assert [i["path"] for i in man["inputs"]] == [str(profiles.k0), str(profiles.k1), str(profiles.k2)]


def test_normalize_equalizes_totals(profiles: Profiles, tmp_path: Path) -> None:
    c0, c1 = counters(profiles.k0), counters(profiles.k1)
    t0 = sum(sum(v) for v in c0.values())
    t1 = sum(sum(v) for v in c1.values())
    assert t0 != t1
    res = merge_profiles([profiles.k0, profiles.k1], tmp_path / "n", weights=[1, 2], normalize=True)
    target = max(t0, t1)
    assert res["scales"] == [target / t0, target / t1]
    got = counters(tmp_path / "n")
    for rel in got:
        expect = np.rint(np.array(c0[rel], float) * target / t0 + 2 * np.array(c1[rel], float) * target / t1)
        assert got[rel] == expect.astype(np.uint64).tolist()
    # Each input contributes in proportion to its weight, whatever its throughput.
    assert abs(sum(sum(v) for v in got.values()) - 3 * target) <= len(sum(got.values(), []))


def test_different_builds_refused(profiles: Profiles, tmp_path: Path) -> None:
    import shutil

    other = tmp_path / "other"
    shutil.copytree(profiles.k1, other)
    p = other / "net" / "core.gcda"
    g = parse_gcda(p.read_bytes(), str(p))
    g.stamp ^= 0x5A5A
    p.write_bytes(g.to_bytes())
    with pytest.raises(UserError, match=r"net/core.gcda: profiles from different builds"):
        merge_profiles([profiles.k0, other], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out*"))


def test_value_profiles_of_gcc_10_refused(tmp_path: Path) -> None:
    """GCC 10 wrote top-N sites of a fixed size (total and two value/count pairs) and merged them by another rule:
    refused with the file named (GCC >= 11's variable-length sites are merged: tests/test_value_profiles.py)."""
    from gcov_fixtures import version_word, write_profile

    words = [0x67636461, version_word(10), 0x1234, 0x01000000, 3, 1000, 0xAAAA, 0xBBBB, 0x01A10000, 2, 5, 0,
             0x01A70000, 10, 9, 0, 7, 0, 6, 0, 2, 0, 3, 0]
    data = np.array(words, dtype="<u4").tobytes()
    dirs = [write_profile(tmp_path / n, {"lib/x.gcda": data}) for n in ("a", "b")]
    with pytest.raises(UserError, match=r"lib/x\.gcda: cannot merge 'topn' counters of GCC 10"):
        merge_profiles(dirs, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_interrupted_write_leaves_nothing(profiles: Profiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kpgo.gcov.merge as m

    def boom(tmp: Path, items: object) -> int:
        (tmp / "half.gcda").write_bytes(b"x")
        raise KeyboardInterrupt

    monkeypatch.setattr(m, "write_tree", boom)
    before = counters(profiles.k0)
    with pytest.raises(KeyboardInterrupt):
        merge_profiles([profiles.k0, profiles.k1], tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.iterdir())
    assert counters(profiles.k0) == before


def test_weights_parsing() -> None:
    assert parse_weights(None, 3) == [1, 1, 1]
    assert parse_weights("1,0.5", 2) == [1, 0.5]
    for bad in ("1", "a,b", "-1,1", "0,0", "nan,1"):
        with pytest.raises(UserError):
            parse_weights(bad, 2)


def test_missing_file_in_one_input_counts_as_zero(profiles: Profiles, tmp_path: Path) -> None:
    import shutil

    part = tmp_path / "part"
    shutil.copytree(profiles.k1, part)
    (part / "main.gcda").unlink()
    res = merge_profiles([profiles.k0, part], tmp_path / "out")
    assert res["missing"] == {str(part): 1}
    assert counters(tmp_path / "out")[Path("main.gcda")] == counters(profiles.k0)[Path("main.gcda")]


def test_merge_rules() -> None:
    """The rules both merge paths use, against values worked out by hand."""
    from kpgo.gcov.merge import Accumulator, Arith

    a, b = np.array([0, 5, 7, 1 << 40], dtype=np.uint64), np.array([3, 0, 2, 1], dtype=np.uint64)

    def merged(rule: str, factors: list[float], strict: bool = False) -> list[int]:
        acc = Accumulator(rule, 4, Arith.of(factors), strict, lambda _: "x.gcda")
        for v, f in zip((a, b), factors):
            acc.add(v, f)
        return acc.result().tolist()

    assert merged("sum", [2, 3]) == [9, 10, 20, (2 << 40) + 3]
    assert merged("sum", [0.5, 1]) == [3, 2, 6, (1 << 39) + 1]  # 2.5 -> 2, 5.5 -> 6: to nearest, ties to even
    assert merged("sum", [0, 1]) == b.tolist()
    assert merged("ior", [1, 1]) == [3, 5, 7, (1 << 40) | 1] and merged("ior", [1, 0]) == a.tolist()
    assert merged("min_nonzero", [1, 1]) == [3, 5, 2, 1] and merged("min_nonzero", [0, 0]) == [0, 0, 0, 0]
    with pytest.raises(UserError, match=r"x\.gcda: a merged counter exceeds 2\^63-1"):
        merged("sum", [1 << 23, 1], strict=True)
    acc = Accumulator("sum", 4, Arith(None), False, lambda _: "x")
    sel = np.array([False, True, True, False])
    acc.add(a[sel], 1, sel)  # the counters of the files an input holds
    acc.add(b, 1)
    assert acc.result().tolist() == [3, 5, 9, 1]


def test_fractional_sums_are_exact_in_any_grouping() -> None:
    """Fixed-point sums against Python's exact fractions: rounded to nearest, ties to even, saturating at 2^64 - 1,
    the same whether the inputs are added in one accumulator or in two whose states are merged."""
    from fractions import Fraction

    from kpgo.gcov.merge import Accumulator, Arith

    rng = np.random.default_rng(5)
    n = 400
    values = [rng.integers(0, 1 << 20, n, dtype=np.uint64), rng.integers(0, 1 << 64, n, dtype=np.uint64, endpoint=False),
              rng.integers(0, 1 << 40, n, dtype=np.uint64), np.full(n, 5, dtype=np.uint64)]
    factors = [0.5, 1.7, 1e-9, 0.7]
    arith = Arith.of(factors)

    def expect(k: int) -> int:
        s = sum(Fraction(f) * int(v[k]) for v, f in zip(values, factors))
        r = round(s)  # Python rounds a Fraction to nearest, ties to even
        return min(r, (1 << 64) - 1)

    whole = Accumulator("sum", n, arith, False, lambda _: "x")
    left, right = (Accumulator("sum", n, arith, False, lambda _: "x") for _ in range(2))
    for j, (v, f) in enumerate(zip(values, factors)):
        whole.add(v, f)
        (left if j % 2 else right).add(v, f)
    left.merge(right.state())
    want = [expect(k) for k in range(n)]
    assert whole.result().tolist() == want == left.result().tolist()
    assert any(w == (1 << 64) - 1 for w in want)  # some sums saturate
    ties = Accumulator("sum", 3, Arith.of([0.5]), False, lambda _: "x")
    ties.add(np.array([1, 3, 5], dtype=np.uint64), 0.5)
    assert ties.result().tolist() == [0, 2, 2]
