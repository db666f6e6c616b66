"""The cluster under faults (docs/SCALE.md), on real Ray clusters of nodes on this machine: a node killed during a
fleet merge, no node left, `--cluster local` beside another Ray."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import slow_merge
from conftest import assert_one_line_error, kpgo
from gcov_fixtures import gcc_build  # noqa: F401
from kpgo.errors import InfraError, UserError
from kpgo.gcov.merge import merge_profiles
from test_cluster import fleet, same_tree  # noqa: F401

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"
# A lost node declared dead in ~3 s; every task's value in its node's object store, as a real profile's partial is
# (Ray hands values under 100 KB, as these small profiles' are, to their owner directly, and a node's loss would lose none).
CLUSTER_CONFIG = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3, "max_direct_call_object_size": 1}


@pytest.fixture
def watchdog() -> Iterator[None]:
    """A test that hangs fails after 300 s instead (SIGALRM: Ray's waits give way to signals)."""
    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError("the test did not finish in 300 s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(300)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def slowed_cluster(marks: Path, monkeypatch: pytest.MonkeyPatch, head_cpus: int) -> Any:
    """A head of head_cpus CPUs on this machine, its nodes' folds marked and slowed (tests/slow_merge.py)."""
    from ray.cluster_utils import Cluster

    marks.mkdir()
    monkeypatch.setenv(slow_merge.MARKS, str(marks))
    monkeypatch.setenv(slow_merge.SECONDS, "2")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p))
    return Cluster(initialize_head=True, head_node_args={"num_cpus": head_cpus, "include_dashboard": False, "_system_config": CLUSTER_CONFIG})


@contextlib.contextmanager
def driving(cluster: Any) -> Iterator[None]:
    """This process the cluster's driver, its workers' folds slowed; everything stopped after the block."""
    import ray

    try:
        ray.init(address=cluster.address, runtime_env={"worker_process_setup_hook": "slow_merge.install"}, logging_level="WARNING",
                 log_to_driver=False)
        yield
    finally:
        ray.shutdown()
        cluster.shutdown()


def kill_at(cluster: Any, node: Any, marks: Path, mark: str) -> tuple[threading.Thread, list[str]]:
    """A thread that kills node (raylet and workers, no grace) as soon as a fold leaves a mark ending in `mark` there
    (start or end); the list gets the marks seen then (empty if none within 120 s)."""
    seen: list[str] = []

    def kill() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if now := sorted(p.name for p in marks.glob(f"{node.node_id}.*.{mark}")):
                cluster.remove_node(node, allow_graceful=False)
                seen.extend(now)
                return
            time.sleep(0.02)

    t = threading.Thread(target=kill)
    t.start()
    return t, seen


def test_a_node_killed_during_a_merge(fleet: tuple[list[Path], list[Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      watchdog: None, capfd: pytest.CaptureFixture[str]) -> None:
    """A head and a worker node of 1 CPU each; the worker node is killed the moment its first fold ends, its partial
    lost with it: Ray folds those inputs again on the head, the merge ends with the serial merge's bytes, and the driver
    said how far it was while it waited."""
    from kpgo import cluster as kpgo_cluster

    monkeypatch.setattr(kpgo_cluster, "MERGE_HEARTBEAT_SECONDS", 1.0)
    marks = tmp_path / "marks"
    cluster = slowed_cluster(marks, monkeypatch, 1)
    with driving(cluster):
        worker = cluster.add_node(num_cpus=1)
        killer, seen = kill_at(cluster, worker, marks, "end")
        res = kpgo_cluster.tree_merge(fleet[0], tmp_path / "tree", fan_in=2, strict=True, address=cluster.address)
        killer.join()
        head = cluster.head_node.node_id
    assert seen, "the worker node was not seen folding"
    lost = seen[0].split(".")[1]
    assert (marks / f"{head}.{lost}.start").exists(), f"fold {lost} was not made again on the head: {sorted(p.name for p in marks.iterdir())}"
    merge_profiles(fleet[0], tmp_path / "serial", strict=True)
    assert same_tree(tmp_path / "serial", tmp_path / "tree")
    assert res["cluster"]["levels"] == 3
    err = capfd.readouterr().err
    assert "kpgo: merge: level 1 (4 folds): " in err, err


def test_no_node_left_during_a_merge_is_one_line(fleet: tuple[list[Path], list[Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 watchdog: None) -> None:
    """A head without CPUs and one worker node, killed during its first fold: one line, and no output."""
    from kpgo import cluster as kpgo_cluster

    monkeypatch.setattr(kpgo_cluster, "MERGE_HEARTBEAT_SECONDS", 1.0)
    marks = tmp_path / "marks"
    cluster = slowed_cluster(marks, monkeypatch, 0)
    address = cluster.address
    with driving(cluster):
        worker = cluster.add_node(num_cpus=1)
        killer, seen = kill_at(cluster, worker, marks, "start")
        with pytest.raises(InfraError) as e:
            kpgo_cluster.tree_merge(fleet[0], tmp_path / "tree", fan_in=2, strict=True, address=cluster.address)
        killer.join()
    assert seen
    assert str(e.value).startswith(f"merge: no node of the Ray cluster at {address} with a CPU is left (level 1 (4 folds): ")
    assert "\n" not in str(e.value) and e.value.hint and "run the same command again" in e.value.hint
    assert not (tmp_path / "tree").exists() and not list(tmp_path.glob(".tree*"))


@pytest.mark.parametrize("other", ["stale", "running"])
def test_local_beside_another_ray(fleet: tuple[list[Path], list[Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: str) -> None:
    """`--cluster local` starts its own Ray whatever this machine has: a Ray node running here, its address in Ray's
    address file (as `ray start` leaves it), or that file left by a Ray that is gone (and RAY_ADDRESS naming it)."""
    from ray.cluster_utils import Cluster

    short = Path(tempfile.mkdtemp(prefix="kr", dir="/tmp"))  # Ray's socket paths must stay under 108 bytes
    monkeypatch.setenv("RAY_TMPDIR", str(short))
    (short / "ray").mkdir()
    running = None
    try:
        if other == "running":
            running = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
            address = running.address
        else:
            address = "127.0.0.1:1"  # nothing listens there
        (short / "ray" / "ray_current_cluster").write_text(address)
        res = kpgo("profile", "merge", *fleet[0][:3], "-o", tmp_path / "tree", "--cluster", "local", timeout=300, env={"RAY_ADDRESS": address})
        assert res.returncode == 0, res.stderr
        merge_profiles(fleet[0][:3], tmp_path / "serial", strict=True)
        assert same_tree(tmp_path / "serial", tmp_path / "tree")
        if running is not None:  # untouched: still the only node of its cluster
            import ray

            ray.init(address=address, logging_level="WARNING", log_to_driver=False)
            try:
                assert len([n for n in ray.nodes() if n["Alive"]]) == 1
            finally:
                ray.shutdown()
    finally:
        if running is not None:
            running.shutdown()
        shutil.rmtree(short, ignore_errors=True)


def test_json_stays_json_whatever_is_printed(fleet: tuple[list[Path], list[Path]], tmp_path: Path) -> None:
    """`--json` on a cluster: what else writes to stdout while Ray runs (Ray prints its nodes' messages there; here
    lines written to file descriptor 1, to sys.stdout and by a child process once Ray is up) goes to stderr, and
    stdout is the JSON alone."""
    noise = ("import os, subprocess, sys; from kpgo import cluster\n"
             "real = cluster.connect\n"
             "def noisy(*a, **k):\n"
             "    ray = real(*a, **k); os.write(1, b'fd noise\\n'); print('print noise'); subprocess.run(['echo', 'child noise']); return ray\n"
             "cluster.connect = noisy\n")
    code = noise + "from kpgo.cli import main; sys.exit(main(sys.argv[1:]))"
    cp = subprocess.run([sys.executable, "-c", code, "profile", "merge", *map(str, fleet[0][:3]), "-o", str(tmp_path / "m"),
                         "--cluster", "local", "--json"], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stderr
    res = json.loads(cp.stdout)
    assert res["cluster"]["address"] == "local" and len(res["inputs"]) == 3
    assert all(n in cp.stderr for n in ("fd noise", "print noise", "child noise")), cp.stderr


def test_a_node_with_another_kpgo_is_one_line(fleet: tuple[list[Path], list[Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The only node with CPUs runs a kpgo whose files differ from the driver's by one comment: its first task refuses
    in one line naming both, and nothing is written."""
    from ray.cluster_utils import Cluster

    from kpgo import cluster as kpgo_cluster

    other = tmp_path / "other"
    shutil.copytree(SRC / "kpgo", other / "kpgo", ignore=shutil.ignore_patterns("__pycache__"))
    with (other / "kpgo" / "stats.py").open("a") as f:
        f.write("# a node's local change\n")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    address = cluster.address
    try:
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(other), os.environ.get("PYTHONPATH", "")]))
        cluster.add_node(num_cpus=1)  # (its processes import kpgo from `other`)
        monkeypatch.undo()
        with pytest.raises(UserError) as e:
            kpgo_cluster.tree_merge(fleet[0], tmp_path / "out", fan_in=4, address=address)
    finally:
        cluster.shutdown()
    mine = kpgo_cluster.kpgo_identity()
    msg = str(e.value)
    assert "\n" not in msg and " runs another kpgo than the driver: " in msg and f"in {other / 'kpgo'}" in msg, msg
    assert f"the driver {mine['version']} (files {mine['digest']})" in msg and "install the driver's kpgo on every node" in msg
    assert not (tmp_path / "out").exists()


def test_node_caches_are_bounded_and_tidied(tmp_path: Path) -> None:
    """A node's copies of kernels are held to their bound, least recently used first, never the one in use; the task
    directories of nodes no longer alive are removed, those of live nodes kept."""
    from kpgo.cluster import tidy_node_dirs, trim_kernels

    kernels = tmp_path / "cluster" / "kernels"
    for i, name in enumerate(["old", "mid", "new", "used"]):
        (kernels / name).mkdir(parents=True)
        (kernels / name / "bzImage").write_bytes(bytes(400_000))
        os.utime(kernels / name, (1000 + i, 1000 + i))
    os.utime(kernels / "used", (10, 10))  # the least recent, but the one a task uses now
    assert trim_kernels(kernels, keep=kernels / "used", limit_mb=0.9) == ["old", "mid"]
    assert sorted(p.name for p in kernels.iterdir()) == ["new", "used"]
    assert trim_kernels(kernels, keep=kernels / "used", limit_mb=0.9) == []
    for kind, node in [("boots", "aaaaaaaaaaaa"), ("collect", "bbbbbbbbbbbb"), ("builds", "aaaaaaaaaaaa"), ("builds", "cccccccccccc")]:
        (tmp_path / "cluster" / kind / node / "task").mkdir(parents=True)
    assert sorted(tidy_node_dirs(tmp_path, {"aaaaaaaaaaaa" + "0" * 44})) == ["builds/cccccccccccc", "collect/bbbbbbbbbbbb"]
    assert [p.relative_to(tmp_path).as_posix() for p in sorted((tmp_path / "cluster").glob("*/*")) if p.parent.name != "kernels"] == [
        "cluster/boots/aaaaaaaaaaaa", "cluster/builds/aaaaaaaaaaaa"]


def test_a_task_s_unexpected_failure_reaches_the_user(fleet: tuple[list[Path], list[Path]], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A fold fails with an exception kpgo does not expect: one line naming it, and a hint naming a file here that
    holds the node's traceback and where the node keeps its Ray logs."""
    from kpgo import cluster as kpgo_cluster

    monkeypatch.setenv(slow_merge.FAIL, "1")
    monkeypatch.setenv("KPGO_CACHE", str(tmp_path / "cache"))
    marks = tmp_path / "marks"
    cluster = slowed_cluster(marks, monkeypatch, 1)
    with driving(cluster):
        with pytest.raises(InfraError) as e:
            kpgo_cluster.tree_merge(fleet[0], tmp_path / "out", fan_in=4, address=cluster.address)
    assert str(e.value).startswith("a merge task failed: ZeroDivisionError: a bug in a fold, for the test — Ray's report: "), str(e.value)
    assert "\n" not in str(e.value) and "the node's Ray logs: " in str(e.value) and "/logs" in str(e.value)
    report = Path(str(e.value.hint).split("Ray's report: ")[1].split(";")[0])
    assert report.parent == tmp_path / "cache" / "cluster" / "logs"
    text = report.read_text()
    assert "slow_merge.py" in text and 'raise ZeroDivisionError("a bug in a fold, for the test")' in text and "\x1b[" not in text, text
    assert not (tmp_path / "out").exists()


def _own_processes(mark: str) -> list[int]:
    """The processes whose command line names mark (a Ray temporary directory of this test's own), and their children
    (Ray's agents name no directory)."""
    found = []
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if d.name.isdigit() and mark.encode() in (d / "cmdline").read_bytes():
                found.append(int(d.name))
    kids = []
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) in found:
                kids.append(int(d.name))
    return found + kids


def test_a_head_with_token_authentication(fleet: tuple[list[Path], list[Path]], tmp_path: Path) -> None:
    """A head started with `ray start` as docs/SCALE.md's recipe starts it (RAY_AUTH_MODE=token, the token in
    ~/.ray/auth_token, a port that is not redis's 6379): a driver without the token is refused in one line saying what
    a head with a token needs; with it, the merge runs."""
    home, short = tmp_path / "home", Path(tempfile.mkdtemp(prefix="kr", dir="/tmp"))  # Ray's socket paths stay short
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray_bin = Path(sys.executable).parent / "ray"
    env = {**os.environ, "HOME": str(home), "RAY_AUTH_MODE": "token"}
    try:
        subprocess.run([ray_bin, "get-auth-token", "--generate"], env=env, check=True, capture_output=True, timeout=60)
        subprocess.run([ray_bin, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--include-dashboard=false",
                        "--num-cpus=1", f"--temp-dir={short}"], env=env, check=True, capture_output=True, timeout=120)
        args = ("profile", "merge", *fleet[0][:2], "-o", tmp_path / "m", "--cluster", f"127.0.0.1:{port}")
        for mode in ("disabled", "token"):  # a driver without token authentication; one with it but no token
            assert_one_line_error(kpgo(*args, timeout=300, env={"HOME": str(tmp_path), "RAY_AUTH_MODE": mode}), 1,
                                  f"cannot connect to a Ray cluster at 127.0.0.1:{port}", "RAY_AUTH_MODE=token and its token here")
        assert not (tmp_path / "m").exists()
        res = kpgo(*args, timeout=300, env={"HOME": str(home), "RAY_AUTH_MODE": "token"})
        assert res.returncode == 0, res.stderr
    finally:
        ours = _own_processes(str(short))  # (once: an agent whose raylet ended is no longer its child)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in ours:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            time.sleep(3)
        assert not _own_processes(str(short))
        shutil.rmtree(short, ignore_errors=True)


def test_tasks_on_one_machine_fetch_a_kernel_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes on one machine share its cache: tasks wanting the same kernel at once take turns, the first writes the copy
    and the others use it (before, the second rename met the first's directory: "Directory not empty", a CI failure)."""
    import types

    from kpgo import cluster

    monkeypatch.setenv("KPGO_CACHE", str(tmp_path / "cache"))
    fetched = []

    def get(ref: Any) -> dict[str, bytes]:
        fetched.append(ref)
        time.sleep(0.5)  # the object store's transfer: long enough for every thread to be waiting
        return {"arch/x86/boot/bzImage": b"kernel", "build.json": b"{}"}

    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(get=get))
    got: list[Path] = []
    errors: list[BaseException] = []

    def task() -> None:
        try:
            got.append(cluster._build_here("k0", ["ref"]))
        except BaseException as e:  # noqa: BLE001 - the thread's failure is the test's
            errors.append(e)

    threads = [threading.Thread(target=task) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and len(got) == 4 and len(set(got)) == 1 and fetched == ["ref"]
    assert (got[0] / "arch/x86/boot/bzImage").read_bytes() == b"kernel"
    assert sorted(p.name for p in got[0].parent.iterdir() if not p.name.endswith(".lock")) == ["k0"]


def test_a_kernel_with_modules_goes_to_the_nodes_with_them(tmp_path: Path) -> None:
    """A node boots a build with modules (--base debian) as vng boots it here: the modules modules.order names (.o
    there since 6.2, .ko on disk) and what virtme-prep-kdir-mods reads go with the kernel; a build without, just it."""
    from kpgo.cluster import KERNEL_FILES, kernel_files

    assert list(kernel_files(tmp_path)) == list(KERNEL_FILES)
    (tmp_path / "modules.order").write_text("lib/test_static_keys.o\nlib/test_static_key_base.o\n")
    files = kernel_files(tmp_path)
    assert list(files)[:len(KERNEL_FILES)] == list(KERNEL_FILES)
    assert {"modules.order", "modules.builtin", "modules.builtin.modinfo", "System.map", "lib/test_static_keys.ko",
            "lib/test_static_key_base.ko"} == set(files) - set(KERNEL_FILES)
    assert all(p == tmp_path / rel for rel, p in files.items())
