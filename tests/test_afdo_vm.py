"""Clang AutoFDO on a real kernel (docs/CLANG.md): the tiny clang-train kernel's branches recorded under redis
(`kpgo collect --branches`), turned into a sample profile (`kpgo profile afdo`: llvm-profgen --kernel), the tiny
clang-afdo kernel built with it (Clang's records prove the profile applied), then booted under the recorder running
redis again. Two Clang builds (~6 min each on 2 cores) and two recorded boots: marked slow, run with
`make test PYTEST_ARGS='-m slow'`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import kpgo
from test_order_vm import collected

pytestmark = [pytest.mark.vm, pytest.mark.slow]


def test_a_clang_afdo_tiny_kernel_from_emulator_records_builds_proves_and_runs_redis(test_dir: Path) -> None:
    d = test_dir / "afdo"
    res = kpgo("build", "--base", "tiny", "--variant", "clang-train", "-o", d / "train", timeout=3600)
    assert res.returncode == 0, res.stderr[-3000:]
    train = collected(d / "train", d / "br-train")
    assert train["in_functions"] > 0.99
    prof = d / "sample"
    if not (prof / "profile.json").is_file():
        res = kpgo("profile", "afdo", d / "br-train", "-o", prof, timeout=1800)
        assert res.returncode == 0, res.stderr[-3000:]
    m = json.loads((prof / "profile.json").read_text())
    assert m["functions"] > 100 and m["samples"] > 0
    # what redis makes the kernel do most is networking, system calls and scheduling
    hot = [f["function"] for f in m["hot_functions"]]
    assert any(h.startswith(("tcp_", "__sys", "do_syscall", "__schedule", "ep_", "sock_", "__x64_sys", "entry_")) for h in hot), hot
    res = kpgo("build", "--base", "tiny", "--variant", "clang-afdo", "--profile", prof, "-o", d / "afdo", timeout=3600)
    assert res.returncode == 0, res.stderr[-3000:]
    b = json.loads((d / "afdo" / "build.json").read_text())
    p = b["proof"]
    assert b["ok"] and p["ok"] and p["share_samples"] >= 0.9 and p["functions_applied"] > 100, p
    assert "Clang applied the profile to" in res.stdout
    assert "-fprofile-sample-use=" in b["make_command"] and "-fsplit-machine-functions" in b["make_command"]
    # the profile moved code: hot functions into .text.hot, cold blocks split off into .text.split / .text.unlikely
    assert b["sizes"]["text_hot"] > 0, b["sizes"]
    # the AutoFDO kernel boots and serves redis under the recorder, whose addresses are its own
    after = collected(d / "afdo", d / "br-afdo")
    assert after["in_functions"] > 0.99 and after["throughput"] > 0
    w0, w1 = train["sim_windows"][0]["kernel"], after["sim_windows"][0]["kernel"]
    print(f"kernel per op, clang-train -> clang-afdo: instructions {w0['insns'] / train['ops']:.0f} -> {w1['insns'] / after['ops']:.0f}, "
          f"L1i misses {w0['l1i_misses'] / train['ops']:.1f} -> {w1['l1i_misses'] / after['ops']:.1f}")
