"""A kernel with modules (what --base debian builds), at the tiny kernel's size: kpgo builds the modules, the
instrumented kernel with value profiles links them (their value-profiled indirect calls reach the kernel's per-CPU
tuple, which the patch exports), and a module loaded in the guest writes its arc and value profile to debugfs, read
here by GCC's own gcov-dump. An extra kernel (~5 min on 2 cores), so marked slow."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest

from conftest import kpgo
from kpgo import vm
from test_values_vm import indirect_call_sites

pytestmark = [pytest.mark.vm, pytest.mark.slow]
DATA = Path(__file__).parent / "data"
GUEST = vm.Guest(timeout=300)


@pytest.fixture(scope="module")
def instrumented(test_dir: Path) -> Path:
    out = test_dir / "tiny-modules-instrumented"
    res = kpgo("build", "--base", "tiny", "--fragment", DATA / "modules.config", "--variant", "instrumented", "--values", "-o", out, timeout=3600)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def test_modules_are_built_and_use_the_exported_tuple(instrumented: Path) -> None:
    build = json.loads((instrumented / "build.json").read_text())
    order = (instrumented / "modules.order").read_text().split()
    assert "lib/test_static_keys.o" in order and build["modules"] == len(order) and " modules " in build["make_command"]
    ko = instrumented / "lib" / "test_static_keys.ko"
    undefined = subprocess.run(["nm", "-u", ko], capture_output=True, text=True, check=True).stdout.split()
    assert "__kpgo_indirect_call" in undefined and any(u.startswith("__gcov_indirect_call_profiler_v4") for u in undefined)
    assert (instrumented / ".virtme_mods" / "lib" / "modules" / "0.0.0" / "modules.dep").is_file()  # made by the build, not the boot


def test_a_loaded_module_records_arcs_and_values(instrumented: Path, tmp_path: Path) -> None:
    gcda = f"/sys/kernel/debug/gcov{instrumented.resolve()}/lib/test_static_keys.gcda"
    cmd = (f"mountpoint -q /sys/kernel/debug || mount -t debugfs none /sys/kernel/debug; modprobe test_static_keys && "
           f"echo GCDA=$(base64 -w0 {gcda})")
    kernel = instrumented / "arch/x86/boot/bzImage"
    res = vm.run_command(kernel, cmd, guest=GUEST, log=tmp_path / "console.log", accel=vm.accelerator(kernel))
    line = [ln for ln in res.output.splitlines() if ln.startswith("GCDA=")]
    assert line and len(line[0]) > 100, res.output[-3000:]
    data = tmp_path / "test_static_keys.gcda"
    data.write_bytes(base64.b64decode(line[0].removeprefix("GCDA=").strip()))
    dump = subprocess.run(["gcov-dump", "-l", data], capture_output=True, text=True, check=True).stdout
    assert "FUNCTION" in dump and "COUNTERS arcs" in dump
    # verify_keys() calls each entry's test_key() through the table: the site saw its targets
    sites = [s for s in indirect_call_sites(data) if s[0] > 0]
    assert sites and all(pairs and sum(c for _, c in pairs) <= total for total, pairs in sites), sites
