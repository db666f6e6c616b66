"""kpgo.sim without a guest: the plugin header matches the installed QEMU and is cached, the
plugin and the window tool build, configuration and report errors are one line."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from kpgo import bench, sim
from kpgo.errors import InfraError, KpgoError, UserError
from kpgo.paths import cache_dir


def one_line(e: KpgoError) -> str:
    text = str(e)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_header_is_cached_and_matches_installed_qemu() -> None:
    version = sim.qemu_version()
    dpkg = subprocess.run(["dpkg-query", "-W", "-f=${source:Version}", sim.QEMU_PACKAGE], capture_output=True, text=True, check=True).stdout
    assert version.source_version == dpkg
    sim.fetch_header()  # the first call of a session may download; the second must not
    t = time.monotonic()
    inc = sim.fetch_header()
    assert time.monotonic() - t < 2, "a cached header must not be fetched again"
    assert inc == cache_dir() / "qemu-plugin" / version.upstream
    assert (inc / "VERSION").read_text().strip() == f"{version.source_package} {version.source_version}"
    text = (inc / "qemu-plugin.h").read_text()
    assert re.search(r"#define QEMU_PLUGIN_VERSION [0-9]+", text)
    assert "qemu_plugin_register_vcpu_tb_exec_cb" in text and "qemu_plugin_insn_haddr" in text


def test_plugin_builds_and_exports_the_entry_points() -> None:
    lib = sim.build_plugin()
    assert lib.is_file()
    stamp = lib.with_name(lib.name + ".stamp").read_text()
    mtime = lib.stat().st_mtime_ns
    assert sim.build_plugin() == lib and lib.stat().st_mtime_ns == mtime, "an up-to-date plugin is not rebuilt"
    assert lib.with_name(lib.name + ".stamp").read_text() == stamp
    syms = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    exported = {ln.split()[-1] for ln in syms.splitlines() if ln.strip()}
    assert {"qemu_plugin_install", "qemu_plugin_version"} <= exported
    assert not {s for s in exported if s.startswith(("window_", "account", "tb_"))}, "internal symbols stay hidden"


def test_plugin_rebuilds_when_its_source_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inc = sim.fetch_header()  # the real (cached) header: no second download
    monkeypatch.setenv("KPGO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sim.build, "fetch_header", lambda: inc)
    src = tmp_path / "kpgosim.c"
    src.write_text(sim.PLUGIN_SOURCE.read_text())
    monkeypatch.setattr(sim.build, "PLUGIN_SOURCE", src)
    lib = sim.build_plugin()
    assert lib.is_relative_to(tmp_path)
    first = lib.with_name(lib.name + ".stamp").read_text()
    src.write_text(src.read_text() + "\n/* changed */\n")
    sim.build_plugin()
    assert lib.with_name(lib.name + ".stamp").read_text() != first


def test_window_tool_builds_static(tmp_path: Path) -> None:
    tool = sim.build_window_tool()
    assert tool.name == "kpgo-window" and tool.is_file()
    assert b"ld-linux" not in tool.read_bytes(), "static: no dynamic loader to run under TCG"
    # Without the plugin the markers are NOPs: open/close succeed on the host too.
    for arg, code in (("open", 0), ("close", 0), ("bogus", 2)):
        assert subprocess.run([tool, arg], capture_output=True).returncode == code


def test_simconfig_defaults_and_plugin_arg(tmp_path: Path) -> None:
    c = sim.SimConfig()
    # Kernel code on 2 MiB pages by default (x86-64 maps kernel text with 2 MiB pages), user code on 4 KiB.
    assert (c.l1i_size, c.l1i_assoc, c.l1i_line, c.itlb_entries, c.itlb_assoc, c.itlb_page, c.itlb_kpage) == (32768, 8, 64, 64, 4, 4096, 2097152)
    arg = c.plugin_arg(tmp_path / "sim.json")
    assert arg.startswith(f"out={tmp_path / 'sim.json'},")
    assert "l1i_size=32768" in arg and "itlb_kpage=2097152" in arg and "itlb_page=4096" in arg and "warm=off" in arg
    assert sim.SimConfig.parse("l1i_size=16k,itlb_kpage=2M,warm=on") == sim.SimConfig(l1i_size=16384, warm=True)
    assert sim.SimConfig.parse("itlb_kpage=4k").itlb_kpage == 4096  # kernel code on 4 KiB pages, as before
    assert sim.SimConfig(warm=1).warm is True  # an integer from a KEY=NUMBER option
    opts = sim.qemu_opts(c, tmp_path / "sim.json")
    assert opts.startswith("-plugin ") and str(sim.plugin_path()) in opts
    # Guest time from the instruction count by default, a QEMU option and not the plugin's.
    assert c.icount == 5 and "icount" not in arg and opts.endswith(" -icount shift=5,sleep=on,align=off")
    assert sim.SimConfig.parse("icount=off").icount is None and sim.SimConfig.parse("icount=0").icount == 0
    assert "-icount" not in sim.qemu_opts(sim.SimConfig(icount=None), tmp_path / "sim.json")
    # One vCPU only: QEMU runs an icount guest's vCPUs in turns on one thread, where 2-vCPU guests hung.
    assert c.for_guest(1) == c and c.for_guest(2).icount is None and c.for_guest(2).l1i_size == c.l1i_size


def test_vng_argv_builds_and_removes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The argument list of a simulated boot names the plugin; building it and removing the last report
    are vm.prepare_sim's (run_agent and run_command call it)."""
    from kpgo import proc, vm

    monkeypatch.setenv("KPGO_CACHE", str(tmp_path / "cache"))
    for name in ("run", "capture"):
        monkeypatch.setattr(proc, name, lambda *a, **k: pytest.fail("vng_argv started a process"))
    kernel, report = tmp_path / "bzImage", tmp_path / "sim.json"
    kernel.write_bytes(b"")
    report.write_text("{}")
    argv = [str(a) for a in vm.vng_argv(kernel, "true", guest=vm.Guest(), accel="kvm", sim=sim.SimConfig(), report=report)]
    assert "--disable-kvm" in argv and any(str(sim.plugin_path()) in a for a in argv)
    assert not any("-icount" in a for a in argv)  # 2 vCPUs by default: the host's clock
    argv = [str(a) for a in vm.vng_argv(kernel, "true", guest=vm.Guest(cpus=1), accel="kvm", sim=sim.SimConfig(), report=report)]
    assert any(a.endswith(" -icount shift=5,sleep=on,align=off") for a in argv)
    assert report.read_text() == "{}" and not any((tmp_path / "cache").iterdir())  # the cache's root, empty


@pytest.mark.parametrize("bad, needle", [
    ({"l1i_line": 48}, "l1i_line=48 is not a power of two"),
    ({"l1i_assoc": 3}, "l1i_size=32768 over 3 ways"),
    ({"l1i_size": 0}, "l1i_size must be a positive integer"),
    ({"itlb_entries": 48}, "itlb_entries=48 over 4 ways"),
    ({"itlb_assoc": 128, "itlb_entries": 128}, "itlb_assoc=128 is above 64 ways"),
    ({"itlb_kpage": 3000}, "itlb_kpage=3000 is not a power of two"),
    ({"icount": 11}, "icount must be a shift from 0 to 10"),
    ({"icount": -1}, "icount must be a shift from 0 to 10"),
])
def test_simconfig_bad_geometry_is_one_line(bad: dict, needle: str) -> None:
    with pytest.raises(UserError) as e:
        sim.SimConfig(**bad)
    assert needle in one_line(e.value)


def test_simconfig_parse_errors() -> None:
    for text in ("l1i=3", "l1i_size", "l1i_size=big", "icount=auto"):
        with pytest.raises(UserError) as e:
            sim.SimConfig.parse(text)
        one_line(e.value)


def test_plugin_arg_refuses_comma_paths(tmp_path: Path) -> None:
    with pytest.raises(UserError) as e:
        sim.SimConfig().plugin_arg(tmp_path / "a,b" / "sim.json")
    assert "comma" in one_line(e.value)


def _side(insns: int = 10, **over: int) -> dict:
    side = {"insns": insns, "blocks": 1, "l1i_accesses": 3, "l1i_misses": 1, "itlb_accesses": 2, "itlb_misses": 1, "taken_branches": 4,
            "indirect_branches": 2, "itlb_4k_accesses": 2, "itlb_4k_misses": 2}
    return {**side, **over}


def _window(insns: int = 10) -> dict:
    side = _side(insns)
    return {"index": 1, "closed": True, "seconds": 0.5, "user": side, "kernel": side, "total": side,
            "per_vcpu": [{"vcpu": 0, "user": side, "kernel": side}]}


def _report(*windows: dict, fmt: int = sim.REPORT_FORMAT) -> str:
    return json.dumps({"tool": "kpgosim", "format": fmt, "windows": list(windows), "open_window": None})


def test_read_windows(tmp_path: Path) -> None:
    report = tmp_path / "sim.json"
    report.write_text(_report(_window(1), _window(2)))
    windows = sim.read_windows(report)
    assert [w["user"]["insns"] for w in windows] == [1, 2]
    assert [w["kernel"]["taken_branches"] for w in windows] == [4, 4]  # the key kpgo.bench reads
    assert windows[0]["per_vcpu"][0]["user"]["taken_branches"] == 4
    assert [w["kernel"]["indirect_branches"] for w in windows] == [2, 2]
    report.write_text(_report())
    assert sim.read_windows(report) == []


def test_report_format_matches_the_plugin() -> None:
    """The plugin writes the format the Python side reads, and both name the same counters."""
    src = sim.PLUGIN_SOURCE.read_text()
    assert int(re.search(r"^#define FORMAT (\d+)$", src, re.M)[1]) == sim.REPORT_FORMAT == 5
    assert "taken_branches" in sim.COUNTERS and "indirect_branches" in sim.COUNTERS and "itlb_4k_misses" in sim.COUNTERS
    for key in sim.COUNTERS:
        assert f'\\"{key}\\"' in src, f"the plugin writes no {key}"


@pytest.mark.parametrize("fmt, dropped", [(2, ("taken_branches", "indirect_branches", "itlb_4k_accesses", "itlb_4k_misses")),
                                         (3, ("indirect_branches", "itlb_4k_accesses", "itlb_4k_misses")),
                                         (4, ("itlb_4k_accesses", "itlb_4k_misses"))])
def test_old_format_report_is_refused(tmp_path: Path, fmt: int, dropped: tuple[str, ...]) -> None:
    """A report of format 2 (no taken_branches, kernel pages 4 KiB by default), 3 (no indirect_branches) or 4 (no
    4 KiB iTLB) is not read as 5: a bench cell measured with it is measured again (its key holds the format)."""
    report = tmp_path / "sim.json"
    old = _window()
    for side in ("user", "kernel", "total"):
        old[side] = {k: v for k, v in old[side].items() if k not in dropped}
    report.write_text(_report(old, fmt=fmt))
    with pytest.raises(InfraError) as e:
        sim.read_windows(report)
    text = one_line(e.value)
    assert f"report format {fmt} from an older kpgosim" in text and "reads format 5" in text and "python -m kpgo.sim" in text


@pytest.mark.parametrize("counter", ["taken_branches", "indirect_branches"])
@pytest.mark.parametrize("where", ["user", "kernel", "total", "per_vcpu"])
def test_report_without_a_branch_counter_is_refused(tmp_path: Path, where: str, counter: str) -> None:
    w = _window()
    if where == "per_vcpu":
        w["per_vcpu"] = [{"vcpu": 0, "user": _side(), "kernel": {k: v for k, v in _side().items() if k != counter}}]
        needle = f"lacks kernel counters of a vCPU ({counter})"
    else:
        w[where] = {k: v for k, v in _side().items() if k != counter}
        needle = f"lacks {where} counters ({counter})"
    report = tmp_path / "sim.json"
    report.write_text(_report(w))
    with pytest.raises(InfraError) as e:
        sim.read_windows(report)
    assert needle in one_line(e.value)
    w[where if where != "per_vcpu" else "user"] = _side(**{counter: -1})
    report.write_text(_report(w))
    with pytest.raises(InfraError):
        sim.read_windows(report)


def test_frontend_stall_cycles() -> None:
    assert (sim.STALL_L1I_CYCLES, sim.STALL_ITLB_CYCLES) == (14.0, 14.0)  # docs/SIM.md says why
    side = _side(l1i_misses=1000, itlb_misses=10)
    assert sim.frontend_stall_cycles(side) == 1000 * sim.STALL_L1I_CYCLES + 10 * sim.STALL_ITLB_CYCLES == 14140.0
    assert sim.frontend_stall_cycles(_side(l1i_misses=0, itlb_misses=0)) == 0.0
    assert isinstance(sim.frontend_stall_cycles(_side(l1i_misses=3, itlb_misses=1)), float)


@pytest.mark.parametrize("content, needle", [
    (None, "wrote no report"),
    ('{"tool": "kpgosim", "format": 4, "windows": [', "unreadable or corrupt"),
    ("\x00\x01garbage", "unreadable or corrupt"),
    ('{"tool": "other"}', "not a kpgosim report"),
    ('{"tool": "kpgosim", "format": 1, "windows": []}', "format 1"),
    ('{"tool": "kpgosim", "format": 2, "windows": []}', "report format 2 from an older kpgosim"),
    ('{"tool": "kpgosim", "format": 3, "windows": []}', "report format 3 from an older kpgosim"),
    ('{"tool": "kpgosim", "format": 4, "windows": []}', "report format 4 from an older kpgosim"),
    ('{"tool": "kpgosim", "format": 6, "windows": []}', "report format 6 from another kpgosim"),
    ('{"tool": "kpgosim", "format": 5, "windows": [{"seconds": 1, "user": {"insns": 1}}]}', "lacks user counters"),
])
def test_read_windows_bad_report_is_one_line(tmp_path: Path, content: str | None, needle: str) -> None:
    report = tmp_path / "sim.json"
    if content is not None:
        report.write_text(content)
    with pytest.raises(InfraError) as e:
        sim.read_windows(report)
    assert needle in one_line(e.value)


PROBE = Path(__file__).resolve().parent / "data" / "sim_probe.c"


def test_plugin_counts_probes_in_user_mode_qemu(tmp_path: Path) -> None:
    """The plugin under user-mode QEMU (same source package as qemu-system-x86, no kernel: the
    guest's syscalls are QEMU's, so `syscall` falls through): exact instructions, taken branches
    and indirect branches of sim_probe's windows, including straight-line code whose instructions
    cross pages (the translator's page-crossing quirk), a rep string run as one block per byte,
    and indirect calls and jumps beside direct calls and rets (none of which count), one of them
    in a loop of one block and one across a page boundary."""
    if shutil.which("qemu-x86_64") is None:
        pytest.fail("user-mode QEMU (qemu-x86_64) is missing: `make setup` installs qemu-user")
    lib = sim.build_plugin()
    exe = tmp_path / "sim_probe"
    subprocess.run(["gcc", "-O2", "-static", "-Wall", "-o", exe, PROBE], check=True)
    expect = {  # mode, N: user insns (None: not checked), taken branches, indirect branches
        ("loop", 100_000): (4 * 100_000 + 2, 100_000 - 1, 0),
        ("syscalls", 2_000): (4 * 2_000 + 2, 2_000 - 1, 0),
        ("bigcode", 20): (16386 * 20 + 2, 20 - 1, 0),
        ("straight", 20): (16386 * 20 + 2, 20 - 1, 0),
        ("rep", 50_000): (None, 0, 0),
        ("indirect", 1): (17 + 9, 9 - 2, 4),
        ("indirect", 10_000): (17 * 10_000 + 9, 9 * 10_000 - 2, 4 * 10_000),
        ("empty", 0): (1, 0, 0),
    }
    for (mode, n), (insns, taken, indirect) in expect.items():
        out = tmp_path / f"{mode}-{n}.json"
        subprocess.run(["qemu-x86_64", "-plugin", f"{lib},out={out}", exe, mode, str(n)], check=True, capture_output=True, timeout=120)
        (w,) = sim.read_windows(out)
        u = w["user"]
        assert w["kernel"]["insns"] == 0 and (insns is None or u["insns"] == insns), (mode, u)
        assert u["taken_branches"] == taken and u["indirect_branches"] == indirect, (mode, u)
        assert w["kernel"]["indirect_branches"] == 0 and w["total"]["indirect_branches"] == indirect
        assert sum(v["user"]["indirect_branches"] for v in w["per_vcpu"]) == indirect
    # The straight-line sweeps ran as many blocks, the rep string as one per byte.
    assert u["blocks"] == 1  # empty: the open marker alone
    report = json.loads((tmp_path / "straight-20.json").read_text())
    assert report["windows"][0]["user"]["blocks"] >= 40 * 20 and report["config"]["itlb_kpage"] == 2 << 20
    assert json.loads((tmp_path / "rep-50000.json").read_text())["windows"][0]["user"]["blocks"] >= 50_000
    # The second iTLB has 4 KiB pages: user code's pages (itlb_page 4 KiB) give it the same accesses and misses; with
    # the first on 2 MiB pages it keeps them, and the first misses at most as often.
    small = report["windows"][0]["user"]
    assert (small["itlb_4k_accesses"], small["itlb_4k_misses"]) == (small["itlb_accesses"], small["itlb_misses"])
    assert small["itlb_misses"] > 20  # the sweep spans more pages than the iTLB holds
    big = tmp_path / "straight-2m.json"
    subprocess.run(["qemu-x86_64", "-plugin", f"{lib},out={big},itlb_page=2M", exe, "straight", "20"], check=True, capture_output=True, timeout=120)
    (w,) = sim.read_windows(big)
    assert (w["user"]["itlb_4k_accesses"], w["user"]["itlb_4k_misses"]) == (small["itlb_4k_accesses"], small["itlb_4k_misses"])
    assert w["user"]["itlb_misses"] < small["itlb_misses"] and w["user"]["itlb_accesses"] <= small["itlb_accesses"]


def test_header_fetch_failure_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No reachable archive (here: a closed local port standing in for no network)."""
    monkeypatch.setenv("KPGO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sim.header, "_deb_src_lines", lambda: ["deb-src http://127.0.0.1:9/debian bookworm main"])
    monkeypatch.setattr(sim.header, "APT_RETRIES", 0)
    with pytest.raises(InfraError) as e:
        sim.fetch_header()
    text = one_line(e.value)
    assert "apt-get update failed" in text and "check the network" in text
    monkeypatch.setattr(sim.header, "_deb_src_lines", lambda: [])
    with pytest.raises(UserError) as e2:
        sim.fetch_header()
    assert "no Debian archive" in one_line(e2.value)


def test_header_hunks_keep_only_the_header() -> None:
    patch = (
        "Subject: x\n---\n"
        "diff --git a/hw/x.c b/hw/x.c\n--- a/hw/x.c\n+++ b/hw/x.c\n@@ -1 +1 @@\n-a\n+b\n"
        "diff --git a/include/qemu/qemu-plugin.h b/include/qemu/qemu-plugin.h\n--- a/include/qemu/qemu-plugin.h\n"
        "+++ b/include/qemu/qemu-plugin.h\n@@ -1 +1 @@\n-c\n+d\n"
    )
    out = sim.header._header_hunks(patch)
    assert "hw/x.c" not in out and out.startswith("diff --git a/include/qemu/qemu-plugin.h") and out.endswith("+d\n")


def test_report_names_the_guest_clock() -> None:
    """The report's phrase for the simulated machine says whether the guest's clock followed its instruction count."""
    from kpgo.records import Measurement
    from kpgo.report import measure

    def model(**sim: object) -> str:
        return measure.sim_model(Measurement.from_json({"sim": {"l1i_size": 32768, **sim}}))

    assert "guest clock from the instruction count (32 ns each, QEMU -icount shift=5)" in model(icount=5)
    assert "guest clock on the host's" in model(icount=None)
    two = measure.sim_model(Measurement.from_json({"sim": {"icount": 5}, "icount": {"redis": 5, "micro": None}}))
    assert two.endswith("except on the host's clock for micro (more than one vCPU)")
    assert "clock" not in model()  # results from before the setting


def test_boot_cost_compares_boots_of_the_same_workload() -> None:
    """A kernel measured on one workload is set against the baseline's boots of that workload, not against the
    baseline's boots of every guest (a 2-vCPU guest boots with more kernel work than a 1-vCPU one)."""
    def sample(kernel: str, workload: str, insns: float) -> dict:
        return {"kernel": kernel, "workload": workload, "sim_boot": {"kernel": {"insns": insns, "l1i_misses": insns / 100, "taken_branches": insns / 10}}}

    samples = [sample("vanilla", "redis", 100e6), sample("vanilla", "redis", 102e6), sample("vanilla", "micro", 200e6), sample("vanilla", "micro", 204e6),
               sample("opt-redis", "redis", 95e6), sample("opt-redis", "redis", 96.9e6), sample("other", "nginx", 90e6)]
    cost = bench.boot_cost(samples, "vanilla", ["vanilla", "opt-redis", "other"])
    r = cost["opt-redis"]["insns"]
    assert r["ratio"] == pytest.approx(0.95) and r["workloads"] == ["redis"] and r["n"] == 2 and r["mean"] == pytest.approx(95.95e6)
    assert cost["vanilla"]["insns"]["ratio"] == pytest.approx(1.0) and cost["vanilla"]["insns"]["workloads"] == ["micro", "redis"]
    assert cost["other"]["insns"]["workloads"] == [] and math.isnan(cost["other"]["insns"]["ratio"])  # no baseline boot to compare with
    assert bench.boot_cost([s for s in samples if s["kernel"] != "vanilla"], "vanilla", ["opt-redis"]) == {}
