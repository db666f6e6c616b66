"""End to end on a real tiny kernel: no mocks. Builds (instrumented, optimized, vanilla), boots
under virtme-ng, runs redis-server under redis-benchmark, collects and repairs the profile,
proves GCC used it, benchmarks. Takes ~15 min on 2 cores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import kpgo

pytestmark = pytest.mark.vm


def test_profile_collected_from_guest(tiny_run: Path) -> None:
    raw = tiny_run / "profiles" / "redis.raw"
    meta = json.loads((raw / "profile.json").read_text())
    for key in ("kernel_release", "config_hash", "gcc", "gcov_version", "workload", "throughput", "files", "arcs_sum"):
        assert key in meta, key
    assert meta["workload"]["name"] == "redis" and meta["workload"]["params"]["requests"] > 0
    assert meta["throughput"] > 0
    assert meta["files"] > 300  # the whole tiny kernel is instrumented
    assert meta["arcs_sum"] > 0
    # paths relative to the build directory, as the compiler expects them
    assert (raw / "kernel" / "sched" / "core.gcda").is_file()
    assert (raw / "net" / "ipv4" / "tcp.gcda").is_file()
    assert len(list(raw.rglob("*.gcda"))) == meta["files"]
    # the network stack ran under redis: tcp counters are non-zero
    stats = kpgo("profile", "stats", raw, "--json")
    assert stats.returncode == 0
    s = json.loads(stats.stdout)
    assert s["files"] == meta["files"] and s["with_summary"] == 0  # the kernel writes no summary


def test_fixed_profile_has_summaries(tiny_run: Path) -> None:
    s = json.loads(kpgo("profile", "stats", tiny_run / "profiles" / "redis", "--json").stdout)
    assert s["with_summary"] == s["files"] > 0


def test_optimized_build_used_the_profile(tiny_summary: dict, tiny_run: Path) -> None:
    proof = tiny_summary["workloads"]["redis"]["proof"]
    assert proof["objects_nonempty"] > 100
    assert proof["ratio"] >= 0.95 and proof["ok"]
    assert proof["functions_read"] > 1000
    per_object = json.loads((tiny_run / "builds" / "optimized-redis" / "proof.json").read_text())["objects"]
    assert per_object["kernel/sched/core.o"]["used"]
    sizes = tiny_summary["builds"]["optimized-redis"]["sizes"]
    assert sizes["text_unlikely"] > 0 and sizes["text_hot"] >= 0 and sizes["vmlinux_text"] > 0


def test_bench_compared_both_kernels(tiny_summary: dict, tiny_run: Path) -> None:
    rows = {r["kernel"]: r for r in tiny_summary["workloads"]["redis"]["bench"]["summary"]}
    assert set(rows) == {"vanilla", "optimized"}
    assert all(r["n"] == 2 and r["mean"] > 0 for r in rows.values())
    assert rows["vanilla"]["ratio"] == 1.0
    assert rows["optimized"]["ci_low"] <= rows["optimized"]["ratio"] <= rows["optimized"]["ci_high"]
    md = (tiny_run / "summary.md").read_text()
    assert "Proof that GCC used the profile" in md and "95% CI" in md
    if tiny_summary["host"]["accelerator"] == "tcg":
        assert "TCG" in md


def test_second_run_reuses_every_step(tiny_run: Path) -> None:
    res = kpgo("run", "--base", "tiny", "--boots", "2", "--dir", tiny_run)
    assert res.returncode == 0
    for step in ("build instrumented: up to date", "collect redis: up to date", "profile fix redis: up to date",
                 "build optimized: up to date", "build vanilla: up to date"):
        assert step in res.stderr
    assert "bench: boot" not in res.stderr  # every boot's sample was kept
