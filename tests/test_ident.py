"""GCC's function idents (kpgo.gcov.ident) on real GCC output, and a profile used from a copy of its tree at another
path, as kpgo's patched copies (BOLT, function order, value profiles) and another release's directory are: GCC keys
static functions by their source path, so without re-keying it finds no profile for them, and kpgo's proof says so."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gcov_fixtures import require_gcc
from kpgo.errors import UserError
from kpgo.gcov import ident
from kpgo.gcov.gcno import read_gcno
from kpgo.kernel import kbuild, proof

HEADER = r"""
__attribute__((noinline)) static inline int clamp(int v) { if (v > 100) return 100; return v < 0 ? 0 : v; }
"""

LIB = r"""
#include "../include/helper.h"
__attribute__((noinline)) static int scale(int x) { if (x & 1) return x * 5; return x - 1; }
__attribute__((noinline)) static int twice(int x) { return x & 2 ? 2 * x : x; }
__attribute__((noinline)) int work(int i) {
    int r = 0;
    for (int k = 0; k < (i & 3); k++)
        r += scale(k) + twice(k);
    return clamp(r);
}
"""

MAIN = r"""
#include <stdlib.h>
int work(int i);
int main(int argc, char **argv) {
    long s = 0;
    for (int i = 0; i < 900; i++)
        s += work(i);
    return s == 42;
}
"""

SOURCES = {"lib/lib.c": LIB, "main.c": MAIN, "include/helper.h": HEADER}


def tree(root: Path) -> Path:
    for rel, text in SOURCES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def compile_from(src: Path, out: Path, flags: list[str]) -> subprocess.CompletedProcess[str]:
    """Compile each .c of the tree at src (absolute paths, as Kbuild's O= build does) into out/dir/x.o."""
    done = {}
    for rel in ("lib/lib.c", "main.c"):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        done[rel] = subprocess.run(["gcc", "-O2", *flags, "-c", str(src / rel), "-o", rel[:-2] + ".o"], cwd=out,
                                   capture_output=True, text=True, check=True)
    return done["lib/lib.c"]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(source tree, instrumented build, profile) with a profile.json and build.json as kpgo writes them."""
    require_gcc()
    base = tmp_path_factory.mktemp("ident")
    src, build, profile = tree(base / "a" / "linux"), base / "instrumented", base / "profile"
    compile_from(src, build, ["--coverage"])
    subprocess.run(["gcc", "--coverage", "lib/lib.o", "main.o", "-o", "prog"], cwd=build, check=True)
    subprocess.run([str(build / "prog")], cwd=build, check=False)
    for p in build.rglob("*.gcda"):
        (profile / p.relative_to(build)).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(p, profile / p.relative_to(build))
    (build / "build.json").write_text(json.dumps({"ok": True, "key": "k", "variant": "instrumented", "kernel_release": "6.12.0",
                                                  "source": str(src), "build_dir": str(build)}))
    (profile / "profile.json").write_text(json.dumps({"kind": "kernel-gcov-profile", "kernel_release": "6.12.0", "build_dir": str(build)}))
    return src, build, profile


def test_every_ident_gcc_wrote_is_the_hash_kpgo_recomputes(profiled: tuple[Path, Path, Path]) -> None:
    _src, build, _profile = profiled
    notes = read_gcno(build / "lib" / "lib.gcno")
    kinds = {fn.name: ident.kind(fn, "lib/lib") for fn in notes.functions}
    assert kinds == {"work": "public", "scale": "static", "twice": "static", "clamp": "static"}
    assert next(fn.source for fn in notes.functions if fn.name == "clamp").endswith("/include/helper.h")  # keyed by the header's path
    for fn in notes.functions:
        assert fn.name is not None and fn.source is not None
        assert ident.line_checksum(fn.start_line, fn.source, fn.name) == fn.lineno_checksum
    # the object's base name is part of a static function's ident: another -o path, another ident
    assert all(ident.kind(fn, "lib/other") in ("public", None) for fn in notes.functions)


def use(src: Path, out: Path, profile: Path, rekey: ident.Rekey | None) -> tuple[dict, str]:
    """Install the profile as kpgo's build does and compile the copy at src with -fprofile-use and kpgo's proof
    dumps, -Wmissing-profile on; (proof summary, lib.c's warnings)."""
    kbuild._install_profile(profile, out, rekey)
    flags = [f for f in kbuild.PROFILE_USE_FLAGS if f != "-Wno-missing-profile"] + ["-Wmissing-profile"]
    lib = compile_from(src, out, flags)
    return proof.check(out, profile), lib.stderr


def test_a_copy_at_another_path_reads_its_profile_only_rekeyed(profiled: tuple[Path, Path, Path], tmp_path: Path) -> None:
    src, build, profile = profiled
    copy = tree(tmp_path / "b" / "patched-copy")  # the same bytes at another path
    assert ident.profile_rekey(profile, src) is None  # the instrumented build's own tree: nothing to do
    rekey = ident.profile_rekey(profile, copy)
    assert rekey is not None and rekey.old_root == str(src.resolve()) and rekey.new_root == str(copy.resolve())

    # as kpgo built such kernels before: GCC finds no profile for the static functions, and says they ran never
    plain, warned = use(copy, tmp_path / "plain", profile, None)
    missing = set(re.findall(r"profile for function .(\w+). not found", warned))
    assert missing == {"scale", "twice", "clamp"}
    assert plain["weight_read"] < proof.COUNTS_THRESHOLD and not plain["ok"]
    assert plain["ratio"] == 1.0  # the old check (functions "read") saw nothing wrong
    with pytest.raises(Exception, match="GCC read only"):
        proof.enforce(plain, tmp_path / "plain")

    done, warned = use(copy, tmp_path / "rekeyed", profile, rekey)
    assert "not found" not in warned and "source locations" not in warned
    assert done["weight_read"] == 1.0 and done["ok"]
    # the same as compiling the original tree with the profile as it is
    same, _ = use(src, tmp_path / "original", profile, None)
    assert same["weight_read"] == 1.0 and same["functions_read"] == done["functions_read"]


def test_without_the_instrumented_build_the_profile_is_refused(profiled: tuple[Path, Path, Path], tmp_path: Path) -> None:
    src, build, profile = profiled
    rekey = ident.Rekey(tmp_path / "gone", str(src), str(tmp_path / "copy"))
    with pytest.raises(UserError, match=r"has no (lib/lib|main)\.gcno"):
        kbuild._install_profile(profile, tmp_path / "out", rekey)


def test_idents_the_hash_does_not_explain_are_refused(profiled: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """A .gcno whose static idents kpgo's hash does not give (here: the object renamed after the build, so its base
    name is not the one GCC hashed) stops the build before it compiles without those functions' profile."""
    src, build, profile = profiled
    moved_build, moved_profile = tmp_path / "build", tmp_path / "profile"
    (moved_build / "lib2").mkdir(parents=True)
    (moved_profile / "lib2").mkdir(parents=True)
    shutil.copy(build / "lib" / "lib.gcno", moved_build / "lib2" / "lib2.gcno")
    shutil.copy(profile / "lib" / "lib.gcda", moved_profile / "lib2" / "lib2.gcda")
    got = ident.rekey(read_gcno(moved_build / "lib2" / "lib2.gcno"), "lib2/lib2", str(src), "/elsewhere")
    assert {"scale", "twice"} <= set(got.unexplained) and "work" not in got.unexplained
    with pytest.raises(UserError, match="is not the hash kpgo recomputes"):
        kbuild._install_profile(moved_profile, tmp_path / "out", ident.Rekey(moved_build, str(src), "/elsewhere"))


CALLS = r"""
typedef int (*op_t)(int);
__attribute__((noinline)) static int inc(int x) { return x + 1; }
__attribute__((noinline)) static int dbl(int x) { return x * 2; }
op_t volatile ops[2] = { inc, dbl };
__attribute__((noinline)) int apply(int i) { return ops[i > 5000](i); }
int main(void) {
    long s = 0;
    for (int i = 0; i < 900; i++)
        s += apply(i);
    return s == 42;
}
"""


def test_indirect_call_targets_are_rekeyed_too(tmp_path: Path) -> None:
    """A value profile's indirect-call counters name their callees by ident: a static callee's changes with the path,
    and GCC promotes the call only when the counter names the ident it computes."""
    require_gcc()
    src, build, profile = tmp_path / "a" / "linux", tmp_path / "instrumented", tmp_path / "profile"
    (src / "kernel").mkdir(parents=True)
    (src / "kernel" / "calls.c").write_text(CALLS)
    (build / "kernel").mkdir(parents=True)
    subprocess.run(["gcc", "-O2", "--coverage", "-fprofile-values", "-c", str(src / "kernel" / "calls.c"), "-o", "kernel/calls.o"],
                   cwd=build, check=True)
    subprocess.run(["gcc", "--coverage", "kernel/calls.o", "-o", "prog"], cwd=build, check=True)
    subprocess.run([str(build / "prog")], cwd=build, check=False)
    (profile / "kernel").mkdir(parents=True)
    shutil.move(build / "kernel" / "calls.gcda", profile / "kernel" / "calls.gcda")
    copy = tmp_path / "b" / "copy"
    (copy / "kernel").mkdir(parents=True)
    shutil.copy(src / "kernel" / "calls.c", copy / "kernel" / "calls.c")

    def promoted(rekey: ident.Rekey | None, out: Path) -> int:
        kbuild._install_profile(profile, out, rekey)
        subprocess.run(["gcc", "-O2", *kbuild.PROFILE_USE_FLAGS, "-c", str(copy / "kernel" / "calls.c"), "-o", "kernel/calls.o"],
                       cwd=out, check=True, capture_output=True)
        return proof.check(out, profile)["values"]["totals"]["indirect_calls_promoted"]

    assert promoted(None, tmp_path / "plain") == 0
    assert promoted(ident.Rekey(build, str(src.resolve()), str(copy.resolve())), tmp_path / "rekeyed") == 1


def test_profile_check_reports_what_gcc_reads_after_rekeying(profiled: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """`kpgo profile check` of the profile against an instrumented build of the same tree at another path: what GCC
    reads of it as kpgo installs it (re-keyed: all of it), and, for a profile that does not say its build, as it is
    (the static functions absent)."""
    from kpgo.gcov.validate import check_profile

    src, _build, profile = profiled
    copy = tree(tmp_path / "elsewhere" / "linux")
    other = tmp_path / "instrumented-copy"
    compile_from(copy, other, ["--coverage"])
    (other / "build.json").write_text(json.dumps({"ok": True, "key": "k2", "variant": "instrumented", "kernel_release": "6.12.0",
                                                  "source": str(copy), "build_dir": str(other)}))
    checked = check_profile(profile, other)
    assert checked["rekeyed_from"] == str(src.resolve())
    got = checked["gcc"]
    assert got["absent"]["functions"] == got["dropped"]["functions"] == 0 and got["read"]["functions"] == 5  # work, main, 3 static
    anonymous = tmp_path / "anonymous"
    shutil.copytree(profile, anonymous)
    (anonymous / "profile.json").write_text(json.dumps({"kind": "kernel-gcov-profile", "kernel_release": "6.12.0"}))
    as_is = check_profile(anonymous, other)["gcc"]
    assert as_is["absent"]["functions"] == 3 and as_is["absent"]["arcs_sum"] > 0


def test_a_stale_profile_reports_the_counts_gcc_read_without_failing(profiled: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """`--stale-profile` (another release's profile as it is): GCC drops what changed by design, so the share read is
    reported and not held to the threshold; the object check still is."""
    _src, _build, profile = profiled
    copy = tree(tmp_path / "b" / "linux")
    kbuild._install_profile(profile, tmp_path / "out", None)
    compile_from(copy, tmp_path / "out", list(kbuild.PROFILE_USE_FLAGS))
    stale = proof.check(tmp_path / "out", profile, counts_gate=False)
    assert stale["ok"] and stale["weight_read"] < proof.COUNTS_THRESHOLD and not stale["counts_gate"]
