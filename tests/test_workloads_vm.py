"""Every workload, for real, once, in a guest: `kpgo collect --workload all` on the tiny
instrumented kernel (short windows), so each server starts, each load generator runs, each
metric is parsed and positive, and each workload yields its own profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import kpgo

pytestmark = pytest.mark.vm

# Short measured windows: CI proves each workload works; docs/WORKLOADS.md has the default-size figures.
SHORT = ["nginx.duration=5", "apache.duration=5", "memcached.duration=5", "mysql.duration=5", "postgresql.duration=5",
         "redis.requests=20000", "rocksdb.num=30000", "leveldb.num=30000", "micro.seconds=1", "micro.procs=1,4"]


@pytest.fixture(scope="session")
def all_profiles(tiny_run: Path, test_dir: Path) -> Path:
    out = test_dir / "collect-all"
    if not all((out / n / "profile.json").exists() for n in ("apache", "leveldb", "memcached", "micro", "mysql", "nginx", "postgresql", "redis", "rocksdb")):
        import shutil

        shutil.rmtree(out, ignore_errors=True)
        args = [a for s in SHORT for a in ("--set", s)]
        res = kpgo("collect", tiny_run / "builds" / "instrumented", "--workload", "all", "-o", out, *args)
        assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.mark.parametrize("name", ["apache", "leveldb", "memcached", "micro", "mysql", "nginx", "postgresql", "redis", "rocksdb"])
def test_workload_ran_in_guest(all_profiles: Path, name: str) -> None:
    prof = all_profiles / name
    meta = json.loads((prof / "profile.json").read_text())
    assert meta["workload"]["name"] == name
    assert meta["throughput"] > 0 and all(v > 0 for v in meta["throughput_parts"].values())
    assert meta["files"] > 300 and meta["arcs_sum"] > 0
    assert 0 < meta["kernel_share"] <= 1  # guest CPU time in the kernel over the window
    raw = list((prof / "log").glob("load-0-*.txt"))
    assert raw, "raw generator output kept"
    for override in SHORT:  # the profile records the parameters it was collected with
        wl, _, kv = override.partition(".")
        key, _, value = kv.partition("=")
        if wl == name:
            assert str(meta["workload"]["params"][key]) == value
