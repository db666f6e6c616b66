"""`kpgo bench --cluster` without guests: the schedule (rounds round-robin over the nodes, each whole on one node, a
lost node's rounds moved whole), the choice of nodes and its one-line errors, and a bench on a Ray cluster of two
nodes on this machine whose workers boot fake guests (tests/fake_boot.py): the single-machine bench's design, hosts
recorded, kernels written once per node, a rerun that boots nothing, a node removed during a boot. Also: the
single-machine bench never imports Ray. The same with real guests: test_cluster_bench_vm.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import fake_boot
import gcov_fixtures
from conftest import CliResult, assert_one_line_error, workload
from kpgo import bench, collect, pipeline, records, variants, vm, workloads
from kpgo.cluster import GUEST, Cluster, Schedule, choose_nodes
from kpgo.errors import InfraError, UserError
from kpgo.kernel import kbuild
from test_variants import FAKE_MAKE, fake_buildable_tree

TESTS = Path(__file__).resolve().parent
SPREAD = "0.02"  # the fake boots' boot-to-boot spread on the cluster's nodes (a real redis bench's is ~1-2%)


def fake_build(d: Path, key: str, size: int) -> Path:
    """A directory that passes for a kpgo build: build.json, .config and a bzImage of `size` bytes (the fake boot's
    figure)."""
    (d / "arch" / "x86" / "boot").mkdir(parents=True)
    (d / "arch" / "x86" / "boot" / "bzImage").write_bytes(bytes(size))
    (d / ".config").write_text("CONFIG_MODULES=n\nCONFIG_SYSVIPC=y\n" + "".join(f"CONFIG_{o}=y\n" for o in workloads.GUEST_BUILTIN))
    (d / "build.json").write_text(json.dumps({"ok": True, "key": key, "variant": "vanilla", "kernel_release": "6.12.0-fake"}))
    return d


@pytest.fixture
def two_kernels(tmp_path: Path) -> list[bench.Kernel]:
    return [bench.Kernel("vanilla", fake_build(tmp_path / "k1", "aaaa1111", 4096)),
            bench.Kernel("optimized", fake_build(tmp_path / "k2", "bbbb2222", 8192))]


def run(*args: str | Path, code: str, env: dict[str, str] | None = None) -> CliResult:
    """kpgo's command line in a child Python that runs `code` first."""
    start = time.monotonic()
    cp = subprocess.run([sys.executable, "-c", code + "\nfrom kpgo.cli import main; sys.exit(main(sys.argv[1:]))", *map(str, args)],
                        capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
    return CliResult(cp.returncode, cp.stdout, cp.stderr, time.monotonic() - start)


# -- the schedule -------------------------------------------------------------------------------------------------


def boots_of(rounds: int, kept: dict[tuple[int, str], str | None] | None = None) -> list[bench.Boot]:
    """A plan of two kernels on one workload; kept: (round, kernel) -> the node that made an earlier bench's sample."""
    seq = bench.plan([("a", "w"), ("b", "w")], rounds, "random", 7)
    kept = kept or {}
    return [bench.Boot(s, Path(f"/b/{s['round']}-{s['kernel']}"), "key",
                       {"host": {"node_id": kept[(s["round"], s["kernel"])]}} if (s["round"], s["kernel"]) in kept else None)
            for s in seq]


def drain(s: Schedule, node: str) -> list[bench.Boot]:
    out = []
    while (b := s.next(node)) is not None:
        out.append(b)
        s.done(b)
    return out


def test_rounds_go_round_robin_each_whole_on_one_node() -> None:
    boots = boots_of(5)
    s = Schedule(boots, ["A", "B"])
    assert s.owner == {0: "A", 1: "B", 2: "A", 3: "B", 4: "A"} and not s.moves
    a, b = drain(s, "A"), drain(s, "B")
    # Each node boots its rounds in round order, each in the plan's order.
    assert a == [x for x in boots if x.step["round"] in (0, 2, 4)]
    assert b == [x for x in boots if x.step["round"] in (1, 3)]
    assert s.remaining() == 0


def test_a_rerun_keeps_a_round_on_its_node_or_moves_it_whole() -> None:
    """Round 0 finished on a node that is gone: kept as it is. Round 1 half done on B: the rest stays on B. Round 2
    half done on Z, which is gone: booted again whole elsewhere. Round 3: new."""
    boots = boots_of(4, {(0, "a"): "X", (0, "b"): "X", (1, "a"): "B", (2, "b"): "Z"})
    s = Schedule(boots, ["A", "B"])
    assert s.owner == {0: "X", 1: "B", 2: "A", 3: "A"}
    assert s.moves == [{"round": 2, "from": ["Z"], "to": "A", "booted_again": 1,
                        "why": "an earlier bench left it half done on a node that is not here"}]
    assert [x.cell for x in drain(s, "B")] == [(1, "b", "w")]
    assert [x.step["round"] for x in drain(s, "A")] == [2, 2, 3, 3]


def test_a_lost_node_s_rounds_move_whole() -> None:
    boots = boots_of(4)
    s = Schedule(boots, ["A", "B"])
    first = s.next("A")
    assert first is not None
    s.done(first)  # round 0's first boot finished on A ...
    assert s.next("A") is not None  # ... and A is lost during its second
    on_b = s.next("B")
    assert on_b is not None and on_b.step["round"] == 1
    moved = s.lost("A")
    assert [(m["round"], m["from"], m["to"], m["booted_again"]) for m in moved] == [(0, ["A"], "B", 1), (2, ["A"], "B", 0)]
    assert moved[0]["why"] == "its node was lost during a boot"
    s.done(on_b)
    # B finishes the round it is in the middle of, then boots round 0 again from its first cell, then round 2.
    assert [x.step["round"] for x in drain(s, "B")] == [1, 0, 0, 2, 2, 3, 3]
    assert set(s.owner.values()) == {"B"}


def test_no_node_left_is_an_error() -> None:
    s = Schedule(boots_of(2), ["A", "B"])
    s.lost("A")
    with pytest.raises(InfraError, match="every node of the Ray cluster that boots guests was lost"):
        s.lost("B")


# -- choosing the nodes -------------------------------------------------------------------------------------------


def check(name: str, problems: tuple[str, ...] = (), kvm: bool = False, sim_problem: str | None = None) -> dict[str, Any]:
    return {"node_id": name * 8, "hostname": f"host-{name}", "problems": list(problems), "kvm": kvm, "sim_problem": sim_problem}


def test_choose_nodes() -> None:
    checks = [check("a", kvm=True), check("b"), check("c", ("workload packages not installed: redis needs redis-server",))]

    def chose(cs: list[dict[str, Any]], mode: str) -> tuple[str, bool, list[str]]:
        accel, sim, chosen = choose_nodes(cs, bench.SimChoice(mode), "head:6379")
        return accel, sim is not None, [c["hostname"] for c in chosen]

    # KVM where some node has it, and then only those nodes; without KVM anywhere, TCG with simulated counters.
    assert chose(checks, "auto") == ("kvm", False, ["host-a"])
    assert chose(checks, "off") == ("kvm", False, ["host-a"])
    assert chose(checks[1:], "auto") == ("tcg", True, ["host-b"])
    # Simulated boots: TCG on every node with the plugin.
    assert chose([check("a", kvm=True, sim_problem="kpgo's QEMU plugin: no header"), *checks[1:]], "on") == ("tcg", True, ["host-b"])


def test_no_node_can_boot_is_one_line() -> None:
    checks = [check("c", ("workload packages not installed: redis needs redis-server",)), check("d", sim_problem="kpgo's QEMU plugin: no\nheader")]
    with pytest.raises(UserError) as e:
        choose_nodes(checks, bench.SimChoice("on"), "head:6379")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("no node of the Ray cluster at head:6379 can boot these guests")
    assert "host-c [cccccccc]: workload packages not installed: redis needs redis-server" in msg
    assert "host-d [dddddddd]: kpgo's QEMU plugin: no header" in msg and "make setup" in msg


# -- the command line ---------------------------------------------------------------------------------------------


def test_single_machine_bench_does_not_import_ray(two_kernels: list[bench.Kernel], tmp_path: Path) -> None:
    """`kpgo bench` without --cluster (fake boots): a complete bench, each sample naming its host, and Ray never
    imported."""
    code = f"import sys; sys.path.insert(0, {str(TESTS)!r}); import fake_boot; fake_boot.install()"
    check_ray = "\nimport atexit; atexit.register(lambda: print('RAY IMPORTED' if 'ray' in sys.modules else 'no ray'))"
    meta = two_kernels[1].build_dir / "build.json"  # a PGO build's flags: the profile-use set, then what tells it apart
    meta.write_text(json.dumps(json.loads(meta.read_text()) | {"kcflags": [*kbuild.PROFILE_USE_FLAGS, *variants.PARTIAL_TRAINING_FLAGS]}))
    res = run("bench", "--kernel", f"vanilla={two_kernels[0].build_dir}", "--kernel", f"optimized={two_kernels[1].build_dir}",
              "--workload", "redis", "--boots", "2", "--no-sim", "-o", tmp_path / "b", code=code + check_ray, env={"KPGO_ACCEL": "tcg"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith("no ray")
    out = json.loads((tmp_path / "b" / "results.json").read_text())
    assert len(out["samples"]) == 4 and "hosts" not in out and "hosts" not in out["design"]
    assert all(set(s["host"]) == {"hostname", "cpu_model", "qemu"} for s in out["samples"])
    assert out["kernels"]["optimized"]["flags"] == ["-fprofile-partial-training"] and out["kernels"]["vanilla"]["flags"] is None


def test_boots_of_another_set_of_cells_are_measured_again(two_kernels: list[bench.Kernel], tmp_path: Path) -> None:
    """A bench given a third kernel measures every cell again (its earlier boots ran in another block); the same
    bench again keeps them all; more boots keep the earlier rounds (fake boots)."""
    code = f"import sys; sys.path.insert(0, {str(TESTS)!r}); import fake_boot; fake_boot.install()"
    third = bench.Kernel("other", fake_build(tmp_path / "k3", "cccc3333", 12288))
    args = ["--kernel", f"vanilla={two_kernels[0].build_dir}", "--kernel", f"optimized={two_kernels[1].build_dir}",
            "--workload", "redis", "--no-sim", "-o", tmp_path / "b"]
    env = {"KPGO_ACCEL": "tcg"}
    first = run("bench", *args, "--boots", "2", code=code, env=env)
    assert first.returncode == 0, first.stderr
    blocks = {json.loads(p.read_text())["block"] for p in (tmp_path / "b" / "boots").glob("*/sample.json")}
    assert len(blocks) == 1
    more = run("bench", *args, "--kernel", f"other={third.build_dir}", "--boots", "2", code=code, env=env)
    assert more.returncode == 0, more.stderr
    assert "changed since its 4 earlier boots: every cell is measured again" in more.stderr and "kept" not in more.stderr
    assert "boot 6/6" in more.stderr
    same = run("bench", *args, "--kernel", f"other={third.build_dir}", "--boots", "3", code=code, env=env)
    assert same.returncode == 0, same.stderr
    assert "6 of 9 boots kept" in same.stderr and "boot 3/3" in same.stderr and "changed" not in same.stderr
    out = json.loads((tmp_path / "b" / "results.json").read_text())
    assert len(out["samples"]) == 9 and len({s["block"] for s in out["samples"]}) == 1


def test_no_node_with_the_guest_resource_is_one_line(two_kernels: list[bench.Kernel], tmp_path: Path) -> None:
    """A Ray cluster whose nodes lack kpgo_guest (this machine's, started without it): refused before any boot."""
    code = "import sys, ray; ray.init(address='local', num_cpus=1, include_dashboard=False, logging_level='ERROR', log_to_driver=False)"  # a Ray of its own
    res = run("bench", "--kernel", f"vanilla={two_kernels[0].build_dir}", "--workload", "redis", "--cluster", "local",
              "-o", tmp_path / "b", code=code)
    assert_one_line_error(res, 1, f"no node of the Ray cluster at local offers the {GUEST} resource", "ray start",
                          f"--resources='{{\"{GUEST}\": 1}}'")
    assert not (tmp_path / "b").exists()


def test_ray_missing_or_unreachable_is_one_line(two_kernels: list[bench.Kernel], tmp_path: Path) -> None:
    args = ("bench", "--kernel", f"vanilla={two_kernels[0].build_dir}", "--workload", "redis", "-o", tmp_path / "b")
    res = run(*args, "--cluster", "local", code="import sys; sys.modules['ray'] = None")
    assert_one_line_error(res, 1, "--cluster needs Ray, which is not installed", "pip install 'kpgo[cluster]'")
    res = run(*args, "--cluster", "127.0.0.1:1", code="import sys")
    assert_one_line_error(res, 1, "cannot reach a Ray cluster at 127.0.0.1:1")
    assert not (tmp_path / "b").exists()


# -- a Ray cluster of two nodes with fake boots -------------------------------------------------------------------


@dataclass
class LocalCluster:
    """The module's Ray cluster on this machine and the worker node a test starts with."""

    cluster: Any
    worker: Any
    cache: Path


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A head and a worker node on this machine (1 CPU and the kpgo_guest resource each), this process their driver,
    their workers booting fake guests of 1.5 s whose figures spread from boot to boot as real ones do (the same
    figure for a boot wherever it runs), and the nodes' kpgo cache."""
    import ray
    from ray.cluster_utils import Cluster

    cache = tmp_path_factory.mktemp("node-cache")
    gcc = gcov_fixtures.build_program(tmp_path_factory.mktemp("gccbuild"))
    gcda = gcov_fixtures.kernelize_tree(gcc.profile(tmp_path_factory.mktemp("p") / "raw", 0, 100), tmp_path_factory.mktemp("p") / "kernel")
    with pytest.MonkeyPatch.context() as mp:  # what the nodes' processes inherit
        mp.setenv(fake_boot.GCDA, str(gcda))
        mp.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p))
        mp.setenv("KPGO_CACHE", str(cache))
        mp.setenv("KPGO_ACCEL", "tcg")
        mp.setenv(fake_boot.SECONDS, "1.5")
        mp.setenv(fake_boot.SPREAD, SPREAD)
        # builds: make is test_variants' fake, which logs each call and takes FAKE_MAKE_SECONDS to make a bzImage
        bin_dir = tmp_path_factory.mktemp("bin")
        (bin_dir / "make").write_text(FAKE_MAKE)
        (bin_dir / "make").chmod(0o755)
        mp.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
        mp.setenv("KPGO_FAKE_LOG", str(cache / "make.log"))
        mp.setenv("KPGO_FAKE_MAKE_SECONDS", "1.5")
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {GUEST: 1}, "include_dashboard": False})
        try:
            worker = cluster.add_node(num_cpus=1, resources={GUEST: 1})
            ray.init(address=cluster.address, runtime_env={"worker_process_setup_hook": "fake_boot.install"},
                     logging_level="WARNING", log_to_driver=False)
            yield LocalCluster(cluster, worker, cache)
        finally:
            ray.shutdown()
            cluster.shutdown()


@pytest.fixture
def two_nodes(local_cluster: LocalCluster) -> tuple[Any, Any, Path]:
    """The head and one live worker node, whatever the tests before this one did to the cluster (a worker node killed,
    a node added and left): each test starts from the same two nodes, in any order. Yields the cluster, the worker node
    and the nodes' kpgo cache."""
    cluster = local_cluster.cluster
    for node in list(cluster.worker_nodes):
        if node is not local_cluster.worker:
            cluster.remove_node(node, allow_graceful=False)
    if local_cluster.worker not in cluster.worker_nodes:  # killed by an earlier test: a new one
        local_cluster.worker = cluster.add_node(num_cpus=1, resources={GUEST: 1})
    wait_for_live_nodes(cluster)
    return cluster, local_cluster.worker, local_cluster.cache


def wait_for_live_nodes(cluster: Any) -> None:
    """Until Ray's own list of live nodes is the cluster's nodes: those added are up, those removed seen gone."""
    import ray

    cluster.wait_for_nodes()
    want = {n.node_id for n in cluster.list_all_nodes()}
    deadline = time.monotonic() + 60
    while {n["NodeID"] for n in ray.nodes() if n["Alive"]} != want:
        assert time.monotonic() < deadline, f"the cluster's live nodes are not {want}: {ray.nodes()}"
        time.sleep(0.2)


def test_cluster_bench_is_the_same_design_with_hosts(two_nodes: tuple[Any, Any, Path], two_kernels: list[bench.Kernel], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cluster, worker, cache = two_nodes
    wls = [workload("fake")]
    design = bench.Design(boots=4, seed=11)
    res = bench.bench(two_kernels, wls, tmp_path / "c", design=design, guest=vm.Guest(), cluster=Cluster(cluster.address))
    monkeypatch.setattr(vm, "run_agent", fake_boot.fake_run_agent)
    monkeypatch.setenv("KPGO_ACCEL", "tcg")
    monkeypatch.setenv(fake_boot.SPREAD, SPREAD)  # as on the nodes
    here = bench.bench(two_kernels, wls, tmp_path / "h", design=design, guest=vm.Guest())

    # The design is the single-machine bench's, with where each round ran beside it.
    placed = res["design"].pop("hosts")
    assert res["design"] == here["design"]
    # Each boot its own figure (the fake boots spread), so each sample is its own boot's and no other's, and the
    # statistics are those of the same figures: a ratio with an interval of some width.
    assert [s["values"] for s in res["samples"]] == [s["values"] for s in here["samples"]]
    assert [(s["round"], s["kernel"]) for s in res["samples"]] == [(s["round"], s["kernel"]) for s in here["samples"]]
    assert len({s["values"][0] for s in res["samples"]}) == len(res["samples"]) == 8
    assert res["workloads"] == here["workloads"] and not res["failed"]
    [opt] = [r for r in res["workloads"]["fake"]["summary"] if r["kernel"] == "optimized"]
    assert opt["ci_low"] < opt["speedup"] < opt["ci_high"]
    # Rounds round-robin over the two nodes (in node order), each whole on one; every sample names its node.
    nodes = placed["nodes"]
    assert sorted(nodes) == sorted([cluster.head_node.node_id, worker.node_id])
    assert placed["rounds"] == {str(r): nodes[r % 2] for r in range(4)} and placed["moved"] == []
    for s in res["samples"]:
        assert s["host"]["node_id"] == placed["rounds"][str(s["round"])]
        t = s["host"]["task"]
        assert set(t) == {"fetch", "work", "pack", "wall", "unpack", "bytes"} and t["wall"] >= t["work"] >= 1.5  # a fake boot's 1.5 s
        assert s["host"]["hostname"] and s["host"]["cpu_model"] and s["host"]["qemu"].startswith("QEMU")
    assert {n: (h["rounds"], h["boots"]) for n, h in res["hosts"].items()} == {nodes[0]: ([0, 2], 4), nodes[1]: ([1, 3], 4)}
    assert res["host"]["hosts"] == 2 and res["host"]["cluster"] == cluster.address
    assert "on 2 host(s) of a Ray cluster, each round whole on one host" in bench.format_table(res)
    # The driver wrote each boot's sample and outputs; the nodes kept a copy of each kernel and no boot directory.
    for s in res["samples"]:
        d = tmp_path / "c" / "boots" / f"{s['round']:02d}-fake-{s['kernel']}"
        assert json.loads((d / "sample.json").read_text()) == s
        assert (d / "console.log").read_text().startswith("fake boot of ") and (d / "guest" / "load-0.txt").is_file()
    for k in two_kernels:
        key = json.loads((k.build_dir / "build.json").read_text())["key"]
        copy = cache / "cluster" / "kernels" / key
        assert (copy / "arch" / "x86" / "boot" / "bzImage").read_bytes() == (k.build_dir / "arch" / "x86" / "boot" / "bzImage").read_bytes()
    assert not [p for p in (cache / "cluster" / "boots").glob("*/*")]
    # A rerun boots nothing: every sample is kept as it was.
    again = bench.bench(two_kernels, wls, tmp_path / "c", design=bench.Design(boots=4), guest=vm.Guest(), cluster=Cluster(cluster.address))
    assert again["samples"] == res["samples"]


def test_cluster_collect(two_nodes: tuple[Any, Any, Path], tmp_path: Path) -> None:
    """`kpgo collect --cluster` (fake guests): each workload's collection on a free node, its profile written here
    with the node that collected it, the nodes' own directories removed; a workload failing in the guest is reported
    with its logs kept here, and one whose output exists fails before any task, the others going on."""
    cluster, worker, cache = two_nodes
    build = fake_build(tmp_path / "instr", "iiii0000", 4096)
    meta = json.loads((build / "build.json").read_text())
    (build / "build.json").write_text(json.dumps(meta | {"gcov": True, "build_dir": str(build), "config_name": "tiny",
                                                         "config_hash": "c0", "gcc": "gcc-12"}))
    wls = [workload("fake-a"), workload("fake-b"), workload("broken-c"), workload("fake-d")]
    outs = {w.name: tmp_path / "p" / w.name for w in wls}
    (tmp_path / "p" / "fake-d").mkdir(parents=True)  # an earlier collection's, say
    res = dict((w.name, r) for w, r in collect.on_cluster(Cluster(cluster.address), build, outs, wls, guest=vm.Guest()))
    assert isinstance(res["fake-d"], UserError) and "already exists" in res["fake-d"].message
    assert isinstance(res["broken-c"], InfraError) and "a fake failure" in res["broken-c"].message
    assert res["broken-c"].hint == f"guest logs kept in {tmp_path / 'p' / 'broken-c.failed-logs'}"
    assert (tmp_path / "p" / "broken-c.failed-logs" / "log" / "console.log").read_text().startswith("fake boot of ")
    assert not (tmp_path / "p" / "broken-c").exists()
    source = {p.relative_to(os.environ[fake_boot.GCDA]): p.read_bytes() for p in Path(os.environ[fake_boot.GCDA]).rglob("*.gcda")}
    nodes = {cluster.head_node.node_id, worker.node_id}
    used = set()
    for name in ("fake-a", "fake-b"):
        p = res[name]
        assert isinstance(p, dict) and p["workload"]["name"] == name and p["build_key"] == "iiii0000"
        on_disk = json.loads((outs[name] / "profile.json").read_text())
        assert on_disk == p and p["host"]["node_id"] in nodes and p["host"]["hostname"]
        t = p["host"]["task"]
        assert set(t) == {"fetch", "work", "pack", "wall", "unpack", "bytes"} and t["wall"] >= t["work"] >= 1.5  # a fake boot's 1.5 s
        used.add(p["host"]["node_id"])
        assert {q.relative_to(outs[name]): q.read_bytes() for q in outs[name].rglob("*.gcda")} == source
    assert used == nodes  # two free nodes, two collections at once
    assert not [p for p in (cache / "cluster" / "collect").glob("*/*")]


def test_run_collects_on_the_cluster_what_is_not_up_to_date(two_nodes: tuple[Any, Any, Path], tmp_path: Path) -> None:
    """`kpgo run --cluster`'s collect step (fake guests): the profiles not up to date are collected at once on the
    nodes, the others kept; a changed parameter collects that workload again."""
    from dataclasses import replace

    cluster, _, _ = two_nodes
    build = fake_build(tmp_path / "instr", "iiii3333", 4096)
    meta = json.loads((build / "build.json").read_text())
    (build / "build.json").write_text(json.dumps(meta | {"gcov": True, "build_dir": str(build), "config_name": "tiny",
                                                         "config_hash": "c0", "gcc": "gcc-12"}))
    instr = records.Build.of(build, json.loads((build / "build.json").read_text()))
    assert instr.key == "iiii3333"
    wls = [workload("fake-a", params={"n": 1}), workload("fake-b", params={"n": 1})]
    first = pipeline.collect_cached_on_cluster(tmp_path / "profiles", build, instr, wls, vm.Guest(), Cluster(cluster.address))
    assert sorted(first) == ["fake-a", "fake-b"] and all(p.raw["host"]["node_id"] for p in first.values())
    assert first["fake-a"].raw["host"]["node_id"] != first["fake-b"].raw["host"]["node_id"]  # at once, one on each node
    again = pipeline.collect_cached_on_cluster(tmp_path / "profiles", build, instr, wls, vm.Guest(), Cluster(cluster.address))
    assert {n: p.raw for n, p in again.items()} == {n: p.raw for n, p in first.items()}
    changed = [wls[0], replace(wls[1], params={"n": 2})]
    third = pipeline.collect_cached_on_cluster(tmp_path / "profiles", build, instr, changed, vm.Guest(), Cluster(cluster.address))
    assert third["fake-a"].raw == first["fake-a"].raw
    assert third["fake-b"].params == {"n": 2}
    assert json.loads((tmp_path / "profiles" / "fake-b.raw" / "profile.json").read_text()) == third["fake-b"].raw


def test_cli_collect_on_a_local_cluster(tmp_path: Path) -> None:
    """`kpgo collect --cluster local` from the command line (fake guests in the Ray workers): the profile and the
    line that names it, the node in profile.json."""
    gcc = gcov_fixtures.build_program(tmp_path / "gccbuild")
    gcda = gcov_fixtures.kernelize_tree(gcc.profile(tmp_path / "raw", 0, 100), tmp_path / "kernel")
    build = fake_build(tmp_path / "instr", "iiii1111", 4096)
    meta = json.loads((build / "build.json").read_text())
    (build / "build.json").write_text(json.dumps(meta | {"gcov": True, "build_dir": str(build), "config_name": "tiny",
                                                         "config_hash": "c0", "gcc": "gcc-12"}))
    code = (f"import sys, ray; sys.path.insert(0, {str(TESTS)!r}); ray.init(address='local', num_cpus=1, resources={{{GUEST!r}: 1}}, "
            "runtime_env={'worker_process_setup_hook': 'fake_boot.install'}, include_dashboard=False, logging_level='ERROR', log_to_driver=False)")
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p), "KPGO_ACCEL": "tcg",
           fake_boot.GCDA: str(gcda), "KPGO_CACHE": str(tmp_path / "cache"),
           fake_boot.SPREAD: "0", fake_boot.SECONDS: "0"}  # not the module cluster's, whether or not it is up: the figure is the kernel's size
    res = run("collect", build, "--workload", "micro", "--cluster", "local", "-o", tmp_path / "p", code=code, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"profile: {tmp_path / 'p'}  (3 files, 4096 ")
    meta = json.loads((tmp_path / "p" / "profile.json").read_text())
    assert meta["workload"]["name"] == "micro" and meta["host"]["node_id"] and "collect: 1 of 1 guest node(s)" in res.stderr


def test_a_node_removed_during_a_boot(two_nodes: tuple[Any, Any, Path], two_kernels: list[bench.Kernel], tmp_path: Path) -> None:
    """The worker node is killed during its second boot: its round moves whole to the head (the boot it finished is
    booted again there and replaces its sample), so is its other round, and the bench completes with every cell
    counted once."""
    cluster, worker, cache = two_nodes
    work = cache / "cluster" / "boots" / worker.node_id[:12]
    removed: list[str] = []

    def kill_during_second_boot() -> None:
        seen: set[str] = set()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            seen |= {p.name for p in work.glob("*")}
            if len(seen) == 2:
                cluster.remove_node(worker, allow_graceful=False)
                removed.extend(sorted(seen))
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_during_second_boot)
    killer.start()
    res = bench.bench(two_kernels, [workload("fake")], tmp_path / "c", design=bench.Design(boots=4, seed=5), guest=vm.Guest(),
                      cluster=Cluster(cluster.address))
    killer.join()
    assert removed, "the worker node was not seen booting twice"
    head = cluster.head_node.node_id
    cells = [(s["round"], s["kernel"]) for s in res["samples"]]
    assert len(cells) == 8 and len(set(cells)) == 8 and not res["failed"]
    assert {s["host"]["node_id"] for s in res["samples"]} == {head} and list(res["hosts"]) == [head]
    placed = res["design"]["hosts"]
    lost = [r for r, n in placed["rounds"].items() if n == head and int(r) % 2 == placed["nodes"].index(worker.node_id)]
    assert sorted(lost) == sorted(str(m["round"]) for m in placed["moved"])
    assert [(m["from"], m["to"], m["booted_again"]) for m in placed["moved"]] == [([worker.node_id], head, 1), ([worker.node_id], head, 0)]
    for s in res["samples"]:  # what is on disk is what was counted
        d = tmp_path / "c" / "boots" / f"{s['round']:02d}-fake-{s['kernel']}"
        assert json.loads((d / "sample.json").read_text())["host"]["node_id"] == head


def kill_once_busy(cluster: Any, node: Any, work: Path) -> tuple[threading.Thread, list[str]]:
    """A thread that kills `node` (raylet and workers, no grace) as soon as a task's directory appears in `work`, its
    node-local directory; the list gets the directories seen (empty if none appeared within 120 s)."""
    removed: list[str] = []

    def kill() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            seen = [p.name for p in work.glob("*")]
            if seen:
                cluster.remove_node(node, allow_graceful=False)
                removed.extend(seen)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill)
    killer.start()
    return killer, removed


def test_a_node_removed_during_a_collection(two_nodes: tuple[Any, Any, Path], tmp_path: Path) -> None:
    """A node added to the cluster is killed while it collects: its workload goes back to the queue and is collected
    on the head, and every profile is written once."""
    cluster, worker, cache = two_nodes
    cluster.remove_node(worker)  # the head and the added node: two workloads, so the added node collects one
    fresh = cluster.add_node(num_cpus=1, resources={GUEST: 1})
    wait_for_live_nodes(cluster)
    build = fake_build(tmp_path / "instr", "iiii2222", 4096)
    meta = json.loads((build / "build.json").read_text())
    (build / "build.json").write_text(json.dumps(meta | {"gcov": True, "build_dir": str(build), "config_name": "tiny",
                                                         "config_hash": "c0", "gcc": "gcc-12"}))
    killer, removed = kill_once_busy(cluster, fresh, cache / "cluster" / "collect" / fresh.node_id[:12])
    wls = [workload("fake-a"), workload("fake-b")]
    outs = {w.name: tmp_path / "p" / w.name for w in wls}
    res = dict((w.name, r) for w, r in collect.on_cluster(Cluster(cluster.address), build, outs, wls, guest=vm.Guest()))
    killer.join()
    assert removed, "the added node was not seen collecting"
    head = cluster.head_node.node_id
    for name in ("fake-a", "fake-b"):
        assert isinstance(res[name], dict) and res[name]["host"]["node_id"] == head
        assert json.loads((outs[name] / "profile.json").read_text()) == res[name]
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["fake-a", "fake-b"]


# -- kernel builds on the cluster (make faked: test_variants.FAKE_MAKE) -------------------------------------------


def run_options(tmp_path: Path, tree: Path) -> pipeline.RunOptions:
    return pipeline.RunOptions(tmp_path / "run", "tiny", None, (), tree, "redis", (), bench.Design(), 3, vm.Guest())


def made(cache: Path) -> list[list[str]]:
    """The fake make's bzImage calls so far, each its arguments."""
    log = cache / "make.log"
    return [args for ln in log.read_text().splitlines() if "bzImage" in (args := ln.split("\t"))] if log.exists() else []


def test_builds_on_the_cluster(two_nodes: tuple[Any, Any, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    """`kpgo run --cluster`'s builds: two at once, each on its own node from the node's copy of the source, written
    here under the key a local build would have, saying where they were built, and what runs where while they do; a
    rerun builds nothing."""
    from kpgo import cluster as kpgo_cluster

    monkeypatch.setattr(kpgo_cluster, "HEARTBEAT_SECONDS", 0.5)
    cluster, _, cache = two_nodes
    extra = cluster.add_node(num_cpus=1)  # a node without the guest resource builds too
    cluster.wait_for_nodes()
    opts = run_options(tmp_path, fake_buildable_tree(tmp_path / "linux"))
    build = opts.builder(*opts.kernel(), Cluster(cluster.address))
    before = len(made(cache))
    try:
        res = build.many([("vanilla", "vanilla", None), ("o3", "o3", None)])
    finally:
        cluster.remove_node(extra)
    runs = made(cache)[before:]
    assert len(runs) == 2
    assert len({r.raw["built_on"]["node_id"] for r in res.values()}) == 2  # two free nodes, two builds at once
    running = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("kpgo: build: running ")]
    assert running and "vanilla on " in running[0] and "o3 on " in running[0]
    for label, r in res.items():
        out = tmp_path / "run" / "builds" / label
        assert r.ok and r.key == kbuild.key_of(build.request(label, label)) and r.variant == label
        assert json.loads((out / "build.json").read_text()) == r.raw
        assert r.raw["bzImage"] == str(out / "arch" / "x86" / "boot" / "bzImage") and (out / "arch" / "x86" / "boot" / "bzImage").is_file()
        assert (out / ".kpgo-key").read_text() == r.key and (out / "build.log").is_file()
        # compiled on its node, in the node's directory (the build's build_dir: a gcov kernel's debugfs names it)
        node_out = cache / "cluster" / "builds" / r.raw["built_on"]["node_id"][:12] / label / "out"
        assert r.build_dir == str(node_out) and any(f"O={node_out}" in run for run in runs)
        assert kbuild.cached(build.request(label, label)) is not None
        # the task's timeline: the fake make takes 1.5 s; the wall time from submit to result holds the rest
        t = r.raw["built_on"]["task"]
        assert set(t) == {"fetch", "work", "pack", "wall", "unpack", "bytes"} and t["wall"] >= t["fetch"] + t["work"] + t["pack"] and t["work"] >= 1.5
    assert not [p for p in (cache / "cluster" / "builds").glob("*/*")]
    # Up to date here: nothing is built again.
    again = build.many([("vanilla", "vanilla", None), ("o3", "o3", None)])
    assert {k: r.raw for k, r in again.items()} == {k: r.raw for k, r in res.items()} and len(made(cache)) == before + 2


def test_no_node_can_build_is_one_line(two_nodes: tuple[Any, Any, Path], tmp_path: Path) -> None:
    """Nodes whose kernel source is not the driver's are not chosen; with none left, one line naming each node."""
    from dataclasses import replace

    cluster, _, _ = two_nodes
    opts = run_options(tmp_path, fake_buildable_tree(tmp_path / "linux"))
    spec, src = opts.kernel()
    build = pipeline.Builder(opts, spec, replace(src, ident="0" * 16), Cluster(cluster.address))
    with pytest.raises(UserError) as e:
        build("vanilla", "vanilla")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"no node of the Ray cluster at {cluster.address} can build these kernels")
    import ray

    alive = [n for n in ray.nodes() if n["Alive"]]
    assert msg.count("is not the driver's") == len(alive) and "make setup" in msg
    assert not (tmp_path / "run" / "builds" / "vanilla").exists()


def test_a_node_removed_during_a_build(two_nodes: tuple[Any, Any, Path], tmp_path: Path) -> None:
    """A node added to the cluster is killed while it builds: its build goes back to the queue and is built on
    another node; every build is written here once, complete."""
    cluster, _, cache = two_nodes
    fresh = cluster.add_node(num_cpus=1)
    wait_for_live_nodes(cluster)
    killer, removed = kill_once_busy(cluster, fresh, cache / "cluster" / "builds" / fresh.node_id[:12])
    opts = run_options(tmp_path, fake_buildable_tree(tmp_path / "linux"))
    res = opts.builder(*opts.kernel(), Cluster(cluster.address)).many([(v, v, None) for v in ("vanilla", "o3", "os")])
    killer.join()
    assert removed, "the added node was not seen building"
    assert all(r.ok and r.raw["built_on"]["node_id"] != fresh.node_id for r in res.values())
    for label, r in res.items():
        assert json.loads((tmp_path / "run" / "builds" / label / "build.json").read_text()) == r.raw
    assert sorted(p.name for p in (tmp_path / "run" / "builds").iterdir()) == ["o3", "os", "vanilla"]
