"""`kpgo profile port` on real GCC output: a small program built instrumented from two versions of its source,
(1) a function whose lines only moved (blank lines above it; a static one too, read all the same: its id hashes its file's path, not its line),
(2) a function whose control flow changed (an `if` added), (3) a function removed and one added, an object only in
the old build and one only in the new, (4) an unchanged function. The old build's profile is ported and held to a
fresh profile of the new build from the same workload, and to GCC itself (-fprofile-use -Wcoverage-mismatch, and
kpgo's proof from GCC's dump)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_one_line_error, kpgo
from gcov_fixtures import require_gcc
from kpgo.gcov import flow
from kpgo.gcov.gcda import ARCS, read_gcda
from kpgo.gcov.gcno import GcnoFunction, read_gcno
from kpgo.gcov.port import port_profile
from kpgo.gcov.profile import check_for_build, fix_profile
from kpgo.gcov.validate import check_profile
from kpgo.kernel import kbuild, proof

MAIN = r"""
#include <stdlib.h>
int unchanged(int i);
int moved(int i);
int changed(int i);
int %(extra)s(int i);
int %(other)s(int i);
int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    long s = 0;
    for (int i = 0; i < n; i++) {
        s += unchanged(i);
        s += moved(i);
        s += changed(i);
        s += %(extra)s(i);
        if (i %% 5 == 0)
            s += %(other)s(i);
    }
    return s == 42;
}
"""

UNCHANGED = r"""
__attribute__((noinline)) int unchanged(int i) {
    int r = 0;
    if (i % 4 == 0)
        r += i * 3;
    else if (i % 4 == 1)
        r -= 2;
    return r;
}
"""

MOVED = r"""
__attribute__((noinline)) static int scale(int x) { if (x & 1) return x * 5; return x; }
__attribute__((noinline)) int moved(int i) {
    int r = 0;
    for (int k = 0; k < (i & 3); k++)
        r += scale(k);
    return r;
}
"""

CHANGED_OLD = r"""
__attribute__((noinline)) int changed(int i) {
    int r = 0;
    for (int k = 0; k < (i & 7); k++)
        r += k * i;
    if (i % 3 == 0)
        r -= 7;
    return r;
}
"""

CHANGED_NEW = r"""
__attribute__((noinline)) int changed(int i) {
    int r = 0;
    for (int k = 0; k < (i & 7); k++)
        r += k * i;
    if (i & 64)
        r += 1;
    if (i % 3 == 0)
        r -= 7;
    return r;
}
"""

REMOVED = r"""
__attribute__((noinline)) int removed(int i) { return i % 7 ? i : -i; }
"""

ADDED = r"""
__attribute__((noinline)) int added(int i) { return i % 9 ? i : -i; }
"""

GONE = "int gone(int i) { if (i > 10) return i / 2; return i; }\n"
FRESH = "int fresh(int i) { if (i > 20) return i / 3; return i; }\n"

OLD = {
    "main.c": MAIN % {"extra": "removed", "other": "gone"},
    "lib/lib.c": UNCHANGED + MOVED + CHANGED_OLD + REMOVED,
    "drivers/gone.c": GONE,
}
NEW = {
    "main.c": MAIN % {"extra": "added", "other": "fresh"},
    "lib/lib.c": UNCHANGED + "\n\n\n" + MOVED + CHANGED_NEW + ADDED,
    "drivers/fresh.c": FRESH,
}
FLAGS = ("-O2", "--coverage")
N = 700


def compile_tree(root: Path, sources: dict[str, str], flags: tuple[str, ...]) -> list[str]:
    """Compile each source like Kbuild (from the build directory, -o dir/x.o); returns the objects."""
    objs = []
    for rel, text in sources.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for rel in sources:
        obj = rel[:-2] + ".o"
        subprocess.run(["gcc", *flags, "-c", rel, "-o", obj], cwd=root, check=True, capture_output=True, text=True)
        objs.append(obj)
    return objs


def instrumented(root: Path, sources: dict[str, str]) -> Path:
    objs = compile_tree(root, sources, FLAGS)
    subprocess.run(["gcc", "--coverage", *objs, "-o", "prog"], cwd=root, check=True)
    return root


def profile_of(build: Path, dst: Path) -> Path:
    """Run the program once and take its .gcda as a kernel profile directory."""
    for p in build.rglob("*.gcda"):
        p.unlink()
    subprocess.run([str(build / "prog"), str(N)], cwd=build, check=False)
    for p in build.rglob("*.gcda"):
        (dst / p.relative_to(build)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, dst / p.relative_to(build))
        p.unlink()
    return dst


@dataclass
class World:
    old: Path
    new: Path
    profile: Path  # of the old build
    fresh: Path  # of the new build, the same workload
    ported: Path
    report: dict


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    require_gcc()
    base = tmp_path_factory.mktemp("port")
    old = instrumented(base / "old", OLD)
    new = instrumented(base / "new", NEW)
    profile = profile_of(old, base / "profile")
    fresh = profile_of(new, base / "fresh")
    report = port_profile(profile, old, new, base / "ported")
    return World(old, new, profile, fresh, base / "ported", report)


def functions(profile: Path, build: Path, rel: str) -> dict[str, tuple[GcnoFunction, np.ndarray]]:
    """name -> (its .gcno function, its arc counters) of one object of a profile."""
    notes = {f.ident: f for f in read_gcno(build / (rel + ".gcno")).functions}
    out = {}
    for fr in read_gcda(profile / (rel + ".gcda")).functions():
        if fr.ident is not None:
            f = notes[fr.ident]
            out[f.name or ""] = (f, fr.counters[ARCS])
    return out


def counts(fn: GcnoFunction, c: np.ndarray) -> tuple[list[int], list[int]]:
    expr = flow.solve_function(fn)
    assert expr is not None
    return [flow.evaluate(e, c) for e in expr], [flow.evaluate(e, c) for e in flow.block_counts(fn, expr)]


def test_statuses_and_report(world: World) -> None:
    r = world.report
    fns = {(f["object"], f["function"]): f for f in r["functions"]}
    assert fns[("lib/lib.o", "moved")]["status"] == "carried"
    assert fns[("lib/lib.o", "scale")]["status"] == "carried"  # static: its id changed with its line
    assert fns[("lib/lib.o", "changed")]["status"] == "mapped"
    assert fns[("lib/lib.o", "removed")]["status"] == "dropped"
    assert ("lib/lib.o", "unchanged") not in fns  # kept: only the others are listed
    assert r["objects"]["drivers/gone.o"]["status"] == "dropped"
    assert r["new_objects"] == ["drivers/fresh.o"]
    t = r["total"]
    assert t["weight"] == sum(t[s] for s in ("kept", "carried", "mapped", "dropped")) > 0
    assert t["weight"] == sum(o["weight"] for o in r["objects"].values())
    assert t["objects"] == {"ported": 2, "dropped": 1, "new": 1}
    assert r["objects"]["main.o"]["kept"] == r["objects"]["main.o"]["weight"]  # unchanged object
    rec = json.loads((world.ported / "profile.json").read_text())
    assert rec["ported"]["report"]["total"] == json.loads(json.dumps(t))
    assert rec["ported"]["source"] == str(world.profile) and rec["ported"]["to_build"] == str(world.new)


def test_unchanged_and_moved_counters_exact(world: World) -> None:
    ported = functions(world.ported, world.new, "lib/lib")
    fresh = functions(world.fresh, world.new, "lib/lib")
    old = functions(world.profile, world.old, "lib/lib")
    for name in ("unchanged", "moved", "scale"):
        assert np.array_equal(ported[name][1], fresh[name][1]), name  # the same workload on the new build
        assert np.array_equal(ported[name][1], old[name][1]), name
    assert "removed" not in ported and "added" not in ported  # no profile: GCC estimates them
    assert set(functions(world.ported, world.new, "main")) == {"main"}
    assert not (world.ported / "drivers/gone.gcda").exists() and not (world.ported / "drivers/fresh.gcda").exists()


def consistent_counts(profile: Path, build: Path) -> tuple[list[int], list[int]]:
    """The changed function's block counts in a profile and the fresh one's, its flow checked conserved."""
    fn, c = functions(profile, build, "lib/lib")["changed"]
    arcs, blocks = counts(fn, c)
    assert min(arcs) >= 0  # flow conserved: every count non-negative, what enters a block leaves it
    for b in range(2, fn.n_blocks):
        ins = [a for a in range(len(arcs)) if fn.arc_dst[a] == b]
        outs = [a for a in range(len(arcs)) if fn.arc_src[a] == b]
        if ins and outs:
            assert sum(arcs[a] for a in ins) == sum(arcs[a] for a in outs)
    return blocks, counts(*functions(profile.parent / "fresh", build, "lib/lib")["changed"])[1]


def test_changed_function_mapped_by_source(world: World) -> None:
    blocks, true = consistent_counts(world.ported, world.new)
    assert blocks[0] == true[0] == N  # called as often as before
    # Every block of the old code keeps its count (the loop, the old `if`); the added `if`, which no old count
    # tells, is split evenly (fresh: taken 320 of 700 times).
    new_if = [b for b in range(len(blocks)) if blocks[b] != true[b]]
    assert len(new_if) == 1 and blocks[new_if[0]] == N // 2 and true[new_if[0]] == 320, (blocks, true)
    assert "by the source's diff" in next(f["reason"] for f in world.report["functions"] if f["function"] == "changed")


def test_changed_function_mapped_without_source(world: World, tmp_path: Path) -> None:
    report = port_profile(world.profile, world.old, world.new, world.profile.parent / "ported-nosource", use_source=False)
    changed = next(f for f in report["functions"] if f["function"] == "changed")
    assert changed["status"] == "mapped" and "by line numbers" in changed["reason"]
    blocks, true = consistent_counts(world.profile.parent / "ported-nosource", world.new)
    assert blocks[0] == true[0] == N
    assert sum(b == t for b, t in zip(blocks, true)) >= len(true) - 2  # the two `if`s cannot be told apart: both split evenly


def test_fixed_and_checked(world: World) -> None:
    info = check_for_build(world.ported)  # summaries, one version: what `kpgo build --profile` needs
    assert info["files"] == 2
    chk = check_profile(world.ported, world.new)
    assert chk["all_matched"], chk["problems"]


def mismatch_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if re.search(r"coverage.mismatch|does not match its profile|source locations .* changed", ln)]


def use_profile(sources: dict[str, str], profile: Path, out: Path) -> dict[str, list[str]]:
    """Compile the sources with -fprofile-use from `profile` (installed as kpgo builds do), warnings on; returns
    the coverage-mismatch warnings of each object."""
    for rel, text in sources.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    kbuild._install_profile(profile, out, None)
    flags = [f for f in kbuild.PROFILE_USE_FLAGS if f != "-Wno-coverage-mismatch"] + ["-Wcoverage-mismatch"]
    warned = {}
    for rel in sources:
        res = subprocess.run(["gcc", "-O2", *flags, "-c", rel, "-o", rel[:-2] + ".o"], cwd=out, capture_output=True, text=True, check=True)
        warned[rel] = mismatch_lines(res.stderr)
    return warned


def test_gcc_uses_ported_profile_without_mismatch(world: World, tmp_path: Path) -> None:
    warned = use_profile(NEW, world.ported, tmp_path / "opt")
    assert warned == {rel: [] for rel in NEW}
    verdict = proof.check(tmp_path / "opt", world.ported)
    assert verdict["ok"] and verdict["functions_giving_up"] == 0
    assert verdict["objects_used"] == verdict["objects_nonempty"] == 2


def test_old_profile_as_is_mismatches(world: World, tmp_path: Path) -> None:
    fixed = tmp_path / "fixed"
    fix_profile(world.profile, fixed)
    warned = use_profile(NEW, fixed, tmp_path / "opt")
    text = "\n".join(warned["lib/lib.c"])
    assert "moved" in text and "changed" in text  # GCC drops what the port carries over and maps


def test_cli_table_and_json(world: World, tmp_path: Path) -> None:
    res = kpgo("profile", "port", world.profile, "--from", world.old, "--to", world.new, "-o", tmp_path / "p")
    assert res.returncode == 0, res.stderr
    assert "total" in res.stdout and "mapped" in res.stdout and "lib/lib.o" in res.stdout
    res = kpgo("profile", "port", world.profile, "--from", world.old, "--to", world.new, "-o", tmp_path / "q", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["total"] == json.loads(json.dumps(world.report["total"]))


def test_profile_of_another_build(world: World, tmp_path: Path) -> None:
    res = kpgo("profile", "port", world.fresh, "--from", world.old, "--to", world.new, "-o", tmp_path / "p")
    assert_one_line_error(res, 1, "is not a profile of", "drivers/fresh.gcda has no .gcno there")
    same_files = shutil.copytree(world.fresh, tmp_path / "same-files", ignore=shutil.ignore_patterns("drivers"))
    res = kpgo("profile", "port", same_files, "--from", world.old, "--to", world.new, "-o", tmp_path / "p")
    assert_one_line_error(res, 1, "is not a profile of", "lib/lib.gcda: stamp", "another build")
    assert not (tmp_path / "p").exists()


def test_builds_that_are_not_instrumented(world: World, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    compile_tree(plain, NEW, ("-O2",))
    res = kpgo("profile", "port", world.profile, "--from", world.old, "--to", plain, "-o", tmp_path / "p")
    assert_one_line_error(res, 1, "--to", "not an instrumented build")
    res = kpgo("profile", "port", world.profile, "--from", tmp_path / "nope", "--to", world.new, "-o", tmp_path / "p")
    assert_one_line_error(res, 1, "--from", "does not exist")


def test_a_stale_profile_is_taken_as_it_is_only_when_asked(tmp_path: Path) -> None:
    """`kpgo build --stale-profile`: a profile of another kernel version goes to GCC as it is (the contrast a ported
    profile is measured against); without it, one line naming the versions. Another config stays refused."""
    from types import SimpleNamespace

    from kpgo.errors import UserError

    prof = tmp_path / "p"
    prof.mkdir()
    (prof / "profile.json").write_text('{"config_name": "server", "kernel_release": "6.12.111"}')
    req = SimpleNamespace(profile=prof, source=SimpleNamespace(version="6.12.117"), config=SimpleNamespace(name="server"), stale_profile=False)
    with pytest.raises(UserError, match="collected on kernel 6.12.111; the source is 6.12.117") as e:
        kbuild._check_profile_origin(req)  # type: ignore[arg-type]
    assert "--stale-profile" in (e.value.hint or "")
    kbuild._check_profile_origin(SimpleNamespace(**{**vars(req), "stale_profile": True}))  # type: ignore[arg-type]
    with pytest.raises(UserError, match="collected on a server kernel; this build is tiny"):
        kbuild._check_profile_origin(SimpleNamespace(**{**vars(req), "stale_profile": True, "config": SimpleNamespace(name="tiny")}))  # type: ignore[arg-type]


def test_what_gcc_reads_of_an_old_profile_is_what_gcc_says(world: World, tmp_path: Path) -> None:
    """`kpgo profile check`'s function-by-function view of a profile on a changed source (validate.gcc_reads) against
    GCC itself: the new lib.c compiled with -fprofile-use of the old build's lib.gcda warns of exactly the functions
    said dropped (control flow differs) and moved (source locations changed), by name."""
    from kpgo.gcov.validate import check_profile, gcc_reads

    (tmp_path / "lib").mkdir()
    shutil.copy(world.new / "lib" / "lib.c", tmp_path / "lib" / "lib.c")
    shutil.copy(world.profile / "lib" / "lib.gcda", tmp_path / "lib" / "lib.gcda")
    res = subprocess.run(["gcc", "-O2", "-fprofile-use", "-Wcoverage-mismatch", "-Wno-error=coverage-mismatch", "-c", "lib/lib.c", "-o", "lib/lib.o"],
                         cwd=tmp_path, capture_output=True, text=True, check=True)
    # GCC's two words for a function whose counts it drops, and the one for counts it reads despite moved lines
    said = {m.group(2): "dropped" if "source" not in m.group(1) else "moved" for m in re.finditer(
        r"(control flow of function|number of counters in profile data for function|source locations for function) .(\w+). ", res.stderr)}
    notes = read_gcno(world.new / "lib" / "lib.gcno")
    got = gcc_reads(read_gcda(world.profile / "lib" / "lib.gcda"), notes)
    assert said == {"changed": "dropped", "moved": "moved", "scale": "moved"}  # CHANGED_NEW's extra branch; three blank lines
    assert (got["dropped"][0], got["moved"][0]) == (1, 2) and got["read"][0] >= 1  # unchanged
    assert got["dropped"][1] > 0 and got["moved"][1] > 0  # with their arc counts
    # the ported profile: every function read as it is, nothing for GCC to warn about
    ported = check_profile(world.ported, world.new)["gcc"]
    assert ported["dropped"]["functions"] == ported["moved"]["functions"] == ported["absent"]["functions"] == 0 < ported["read"]["functions"]
