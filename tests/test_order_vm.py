"""Function order on a real kernel (issue 35 part 3, docs/LAYOUT.md): the tiny vanilla kernel's branches recorded under
redis (`kpgo collect --branches`), the tiny `order` kernel built from that call graph (the order checked in its
vmlinux by the build itself, its hot text compacted), then booted under the recorder running redis again. One more
tiny build (~4 min on 2 cores from a warm ccache, ~8 min cold) and two recorded boots: marked slow, run with
`make test PYTEST_ARGS='-m slow'`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import kpgo

pytestmark = [pytest.mark.vm, pytest.mark.slow]

REDIS = ("--workload", "redis", "--set", "redis.requests=20000")


def collected(build: Path, out: Path, load: tuple[str, ...] = REDIS) -> dict:
    """The branch profile of `build` under `load` (redis unless told), recorded once (a profile of the same build is
    reused); the BOLT and AutoFDO VM tests record with it too."""
    key = json.loads((build / "build.json").read_text())["key"]
    try:
        have = json.loads((out / "profile.json").read_text())
        if have.get("build_key") == key:
            return have
    except (OSError, ValueError):
        pass
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    res = kpgo("collect", build, "--branches", *load, "-o", out, timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads((out / "profile.json").read_text())


def test_an_ordered_tiny_kernel_builds_checks_and_runs_redis(test_dir: Path) -> None:
    d = test_dir / "order"
    res = kpgo("build", "--base", "tiny", "-o", d / "vanilla", timeout=3600)
    assert res.returncode == 0, res.stderr[-3000:]
    before = collected(d / "vanilla", d / "br-vanilla")
    res = kpgo("build", "--base", "tiny", "--variant", "order", "--call-graph", d / "br-vanilla", "-o", d / "order", timeout=3600)
    assert res.returncode == 0, res.stderr[-3000:]
    m = json.loads((d / "order" / "build.json").read_text())
    o = m["order"]
    assert m["ok"] and o["ok"] and o["inversions"] == 0 and o["intruders"] == 0 and o["missing"] == 0
    # nearly every function that ran is a C function with a section of its own; what is not (assembly, noinstr,
    # spinlocks, the scheduler) is a small share of the recorded branches
    assert o["placeable"] > 0.9 * o["functions"] and o["weight_placed_share"] > 0.85
    hot = o["hot_text"]["0.99"]
    assert hot["built"]["pages_4k"] < hot["recorded"]["pages_4k"]
    assert hot["built"]["span_before_entry_text"] < hot["recorded"]["span_before_entry_text"] / 4
    assert "order: C3 over" in res.stdout and "hot text (99%" in res.stdout
    assert (d / "order" / "function-order.lds").is_file() and m["make_command"].count("KPGO_FUNCTION_ORDER=") == 1
    # the ordered kernel boots and serves redis under the recorder, whose addresses are its own
    after = collected(d / "order", d / "br-order")
    assert after["in_functions"] > 0.99 and after["throughput"] > 0
    w0, w1 = before["sim_windows"][0]["kernel"], after["sim_windows"][0]["kernel"]
    print(f"kernel L1i misses per op: vanilla {w0['l1i_misses'] / before['ops']:.1f}, order {w1['l1i_misses'] / after['ops']:.1f}; "
          f"iTLB misses per op: {w0['itlb_misses'] / before['ops']:.2f} -> {w1['itlb_misses'] / after['ops']:.2f}")
