"""Simulated CPU counters for guests under QEMU TCG (docs/SIM.md).

kpgosim.c is a QEMU TCG plugin: inside windows the guest opens and closes with marker NOPs
(window.c, the guest tool `kpgo-window open|close`), it counts guest instructions, taken and
indirect branches and simulated L1 instruction-cache and iTLB accesses and misses, each split kernel/user, and writes
every closed window to a JSON report on the host. One module per job:

- config: SimConfig, the simulated cache and iTLB, and the plugin's arguments; BranchConfig, its branch records;
- header: the installed QEMU's version and its qemu-plugin.h, fetched once from Debian's source package;
- build: the plugin and the guest's window tool, and the QEMU option that loads the plugin;
- report: reading the plugin's report, and the front-end stall estimate.

Only functions whose names say so fetch, build or remove anything: fetch_header, build_plugin,
build_window_tool, setup (both programs; `python -m kpgo.sim` and vm.prepare_sim run it), clean_report."""

from kpgo.sim.build import (
    PLUGIN_SOURCE,
    WINDOW_SOURCE,
    WINDOW_TOOL,
    build_plugin,
    build_window_tool,
    plugin_path,
    qemu_opts,
    setup,
)
from kpgo.sim.config import BOOLS, BRANCH_PERIOD, BranchConfig, SimConfig
from kpgo.sim.header import HEADER, QEMU_PACKAGE, SETUP_HINT, QemuVersion, fetch_header, header_dir, qemu_version
from kpgo.sim.report import (
    COUNTERS,
    REPORT_FORMAT,
    STALL_ITLB_CYCLES,
    STALL_L1I_CYCLES,
    clean_report,
    frontend_stall_cycles,
    read_windows,
)

__all__ = [
    "BOOLS", "BRANCH_PERIOD", "COUNTERS", "HEADER", "PLUGIN_SOURCE", "QEMU_PACKAGE", "REPORT_FORMAT", "SETUP_HINT",
    "STALL_ITLB_CYCLES", "STALL_L1I_CYCLES", "WINDOW_SOURCE", "WINDOW_TOOL",
    "BranchConfig", "QemuVersion", "SimConfig",
    "build_plugin", "build_window_tool", "clean_report", "fetch_header", "frontend_stall_cycles", "header_dir",
    "plugin_path", "qemu_opts", "qemu_version", "read_windows", "setup",
]
