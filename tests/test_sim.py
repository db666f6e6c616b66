"""kpgo.sim without a guest: the plugin header matches the installed QEMU and is cached, the
plugin and the window tool build, configuration and report errors are one line."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from kpgo import sim
from kpgo.errors import InfraError, KpgoError, UserError


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
    assert inc == sim.cache_dir() / "qemu-plugin" / version.upstream
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
    monkeypatch.setattr(sim, "fetch_header", lambda: inc)
    src = tmp_path / "kpgosim.c"
    src.write_text(sim.PLUGIN_SOURCE.read_text())
    monkeypatch.setattr(sim, "PLUGIN_SOURCE", src)
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
    assert (c.l1i_size, c.l1i_assoc, c.l1i_line, c.itlb_entries, c.itlb_assoc, c.itlb_page, c.itlb_kpage) == (32768, 8, 64, 64, 4, 4096, 4096)
    arg = c.plugin_arg(tmp_path / "sim.json")
    assert arg.startswith(f"out={tmp_path / 'sim.json'},")
    assert "l1i_size=32768" in arg and "itlb_kpage=4096" in arg and "warm=off" in arg
    assert sim.SimConfig.parse("l1i_size=16k,itlb_kpage=2M,warm=on") == sim.SimConfig(l1i_size=16384, itlb_kpage=2 << 20, warm=True)
    assert sim.SimConfig(warm=1).warm is True  # an integer from a KEY=NUMBER option
    opts = sim.qemu_opts(c, tmp_path / "sim.json")
    assert opts.startswith("-plugin ") and str(sim.plugin_path()) in opts


@pytest.mark.parametrize("bad, needle", [
    ({"l1i_line": 48}, "l1i_line=48 is not a power of two"),
    ({"l1i_assoc": 3}, "l1i_size=32768 over 3 ways"),
    ({"l1i_size": 0}, "l1i_size must be a positive integer"),
    ({"itlb_entries": 48}, "itlb_entries=48 over 4 ways"),
    ({"itlb_assoc": 128, "itlb_entries": 128}, "itlb_assoc=128 is above 64 ways"),
    ({"itlb_kpage": 3000}, "itlb_kpage=3000 is not a power of two"),
])
def test_simconfig_bad_geometry_is_one_line(bad: dict, needle: str) -> None:
    with pytest.raises(UserError) as e:
        sim.SimConfig(**bad)
    assert needle in one_line(e.value)


def test_simconfig_parse_errors() -> None:
    for text in ("l1i=3", "l1i_size", "l1i_size=big"):
        with pytest.raises(UserError) as e:
            sim.SimConfig.parse(text)
        one_line(e.value)


def test_plugin_arg_refuses_comma_paths(tmp_path: Path) -> None:
    with pytest.raises(UserError) as e:
        sim.SimConfig().plugin_arg(tmp_path / "a,b" / "sim.json")
    assert "comma" in one_line(e.value)


def _window(insns: int = 10) -> dict:
    side = {"insns": insns, "blocks": 1, "l1i_accesses": 3, "l1i_misses": 1, "itlb_accesses": 2, "itlb_misses": 1}
    return {"index": 1, "closed": True, "seconds": 0.5, "user": side, "kernel": side, "total": side}


def test_read_windows(tmp_path: Path) -> None:
    report = tmp_path / "sim.json"
    report.write_text(json.dumps({"tool": "kpgosim", "format": 2, "windows": [_window(1), _window(2)], "open_window": None}))
    windows = sim.read_windows(report)
    assert [w["user"]["insns"] for w in windows] == [1, 2]
    report.write_text(json.dumps({"tool": "kpgosim", "format": 2, "windows": []}))
    assert sim.read_windows(report) == []


@pytest.mark.parametrize("content, needle", [
    (None, "wrote no report"),
    ('{"tool": "kpgosim", "format": 2, "windows": [', "unreadable or corrupt"),
    ("\x00\x01garbage", "unreadable or corrupt"),
    ('{"tool": "other"}', "not a kpgosim report"),
    ('{"tool": "kpgosim", "format": 1, "windows": []}', "format 1"),
    ('{"tool": "kpgosim", "format": 2, "windows": [{"seconds": 1, "user": {"insns": 1}}]}', "lacks user counters"),
])
def test_read_windows_bad_report_is_one_line(tmp_path: Path, content: str | None, needle: str) -> None:
    report = tmp_path / "sim.json"
    if content is not None:
        report.write_text(content)
    with pytest.raises(InfraError) as e:
        sim.read_windows(report)
    assert needle in one_line(e.value)


def test_header_fetch_failure_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No reachable archive (here: a closed local port standing in for no network)."""
    monkeypatch.setenv("KPGO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sim, "_deb_src_lines", lambda: ["deb-src http://127.0.0.1:9/debian bookworm main"])
    monkeypatch.setattr(sim, "APT_RETRIES", 0)
    with pytest.raises(InfraError) as e:
        sim.fetch_header()
    text = one_line(e.value)
    assert "apt-get update failed" in text and "check the network" in text
    monkeypatch.setattr(sim, "_deb_src_lines", lambda: [])
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
    out = sim._header_hunks(patch)
    assert "hw/x.c" not in out and out.startswith("diff --git a/include/qemu/qemu-plugin.h") and out.endswith("+d\n")
