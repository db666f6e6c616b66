"""The compiler study for real: a Clang and a GCC -O3 tiny kernel built from the session's tiny run, booted and measured
beside -O2 vanilla on redis. Two more tiny builds (~20 min on 2 cores) do not fit CI's hour: marked slow, run with
`make test PYTEST_ARGS='-m slow'` (needs clang-19: `kpgo variants install clang`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import copy_of_run, kpgo

pytestmark = [pytest.mark.vm, pytest.mark.slow]


@pytest.fixture(scope="module")
def compiler_run(tiny_run: Path, test_dir: Path) -> Path:
    """A copy of the session run to add the study to."""
    return copy_of_run(tiny_run, test_dir / "run-compiler")


def comment(vmlinux: Path) -> str:
    """The compilers that wrote vmlinux's objects, as the ELF's .comment section names them (readelf, not kpgo)."""
    return subprocess.run(["readelf", "-p", ".comment", str(vmlinux)], capture_output=True, text=True, check=True).stdout


def test_clang_and_o3_kernels_boot_and_are_measured(compiler_run: Path) -> None:
    res = kpgo("study", "compiler", compiler_run, "--variants", "o3,clang", "--workload", "redis", "--boots", "1", timeout=5400)
    assert res.returncode == 0, res.stderr[-3000:]
    builds = {v: json.loads((compiler_run / "builds" / v / "build.json").read_text()) for v in ("vanilla", "o3", "clang")}
    assert builds["clang"]["compiler"]["name"] == "clang-19" and builds["clang"]["make_vars"] == ["LLVM=-19"]
    assert "clang version 19" in comment(compiler_run / "builds" / "clang" / "vmlinux")
    assert "clang" not in comment(compiler_run / "builds" / "o3" / "vmlinux")
    assert builds["o3"]["opt"] == "O3" and "-O3" in builds["o3"]["kcflags"]
    # -O3 inlines and unrolls more: more code than -O2 (the 2015 study: 26% more .text)
    assert builds["o3"]["sizes"]["functions_size"] > builds["vanilla"]["sizes"]["functions_size"]

    table = json.loads((compiler_run / "studies" / "compiler" / "compiler.json").read_text())
    rows = {r["variant"]: r for r in table["variants"]}
    assert list(rows) == ["vanilla", "o3", "clang"] and table["headline"] == "simulated"
    for v in ("o3", "clang"):
        insns = rows[v]["workloads"]["redis"]["kernel_insns_per_op"]
        # one boot per cell: a ratio, and no interval made up for it: the range, so named
        assert 0.5 < insns["ratio"] < 2 and insns["ci_method"] == "range" and insns["ci_low"] == insns["ci_high"] == insns["ratio"]
        assert rows[v]["size"]["functions_size"]["mean"] == builds[v]["sizes"]["functions_size"]
    assert "clang" in res.stdout and "o3" in res.stdout and "range " in res.stdout
