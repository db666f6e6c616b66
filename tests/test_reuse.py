"""Reuse of unchanged objects across optimized builds (docs/ARCHITECTURE.md, "Reuse"), on real GCC output:
an object whose profile is all zero compiles to the same bytes whatever the summary's sum_max (which `kpgo
profile fix` sets from the whole profile, so it differs between workloads), kpgo installs such files with one
canonical summary, and its compiler wrapper then takes them from ccache — byte-identical to what GCC itself
produces — while objects with a non-zero profile are always compiled, with the dump the proof reads."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kpgo import variants
from kpgo.gcov.gcda import read_gcda
from kpgo.kernel import kbuild

HOT = "int hot(int n) { int s = 0; for (int i = 0; i < n; i++) s += (i % 3) ? i : -i; return s; }\n"
COLD = "int cold(int n) { int s = 1; for (int i = 0; i < n; i++) s *= (i & 1) ? 3 : 5; return s; }\n"
MAIN = "int hot(int); int main(int c, char **v) { (void)v; return hot(c * 1000) & 1; }\n"
FLAGS = ["-O2", "-fprofile-use", "-fprofile-correction", "-Wno-missing-profile"]


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Sources, and a real profile: hot.gcda with counts, cold.gcda all zero (cold() never runs)."""
    src = tmp_path_factory.mktemp("src")
    for name, text in (("hot.c", HOT), ("cold.c", COLD), ("main.c", MAIN)):
        (src / name).write_text(text)
    run = tmp_path_factory.mktemp("instrumented")
    for name in ("hot", "cold", "main"):
        subprocess.run(["gcc", "-O2", "-fprofile-generate", "-c", src / f"{name}.c", "-o", f"{name}.o"], cwd=run, check=True)
    subprocess.run(["gcc", "-fprofile-generate", "hot.o", "cold.o", "main.o", "-o", "prog"], cwd=run, check=True)
    subprocess.run(["./prog", "a", "b"], cwd=run, check=False)
    assert read_gcda(run / "cold.gcda").all_zero() and not read_gcda(run / "hot.gcda").all_zero()
    return src, run


def profile_dir(base: Path, run: Path, sum_max: int) -> Path:
    """A fixed profile as `kpgo profile fix` writes it: every file's summary carries the profile-wide sum_max."""
    base.mkdir()
    for name in ("hot", "cold"):
        (base / f"{name}.gcda").write_bytes(read_gcda(run / f"{name}.gcda").with_summary(1, sum_max).to_bytes())
    return base


def compile_in(d: Path, src: Path, name: str, *, cc: list[str], extra: list[str] = (), env: dict[str, str] | None = None,
               flags: list[str] = FLAGS) -> Path:
    # with the dependency file as Kbuild asks for it (ccache's depend mode reads it)
    subprocess.run([*cc, f"-Wp,-MMD,.{name}.o.d", *flags, *extra, "-c", src / f"{name}.c", "-o", f"{name}.o"], cwd=d, check=True,
                   env={**os.environ, **(env or {})})
    return d / f"{name}.o"


def ccache_env(variant: str, tmp_path: Path) -> dict[str, str]:
    """The build's own compiler environment (kbuild._make_vars) with a cache of the test's."""
    make_args, env = kbuild._make_vars(variants.get(variant))
    assert make_args == [f"CC=sh {kbuild.REUSE_CC}"]
    return env | {"CCACHE_DIR": str(tmp_path / "ccache")}


def ccache_counts(env: dict[str, str]) -> dict[str, int]:
    stats = subprocess.run(["ccache", "--print-stats"], env={**os.environ, **env}, capture_output=True, text=True, check=True).stdout
    return {k: int(v) for k, v in (line.split("\t") for line in stats.splitlines())}


def test_all_zero_profile_compiles_the_same_for_any_sum_max(profiled: tuple[Path, Path], tmp_path: Path) -> None:
    src, run = profiled
    objs = {}
    for sum_max in (1, 2000, 987654321):
        d = tmp_path / f"m{sum_max}"
        d.mkdir()
        (d / "cold.gcda").write_bytes(read_gcda(run / "cold.gcda").with_summary(1, sum_max).to_bytes())
        objs[sum_max] = sha(compile_in(d, src, "cold", cc=["gcc"]))
    assert len(set(objs.values())) == 1
    # ...and the profile is used: without the .gcda GCC optimizes the function normally.
    bare = tmp_path / "bare"
    bare.mkdir()
    assert sha(compile_in(bare, src, "cold", cc=["gcc"])) != objs[1]


@pytest.mark.skipif(shutil.which("ccache") is None, reason="ccache is installed by `make setup`")
@pytest.mark.parametrize("pt", [(), variants.PARTIAL_TRAINING_FLAGS], ids=["gcc-default", "partial-training"])
def test_zero_objects_come_from_ccache_byte_identical(profiled: tuple[Path, Path], tmp_path: Path, pt: tuple[str, ...]) -> None:
    """Also with partial training, kpgo's default, whose flag ccache refuses on a command line (REUSE_CC then hands
    ccache a compiler that adds it: kbuild._partial_training_cc)."""
    src, run = profiled
    env = ccache_env("optimized", tmp_path)
    assert env["KPGO_REUSE"] == "zero" and env["CCACHE_DEPEND"] == "1"
    cc = ["sh", str(kbuild.REUSE_CC)]
    builds = {}
    for name, sum_max in (("redis", 2000), ("nginx", 31337)):  # two workloads: different profile-wide maxima
        prof = profile_dir(tmp_path / f"profile-{name}", run, sum_max)
        out = tmp_path / f"optimized-{name}"
        out.mkdir()
        assert kbuild._install_profile(prof, out, None) == (2, 1, 0)
        assert (out / "cold.kpgo-zero").exists() and not (out / "hot.kpgo-zero").exists()
        for obj in ("hot", "cold"):
            compile_in(out, src, obj, cc=cc, extra=["-fdump-ipa-profile", *pt], env=env)
        builds[name] = out
    assert sha(builds["redis"] / "cold.gcda") == sha(builds["nginx"] / "cold.gcda")  # canonical summary
    counts = ccache_counts(env)
    assert counts["direct_cache_hit"] == 1 and counts["preprocessed_cache_hit"] == 0  # nginx's cold.o, by depend mode
    assert counts["cache_miss"] == 1  # redis's cold.o; hot.o never goes through ccache
    # The reused object is what GCC produces from the workload's own (un-canonicalized) profile.
    direct = tmp_path / "direct"
    profile_dir(direct, run, 31337)
    assert sha(compile_in(direct, src, "cold", cc=["gcc"], extra=list(pt))) == sha(builds["nginx"] / "cold.o")
    # ...and whether partial training is in it shows: GCC compiles the never-run function otherwise the other way.
    other = tmp_path / "other"
    profile_dir(other, run, 31337)
    flipped = [] if pt else list(variants.PARTIAL_TRAINING_FLAGS)
    assert sha(compile_in(other, src, "cold", cc=["gcc"], extra=flipped)) != sha(builds["nginx"] / "cold.o")
    # The two kinds never share a cache entry: the same object the other way through the wrapper is a miss, and right.
    again = tmp_path / "again"
    kbuild._install_profile(profile_dir(tmp_path / "profile-again", run, 31337), again, None)
    assert sha(compile_in(again, src, "cold", cc=cc, extra=["-fdump-ipa-profile", *flipped], env=env)) == sha(other / "cold.o")
    assert ccache_counts(env)["cache_miss"] == 2
    # The proof's evidence: objects with a non-zero profile are compiled with their dump, every time.
    for out in builds.values():
        assert list(out.glob("hot.c.*i.profile")) and not list(out.glob("cold.c.*i.profile"))


@pytest.mark.skipif(shutil.which("ccache") is None, reason="ccache is installed by `make setup`")
def test_vanilla_objects_come_from_ccache_and_a_changed_profile_misses(profiled: tuple[Path, Path], tmp_path: Path) -> None:
    """A build with neither profile nor gcov sends every object through ccache (a second run's vanilla kernel comes
    from the cache, byte-identical to GCC's); in depend mode a changed .gcda still misses; gcov builds never use it."""
    src, run = profiled
    env = ccache_env("vanilla", tmp_path)
    assert env["KPGO_REUSE"] == "all"
    objs = []
    for name in ("run1", "run2"):
        d = tmp_path / name
        d.mkdir()
        objs.append(sha(compile_in(d, src, "hot", cc=["sh", str(kbuild.REUSE_CC)], env=env, flags=["-O2"])))
    assert ccache_counts(env)["direct_cache_hit"] == 1 and ccache_counts(env)["cache_miss"] == 1
    plain = tmp_path / "plain"
    plain.mkdir()
    assert objs == [sha(compile_in(plain, src, "hot", cc=["gcc"], flags=["-O2"]))] * 2
    # Under -fprofile-use the .gcda is an input: the same object with another profile is compiled, not reused.
    opt = ccache_env("optimized", tmp_path) | {"KPGO_REUSE": "all"}
    for i, sum_max in enumerate((2000, 2000, 31337)):
        d = tmp_path / f"p{i}"
        profile_dir(d, run, sum_max)
        compile_in(d, src, "hot", cc=["sh", str(kbuild.REUSE_CC)], env=opt)
    assert ccache_counts(opt)["direct_cache_hit"] == 2 and ccache_counts(opt)["cache_miss"] == 3  # (the first from run1/2)
    assert kbuild._make_vars(variants.get("instrumented")) == ([], {})


@pytest.mark.skipif(shutil.which("ccache") is None, reason="ccache is installed by `make setup`")
def test_a_source_that_includes_a_file_with_incbin_is_always_compiled(tmp_path: Path) -> None:
    """arch/x86/boot/compressed/piggy.S pulls the compressed kernel in with .incbin; ccache's depend mode does not see
    that file, so a second build of the same config (the same piggy.S: the sizes match) took the first build's kernel
    into its bzImage. Through kpgo's wrapper such a source is compiled every time, with the file it includes now."""
    env = ccache_env("vanilla", tmp_path)
    cc = ["sh", str(kbuild.REUSE_CC)]
    src = tmp_path / "piggy.S"
    src.write_text('.section .rodata\n.incbin "payload.bin"\n')
    objs = []
    for i, payload in enumerate((b"first kernel", b"other kernel")):  # same size, as two builds of one config
        d = tmp_path / f"build{i}"
        d.mkdir()
        (d / "payload.bin").write_bytes(payload)
        subprocess.run([*cc, "-Wp,-MMD,.piggy.o.d", "-c", src, "-o", "piggy.o"], cwd=d, check=True, env={**os.environ, **env})
        objs.append((d / "piggy.o").read_bytes())
    assert b"first kernel" in objs[0] and b"other kernel" in objs[1]
    counts = ccache_counts(env)
    assert counts.get("direct_cache_hit", 0) == counts.get("cache_miss", 0) == 0  # not through ccache at all
    # An ordinary source beside it still goes through ccache (the control: the wrapper and the cache work).
    (tmp_path / "plain.S").write_text(".section .rodata\n.byte 1\n")
    subprocess.run([*cc, "-Wp,-MMD,.plain.o.d", "-c", tmp_path / "plain.S", "-o", "plain.o"], cwd=tmp_path, check=True, env={**os.environ, **env})
    assert ccache_counts(env)["cache_miss"] == 1
