"""BOLT on a real kernel (issue 35 part 2, docs/LAYOUT.md "BOLT"): the tiny vanilla kernel's branches recorded under
micro (`kpgo collect --branches`), the tiny `bolt` kernel built from them (BOLT's report in build.json, above its
threshold), then booted under the recorder running micro again: the guest says it runs the BOLTed vmlinux (its build
id, from /sys/kernel/notes, is the one BOLT gave vmlinux), and its hot code runs where BOLT put it. Two tiny builds
(~5 min each on 2 cores, cold ccache) and two recorded boots (~2 min each): marked slow, run with
`make test PYTEST_ARGS='-m slow'`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import kpgo
from test_order_vm import collected as order_collected

pytestmark = [pytest.mark.vm, pytest.mark.slow]

MICRO = ("--workload", "micro")


def collected(build: Path, out: Path) -> dict:
    """The branch profile of `build` under micro, recorded once (test_order_vm's recorder)."""
    return order_collected(build, out, MICRO)


MITIGATIONS = Path(__file__).parent / "data" / "mitigations.config"


@pytest.mark.parametrize("config", ["tiny", "tiny+mitigations"])
def test_a_bolted_tiny_kernel_builds_boots_and_runs_micro(config: str, test_dir: Path) -> None:
    """With the server config's mitigations too: their lists of returns, retpoline calls and direct calls the kernel
    patches at boot, which BOLT 19 leaves as they were, written again by kpgo for BOLT's code, every entry read back."""
    d = test_dir / "bolt" / config
    base = ("--base", "tiny", *(("--fragment", MITIGATIONS) if "mitigations" in config else ()))
    res = kpgo("build", *base, "-o", d / "vanilla", timeout=3600)
    assert res.returncode == 0, res.stderr[-3000:]
    collected(d / "vanilla", d / "br-vanilla")
    res = kpgo("build", *base, "--variant", "bolt", "--branches", d / "br-vanilla", "-o", d / "bolt", timeout=3600)
    assert res.returncode == 0, res.stderr[-3000:]
    m = json.loads((d / "bolt" / "build.json").read_text())
    b = m["bolt"]
    rep = b["report"]
    assert m["ok"] and b["ok"] and b["valid_share"] >= b["min_valid_share"]
    assert rep["linux_kernel"] and rep["functions_profiled"] > 1000 and rep["functions_reordered"] > 500
    assert rep["cold_bytes_moved"] > 0 and rep["dyno_after"]["taken branches"] < rep["dyno_before"]["taken branches"]
    assert b["build_id"] != b["build_id_pre_bolt"] and "BOLT:" in res.stdout
    lists = b["patch_lists"]
    assert all(c["valid"] == c["valid_before"] == c["entries"] for c in lists.values()) and ".ibt_endbr_seal" in lists
    if "mitigations" in config:
        assert {".return_sites", ".retpoline_sites", ".call_sites"} <= set(lists) and lists[".return_sites"]["entries"] > 1000
        assert lists[".return_sites"]["moved"] > 0 and lists[".call_sites"]["moved"] > 0  # in the functions BOLT rewrote
    # the BOLTed kernel boots and runs micro; the guest names the kernel it runs: BOLT's vmlinux
    after = collected(d / "bolt", d / "br-bolt")
    assert after["guest_build_id"] == b["build_id"] and after["throughput"] > 0
    assert after["in_functions"] > 0.9  # cold parts BOLT moved run rarely, and outside any symbol
