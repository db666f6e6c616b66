"""The whole-profile fast paths (kpgo.gcov.gcda.index_image, the vectorized merge, read_notes, the tree flow solver)
against the per-file code, on real GCC output and on synthesized files of every layout, including the
shapes that must fall back to the per-file code (other byte order, negative lengths, end markers, counters that
look like record tags, layouts that differ between inputs)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gcov_fixtures import (  # noqa: F401
    TAG_WORDS,
    Profiles,
    gcc_build,
    gcda_files,
    profiles,
    synth_gcda,
    value_profile,
    write_profile,
)
from kpgo.errors import UserError
from kpgo.gcov.gcda import ARCS, TAG_FUNCTION, GcovFormatError, index_image, walk_gcda
from kpgo.gcov.image import gcda_rels, read_image
from kpgo.gcov.merge import Template, combine, combine_files, finish, fold_files, fold_inputs, make_plan, merge_profiles, slow_files
from kpgo.gcov.profile import fix_profile, iter_gcda, profile_stats, value_counters_of

# -- references: the per-file computations ------------------------------------------------------------------------

def stats_per_file(src: Path) -> dict:
    files = functions = arcs = with_summary = nbytes = nonzero = arcs_sum = arcs_max = 0
    versions, stamps = set(), set()
    values: dict[str, dict[str, int]] = {}
    for rel in gcda_rels(src):
        g = walk_gcda((src / rel).read_bytes(), rel)
        value_counters_of(g, values)
        files += 1
        nbytes += len(g.payload) * 4
        versions.add(g.version_text)
        stamps.add(g.stamp)
        functions += int(np.count_nonzero(np.diff(g.offsets)[g.tags == TAG_FUNCTION] >= 3))
        with_summary += g.summary is not None
        v = g.counters(ARCS)
        arcs += len(v)
        arcs_sum += sum(int(x) for x in v)
        arcs_max = max([arcs_max, *(int(x) for x in v)])
        nonzero += int(np.count_nonzero(v))
    return {"files": files, "functions": functions, "arcs": arcs, "arcs_sum": arcs_sum, "arcs_max": arcs_max,
            "arcs_nonzero": nonzero, "with_summary": with_summary, "gcov_version": ",".join(sorted(versions)),
            "stamps": len(stamps), "bytes": nbytes, "values": dict(sorted(values.items()))}


def fix_per_file(src: Path, runs: int) -> dict[str, bytes]:
    parsed = {rel: walk_gcda((src / rel).read_bytes(), rel) for rel in gcda_rels(src)}
    top = max([0, *(int(g.counters(ARCS).max()) for g in parsed.values() if g.counter_count(ARCS))])
    sum_max = min(top, 0xFFFFFFFF)
    return {rel: g.with_summary(runs, sum_max).to_bytes() for rel, g in parsed.items()}


def tree(root: Path) -> dict[str, bytes]:
    return {rel: (root / rel).read_bytes() for rel in gcda_rels(root)}


# -- random profiles --------------------------------------------------------------------------------------------

_value = st.one_of(st.integers(0, 5), st.integers(0, (1 << 64) - 1), st.sampled_from(TAG_WORDS))
_counts = st.lists(_value, min_size=0, max_size=4)
# Top-N sites: totals (some negative: a merge dropped values), a few values from a small pool (so that inputs share
# some), counts that may look like tags or exceed the total.
_target = st.one_of(st.sampled_from([0, 1, 7, 0x01A10000, 2**63]), st.integers(0, (1 << 64) - 1))
_site = st.tuples(st.one_of(st.integers(0, 50), st.integers(-50, -1), st.sampled_from(TAG_WORDS)),
                  st.lists(st.tuples(_target, st.integers(0, 40)), max_size=4, unique_by=lambda p: p[0]))


@st.composite
def gcda_file(draw: st.DrawFn) -> bytes:
    major = draw(st.integers(9, 14))
    functions = draw(st.lists(_counts, min_size=0, max_size=4))
    return synth_gcda(
        major, draw(st.sampled_from(["<", "<", "<", ">"])), functions,
        summary=draw(st.none() | st.tuples(st.integers(0, 9), st.integers(0, 99))),
        trailer=draw(st.none() | st.just([0]) | st.just([0, 7, 0x01000000])),
        negative=draw(st.booleans()),
        sites=draw(st.lists(st.lists(_site, max_size=3), max_size=len(functions))) if major >= 11 else None,
    )


_profile = st.dictionaries(st.sampled_from(["a.gcda", "b/c.gcda", "b/d.gcda", "e/f/g.gcda"]), gcda_file(),
                           min_size=1, max_size=4)
_settings = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_settings
@given(files=_profile, runs=st.integers(1, 5))
def test_stats_and_fix_equal_per_file(tmp_path_factory: pytest.TempPathFactory, files: dict[str, bytes],
                                      runs: int) -> None:
    root = write_profile(tmp_path_factory.mktemp("p"), files)
    assert profile_stats(root) == stats_per_file(root)
    out = root.parent / (root.name + "-fixed")
    fix_profile(root, out, runs=runs)
    assert tree(out) == fix_per_file(root, runs)


def test_index_takes_kernel_files_and_leaves_the_rest(profiles: Profiles, value_profile: Path) -> None:
    """Every file of the kernel's shape takes the fast path and is indexed exactly as the walk reads it."""
    for root, all_fast in ((profiles.k0, True), (profiles.k1, True), (profiles.mode0, False),
                           (value_profile, False)):
        rels = gcda_rels(root)
        idx = index_image(read_image(root, rels))
        if all_fast:
            assert idx.fast.all()
        for k in np.flatnonzero(idx.fast).tolist():
            g = walk_gcda((root / rels[k]).read_bytes(), rels[k])
            r = slice(int(idx.rec_first[k]), int(idx.rec_first[k + 1]))
            assert idx.rec_tag[r].tolist() == g.tags.tolist()
            assert idx.rec_len[r].tolist() == np.diff(g.offsets).tolist()


def test_fallback_shapes(tmp_path: Path) -> None:
    files = {
        "big.gcda": synth_gcda(12, ">"),
        "neg.gcda": synth_gcda(12, functions=[[0, 0], [5]], negative=True),
        "tagword.gcda": synth_gcda(11, functions=[[0x01000000, 3], [0x01A10000]]),
        "end.gcda": synth_gcda(13, trailer=[0]),
        "plain.gcda": synth_gcda(12),
    }
    root = write_profile(tmp_path / "p", files)
    idx = index_image(read_image(root, gcda_rels(root)))
    fast = dict(zip(gcda_rels(root), idx.fast.tolist()))
    assert fast == {"big.gcda": False, "end.gcda": True, "neg.gcda": False, "plain.gcda": True,
                    "tagword.gcda": False}
    assert profile_stats(root) == stats_per_file(root)


@pytest.mark.parametrize("cut", [3, 8, 20])
def test_defective_file_is_named(tmp_path: Path, cut: int) -> None:
    root = write_profile(tmp_path / "p", {"a.gcda": synth_gcda(12), "b/x.gcda": synth_gcda(12)[:-cut],
                                          "c.gcda": synth_gcda(12)[:5]})
    for call in (lambda: profile_stats(root), lambda: fix_profile(root, tmp_path / "o"),
                 lambda: merge_profiles([root, root], tmp_path / "m")):
        with pytest.raises(GcovFormatError, match=r"b/x\.gcda: "):
            call()
    assert not (tmp_path / "o").exists() and not (tmp_path / "m").exists()


# -- merge ------------------------------------------------------------------------------------------------------

def merge_per_file(dirs: list[Path], factors: list[float], runs: int) -> dict[str, bytes]:
    """Every file through the per-file merge (the weights given are the factors: no normalization)."""
    from kpgo.gcov.merge import _file_output

    plan = make_plan(dirs, factors, False, runs, False, None)
    rels = sorted(set().union(*(gcda_rels(d) for d in dirs)))
    files = fold_files(plan, rels, 0, len(dirs), [[]] * len(dirs))
    out = {rel: _file_output(plan, rel, files.parts[rel]) for rel in rels}
    top = max(m for _, m in out.values())
    return {rel: g.with_summary(runs, min(top, 0xFFFFFFFF)).to_bytes() for rel, (g, _) in out.items()}


@st.composite
def merge_case(draw: st.DrawFn) -> tuple[list[dict[str, bytes]], list[float]]:
    """2-4 profiles of one build: same files and functions, other counters; some files missing from some inputs,
    some inputs with a summary or an end marker in some files (layouts that differ: per-file merge)."""
    n_in = draw(st.integers(2, 4))
    layout = draw(st.dictionaries(st.sampled_from(["a.gcda", "b/c.gcda", "d/e.gcda"]),
                                  st.tuples(st.integers(9, 14), st.lists(st.integers(0, 4), max_size=4),
                                            st.lists(st.integers(0, 3), max_size=4)),
                                  min_size=1, max_size=3))
    inputs = []
    for i in range(n_in):
        files = {}
        for rel, (major, sizes, nsites) in layout.items():
            if i and draw(st.integers(0, 9)) == 0:
                continue  # missing from this input
            counts = [draw(st.lists(_value, min_size=n, max_size=n)) for n in sizes]
            sites = [draw(st.lists(_site, min_size=n, max_size=n)) for n in nsites[: len(sizes)]] if major >= 11 else None
            files[rel] = synth_gcda(major, "<", counts,
                                    summary=(i + 1, 5) if draw(st.integers(0, 5)) == 0 else None,
                                    trailer=[0] if draw(st.integers(0, 5)) == 0 else None, sites=sites)
        inputs.append(files)
    weights = draw(st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.0, 0.5, 1.7]), min_size=n_in, max_size=n_in))
    if not any(weights):
        weights[0] = 1.0
    return inputs, weights


def _input_dirs(base: Path, inputs: list[dict[str, bytes]]) -> list[Path] | None:
    """A merge case's inputs as profile directories under base; None when one of them holds no .gcda."""
    dirs = [write_profile(base / f"in{i}", files) for i, files in enumerate(inputs)]
    for d in dirs:
        d.mkdir(exist_ok=True)
    return None if any(not gcda_rels(d) for d in dirs) else dirs


@_settings
@given(case=merge_case())
def test_merge_equals_per_file(tmp_path_factory: pytest.TempPathFactory,
                               case: tuple[list[dict[str, bytes]], list[float]]) -> None:
    inputs, weights = case
    base = tmp_path_factory.mktemp("m")
    dirs = _input_dirs(base, inputs)
    if dirs is None:
        return
    res = merge_profiles(dirs, base / "out", weights=weights)
    assert tree(base / "out") == merge_per_file(dirs, res["factors"], res["runs"])


@_settings
@given(case=merge_case(), data=st.data())
def test_merge_in_any_grouping(tmp_path_factory: pytest.TempPathFactory,
                               case: tuple[list[dict[str, bytes]], list[float]], data: st.DataObject) -> None:
    """The steps kpgo.cluster runs (fold_inputs over ranges, combine in any grouping and order, fold_files and
    combine_files, finish) give the serial merge's bytes, value sites included."""
    inputs, weights = case
    base = tmp_path_factory.mktemp("g")
    dirs = _input_dirs(base, inputs)
    if dirs is None:
        return
    merge_profiles(dirs, base / "serial", weights=weights)
    plan = make_plan(dirs, weights, False, None, False, None)
    template = Template.load(str(dirs[0]))
    cuts = sorted(data.draw(st.sets(st.integers(1, len(dirs) - 1))))
    ranges = list(zip([0, *cuts], [*cuts, len(dirs)]))
    parts = [fold_inputs(plan, a, b) for a, b in ranges]
    while len(parts) > 1:  # a random tree of combines
        i, j = data.draw(st.lists(st.integers(0, len(parts) - 1), min_size=2, max_size=2, unique=True))
        parts = [p for k, p in enumerate(parts) if k not in (i, j)] + [combine(plan, [parts[i], parts[j]])]
    part = parts[0]
    rels = slow_files(template, part)
    files = combine_files(plan, [fold_files(plan, rels, a, b, [part.inputs[k].unmatched for k in range(a, b)])
                                 for a, b in reversed(ranges)])
    finish(plan, template, part, files, base / "tree")
    assert tree(base / "tree") == tree(base / "serial")


def test_merge_refuses_other_functions(tmp_path: Path) -> None:
    a = write_profile(tmp_path / "a", {"x/y.gcda": synth_gcda(12, functions=[[1, 2], [3]])})
    b = write_profile(tmp_path / "b", {"x/y.gcda": synth_gcda(12, functions=[[1, 2], [3]], idents=[1000, 999])})
    with pytest.raises(UserError, match=r"x/y.gcda: different function ids or checksums"):
        merge_profiles([a, b], tmp_path / "out")
    c = write_profile(tmp_path / "c", {"x/y.gcda": synth_gcda(12, functions=[[1, 2], [3]], stamp=77)})
    with pytest.raises(UserError, match=r"x/y.gcda: profiles from different builds"):
        merge_profiles([a, c], tmp_path / "out")


def test_merge_real_profiles_fast_and_per_file_agree(profiles: Profiles, tmp_path: Path) -> None:
    dirs = [profiles.k0, profiles.k1, profiles.k2, profiles.mode0]
    for weights in ([1, 1, 1, 1], [2, 0, 1, 3], [0.5, 1, 1.25, 1]):
        res = merge_profiles(dirs, tmp_path / f"o{weights}", weights=weights)
        assert tree(tmp_path / f"o{weights}") == merge_per_file(dirs, res["factors"], res["runs"])


# -- compare: .gcno reader and flow solvers ------------------------------------------------------------------------

def test_read_notes_equals_parse_gcno(profiles: Profiles, tmp_path: Path) -> None:
    from kpgo.gcov.gcno import parse_gcno, read_notes

    root = profiles.build.root
    rels = sorted(str(p.relative_to(root)) for p in root.rglob("*.gcno"))
    broken = tmp_path / "broken.gcno"
    broken.write_bytes((root / rels[0]).read_bytes()[:-6])
    t = read_notes([str(root / r) for r in rels] + [str(broken), str(tmp_path / "none.gcno")],
                   rels + ["broken", "none"])
    assert t.names == rels and set(t.errors) == {"broken", "none"} and t.errors["none"] == "missing"
    fn = 0
    for k, rel in enumerate(rels):
        g = parse_gcno((root / rel).read_bytes(), rel)
        assert t.stamps[k] == g.stamp
        assert int(t.func_first[k + 1] - t.func_first[k]) == len(g.functions)
        for f in g.functions:
            a, b = int(t.arc_first[fn]), int(t.arc_first[fn + 1])
            assert (int(t.ident[fn]), int(t.n_blocks[fn]), t.fname[fn]) == (f.ident, f.n_blocks, f.name)
            assert t.arc_src[a:b].tolist() == f.arc_src.tolist() and t.arc_dst[a:b].tolist() == f.arc_dst.tolist()
            assert t.arc_flags[a:b].tolist() == f.arc_flags.tolist()
            fn += 1


def test_tree_and_symbolic_solvers_agree(profiles: Profiles, monkeypatch: pytest.MonkeyPatch) -> None:
    import kpgo.analysis.characterize as c

    rels = [str(p) for p in gcda_files(profiles.k0)]
    fast = c.build_model(profiles.build.root, rels)
    monkeypatch.setattr(c, "TREE_SOLVER", False)
    slow = c.build_model(profiles.build.root, rels)
    assert len(slow.fb_row) and not len(fast.fb_row)
    assert fast.function_names == slow.function_names and fast.sizes == slow.sizes
    for d in (profiles.k0, profiles.k1, profiles.mode2):
        a, b = c.profile_vectors(fast, d), c.profile_vectors(slow, d)
        for k in a:
            assert np.array_equal(a[k], b[k]), k


def test_iter_gcda_unchanged(tmp_path: Path) -> None:
    root = write_profile(tmp_path / "p", {"b/x.gcda": b"", "a.gcda": b"", ".hidden/y.gcda": b"", "c/.z.gcda": b""})
    (root / "d").mkdir()
    os.symlink(root / "b", root / "link")
    assert [str(p) for p in iter_gcda(root)] == ["a.gcda", "b/x.gcda"]
    shutil.rmtree(root)
