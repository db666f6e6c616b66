"""End to end on a real tiny kernel: no mocks. Builds (instrumented with value profiles, one optimized
kernel per workload, vanilla), boots under virtme-ng, runs redis-server under redis-benchmark and stress-ng,
collects and repairs the profiles, proves GCC used them, benchmarks every kernel on both workloads
(cross-application study) in one randomized design with simulated counters. ~45 min on 2 cores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REDIS_REQUESTS, TINY_RUN_ARGS, kpgo

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
    # the kernel's gcov code (reset, snapshot) is measurement, not the workload: left out, and what it held recorded
    assert not (raw / "kernel" / "gcov").exists()
    assert "kernel/gcov/base.gcda" in meta["left_out"]["files"] and meta["left_out"]["arcs_sum"] > 0
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
    # Value profiles too (--values): the summary gives the transforms GCC applied (test_values_vm checks the figures).
    assert proof["values"]["totals"]["indirect_calls_trained"] > 0
    assert "value profiles: " in (tiny_run / "summary.md").read_text() and "promoted to direct calls" in (tiny_run / "summary.md").read_text()
    per_object = json.loads((tiny_run / "builds" / "optimized-redis" / "proof.json").read_text())["objects"]
    assert per_object["kernel/sched/core.o"]["used"]
    sizes = tiny_summary["builds"]["optimized-redis"]["sizes"]
    assert sizes["text_unlikely"] > 0 and sizes["text_hot"] >= 0 and sizes["vmlinux_text"] > 0
    # partial training by default: never-run code kept at -O2 (docs/COMPILERS.md)
    assert "-fprofile-partial-training" in json.loads((tiny_run / "builds" / "optimized-redis" / "build.json").read_text())["kcflags"]


def test_bench_matrix_with_cross_study_and_sim(tiny_summary: dict, tiny_run: Path) -> None:
    res = json.loads((tiny_run / "bench" / "results.json").read_text())
    assert res["schema"] == 3 and res["baseline"] == "vanilla"
    plan = json.loads((tiny_run / "bench" / "plan.json").read_text())  # written before the first boot
    assert plan["seed"] == res["design"]["seed"] and plan["rounds"] == 2 and "Welch" in res["design"]["interval"]
    labels = {"vanilla", "optimized-redis", "optimized-micro"}
    d = res["design"]
    assert d["order_name"] == "random" and d["boots_per_kernel"] == 2 and d["warmup_per_boot"]
    # randomized blocks: every round boots each of the 3 kernels × 2 workloads once
    for r in (0, 1):
        assert sorted((s["kernel"], s["workload"]) for s in d["sequence"] if s["round"] == r) == sorted((k, w) for k in labels for w in ("redis", "micro"))
    assert len(res["samples"]) == 12
    for n in ("redis", "micro"):
        w = res["workloads"][n]
        rows = {r["kernel"]: r for r in w["summary"]}
        assert set(rows) == labels  # the cross study: each optimized kernel on both workloads
        assert all(r["n"] == 2 and r["mean"] > 0 for r in rows.values())
        assert rows["vanilla"]["ratio"] == 1.0
        for r in rows.values():
            assert r["ci_low"] <= r["ratio"] <= r["ci_high"] and r["ci_includes_1"] == (r["ci_low"] <= 1 <= r["ci_high"])
        # simulated counters: per operation, kernel and user, a share in (0, 1)
        for label in labels:
            m = w["sim"][label]
            assert m["kernel_insns_per_op"]["mean"] > 100 and m["kernel_l1i_misses_per_op"]["mean"] > 0
            assert 0 < m["kernel_insn_share"]["mean"] < 1
            assert m["kernel_taken_branches_per_op"]["mean"] > 10 and m["kernel_fetch_bytes_per_op"]["mean"] > 0
    # redis-server and redis-benchmark spend most of their instructions in the network stack
    assert res["workloads"]["redis"]["sim"]["vanilla"]["kernel_insn_share"]["mean"] > 0.5
    assert set(res["geomean"]) == {"optimized-redis", "optimized-micro"}
    for s in res["samples"]:
        # micro's stressors each have a window (windows = "step"; procs=1: 10 steps), redis's run one
        assert len(s["sim"]) == (10 if s["workload"] == "micro" else 1) == len(s["step_ops"][0]) and s["ops"][0] > 0 and (
            tiny_run / "bench" / "boots" / f"{s['round']:02d}-{s['workload']}-{s['kernel']}" / "console.log").is_file()
    h = res["host"]
    assert h["accelerator"] in ("tcg", "kvm") and h["qemu"].startswith("QEMU") and h["gcc"] and h["cpu"]
    # No --sim was given: simulated counters are the default exactly under TCG, and then the headline.
    meas = res["measurement"]
    assert meas["sim_mode"] == "auto" and (meas["sim"] is not None) == (h["accelerator"] == "tcg")
    if meas["sim"] is not None:
        # redis's guest has one vCPU (its client is on the host): the guest's clock on the instruction count;
        # micro's has two, which keep the host's (SimConfig.for_guest).
        assert meas["sim"]["icount"] == 5 and meas["icount"] == {"redis": 5, "micro": None}
        assert all(s["sim"][0]["icount"] == meas["icount"][s["workload"]] for s in res["samples"])
    # Both generators report their exact operation counts (redis-benchmark runs -n per test).
    assert meas["ops_methods"] == {"redis": ["count"], "micro": ["count"]}
    assert all(s["ops_method"] == ["count"] for s in res["samples"])
    assert {s["ops"][0] for s in res["samples"] if s["workload"] == "redis"} == {2.0 * REDIS_REQUESTS}
    md = (tiny_run / "summary.md").read_text()
    assert "Proof that GCC used the profile" in md and "95% CI" in md and "Studies: cross" in md
    if h["accelerator"] == "tcg":
        assert md.index("Results: simulated kernel work per operation") < md.index("Results: wall-clock (TCG: indicative only")
        assert "kernel taken branches/op" in md and "| geomean |" in md
        assert set(res["sim_geomean"]) == {"optimized-redis", "optimized-micro"}


def test_second_run_reuses_every_step(tiny_run: Path) -> None:
    res = kpgo(*TINY_RUN_ARGS, "--dir", tiny_run)
    assert res.returncode == 0
    for step in ("build instrumented: up to date", "collect redis: up to date", "profile fix redis: up to date",
                 "collect micro: up to date", "build optimized: up to date", "build vanilla: up to date", "12 of 12 boots kept"):
        assert step in res.stderr
    assert "bench: boot" not in res.stderr  # every boot's sample was kept
