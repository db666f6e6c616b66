"""`kpgo bench --cluster` booting real guests on a Ray cluster of two nodes on this machine (ray.cluster_utils.Cluster:
a head and one worker node, 1 CPU and the kpgo_guest resource each), with the session's two tiny kernels (conftest's
tiny_run) on redis, two boots each:

(a) the design of `kpgo bench` on this machine with the same seed, and a complete results.json with the hosts;
(b) (marked slow) the worker node killed during its second boot: its round moves whole to the head, the bench
    completes, and no cell is counted twice;
(c) `kpgo collect --cluster` of two workloads with the tiny instrumented kernel: one on each node at once, each
    profile the kernel's own;
(d) (marked slow) the run's vanilla and optimized-micro kernels built again on the two nodes at once: the same keys,
    code and proof.

    nice -n 19 .venv/bin/python -m pytest -q -m 'vm and not slow' tests/test_cluster_bench_vm.py   # (b), (d): -m slow

The fast tests of the same code with fake boots are in test_cluster_bench.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import kpgo, short_sets
from kpgo import bench
from kpgo.cluster import GUEST
from kpgo.cluster import Cluster as KpgoCluster
from kpgo.paths import cache_dir
from kpgo.vm import AGENT_STARTED

pytestmark = pytest.mark.vm

# One vCPU per guest: each node has one CPU, and two guests run at once on this machine, so the client is in the
# guest (two host clients would both forward the host's 127.0.0.1:6379; nodes of a real cluster are separate hosts).
ARGS = ("--workload", "redis", "--set", "redis.requests=20000", "--boots", "2", "--cpus", "1", "--client", "guest", "--seed", "4242")


def kernels(tiny_run: Path) -> list[str]:
    return ["--kernel", f"vanilla={tiny_run / 'builds' / 'vanilla'}", "--kernel", f"optimized-redis={tiny_run / 'builds' / 'optimized-redis'}"]


@pytest.fixture
def two_nodes() -> Iterator[tuple[Any, Any]]:
    """A head and a worker node on this machine; their processes inherit this session's environment (its kpgo cache,
    where `make setup` built the simulator and the helpers)."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {GUEST: 1}, "include_dashboard": False})
    try:
        yield cluster, cluster.add_node(num_cpus=1, resources={GUEST: 1})
    finally:
        cluster.shutdown()


def boot_dir(out: Path, s: dict) -> Path:
    return out / "boots" / f"{s['round']:02d}-{s['workload']}-{s['kernel']}"


def test_cluster_collect_with_real_guests(tiny_run: Path, two_nodes: tuple[Any, Any], tmp_path: Path) -> None:
    from kpgo.gcov.gcda import ARCS, read_gcda

    cluster, worker = two_nodes
    instrumented = tiny_run / "builds" / "instrumented"
    res = kpgo("collect", instrumented, "--workload", "micro,redis", "--client", "guest", "--cpus", "1", *short_sets(["micro"]),
               "--set", "redis.requests=10000", "--cluster", cluster.address, "-o", tmp_path / "p", timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    key = json.loads((instrumented / "build.json").read_text())["key"]
    nodes = set()
    for w in ("micro", "redis"):
        meta = json.loads((tmp_path / "p" / w / "profile.json").read_text())
        assert meta["build_key"] == key and meta["throughput"] > 0 and meta["files"] > 100
        nodes.add(meta["host"]["node_id"])
        assert read_gcda(tmp_path / "p" / w / "kernel" / "sched" / "core.gcda").counters(ARCS).sum() > 0
    assert nodes == {cluster.head_node.node_id, worker.node_id}  # one collection on each node, at once


def test_cluster_bench_has_the_local_design_and_hosts(tiny_run: Path, two_nodes: tuple[Any, Any], tmp_path: Path) -> None:
    cluster, worker = two_nodes
    res = kpgo("bench", *kernels(tiny_run), *ARGS, "--cluster", cluster.address, "-o", tmp_path / "cluster", timeout=3600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "on 2 host(s) of a Ray cluster, each round whole on one host" in res.stdout
    c = json.loads((tmp_path / "cluster" / "results.json").read_text())

    # The single-machine bench's design for this seed (test_cluster_bench compares whole designs with fake boots),
    # and its measurement: simulated counters by default exactly under TCG.
    placed = c["design"].pop("hosts")
    assert c["design"]["sequence"] == bench.plan([("vanilla", "redis"), ("optimized-redis", "redis")], 2, "random", 4242)
    assert c["design"]["seed"] == 4242 and c["design"]["boots_per_kernel"] == 2 and c["design"]["order_name"] == "random"
    m = c["measurement"]
    assert m["sim_mode"] == "auto" and (m["sim"] is not None) == (m["accelerator"] == "tcg") == (m["headline"] == "simulated")
    assert not c["failed"] and sorted((s["round"], s["kernel"]) for s in c["samples"]) == [(r, k) for r in (0, 1) for k in ("optimized-redis", "vanilla")]
    assert sorted(c["workloads"]["redis"]["kernels"]) == ["optimized-redis", "vanilla"]
    nodes = placed["nodes"]
    assert sorted(nodes) == sorted([cluster.head_node.node_id, worker.node_id])
    assert placed["rounds"] == {"0": nodes[0], "1": nodes[1]} and placed["moved"] == []
    for s in c["samples"]:
        assert s["host"]["node_id"] == placed["rounds"][str(s["round"])]
        assert s["host"]["hostname"] and s["host"]["cpu_model"] == c["host"]["cpu"] and s["host"]["qemu"] == c["host"]["qemu"]
        assert s["mean"] > 0 and (s["sim_per_op"] is not None) == (c["measurement"]["sim"] is not None)
        d = boot_dir(tmp_path / "cluster", s)
        assert json.loads((d / "sample.json").read_text()) == s
        assert AGENT_STARTED in (d / "console.log").read_text()
    assert {n: (e["rounds"], e["boots"]) for n, e in c["hosts"].items()} == {nodes[0]: ([0], 2), nodes[1]: ([1], 2)}


@pytest.mark.slow  # ~3 min of boots; its logic is tested with fake boots in test_cluster_bench.py (CI's time, docs/MEASUREMENTS.md)
def test_worker_node_killed_during_a_boot(tiny_run: Path, two_nodes: tuple[Any, Any], tmp_path: Path) -> None:
    cluster, worker = two_nodes
    work = cache_dir() / "cluster" / "boots" / worker.node_id[:12]  # where the worker node boots (kpgo.cluster)
    out = tmp_path / "b"
    p = subprocess.Popen([sys.executable, "-m", "kpgo", "bench", *kernels(tiny_run), *ARGS, "--no-sim", "--cluster", cluster.address,
                          "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    seen: list[str] = []
    killed = None
    deadline = time.monotonic() + 2400
    try:
        while killed is None and p.poll() is None and time.monotonic() < deadline:
            for log in sorted(work.glob("*/console.log")):
                if log.parent.name not in seen:
                    seen.append(log.parent.name)
                # Its second boot's guest is running: the worker node's first boot is finished and written.
                if len(seen) == 2 and log.parent.name == seen[1] and AGENT_STARTED in log.read_text(errors="replace"):
                    cluster.remove_node(worker, allow_graceful=False)
                    killed = time.monotonic()
            time.sleep(0.5)
        stdout, stderr = p.communicate(timeout=max(60.0, deadline - time.monotonic()))
    finally:
        if p.poll() is None:
            p.kill()
    print(stderr[-4000:])
    assert killed is not None, f"the worker node was not seen in its second boot (seen: {seen})"
    assert p.returncode == 0, stderr[-3000:]
    assert "was lost: round" in stderr
    res = json.loads((out / "results.json").read_text())
    head = cluster.head_node.node_id
    cells = [(s["round"], s["kernel"]) for s in res["samples"]]
    assert len(cells) == 4 and len(set(cells)) == 4 and not res["failed"]
    assert {s["host"]["node_id"] for s in res["samples"]} == {head} and list(res["hosts"]) == [head]
    placed = res["design"]["hosts"]
    lost_round = placed["nodes"].index(worker.node_id)
    assert placed["rounds"] == {"0": head, "1": head}
    assert [(m["round"], m["from"], m["to"], m["booted_again"]) for m in placed["moved"]] == [(lost_round, [worker.node_id], head, 1)]
    for s in res["samples"]:  # on disk, what was counted: the worker's finished boot was replaced by the head's
        assert json.loads((boot_dir(out, s) / "sample.json").read_text())["host"]["node_id"] == head


@pytest.mark.slow
def test_real_builds_on_a_local_cluster(tiny_run: Path, two_nodes: tuple[Any, Any], tmp_path: Path) -> None:
    """The tiny run's vanilla and optimized-micro kernels built again, at once, one on each node of the cluster (the
    nodes' ccache is this session's: vanilla and the all-zero-profile objects come from it, the profiled objects are
    compiled): the same keys, the same code (functions' sizes) and the same proof as the run's own builds, the
    instrumented kernel's .gcno files not needed here."""
    from dataclasses import replace

    from kpgo import study

    cluster, worker = two_nodes
    opts = replace(study.run_options(tiny_run), run_dir=tmp_path / "run")
    res = opts.builder(*opts.kernel(), KpgoCluster(cluster.address)).many(
        [("vanilla", "vanilla", None), ("optimized", "optimized-micro", tiny_run / "profiles" / "micro")])
    assert {r.raw["built_on"]["node_id"] for r in res.values()} == {cluster.head_node.node_id, worker.node_id}
    for label, r in res.items():
        mine = json.loads((tiny_run / "builds" / label / "build.json").read_text())
        assert r.ok and r.key == mine["key"]
        assert r.sizes["functions_size"] == mine["sizes"]["functions_size"] and r.sizes["text_span"] == mine["sizes"]["text_span"]
        out = tmp_path / "run" / "builds" / label
        assert (out / "vmlinux").is_file() and (out / "arch" / "x86" / "boot" / "bzImage").is_file()
    proof = res["optimized-micro"].proof
    assert proof is not None and proof.ok
    assert proof.raw == json.loads((tiny_run / "builds" / "optimized-micro" / "build.json").read_text())["proof"]
    assert json.loads((tmp_path / "run" / "builds" / "optimized-micro" / "proof.json").read_text())["summary"]["ok"]
    print(json.dumps({label: {"node": r.raw["built_on"]["node_id"][:8], "seconds": r.seconds, "reuse": r.raw["reuse"],
                              "objects_compiled": r.raw["objects_compiled"]} for label, r in res.items()}, indent=1))
