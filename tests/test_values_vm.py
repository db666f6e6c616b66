"""Value profiles on a real kernel (issue 14, docs/VALUES.md): the tiny gcov kernel built with kpgo's patch and GCC
plugin boots, runs redis and records value profiles; the optimized kernel built from them proves, from GCC's dumps,
which value transforms it applied. The kernels and profiles are the tiny run's (conftest: `kpgo run ... --values`)."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from kpgo.kernel.proof import COUNTS_THRESHOLD

pytestmark = pytest.mark.vm


@dataclass(frozen=True)
class ValueKernels:
    instrumented: Path
    profile: Path
    optimized: Path


@pytest.fixture(scope="module")
def value_kernels(tiny_run: Path) -> ValueKernels:
    return ValueKernels(tiny_run / "builds" / "instrumented", tiny_run / "profiles" / "redis.raw", tiny_run / "builds" / "optimized-redis")


def test_value_kernel_is_built_from_the_patched_source_with_the_plugin(value_kernels: ValueKernels) -> None:
    build = json.loads((value_kernels.instrumented / "build.json").read_text())
    assert build["values"]["pool_nodes"] == 524288 and Path(build["values"]["plugin"]).is_file()
    assert "/values-" in build["source"]
    assert "CONFIG_GCOV_PROFILE_VALUES=y" in (value_kernels.instrumented / ".config").read_text()
    syms = subprocess.run(["nm", value_kernels.instrumented / "vmlinux"], capture_output=True, text=True, check=True).stdout
    assert re.search(r" __kpgo_indirect_call$", syms, re.M) and " __gcov_topn_values_profiler" in syms
    assert not re.search(r" __gcov_indirect_call$", syms, re.M)  # GCC's thread-local tuple is gone


def indirect_call_sites(gcda: Path) -> list[tuple[int, list[tuple[int, int]]]]:
    """(total, [(value, count), ...]) per indirect-call site of a .gcda, as GCC's gcov-dump reads it (the oracle)."""
    out = subprocess.run(["gcov-dump", "-l", gcda], capture_output=True, text=True, check=True).stdout
    sites = []
    numbers: list[int] | None = None
    for line in out.splitlines() + ["end: COUNTERS"]:
        if "COUNTERS" in line or "FUNCTION" in line:
            while numbers:  # per site: total, n, then n (value, count) pairs
                total, n = numbers[0], numbers[1]
                sites.append((total, list(zip(numbers[2:2 + 2 * n:2], numbers[3:3 + 2 * n:2]))))
                numbers = numbers[2 + 2 * n:]
            numbers = [] if "COUNTERS indirect_call" in line else None
        elif numbers is not None:
            numbers += [int(x) for x in line.split(":", 2)[2].split()]
    return sites


def test_value_kernel_records_value_profiles(value_kernels: ValueKernels) -> None:
    prof = json.loads((value_kernels.profile / "profile.json").read_text())
    pool = prof["value_profiles"]
    assert pool["pool_nodes"] == 524288 and 0 < pool["used_nodes"] < pool["pool_nodes"] and pool["dropped_values"] == 0
    assert prof["mitigations"] and "spectre_v2" in prof["mitigations"]
    # GCC's own reader as the oracle: the VFS's indirect calls (file->f_op->...) that redis drives through its sockets
    # reached their targets, each counted at most once per execution of the site (plus the one or two executions
    # another vCPU may have in flight when the reset after the warm-up detaches the lists: docs/VALUES.md).
    sites = [s for s in indirect_call_sites(value_kernels.profile / "fs/read_write.gcda") if s[0] > 0]
    assert sites and all(0 < sum(c for _, c in pairs) <= total + 2 and len(pairs) <= 32 for total, pairs in sites)


def test_optimized_kernel_applies_value_transforms(value_kernels: ValueKernels) -> None:
    build = json.loads((value_kernels.optimized / "build.json").read_text())
    proof = build["proof"]
    assert proof["ok"]
    assert "-Wno-error" in build["kcflags"]  # a profile's inlining can trip GCC's -Wstringop-* under the kernel's -Werror
    # The instrumented kernel compiled kpgo's patched copy of the source, this one the source itself: GCC keys static
    # functions by their file's path, so the profile was re-keyed, and GCC read its counts (docs/PROFILES.md).
    assert build["profile"]["rekeyed"]["functions"] > 0 and "/values-" in build["profile"]["rekeyed"]["from_source"]
    assert proof["weight_read"] >= COUNTS_THRESHOLD
    t = proof["values"]["totals"]
    assert t["indirect_calls_trained"] > 0 and t["divmod"] + t["stringop"] > 0
    # Sites, not targets: a promoted call's dominant target is in its own object, so promotions and sites whose dominant
    # target lies elsewhere are apart; vmlinux keeps at most what GCC promoted.
    assert t["indirect_calls_promoted"] + t["dominant_sites_elsewhere"] <= t["dominant_sites"] <= t["indirect_calls_trained"]
    assert t["indirect_calls_promoted_in_vmlinux"] <= t["indirect_calls_promoted"]
    for site in proof["values"]["hot_promoted_sites"]:
        assert site["promoted"] and 0 < site["count"] <= site["all"]
        assert site["in_vmlinux"] in ("direct call", "guard only (target inlined)", "gone", "caller not in vmlinux")
