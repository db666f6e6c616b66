"""`kpgo profile merge --cluster`: the tree of Ray tasks on a local Ray cluster started here (2 CPUs) gives the serial
merge's bytes; Ray is imported only with --cluster; a missing Ray or an unreachable cluster is a one-line error.

The inputs are real GCC-made profiles (tests/gcov_fixtures.py): the fixture program run with 7 different workloads
(mode, iterations), each snapshot rewritten in the kernel's shape; two of them are also kept in libgcov's shape,
whose files differ in layout from the kernel's and so take the per-file merge."""

from __future__ import annotations

import contextlib
import filecmp
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import CliResult, assert_one_line_error, kpgo
from gcov_fixtures import GccBuild, gcc_build, kernelize_tree  # noqa: F401
from kpgo.errors import UserError
from kpgo.gcov.gcda import parse_gcda
from kpgo.gcov.merge import merge_profiles

WORKLOADS = [(0, 1000), (1, 3000), (2, 500), (0, 77), (2, 4321), (1, 10), (0, 2500)]
WEIGHTS = [1.0, 0.5, 2.0, 1.5, 3.0, 0.7, 1.0]  # fractional: the exact fixed-point sums
MODES = {"plain": {}, "weighted": {"weights": WEIGHTS}, "normalize": {"normalize": True},
         "weighted-normalize": {"normalize": True, "weights": WEIGHTS}}


def same_tree(a: Path, b: Path) -> bool:
    """Same files (profile.json included) with the same bytes."""
    cmp = filecmp.dircmp(a, b)
    if cmp.left_only or cmp.right_only or cmp.funny_files:
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    return not mismatch and not errors and all(same_tree(a / d, b / d) for d in cmp.common_dirs)


@pytest.fixture(scope="module")
def fleet(gcc_build: GccBuild, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], list[Path]]:
    """Seven kernel-shaped profiles of one build, and the first two as libgcov wrote them."""
    base = tmp_path_factory.mktemp("fleet")
    raw = [gcc_build.profile(base / f"raw{i}", mode, n) for i, (mode, n) in enumerate(WORKLOADS)]
    gcc_build.clear_gcda()
    return [kernelize_tree(r, base / f"k{i}") for i, r in enumerate(raw)], raw[:2]


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A local Ray cluster of 2 CPUs for this module's in-process merges, shut down after them."""
    if importlib.util.find_spec("ray") is None:
        pytest.fail(f"ray is not installed in {sys.executable}; run `make setup` (it installs the cluster extra)")
    from kpgo import cluster

    ray = cluster.connect("local", num_cpus=2)
    try:
        yield
    finally:
        ray.shutdown()


def serial_and_tree(dirs: list[Path], tmp: Path, fan_in: int, **kw: object) -> dict:
    from kpgo import cluster

    merge_profiles(dirs, tmp / "serial", strict=True, **kw)  # type: ignore[arg-type]
    res = cluster.tree_merge(dirs, tmp / "tree", fan_in=fan_in, strict=True, **kw)  # type: ignore[arg-type]
    assert same_tree(tmp / "serial", tmp / "tree")
    return res


@pytest.mark.parametrize("fan_in", [2, 3])
@pytest.mark.parametrize("mode", list(MODES))
def test_tree_equals_serial(local_ray: None, fleet: tuple[list[Path], list[Path]], tmp_path: Path, mode: str, fan_in: int) -> None:
    res = serial_and_tree(fleet[0], tmp_path, fan_in, **MODES[mode])
    c = res["cluster"]
    assert c["levels"] == (2 if fan_in == 3 else 3)  # 7 inputs: 3 leaves and a root, or 4 leaves, 2 nodes and a root
    assert c["files_merged_per_file"] == 0
    folds = [t for t in c["tasks"] if t["kind"] == "fold"]
    assert sorted(t["inputs"] for t in folds) == sorted(b - a for a, b in [(i, min(i + fan_in, 7)) for i in range(0, 7, fan_in)])
    assert all(t["inputs"] <= fan_in for t in c["tasks"])
    # The inputs differ, and the merge is not one of them.
    merged = parse_gcda((tmp_path / "tree" / "kernel" / "sched.gcda").read_bytes(), "x").counters()
    inputs = [parse_gcda((d / "kernel" / "sched.gcda").read_bytes(), "x").counters().tolist() for d in fleet[0]]
    assert len({tuple(v) for v in inputs}) == 7 and merged.tolist() not in inputs


def test_tree_equals_serial_per_file(local_ray: None, fleet: tuple[list[Path], list[Path]], tmp_path: Path) -> None:
    """Inputs of two shapes (libgcov's files carry a summary, the kernel's do not): every file is merged per file, in
    a tree of its own, and a file missing from one input counts as zeros there."""
    kernel, libgcov = fleet
    part = tmp_path / "part"
    shutil.copytree(kernel[3], part)
    (part / "net" / "core.gcda").unlink()
    dirs = [kernel[0], libgcov[0], kernel[1], part, libgcov[1], kernel[2], kernel[4]]
    for name, kw in MODES.items():
        res = serial_and_tree(dirs, tmp_path / name, 2, **kw)
        assert res["cluster"]["files_merged_per_file"] == 3
        assert res["missing"] == {str(part): 1}


def test_task_error_is_the_users_one_line(local_ray: None, fleet: tuple[list[Path], list[Path]], tmp_path: Path) -> None:
    """A profile of another build in the fifth input: the task's UserError comes back as itself, and nothing is
    written."""
    from kpgo import cluster

    other = tmp_path / "other"
    shutil.copytree(fleet[0][4], other)
    p = other / "net" / "core.gcda"
    g = parse_gcda(p.read_bytes(), str(p))
    g.stamp ^= 0x5A5A
    p.write_bytes(g.to_bytes())
    dirs = [*fleet[0][:4], other, *fleet[0][5:]]
    with pytest.raises(UserError, match=r"net/core.gcda: profiles from different builds") as e:
        cluster.tree_merge(dirs, tmp_path / "out", fan_in=2, strict=True)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def _processes_naming(mark: str) -> list[int]:
    """This machine's processes whose command line names `mark` (another session's Ray, or another test's, does not)."""
    found = []
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if d.name.isdigit() and mark.encode() in (d / "cmdline").read_bytes():
                found.append(int(d.name))
    return found


def test_cli_local_cluster(fleet: tuple[list[Path], list[Path]], tmp_path: Path) -> None:
    """The command a user runs: it starts Ray on this machine, merges, and leaves no Ray process behind. Its Ray is
    told apart from any other on the machine by its own temporary directory (RAY_TMPDIR), which its raylet and GCS
    server name on their command lines: seen while it merges, gone after."""
    dirs = fleet[0]
    w = ",".join(map(str, WEIGHTS))
    assert kpgo("profile", "merge", *dirs, "-o", tmp_path / "serial", "--weights", w, "--normalize").returncode == 0
    mine = Path(tempfile.mkdtemp(prefix="kr", dir="/tmp"))  # Ray's socket paths stay short
    try:
        # Output to files, not pipes: a process left behind holding them would keep a pipe open past kpgo's end.
        with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
            p = subprocess.Popen([sys.executable, "-m", "kpgo", "profile", "merge", *map(str, dirs), "-o", str(tmp_path / "tree"),
                                  "--weights", w, "--normalize", "--cluster", "local", "--fan-in", "3"],
                                 env={**os.environ, "RAY_TMPDIR": str(mine)}, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        seen: set[int] = set()
        deadline = time.monotonic() + 300
        while p.poll() is None and time.monotonic() < deadline:
            seen.update(_processes_naming(str(mine)))
            time.sleep(0.1)
        assert p.wait(timeout=1) == 0, (tmp_path / "err").read_text()
        assert "merged 7 profiles" in (tmp_path / "out").read_text()
        assert same_tree(tmp_path / "serial", tmp_path / "tree")
        assert len(seen) >= 2, "the merge's Ray was never seen: the check below would prove nothing"
        deadline = time.monotonic() + 30
        while _processes_naming(str(mine)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _processes_naming(str(mine)), "Ray processes outlived the merge"
    finally:
        for pid in _processes_naming(str(mine)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(mine, ignore_errors=True)


def _kpgo_without_ray(*args: str | Path) -> CliResult:
    """kpgo where `import ray` fails as it does when Ray is not installed (Python's own way to block an import: None
    in sys.modules)."""
    code = "import sys; sys.modules['ray'] = None; from kpgo.cli import main; sys.exit(main(sys.argv[1:]))"
    start = time.monotonic()
    cp = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=120)
    return CliResult(cp.returncode, cp.stdout, cp.stderr, time.monotonic() - start)


def test_ray_missing_is_one_line(fleet: tuple[list[Path], list[Path]], tmp_path: Path) -> None:
    res = _kpgo_without_ray("profile", "merge", *fleet[0][:2], "-o", tmp_path / "out", "--cluster", "local")
    assert_one_line_error(res, 1, "--cluster needs Ray, which is not installed", "pip install 'kpgo[cluster]' or make setup")
    assert not (tmp_path / "out").exists()
    # Without --cluster the same Python merges as ever.
    assert _kpgo_without_ray("profile", "merge", *fleet[0][:2], "-o", tmp_path / "out").returncode == 0


@pytest.mark.parametrize("address", ["127.0.0.1:1", "auto"])
def test_unreachable_cluster_is_one_line(fleet: tuple[list[Path], list[Path]], tmp_path: Path, address: str) -> None:
    """Nothing listens on port 1 (auto reads RAY_ADDRESS, set to it): an error within seconds, not Ray's minutes of
    retries."""
    res = kpgo("profile", "merge", *fleet[0][:2], "-o", tmp_path / "out", "--cluster", address, timeout=120,
               env={"RAY_ADDRESS": "127.0.0.1:1"})
    assert_one_line_error(res, 1, "cannot reach a Ray cluster at", "ray status")
    assert res.seconds < 60
    assert not (tmp_path / "out").exists()


def test_fan_in_needs_cluster_and_two(fleet: tuple[list[Path], list[Path]], tmp_path: Path) -> None:
    assert_one_line_error(kpgo("profile", "merge", *fleet[0][:2], "-o", tmp_path / "o", "--fan-in", "4"), 1, "add --cluster")
    assert_one_line_error(kpgo("profile", "merge", *fleet[0][:2], "-o", tmp_path / "o", "--cluster", "local", "--fan-in", "1"),
                          1, "--fan-in 1")


def test_single_machine_commands_do_not_import_ray(fleet: tuple[list[Path], list[Path]], tmp_path: Path) -> None:
    code = ("import sys; import kpgo, kpgo.cli, kpgo.cluster, kpgo.gcov.merge, kpgo.commands.profile, kpgo.pipeline, "
            "kpgo.bench, kpgo.commands.bench; "
            f"rc = kpgo.cli.main(['profile', 'merge', {str(fleet[0][0])!r}, {str(fleet[0][1])!r}, '-o', {str(tmp_path / 'o')!r}]); "
            "assert rc == 0; assert 'ray' not in sys.modules, 'ray was imported'")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
