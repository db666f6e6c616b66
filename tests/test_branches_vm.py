"""`kpgo collect --branches` on the session's tiny vanilla kernel (no instrumented build): branch records of the
kernel in a real guest, at vmlinux's addresses, agreeing with the simulator's own count of kernel taken branches,
and the profile directory `kpgo profile stats` reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.conftest import kpgo

from kpgo import branches

pytestmark = pytest.mark.vm


@pytest.fixture(scope="session")
def tiny_vanilla(request: pytest.FixtureRequest, test_dir: Path) -> Path:
    """The build directory of the tiny vanilla kernel tests/conftest.py's tiny_run builds (reused when present)."""
    build = test_dir / "run-tiny" / "builds" / "vanilla"
    if not ((build / "build.json").is_file() and json.loads((build / "build.json").read_text()).get("ok")):
        request.getfixturevalue("tiny_run")
    return build


def test_collect_branches_on_a_vanilla_kernel(tiny_vanilla: Path, tmp_path: Path) -> None:
    out = tmp_path / "branches-redis"
    res = kpgo("collect", tiny_vanilla, "--branches", "--workload", "redis", "--set", "requests=5000", "--branch-period", "1024",
               "-o", out, timeout=1800)
    assert res.returncode == 0, res.stderr
    prof = json.loads((out / "profile.json").read_text())
    vmlinux = tiny_vanilla / "vmlinux"
    assert prof["kind"] == branches.PROFILE_KIND and prof["build_id"] == branches.build_id_of(vmlinux)
    rec = branches.read_records(out / branches.RECORDS_FILE, prof["build_id"])
    assert rec.side == "kernel" and rec.period == 1024 and rec.windows == 1 and not rec.open_window
    assert rec.lost_edges == rec.lost_ranges == rec.lost_samples == 0
    # nokaslr: the recorded kernel code is vmlinux's, address for address.
    assert prof["in_functions"] > 0.99
    # The simulator's own count: every taken branch out of kernel code closes a range (the window opens in user mode,
    # so the first kernel branch already has a start); the records add the branches into the kernel from user mode.
    taken = prof["sim_windows"][0]["kernel"]["taken_branches"]
    assert int(rec.ranges[:, 2].sum()) == taken and int(rec.edges[:, 2].sum()) == rec.branches > taken
    user_to_kernel = (rec.edges[:, 0] < 1 << 63) & (rec.edges[:, 1] >= 1 << 63)
    assert rec.branches - taken == int(rec.edges[user_to_kernel, 2].sum())
    assert rec.samples == rec.branches // 1024
    graph = branches.read_call_graph(out / branches.CALL_GRAPH_FILE)
    assert len(graph) > 100 and any(e.callee.startswith("tcp_") for e in graph)
    mmap = (out / branches.PERF_SCRIPT_FILE).read_text().split("\n", 1)[0]
    assert mmap.startswith("PERF_RECORD_MMAP2 -1/0: [0xffffffff81000000(") and mmap.endswith("[kernel.kallsyms]_text")
    assert prof["sampling"]["hot1pct_overlap"] >= 0.8 and prof["sampling"]["cosine"] > 0.99
    res = kpgo("profile", "stats", out)
    assert res.returncode == 0 and f"build id {prof['build_id']}" in res.stdout
