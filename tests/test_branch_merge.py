"""Merging branch profiles of one binary (kpgo.branches.merge, `kpgo profile merge` on branch profiles): the layout
study's universal profile. Real records of a guest program under user-mode QEMU with kpgo's plugin; the sums are
checked against the inputs' own tables, the merged file against the plugin's format, bad input in one line."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from tests.conftest import assert_one_line_error, kpgo
from tests.test_branches import probe, record  # noqa: F401 -- the module's fixture, used by name

from kpgo import branches
from kpgo.errors import UserError


def profile_dir(recs: Path, elf: Path, out: Path, workload: str) -> Path:
    """A branch profile directory as `kpgo collect --branches` writes one, of records made for `elf`."""
    out.mkdir()
    shutil.copy(recs, out / branches.RECORDS_FILE)
    rec = branches.read_records(out / branches.RECORDS_FILE)
    outputs = branches.make_outputs(rec, elf, out)
    manifest = {"kind": branches.PROFILE_KIND, "build_id": rec.build_id, "vmlinux": str(elf), "kernel_release": "test",
                "workload": {"name": workload}, "collected_at": "2026-11-28T00:00:00Z", **outputs}
    (out / "profile.json").write_text(json.dumps(manifest))
    return out


@pytest.fixture(scope="module")
def two(probe: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:  # noqa: F811
    """Two workloads of one binary: a call chain run 100 times, and 3,000 loop iterations beside 30 chains."""
    d = tmp_path_factory.mktemp("two")
    record(probe, d / "a.rec", "calls", "100", period=16)
    record(probe, d / "b.rec", "hot", "3000", period=16)
    return profile_dir(d / "a.rec", probe, d / "a", "calls"), profile_dir(d / "b.rec", probe, d / "b", "hot")


def edge_counts(r: branches.Records) -> dict[tuple[int, int], int]:
    return {(a, b): c for a, b, c, _ in r.edges.tolist()}


def range_counts(r: branches.Records) -> dict[tuple[int, int], int]:
    return {(a, b): c for a, b, c in r.ranges.tolist()}


def test_the_writer_writes_what_the_plugin_writes(two: tuple[Path, Path], tmp_path: Path) -> None:
    src = two[0] / branches.RECORDS_FILE
    again = tmp_path / "again.rec"
    branches.write_records(branches.read_records(src), again)
    assert again.read_bytes() == src.read_bytes()


@pytest.mark.parametrize("normalize", [False, True])
def test_the_merge_adds_every_table(two: tuple[Path, Path], tmp_path: Path, normalize: bool) -> None:
    a, b = (branches.read_records(d / branches.RECORDS_FILE) for d in two)
    assert a.branches != b.branches
    res = branches.merge(list(two), tmp_path / "m", weights=[1.0, 2.0], normalize=normalize)
    m = branches.read_records(tmp_path / "m" / branches.RECORDS_FILE, a.build_id)
    fa, fb = 1.0, 2.0
    if normalize:
        most = max(a.branches, b.branches)
        fa, fb = fa * most / a.branches, fb * most / b.branches
    assert [i["factor"] for i in res["merged"]["inputs"]] == [round(fa, 6), round(fb, 6)]
    for mine, theirs in ((edge_counts(m), (edge_counts(a), edge_counts(b))), (range_counts(m), (range_counts(a), range_counts(b)))):
        assert set(mine) == set(theirs[0]) | set(theirs[1])
        for k, c in mine.items():
            assert c == round(theirs[0].get(k, 0) * fa + theirs[1].get(k, 0) * fb)
    assert np.all(np.diff(m.edges[:, 0].astype(np.int64)) >= 0)  # sorted, as the plugin writes them
    assert m.branches == round(a.branches * fa + b.branches * fb)
    stacks = {s.branches.tobytes(): s.count for s in m.stacks}
    for s in a.stacks:
        assert stacks[s.branches.tobytes()] >= round(s.count * fa)
    assert m.samples == sum(stacks.values()) and m.windows == a.windows + b.windows
    # the outputs are made from the merged records, and the directory reads as any branch profile
    info = branches.read_profile(tmp_path / "m")
    assert info["records"]["branches"] == m.branches and info["merged"]["normalize"] is normalize
    assert [i["workload"] for i in info["merged"]["inputs"]] == ["calls", "hot"]
    assert (tmp_path / "m" / branches.BOLT_FILE).read_text().count("\n") == len(m.edges) + len(m.ranges)


def test_the_command_merges_branch_profiles(two: tuple[Path, Path], tmp_path: Path) -> None:
    res = kpgo("profile", "merge", *two, "-o", tmp_path / "m", "--normalize")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("merged 2 branch profiles -> ") and "factors " in res.stdout
    stats = kpgo("profile", "stats", tmp_path / "m", "--json")
    assert stats.returncode == 0 and json.loads(stats.stdout)["records"]["side"] == "user"


def test_bad_merges_are_one_line(two: tuple[Path, Path], probe: Path, tmp_path: Path) -> None:  # noqa: F811
    a, b = two
    before = {p: p.read_bytes() for p in a.iterdir()}
    # another binary's records
    other = tmp_path / "other"
    shutil.copytree(b, other)
    elf = tmp_path / "probe2"
    elf.write_bytes(probe.read_bytes())
    manifest = json.loads((other / "profile.json").read_text())
    (other / "profile.json").write_text(json.dumps(dict(manifest, build_id="ab" * 20, vmlinux=str(elf))))
    with pytest.raises(UserError):
        branches.merge([a, other], tmp_path / "x")
    assert_one_line_error(kpgo("profile", "merge", a, other, "-o", tmp_path / "x"), 1, "belong to the binary with build id")
    # a gcov profile beside a branch profile
    gcov = tmp_path / "gcov"
    gcov.mkdir()
    (gcov / "profile.json").write_text(json.dumps({"build_key": "k"}))
    assert_one_line_error(kpgo("profile", "merge", a, gcov, "-o", tmp_path / "x"), 1, "mix branch profiles and gcov profiles")
    assert_one_line_error(kpgo("profile", "merge", a, b, "-o", tmp_path / "x", "--cluster", "local"), 1, "--cluster is for gcov profiles")
    assert_one_line_error(kpgo("profile", "merge", a, b, "-o", tmp_path / "x", "--weights", "1,0"), 1, "--weights needs 2 positive numbers")
    assert not (tmp_path / "x").exists()
    assert {p: p.read_bytes() for p in a.iterdir()} == before


def test_records_of_another_period_are_not_added(two: tuple[Path, Path]) -> None:
    a = branches.read_records(two[0] / branches.RECORDS_FILE)
    b = branches.read_records(two[1] / branches.RECORDS_FILE)
    from dataclasses import replace

    with pytest.raises(UserError) as e:
        branches.merge_records([a, replace(b, period=64)], [1.0, 1.0])
    assert "every 64 branches" in str(e.value) and "\n" not in str(e.value)


# ---- any records: the writer and the reader agree, and a merge of one is the identity ----

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

U64 = st.integers(0, 2 ** 64 - 1)
COUNT = st.integers(1, 2 ** 40)


@st.composite
def any_records(draw: st.DrawFn) -> branches.Records:
    edges = sorted(draw(st.dictionaries(st.tuples(U64, U64), st.tuples(COUNT, st.integers(0, 6)), max_size=20)).items())
    ranges = sorted(draw(st.dictionaries(st.tuples(U64, U64), COUNT, max_size=20)).items())
    # distinct stacks, as the plugin counts them
    keys = draw(st.lists(st.lists(st.tuples(U64, U64), min_size=1, max_size=branches.DEPTH), max_size=5, unique_by=lambda k: tuple(k)))
    stacks = tuple(branches.Stack(draw(COUNT), np.array(k, dtype=np.uint64).reshape(-1, 2)) for k in keys)
    e = np.array([[a, b, c, k] for (a, b), (c, k) in edges], dtype=np.uint64).reshape(-1, 4)
    r = np.array([[a, b, c] for (a, b), c in ranges], dtype=np.uint64).reshape(-1, 3)
    return branches.Records(draw(st.sampled_from(branches.SIDES)), draw(st.integers(1, 1000)), branches.DEPTH, draw(st.integers(1, 8)),
                            draw(st.integers(0, 9)), draw(st.booleans()), draw(st.integers(0, 2 ** 50)), sum(s.count for s in stacks),
                            draw(st.integers(0, 99)), draw(st.integers(0, 99)), draw(st.integers(0, 99)), draw(st.integers(1, 2 ** 20)),
                            draw(st.integers(1, 2 ** 16)), draw(st.binary(max_size=32)).hex(), e, r, stacks, 0)


def same(a: branches.Records, b: branches.Records) -> bool:
    head = [f.name for f in dataclasses.fields(branches.Records) if f.name not in ("edges", "ranges", "stacks", "size")]
    return (all(getattr(a, f) == getattr(b, f) for f in head) and np.array_equal(a.edges, b.edges) and np.array_equal(a.ranges, b.ranges)
            and [(s.count, s.branches.tolist()) for s in a.stacks] == [(s.count, s.branches.tolist()) for s in b.stacks])


@settings(max_examples=60, deadline=None)
@given(any_records())
def test_any_records_round_trip(tmp_path_factory: pytest.TempPathFactory, rec: branches.Records) -> None:
    f = tmp_path_factory.mktemp("rt") / "r.rec"
    branches.write_records(rec, f)
    back = branches.read_records(f, rec.build_id)
    assert same(back, rec) and back.size == f.stat().st_size
    # a merge of one record set with factor 1 changes nothing but the order of its stacks (none here: kept in order)
    assert same(branches.merge_records([rec], [1.0]), rec)
