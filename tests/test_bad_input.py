"""Bad input gives one line naming the problem and the next step, a non-zero exit, no traceback,
and leaves the input untouched."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from conftest import TINY_RUN_ARGS, assert_one_line_error, kpgo, short_sets


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(f"{p.relative_to(root)} {p.stat().st_mode:o}".encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def test_missing_kernel_source(tmp_path: Path) -> None:
    res = kpgo("build", "--source", tmp_path / "nope", "-o", tmp_path / "b")
    assert_one_line_error(res, 1, "not a kernel source tree")


def test_a_tarball_whose_directory_is_named_otherwise(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Debian's archive serves every release's linux-source-6.12.N.tar.xz with the tree in linux-source-6.12/."""
    import tarfile

    from kpgo.kernel import source

    monkeypatch.setenv("KPGO_CACHE", str(tmp_path / "cache"))
    tree = tmp_path / "t" / "linux-source-6.12"
    (tree / "arch" / "x86").mkdir(parents=True)
    (tree / "Makefile").write_text("VERSION = 6\nPATCHLEVEL = 12\nSUBLEVEL = 111\n")
    (tree / "Kconfig").write_text("")
    (tree / "arch" / "x86" / "Makefile").write_text("")
    ball = tmp_path / "linux-source-6.12.111.tar.xz"
    with tarfile.open(ball, "w:xz") as tf:
        tf.add(tree, arcname="linux-source-6.12")
    ks = source.resolve(ball)
    assert ks.version == "6.12.111" and ks.path.name == "linux-source-6.12" and ks.path.parent.name == "linux-source-6.12.111"


def test_unclean_kernel_tree(tmp_path: Path) -> None:
    tree = tmp_path / "linux"
    (tree / "arch" / "x86").mkdir(parents=True)
    (tree / "Makefile").write_text("VERSION = 6\nPATCHLEVEL = 12\nSUBLEVEL = 0\n")
    (tree / "Kconfig").write_text("")
    (tree / "arch" / "x86" / "Makefile").write_text("")
    (tree / ".config").write_text("CONFIG_X=y\n")
    res = kpgo("build", "--source", tree, "-o", tmp_path / "b")
    assert_one_line_error(res, 1, "not clean", "mrproper")


def test_unknown_base_config(tmp_path: Path) -> None:
    assert_one_line_error(kpgo("build", "--base", "huge", "-o", tmp_path / "b"), 1, "unknown base config", "tiny")


def test_optimized_without_profile(tmp_path: Path) -> None:
    assert_one_line_error(kpgo("build", "--variant", "optimized", "-o", tmp_path / "b"), 1, "needs a profile")


def test_empty_profile_dir(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    res = kpgo("build", "--variant", "optimized", "--profile", empty, "-o", tmp_path / "b")
    assert_one_line_error(res, 1, "no .gcda")
    assert list(empty.iterdir()) == []


def test_unknown_workload_and_bad_set(tmp_path: Path) -> None:
    assert_one_line_error(kpgo("collect", tmp_path, "-o", tmp_path / "p", "--workload", "nosuch"), 1, "unknown workload")
    assert_one_line_error(kpgo("collect", tmp_path, "-o", tmp_path / "p", "--set", "clients=many"), 1, "clients of workload redis takes a value of type int")
    assert_one_line_error(kpgo("collect", tmp_path, "-o", tmp_path / "p", "--workload", "redis,nginx", "--set", "nginx.clients=2"),
                          1, "clients is not a parameter of nginx")


def test_collect_from_non_build(tmp_path: Path) -> None:
    assert_one_line_error(kpgo("collect", tmp_path, "-o", tmp_path / "p"), 1, "no complete kpgo build")
    assert not (tmp_path / "p").exists()


@pytest.mark.vm
def test_guest_hang_is_killed(tiny_run: Path, tmp_path: Path) -> None:
    """A guest that does not finish in time is killed (QEMU included) and reported in one line."""
    res = kpgo("collect", tiny_run / "builds" / "instrumented", "-o", tmp_path / "p", "--guest-timeout", "6")
    assert_one_line_error(res, 3, "did not finish within 6 s")
    assert not (tmp_path / "p").exists()  # no half-written profile
    assert (tmp_path / "p.failed-logs" / "log" / "console.log").is_file()  # but the console log is kept
    assert res.seconds < 60


@pytest.mark.vm
def test_server_that_does_not_start(tiny_run: Path, tmp_path: Path) -> None:
    """A failing workload stops with the server's complaint, the next workload still runs and
    keeps its profile, and the exit status says that one failed."""
    res = kpgo("collect", tiny_run / "builds" / "instrumented", "-o", tmp_path / "p", "--workload", "redis,micro", "--client", "guest",
               "--set", "redis.port=99999", *short_sets(["micro"]))
    assert_one_line_error(res, 3, "1 of 2 workloads failed", "workload redis failed in the guest", "server exited")
    assert "server| " in res.stderr and "65535" in res.stderr  # the server's own complaint
    assert not (tmp_path / "p" / "redis").exists()
    assert (tmp_path / "p" / "redis.failed-logs" / "log" / "console.log").is_file()
    assert json.loads((tmp_path / "p" / "micro" / "profile.json").read_text())["throughput"] > 0


@pytest.mark.vm
def test_failing_build_shows_compiler_error(tiny_run: Path, tmp_path: Path) -> None:
    # Flags GCC accepts (they pass kpgo's up-front probe, a function without a stack frame) but that fail the first
    # kernel object with a frame: the build itself fails, in the compiler.
    res = kpgo("build", "--base", "tiny", "--kcflags=-Wframe-larger-than=8 -Werror", "-o", tmp_path / "broken")
    assert_one_line_error(res, 3, "kernel build of variant vanilla failed", "build.log")
    assert "[-Werror=" in res.stdout  # the compiler's own error line is shown
    assert not (tmp_path / "broken" / "build.json").exists()


@pytest.mark.vm
@pytest.mark.slow  # a whole tiny build from the profile: ~7 min on 2 cores (ccache warm from the session's run)
def test_optimized_build_leaves_profile_untouched(tiny_run: Path, tmp_path: Path) -> None:
    """An optimized build from a profile leaves the profile as it was: the build runs (in a directory of its own, so
    nothing is up to date): kpgo checks, digests and installs the profile, GCC compiles the kernel with it, kpgo proves
    it was used."""
    prof = tiny_run / "profiles" / "redis"
    before = tree_digest(prof)
    out = tmp_path / "optimized"
    res = kpgo("build", "--base", "tiny", "--variant", "optimized", "--profile", prof, "-o", out)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "up to date" not in res.stderr  # built, not reused
    installed = sorted(p.relative_to(out) for p in out.rglob("*.gcda"))
    assert installed == sorted(p.relative_to(prof) for p in prof.rglob("*.gcda")) and len(installed) > 100  # the profile went in
    build = json.loads((out / "build.json").read_text())
    assert build["ok"] and build["proof"]["ok"] and build["profile"]["files_installed"] == len(installed)
    assert tree_digest(prof) == before


@pytest.mark.vm
def test_cached_rerun_leaves_profile_untouched(tiny_run: Path) -> None:
    """`kpgo run` again on a finished run re-checks every step's inputs (nothing is built: the build itself is
    test_optimized_build_leaves_profile_untouched's) and leaves the profile as it was."""
    prof = tiny_run / "profiles" / "redis"
    before = tree_digest(prof)
    res = kpgo(*TINY_RUN_ARGS, "--dir", tiny_run)  # cached: re-checks everything
    assert res.returncode == 0
    assert tree_digest(prof) == before


def test_run_dir_virtme_cannot_share(tmp_path: Path) -> None:
    # Refused before any boot, with the reason: vng's --rwdir takes no '@', '=' or ':' in a path.
    from conftest import workload
    from kpgo import vm
    from kpgo.errors import UserError
    from kpgo.guest import contract

    kernel = tmp_path / "bzImage"
    kernel.write_bytes(b"not booted")
    with pytest.raises(UserError, match="virtme-ng cannot share"):
        vm.run_agent(kernel, tmp_path / "a@b", contract.Job(mode="bench", workload=workload("never")), guest=vm.Guest(), log=tmp_path / "log", accel="tcg")
    assert not (tmp_path / "a@b").exists()


def test_share_study_refuses_no_sim(tmp_path: Path) -> None:
    """`kpgo study share --no-sim` was accepted and then overridden: the study is its simulated shares."""
    assert_one_line_error(kpgo("study", "share", tmp_path, "--no-sim"), 1, "--no-sim leaves it nothing to measure")
