"""Value profiles (-fprofile-values, GCC 12) through kpgo's gcda toolkit, on files the real GCC writes at test time:
the parser against gcov-dump-12, merges against gcov-tool-12 (the oracle), stats against figures worked out here from
gcov-dump-12's output, fix, check, compare, and damaged top-N records.

A small program in the shape of a build tree (four objects) has indirect calls through a table of functions, divisions
and modulos by variable divisors, unsigned modulos (interval and pow2 counters) and memcpy/memset of variable sizes.
It is compiled with gcc-12 -O2 -fprofile-arcs -ftest-coverage -fprofile-values and run in four modes: p0-p2 share the
values of lib/spread.c's divisor (1..20), p3 has others (21..40), so a merge with p3 makes that site hold 40 values,
more than the 32 GCC tracks. Every profile also exists in the kernel's shape (k0-k3: no summary, every record with its
payload, no end marker)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_one_line_error, kpgo
from gcov_fixtures import GccBuild, gcda_files, kernelize, kernelize_tree
from kpgo import cli
from kpgo.gcov.gcda import TOPN_MAX_VALUES, counter_tag, index_image, parse_gcda, walk_gcda
from kpgo.gcov.image import gcda_rels, read_image
from kpgo.gcov.merge import (
    Template,
    combine,
    combine_files,
    finish,
    fold_files,
    fold_inputs,
    make_plan,
    merge_profiles,
    slow_files,
)
from kpgo.gcov.profile import value_counters_of

GCC, DUMP, TOOL = "gcc-12", "gcov-dump-12", "gcov-tool-12"

SOURCES = {
    "main.c": r"""
#include <stdlib.h>
long dispatch(long i, long mode);
long divide(long i, long d);
unsigned long umod(unsigned long x, unsigned long m);
void copy(char *dst, const char *src, long n);
long spread(long i, long mode);
static char a[512], b[512];
int main(int argc, char **argv) {
    long mode = argc > 1 ? atol(argv[1]) : 0, n = argc > 2 ? atol(argv[2]) : 1000, s = 0;
    for (long i = 0; i < n; i++) {
        s += dispatch(i, mode);
        s += divide(i, 3 + mode + (i % 4 == 0));     /* divisor mode + 3, a quarter of the time mode + 4 */
        s += umod(i, mode == 2 ? 8 : 3 + (i & 1));    /* a power of two in mode 2 */
        copy(a, b, 16 + 8 * (mode == 1) + (i % 5 == 0));
        s += spread(i, mode);
    }
    return s == 42;
}
""",
    "kernel/ops.c": r"""
typedef long (*op_t)(long);
static long op_add(long x) { return x + 1; }
static long op_mul(long x) { return x * 3; }
static long op_sub(long x) { return x - 7; }
static long op_xor(long x) { return x ^ 5; }
static op_t ops[4] = { op_add, op_mul, op_sub, op_xor };
/* mode 0: op_add 90%; mode 1: four targets, 25% each; mode 2: op_sub 2/3, op_xor 1/3 */
__attribute__((noinline)) long dispatch(long i, long mode) {
    op_t f = ops[mode == 0 ? (i % 10 == 0) : mode == 1 ? (i & 3) : 2 + (i % 3 == 0)];
    return f(i);
}
__attribute__((noinline)) long divide(long i, long d) { return i / d + i % (d + 1); }
""",
    "lib/string.c": r"""
#include <string.h>
__attribute__((noinline)) unsigned long umod(unsigned long x, unsigned long m) { return x % m; }
__attribute__((noinline)) void copy(char *dst, const char *src, long n) { memcpy(dst, src, n); memset(dst + 256, 0, n); }
""",
    "lib/spread.c": r"""
__attribute__((noinline)) long spread(long i, long mode) { return 1000000 / (1 + i % 20 + 20 * (mode == 3)); }
""",
}
FLAGS = ("-O2", "-fprofile-arcs", "-ftest-coverage", "-fprofile-values")
RUNS = {"p0": (0, 1000, 1), "p1": (1, 2000, 1), "p2": (2, 500, 2), "p3": (3, 700, 1)}  # mode, n, runs


@dataclass
class Values:
    build: GccBuild
    p: dict[str, Path]  # as libgcov writes them
    k: dict[str, Path]  # in the kernel's shape


@pytest.fixture(scope="module")
def vp(tmp_path_factory: pytest.TempPathFactory) -> Values:
    for tool in (GCC, DUMP, TOOL):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: install gcc-12 (`make setup` does; CI installs it)")
    root = tmp_path_factory.mktemp("valuebuild")
    for rel, text in SOURCES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    objs = [rel[:-2] + ".o" for rel in SOURCES]
    for rel, obj in zip(SOURCES, objs):
        subprocess.run([GCC, *FLAGS, "-c", rel, "-o", obj], cwd=root, check=True)
    subprocess.run([GCC, "-fprofile-arcs", *objs, "-o", "prog"], cwd=root, check=True)
    build = GccBuild(root=root, exe=root / "prog")
    base = tmp_path_factory.mktemp("valueprofiles")
    p = {name: build.profile(base / name, mode, n, runs) for name, (mode, n, runs) in RUNS.items()}
    build.clear_gcda()
    k = {"k" + name[1:]: kernelize_tree(d, base / ("k" + name[1:])) for name, d in p.items()}
    return Values(build, p, k)


# -- gcov-dump-12, read here (the independent side) ------------------------------------------------------------

_REC = re.compile(r"^\s*([0-9a-f]{8}):\s*(-?\d+):(\w+)(.*)$")
_VALS = re.compile(r"^\s*\d+:((?:\s+-?\d+)+)\s*$")

Site = tuple[int, list[tuple[int, int]]]


def dump(path: Path) -> list[dict]:
    """The records gcov-dump-12 -l prints: tag, length, what, the rest of the line, the counter values."""
    out = subprocess.run([DUMP, "-l", str(path)], check=True, capture_output=True, text=True).stdout
    recs: list[dict] = []
    for line in out.splitlines():
        body = line[len(str(path)) + 1:] if line.startswith(str(path) + ":") else line
        m = _REC.match(body)
        if m:
            recs.append({"tag": int(m.group(1), 16), "length": int(m.group(2)), "what": m.group(3),
                         "kind": m.group(4).split()[0] if m.group(3) == "COUNTERS" else None, "rest": m.group(4),
                         "values": []})
        elif (m := _VALS.match(body)) and recs:
            recs[-1]["values"].extend(int(x) for x in m.group(1).split())
    return recs


def split_sites(values: list[int]) -> list[Site]:
    """A top-N record's counters as sites: total, n, n (value, count) pairs."""
    out, i = [], 0
    while i < len(values):
        total, n = values[i], values[i + 1]
        body = values[i + 2 : i + 2 + 2 * n]
        out.append((total, list(zip(body[0::2], body[1::2]))))
        i += 2 + 2 * n
    return out


def dumped_sites(path: Path, kind: str) -> list[Site]:
    return [s for r in dump(path) if r["kind"] == kind for s in split_sites(r["values"])]


def dumped_counters(path: Path, kind: str) -> list[int]:
    return [v for r in dump(path) if r["kind"] == kind for v in r["values"]]


def dump_lines(path: Path) -> list[str]:
    """gcov-dump-12 -l output without the file name and the object summary (fix changes only that)."""
    out = subprocess.run([DUMP, "-l", str(path)], check=True, capture_output=True, text=True).stdout
    return [ln.split(":", 1)[1] for ln in out.splitlines() if "OBJECT_SUMMARY" not in ln]


def tool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TOOL, *map(str, args)], capture_output=True, text=True)


def tool_merge(out: Path, a: Path, b: Path) -> Path:
    res = tool("merge", "-o", out, a, b)
    assert res.returncode == 0, res.stderr
    return out


def tree(root: Path) -> dict[str, bytes]:
    return {rel: (root / rel).read_bytes() for rel in gcda_rels(root)}


def equal_to_gcov_tool(ours: Path, ref: Path) -> None:
    """Every file byte for byte as gcov-tool-12 wrote it, once the summary is gcov-tool's (it adds the inputs'
    sum_max; kpgo writes the largest merged arc counter, docs/PROFILES.md)."""
    assert gcda_files(ours) == gcda_files(ref)
    for rel in gcda_files(ref):
        theirs = (ref / rel).read_bytes()
        s = parse_gcda(theirs, str(rel)).summary
        assert s is not None
        assert parse_gcda((ours / rel).read_bytes(), str(rel)).with_summary(s.runs, s.sum_max).to_bytes() == theirs, rel


def equal_in_kernel_shape(ours: Path, ref: Path) -> None:
    """Equal once both are in the kernel's shape: gcov-tool writes all-zero records with a negative length and an end
    marker, where kpgo keeps the kernel's shape of its inputs."""
    assert gcda_files(ours) == gcda_files(ref)
    for rel in gcda_files(ref):
        assert kernelize((ours / rel).read_bytes()) == kernelize((ref / rel).read_bytes()), rel


# -- the merge rule, written out here from libgcov's __gcov_merge_topn (the reference for weights and > 32) ------

def reference_sites(inputs: list[list[Site]], factors: list[Fraction]) -> list[Site]:
    """Site by site: totals' magnitudes and counts times the factor, summed exactly and rounded once (half to even);
    values in order of first appearance; over 32 values, the 32 largest counts (ties: the earlier) and a negative
    total, as for a site that was negative in an input. Inputs of factor 0 take no part."""
    out = []
    for s in range(len(inputs[0])):
        total, dropped, vals = Fraction(0), False, {}
        for i, (sites, f) in enumerate(zip(inputs, factors)):
            if not f:
                continue
            t, pairs = sites[s]
            total += abs(t) * f
            dropped |= t < 0
            for k, (v, c) in enumerate(pairs):
                if v in vals:
                    vals[v][0] += c * f
                else:
                    vals[v] = [c * f, (i, k)]
        rows = sorted(((v, round(c), key) for v, (c, key) in vals.items()), key=lambda r: r[2])
        if len(rows) > TOPN_MAX_VALUES:
            dropped = True
            rows = sorted(sorted(rows, key=lambda r: (-r[1], r[2]))[:TOPN_MAX_VALUES], key=lambda r: r[2])
        t = round(total)
        out.append((-t if dropped else t, [(v, c) for v, c, _ in rows]))
    return out


def sites_of(root: Path, rel: str, kind: str) -> list[Site]:
    return dumped_sites(root / rel, kind)


# -- parsing ---------------------------------------------------------------------------------------------------

def test_parser_reads_value_records_as_gcov_dump_does(vp: Values, tmp_path: Path) -> None:
    ref = tool_merge(tmp_path / "m", vp.p["p0"], vp.p["p1"])
    kinds_seen: set[str] = set()
    for root in [*vp.p.values(), *vp.k.values(), ref]:
        rels = gcda_rels(root)
        idx = index_image(read_image(root, rels))
        if root in vp.k.values():
            assert idx.fast.all(), root  # the kernel's shape takes the whole-profile path
        for k, rel in enumerate(rels):
            path = root / rel
            data = path.read_bytes()
            g = parse_gcda(data, str(path))
            w = walk_gcda(data, str(path))
            assert g.to_bytes() == data and w.to_bytes() == data
            for f in ("tags", "lengths", "offsets", "payload", "trailer"):
                assert np.array_equal(getattr(g, f), getattr(w, f)), (path, f)
            assert [(int(t), abs(int(n))) for t, n in zip(g.tags, g.lengths.view(np.int32))] == \
                   [(r["tag"], abs(r["length"])) for r in dump(path)]
            for kind in sorted(g.layout.topn_kinds & g.counter_kinds_present()):
                name = g.layout.kind_name(kind)
                kinds_seen.add(name)
                sites = g.sites(kind)
                assert [sites.site(i) for i in range(len(sites))] == dumped_sites(path, name), (path, name)
                assert g.with_sites(kind, sites).to_bytes() == data
                if idx.fast[k]:  # the whole-profile index holds the same sites
                    r0, r1 = int(idx.rec_first[k]), int(idx.rec_first[k + 1])
                    mask = np.zeros(len(idx.rec_tag), dtype=bool)
                    mask[r0:r1] = idx.rec_tag[r0:r1] == counter_tag(kind)
                    isites, _ = idx.sites(mask)
                    assert [isites.site(i) for i in range(len(isites))] == dumped_sites(path, name)
    assert kinds_seen == {"topn", "indirect_call"}
    g = parse_gcda((vp.k["k0"] / "main.gcda").read_bytes(), "main.gcda")
    assert {g.layout.kind_name(k) for k in g.counter_kinds_present()} >= {"arcs", "time_profiler"}
    lib = parse_gcda((vp.k["k0"] / "lib/string.gcda").read_bytes(), "string.gcda")
    assert {lib.layout.kind_name(k) for k in lib.counter_kinds_present()} >= {"interval", "pow2", "average", "ior", "topn"}


# -- merge against gcov-tool-12 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("pair", [("0", "1"), ("1", "2"), ("2", "0")])
def test_two_way_merge_equals_gcov_tool(vp: Values, tmp_path: Path, pair: tuple[str, str]) -> None:
    a, b = pair
    # As libgcov writes them: per file (they are not in the kernel's shape); byte for byte but the summary.
    ref = tool_merge(tmp_path / "ref", vp.p["p" + a], vp.p["p" + b])
    merge_profiles([vp.p["p" + a], vp.p["p" + b]], tmp_path / "ours")
    equal_to_gcov_tool(tmp_path / "ours", ref)
    # In the kernel's shape: the whole-profile path, files with sites matched by record.
    kref = tool_merge(tmp_path / "kref", vp.k["k" + a], vp.k["k" + b])
    res = merge_profiles([vp.k["k" + a], vp.k["k" + b]], tmp_path / "kours")
    equal_in_kernel_shape(tmp_path / "kours", kref)
    assert res["value_sites"] == {"sites": 7, "dropped": 0}  # 4 divisions and modulos, 2 string sizes, 1 call


def test_three_way_merge_equals_gcov_tool_in_either_grouping(vp: Values, tmp_path: Path) -> None:
    """Below 32 values a site, GCC's own rule is associative: (p0+p1)+p2 and p0+(p1+p2) give the same bytes, and so
    does kpgo's one merge of the three."""
    left = tool_merge(tmp_path / "l", tool_merge(tmp_path / "l1", vp.k["k0"], vp.k["k1"]), vp.k["k2"])
    right = tool_merge(tmp_path / "r", vp.k["k0"], tool_merge(tmp_path / "r1", vp.k["k1"], vp.k["k2"]))
    assert tree(left) == tree(right)
    merge_profiles([vp.k["k0"], vp.k["k1"], vp.k["k2"]], tmp_path / "ours")
    equal_in_kernel_shape(tmp_path / "ours", left)
    merge_profiles([vp.p["p0"], vp.p["p1"], vp.p["p2"]], tmp_path / "ours-libgcov")
    equal_to_gcov_tool(tmp_path / "ours-libgcov", tool_merge(tmp_path / "pl", tool_merge(tmp_path / "pl1", vp.p["p0"],
                                                                                            vp.p["p1"]), vp.p["p2"]))


@pytest.mark.parametrize("w", [(2, 3), (3, 1)])
def test_weighted_merge_equals_gcov_tool_of_copies(vp: Values, tmp_path: Path, w: tuple[int, int]) -> None:
    """gcov-tool-12 merge -w aborts on top-N records (libgcov's merge scales the pair count n with the weight and
    reads past the site: an internal compiler error). What -w means for every other count, and what kpgo does, is
    the merge of w copies: gcov-tool's unweighted merge of w1 copies of A and w2 of B, one after the other."""
    a, b = vp.k["k0"], vp.k["k1"]
    crash = tool("merge", "-w", f"{w[0]},{w[1]}", "-o", tmp_path / "crash", a, b)
    assert crash.returncode != 0 and "internal compiler error" in crash.stderr
    copies = [a] * w[0] + [b] * w[1]
    ref = copies[0]
    for i, d in enumerate(copies[1:]):
        ref = tool_merge(tmp_path / f"c{i}", ref, d)
    merge_profiles([a, b], tmp_path / "ours", weights=[float(x) for x in w])
    equal_in_kernel_shape(tmp_path / "ours", ref)


def test_fractional_weights_and_normalize_follow_the_rule(vp: Values, tmp_path: Path) -> None:
    """Fractional factors (weights, --normalize's scales) on every kind, against the rule written out here from the
    inputs' gcov-dump: sums rounded once, ior OR, time_profiler smallest non-zero, top-N sites as reference_sites."""
    ins = [vp.k["k0"], vp.k["k1"], vp.k["k2"]]
    arcs = [sum(v for rel in gcda_files(d) for v in dumped_counters(d / rel, "arcs")) for d in ins]
    for out, kw, factors in (
        ("w", {"weights": [0.5, 1.25, 3.0]}, [Fraction(0.5), Fraction(1.25), Fraction(3)]),
        ("n", {"normalize": True}, [Fraction(max(arcs) / t) for t in arcs]),
    ):
        res = merge_profiles(ins, tmp_path / out, **kw)  # type: ignore[arg-type]
        assert [Fraction(f) for f in res["factors"]] == factors
        for rel in gcda_files(ins[0]):
            path = tmp_path / out / rel
            for kind in ("arcs", "interval", "pow2", "average"):
                cols = list(zip(*(dumped_counters(d / rel, kind) for d in ins)))
                assert dumped_counters(path, kind) == [round(sum(c * f for c, f in zip(col, factors))) for col in cols]
            cols = list(zip(*(dumped_counters(d / rel, "ior") for d in ins)))
            assert dumped_counters(path, "ior") == [a | b | c for a, b, c in cols]
            cols = list(zip(*(dumped_counters(d / rel, "time_profiler") for d in ins)))
            assert dumped_counters(path, "time_profiler") == [min([c for c in col if c] or [0]) for col in cols]
            for kind in ("topn", "indirect_call"):
                assert sites_of(tmp_path / out, str(rel), kind) == \
                       reference_sites([sites_of(d, str(rel), kind) for d in ins], factors), (out, rel, kind)


def test_site_over_32_values(vp: Values, tmp_path: Path) -> None:
    """lib/spread.c's divisor takes 20 values in p0 and 20 others in p3. GCC, merging p3 into p0, appends 12 and then
    evicts as it goes (each new value makes the least frequent one lose a count), so what it keeps depends on the
    order of its merges. kpgo keeps the 32 largest exact counts, whatever the grouping; both negate the total."""
    rel = "lib/spread.gcda"
    ref = tool_merge(tmp_path / "ref", vp.k["k0"], vp.k["k3"])
    res = merge_profiles([vp.k["k0"], vp.k["k3"]], tmp_path / "ours")
    ours = sites_of(tmp_path / "ours", rel, "topn")
    theirs = sites_of(ref, rel, "topn")
    inputs = [sites_of(vp.k[k], rel, "topn") for k in ("k0", "k3")]
    assert [len(p) for _, p in inputs[0]] == [20] and [len(p) for _, p in inputs[1]] == [20]
    assert ours == reference_sites(inputs, [Fraction(1), Fraction(1)])
    assert ours[0][0] == theirs[0][0] == -(inputs[0][0][0] + inputs[1][0][0])
    assert len(ours[0][1]) == len(theirs[0][1]) == 32
    assert ours[0][1] != theirs[0][1]  # GCC's counts were decremented by its evictions
    assert res["value_sites"]["dropped"] == 1
    # The other way round: the same values and counts (listed in the other order of first appearance).
    merge_profiles([vp.k["k3"], vp.k["k0"]], tmp_path / "swapped")
    swapped = sites_of(tmp_path / "swapped", rel, "topn")
    assert swapped[0][0] == ours[0][0] and sorted(swapped[0][1]) == sorted(ours[0][1])
    # Every other file is gcov-tool's, byte for byte in the kernel's shape.
    for other in gcda_files(ref):
        if str(other) != rel:
            assert kernelize((tmp_path / "ours" / other).read_bytes()) == kernelize((ref / other).read_bytes())


def test_any_grouping_gives_the_same_bytes(vp: Values, tmp_path: Path) -> None:
    """The steps of kpgo.cluster's tree merge, in several groupings and orders, give the serial merge's bytes: with
    fractional weights, a site over 32 values, and a libgcov-shaped input (its files merged per file)."""
    weights = [1.0, 0.5, 2.0, 1.5]
    for m, dirs in enumerate(([vp.k["k0"], vp.k["k3"], vp.k["k1"], vp.k["k2"]],    # whole-profile path
                              [vp.k["k0"], vp.k["k3"], vp.k["k1"], vp.p["p2"]])):  # p2: every file per file
        merge_profiles(dirs, tmp_path / f"serial{m}", weights=weights)
        serial = tree(tmp_path / f"serial{m}")
        plan = make_plan(dirs, weights, False, None, False, None)
        template = Template.load(str(dirs[0]))
        for n, (ranges, order) in enumerate([
            ([(0, 1), (1, 2), (2, 3), (3, 4)], [3, 1, 2, 0]),
            ([(0, 2), (2, 4)], [1, 0]),
            ([(0, 3), (3, 4)], [0, 1]),
            ([(0, 1), (1, 4)], [1, 0]),
        ]):
            parts = [fold_inputs(plan, a, b) for a, b in ranges]
            part = combine(plan, [combine(plan, [parts[i] for i in order[:2]]), *(parts[i] for i in order[2:])])
            rels = slow_files(template, part)
            assert bool(rels) == (m == 1)
            files = combine_files(plan, [fold_files(plan, rels, a, b, [part.inputs[k].unmatched for k in range(a, b)])
                                         for a, b in reversed(ranges)])
            finish(plan, template, part, files, tmp_path / f"tree{m}-{n}")
            assert tree(tmp_path / f"tree{m}-{n}") == serial, (m, ranges, order)
        assert parse_gcda(serial["lib/spread.gcda"], "s").sites(3).site(0)[0] < 0


# -- stats, fix, check, compare ------------------------------------------------------------------------------------

def ipa_probability(count: int, total: int) -> int:
    """GCC 12's target probability in 1/10000 (profile_probability: 2^27 fixed point, rounded twice)."""
    count = min(count, total)
    if count == total:
        return 10000
    return ((count * 2**27 + total // 2) // total * 10000 + 2**26) // 2**27


def figures_from_dump(root: Path) -> dict[str, dict[str, int]]:
    """`kpgo profile stats`' "values", worked out from gcov-dump-12 -l of every file."""
    out: dict[str, dict[str, int]] = {}
    for rel in gcda_files(root):
        for r in dump(root / rel):
            kind = r["kind"]
            if kind is None or kind == "arcs":
                continue
            if kind in ("topn", "indirect_call"):
                f = out.setdefault(kind, dict.fromkeys(("sites", "sites_with_values", "values", "total", "dropped",
                                                        "dominant"), 0))
                for total, pairs in split_sites(r["values"]):
                    f["sites"] += 1
                    f["sites_with_values"] += bool(pairs)
                    f["values"] += len(pairs)
                    f["total"] += abs(total)
                    f["dropped"] += total < 0
                    if kind == "indirect_call":
                        top = max([c for v, c in pairs if v and c > 0], default=0)
                        f["dominant"] += top > 0 and ipa_probability(top, abs(total)) >= 5000
                    elif pairs:
                        f["dominant"] += 2 * max(c for _, c in pairs) >= abs(total)
            else:
                f = out.setdefault(kind, {"counters": 0, "nonzero": 0})
                n = (r["length"] if r["length"] >= 0 else -r["length"]) // 8
                f["counters"] += n
                f["nonzero"] += sum(1 for v in r["values"] if v)
    return dict(sorted(out.items()))


def test_stats_figures_equal_gcov_dumps(vp: Values, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    merge_profiles([vp.k["k0"], vp.k["k3"]], tmp_path / "dropped")
    for root in (vp.k["k0"], vp.p["p2"], vp.k["k1"], tmp_path / "dropped"):
        assert cli.main(["profile", "stats", str(root), "--json"]) == 0
        got = json.loads(capsys.readouterr().out)["values"]
        assert got == figures_from_dump(root), root
    assert got["topn"]["dropped"] == 1
    assert cli.main(["profile", "stats", str(vp.k["k0"])]) == 0
    text = capsys.readouterr().out
    f = figures_from_dump(vp.k["k0"])["indirect_call"]
    assert f"indirect_call  {f['sites']} sites, {f['sites_with_values']} with values ({f['values']} values), " \
           f"total {f['total']}, {f['dominant']} with a target >= 50%, which GCC 12 promotes" in text
    assert re.search(r"^  interval +\d+ counters \(\d+ non-zero\)$", text, re.M)


@pytest.mark.parametrize("mode", [0, 1])
def test_dominant_targets_are_the_calls_gcc_promotes(vp: Values, tmp_path: Path, mode: int) -> None:
    """kernel/ops.c's dispatch calls one of four functions: op_add 90% of the time in mode 0, each 25% in mode 1.
    stats' dominant indirect calls are the speculative calls gcc-12 -fprofile-use makes of them."""
    use = tmp_path / "use"
    (use / "kernel").mkdir(parents=True)
    shutil.copyfile(vp.build.root / "kernel/ops.c", use / "kernel/ops.c")
    shutil.copyfile(vp.p[f"p{mode}"] / "kernel/ops.gcda", use / "kernel/ops.gcda")
    subprocess.run([GCC, "-O2", "-fprofile-use", "-fdump-ipa-profile_estimate", "-c", "kernel/ops.c", "-o", "kernel/ops.o"],
                   cwd=use, check=True)
    estimate = next(use.glob("**/*profile_estimate")).read_text()
    produced = int(re.search(r"^(\d+) \([\d.]+%\) speculations produced", estimate, re.M).group(1))
    figures = value_counters_of(parse_gcda((use / "kernel/ops.gcda").read_bytes(), "ops.gcda"))["indirect_call"]
    assert figures["sites_with_values"] == 1
    assert figures["dominant"] == produced == (1 if mode == 0 else 0)


def test_fix_keeps_value_records(vp: Values, tmp_path: Path) -> None:
    for name, root in (("k", vp.k["k1"]), ("p", vp.p["p2"])):
        assert cli.main(["profile", "fix", str(root), "-o", str(tmp_path / name)]) == 0
        for rel in gcda_files(root):
            assert dump_lines(tmp_path / name / rel) == dump_lines(root / rel), rel
            s = parse_gcda((tmp_path / name / rel).read_bytes(), str(rel)).summary
            assert s is not None and s.runs == 1


def test_arcs_is_what_an_arc_only_build_writes(vp: Values, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`kpgo profile arcs`: the same program built without -fprofile-values and run the same way writes exactly the
    records the copy holds (gcov-dump-12, header aside: stamps differ per compile); gcc-12 -fprofile-use then makes no
    speculative call of kernel/ops.c's 90% target, which it makes from the value profile. The input stays as it was."""
    arcs_build = tmp_path / "arcs-build"
    arcs_build.mkdir()
    for rel, text in SOURCES.items():
        (arcs_build / rel).parent.mkdir(parents=True, exist_ok=True)
        (arcs_build / rel).write_text(text)
    objs = [rel[:-2] + ".o" for rel in SOURCES]
    for rel, obj in zip(SOURCES, objs):
        subprocess.run([GCC, *(f for f in FLAGS if f != "-fprofile-values"), "-c", rel, "-o", obj], cwd=arcs_build, check=True)
    subprocess.run([GCC, "-fprofile-arcs", *objs, "-o", "prog"], cwd=arcs_build, check=True)
    mode, n, runs = RUNS["p0"]
    expected = GccBuild(root=arcs_build, exe=arcs_build / "prog").profile(tmp_path / "expected", mode, n, runs)

    before = tree(vp.p["p0"])
    assert cli.main(["profile", "arcs", str(vp.p["p0"]), "-o", str(tmp_path / "arcs")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"copied 4 files with their arc counters only .*counters dropped: .*indirect_call [\d,]+.*time_profiler", out)
    assert tree(vp.p["p0"]) == before

    def records(path: Path) -> list[str]:
        return [ln for ln in dump_lines(path) if "magic" not in ln and "stamp" not in ln]

    for rel in gcda_files(expected):
        got = records(tmp_path / "arcs" / rel)
        assert got == records(expected / rel), rel
        assert not [r for r in dump(tmp_path / "arcs" / rel) if r["kind"] not in (None, "arcs")]
    assert any(r["kind"] == "indirect_call" for r in dump(vp.p["p0"] / "kernel/ops.gcda"))

    use = tmp_path / "use"
    (use / "kernel").mkdir(parents=True)
    shutil.copyfile(vp.build.root / "kernel/ops.c", use / "kernel/ops.c")
    shutil.copyfile(tmp_path / "arcs" / "kernel/ops.gcda", use / "kernel/ops.gcda")
    subprocess.run([GCC, "-O2", "-fprofile-use", "-fdump-ipa-profile_estimate", "-c", "kernel/ops.c", "-o", "kernel/ops.o"],
                   cwd=use, check=True)
    estimate = next(use.glob("**/*profile_estimate")).read_text()
    assert int(re.search(r"^(\d+) \([\d.]+%\) speculations produced", estimate, re.M).group(1)) == 0

    # --time-profile: time_profiler as the source has it, every value counter zero (GCC 12 crashes on a file with
    # time_profiler but no value records), and gcc-12 compiles it without a speculative call
    assert cli.main(["profile", "arcs", str(vp.p["p0"]), "-o", str(tmp_path / "tp"), "--time-profile"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"arc and time_profiler counters .*value counters zeroed: .*indirect_call [\d,]+", out), out
    assert "time_profiler" not in out.split("zeroed:")[1]
    for rel in gcda_files(vp.p["p0"]):
        src, got = dump(vp.p["p0"] / rel), dump(tmp_path / "tp" / rel)
        assert [r["tag"] for r in got] == [r["tag"] for r in src], rel
        for a, b in zip(src, got):
            if a["kind"] in (None, "arcs", "time_profiler"):
                assert a == b, (rel, a["what"])
            else:
                assert not any(b["values"]), (rel, b)  # a top-N site: total 0, no values
                assert a["kind"] in ("topn", "indirect_call") or b["length"] == a["length"], (rel, b)
        assert any(r["kind"] == "time_profiler" and any(r["values"]) for r in got), rel
    assert json.loads((tmp_path / "tp" / "profile.json").read_text())["arcs_only"]["time_profile"] is True
    shutil.copyfile(tmp_path / "tp" / "kernel/ops.gcda", use / "kernel/ops.gcda")
    for f in use.glob("**/*profile_estimate"):
        f.unlink()
    subprocess.run([GCC, "-O2", "-fprofile-use", "-fdump-ipa-profile_estimate", "-c", "kernel/ops.c", "-o", "kernel/ops.o"],
                   cwd=use, check=True)
    estimate = next(use.glob("**/*profile_estimate")).read_text()
    assert int(re.search(r"^(\d+) \([\d.]+%\) speculations produced", estimate, re.M).group(1)) == 0

    # kernel-shaped input; an output that exists is refused before anything is written
    assert cli.main(["profile", "arcs", str(vp.k["k1"]), "-o", str(tmp_path / "k1"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["files"] == 4
    assert_one_line_error(kpgo("profile", "arcs", vp.k["k1"], "-o", tmp_path / "k1"), 1, "exists")


def test_check_and_compare_report_value_counters(vp: Values, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["profile", "check", str(vp.k["k0"]), "--build", str(vp.build.root), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["all_matched"]
    want = figures_from_dump(vp.k["k0"])
    assert {k: {f: n for f, n in v.items() if f != "in_matched_files"} for k, v in res["values"].items()} == want
    assert all(v["in_matched_files"] == v.get("sites", v.get("counters")) for v in res["values"].values())
    assert cli.main(["profile", "compare", str(vp.k["k0"]), str(vp.k["k1"]), "--build", str(vp.build.root), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["values"] == [want, figures_from_dump(vp.k["k1"])]
    assert res["matrices"]["function_cosine"][0][0] == 1.0


# -- damaged top-N records -----------------------------------------------------------------------------------------

def _first_site(data: bytes) -> tuple[np.ndarray, int, int]:
    """The words of a kernel-shaped file with sites, the word position of its first top-N record with sites, and its
    payload length in words."""
    w = np.frombuffer(data, dtype="<u4").copy()
    g = parse_gcda(data, "x")
    pos = 4
    for i, tag in enumerate(g.tags.tolist()):
        size = int(g.offsets[i + 1] - g.offsets[i])
        if tag in (0x01A70000, 0x01A90000) and size:
            return w, pos, size
        pos += 2 + size
    raise AssertionError("no top-N record with sites")


def _damage(data: bytes, how: str) -> bytes:
    w, pos, size = _first_site(data)
    n = pos + 2 + 2  # the first site's n (low word)
    if how == "n-past-end":  # one pair more than the record has room for
        w[n] = (size - 4) // 4 + 1
    elif how == "negative-n":
        w[n] = w[n + 1] = 0xFFFFFFFF
    elif how == "n-above-32":
        w[n] = 33
    elif how == "truncated":  # the record (and file) cut inside its last pair
        w[pos + 1] -= 8
        return np.concatenate([w[: pos + 2 + size - 2], w[pos + 2 + size :]]).astype("<u4").tobytes()
    elif how == "short-header":  # a record that ends two words into a site
        w[pos + 1] = 8
        return np.concatenate([w[: pos + 4], w[pos + 2 + size :]]).astype("<u4").tobytes()
    return w.astype("<u4").tobytes()


CASES = {
    "n-past-end": "past the end of the record",
    "negative-n": "has a negative value count (-1)",
    "n-above-32": "has 33 values, more than the 32 GCC tracks at a site",
    "truncated": "past the end of the record",
    "short-header": "ends inside a site's header",
}


@pytest.mark.parametrize("how", sorted(CASES))
def test_damaged_site_is_one_line_error(vp: Values, tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]) -> None:
    rel = "kernel/ops.gcda"
    bad = shutil.copytree(vp.k["k0"], tmp_path / "bad")
    (bad / rel).write_bytes(_damage((bad / rel).read_bytes(), how))
    before = tree(bad)
    other = vp.k["k1"]
    for argv in (["profile", "stats", str(bad)], ["profile", "fix", str(bad), "-o", str(tmp_path / "f")],
                 ["profile", "merge", str(other), str(bad), "-o", str(tmp_path / "m")],
                 ["profile", "merge", str(bad), str(other), "-o", str(tmp_path / "m2"), "--weights", "1,0.5"]):
        assert cli.main(argv) == 1, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("kpgo: error: ") and "Traceback" not in err[0], err
        assert f"{bad / rel}: " in err[0] and re.search(r": site \d+ at byte \d+ ", err[0]) and CASES[how] in err[0], err[0]
    assert tree(bad) == before
    assert not any(p.name.startswith(("f", "m", ".f", ".m")) for p in tmp_path.iterdir())
    if how == "negative-n":  # and through the real command line, as a user runs it
        res = kpgo("profile", "merge", other, bad, "-o", tmp_path / "cli")
        assert_one_line_error(res, 1, f"{bad / rel}: ", CASES[how])
        assert not (tmp_path / "cli").exists() and tree(bad) == before
