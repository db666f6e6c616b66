"""Every workload, for real, once, in a guest: a collection on the tiny instrumented kernel (short
windows; conftest's all_profiles), so each server starts, each load generator runs, each metric is
parsed and positive, and each workload yields its own profile — value profiles included, as the
kernel records them (the tiny run is built with --values)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import MICRO_OPS, SHORT, WORKLOADS, kpgo

pytestmark = pytest.mark.vm

@pytest.mark.parametrize("name", WORKLOADS)
def test_workload_ran_in_guest(all_profiles: dict[str, Path], name: str) -> None:
    prof = all_profiles[name]
    meta = json.loads((prof / "profile.json").read_text())
    assert meta["workload"]["name"] == name
    assert meta["throughput"] > 0 and all(v > 0 for v in meta["throughput_parts"].values())
    assert meta["files"] > 300 and meta["arcs_sum"] > 0
    assert meta["value_profiles"]["used_nodes"] > 0  # the value-profiling kernel ran this workload too
    assert 0 < meta["kernel_share"] <= 1  # guest CPU time in the kernel over the window
    raw = list((prof / "log").glob("load-0-*.txt"))
    assert raw, "raw generator output kept"
    for override in SHORT:  # the profile records the parameters it was collected with
        wl, _, kv = override.partition(".")
        key, _, value = kv.partition("=")
        if wl == name:
            assert str(meta["workload"]["params"][key]) == value


def test_bench_finishes_the_other_cells_when_one_fails(tiny_run: Path, test_dir: Path) -> None:
    """A cell that fails in the guest (stress-ng refuses a process count) does not stop the bench: the
    other cell is measured, the failure is in the tables, results.json and the exit status, and the
    same command again boots only the failed cell."""
    import shutil

    out = test_dir / "bench-one-fails"
    shutil.rmtree(out, ignore_errors=True)
    args = ["bench", "--kernel", f"vanilla={tiny_run / 'builds' / 'vanilla'}", "--workload", "redis,micro", "--boots", "1", "--no-sim",
            "--set", "redis.requests=10000", *(a for o in MICRO_OPS for a in ("--set", f"micro.{o}")), "--set", "micro.procs=1,zz", "-o", out]
    first = kpgo(*args)
    assert first.returncode == 3 and "Traceback" not in first.stderr
    errors = [ln for ln in first.stderr.splitlines() if ln.startswith("kpgo: error:")]
    assert len(errors) == 1 and "1 of 2 boots failed (vanilla on micro" in errors[0] and "retry only the failed" in errors[0]
    assert "FAILED boots (1" in first.stdout and "redis" in first.stdout
    res = json.loads((out / "results.json").read_text())
    assert list(res["workloads"]) == ["redis"] and res["workloads"]["redis"]["summary"][0]["n"] == 1
    [fail] = res["failed"]
    assert fail["kernel"] == "vanilla" and fail["workload"] == "micro" and Path(fail["console_log"]).is_file()
    redis_sample = out / "boots" / "00-redis-vanilla" / "sample.json"
    kept = redis_sample.read_bytes()
    again = kpgo(*args)
    assert again.returncode == 3
    assert "1 of 2 boots kept" in again.stderr and "boot 1/1: vanilla on micro" in again.stderr
    assert redis_sample.read_bytes() == kept
