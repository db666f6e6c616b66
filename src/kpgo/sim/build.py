"""kpgo's two simulator programs, built on the host: the QEMU plugin (kpgosim.c, against the
installed QEMU's header) and the guest's window tool (window.c); and the QEMU option that loads
the plugin."""

from __future__ import annotations

import hashlib
import os
import shlex
from pathlib import Path

from kpgo import proc
from kpgo.errors import InfraError, UserError
from kpgo.guest.contract import Build
from kpgo.paths import cache_dir
from kpgo.progress import say
from kpgo.sim.config import BranchConfig, SimConfig
from kpgo.sim.header import HEADER, SETUP_HINT, fetch_header
from kpgo.workloads import install

HERE = Path(__file__).parent
PLUGIN_SOURCE = HERE / "kpgosim.c"
WINDOW_SOURCE = HERE / "window.c"
WINDOW_TOOL = "kpgo-window"


def plugin_path() -> Path:
    return cache_dir() / "sim" / "libkpgosim.so"


def qemu_opts(config: SimConfig, out: Path, branches: BranchConfig | None = None, records: Path | None = None) -> str:
    """The value of vng's --qemu-opts that loads the plugin (build it first: setup()), with branch records to
    `records` when `branches` is given. vng pastes it into a shell command line, so it is shell-quoted here."""
    arg = f"{plugin_path()},{config.plugin_arg(out)}"
    if branches is not None:
        if records is None:
            raise ValueError("branch records need a records path")
        arg += "," + branches.plugin_arg(records)
    return " ".join(filter(None, ["-plugin " + shlex.quote(arg), config.qemu_args()]))


def build_plugin() -> Path:
    """libkpgosim.so for the installed QEMU, rebuilt when kpgosim.c, the header or the QEMU version changes."""
    inc = fetch_header()
    try:
        glib = proc.capture(["pkg-config", "--cflags", "--libs", "glib-2.0"]).split()
    except (InfraError, UserError):
        raise UserError("the GLib development files are missing (pkg-config glib-2.0)", f"apt-get install libglib2.0-dev pkg-config, or {SETUP_HINT}") from None
    out = plugin_path()
    argv = ["gcc", "-shared", "-fPIC", "-fvisibility=hidden", "-O2", "-g", "-Wall", "-Wextra", "-Wno-unused-parameter",
            f"-I{inc}", "-o", "{output}", str(PLUGIN_SOURCE), *glib]
    h = hashlib.sha256(PLUGIN_SOURCE.read_bytes())
    h.update((inc / HEADER).read_bytes())
    h.update((inc / "VERSION").read_bytes())
    h.update(repr(argv).encode())
    want = h.hexdigest()[:16]
    stamp = out.with_name(out.name + ".stamp")
    if out.is_file() and stamp.is_file() and stamp.read_text() == want:
        return out
    say(f"sim: building the QEMU plugin {out.name}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    log = out.with_name(out.name + ".log")
    log.unlink(missing_ok=True)
    try:
        proc.run([a.replace("{output}", str(tmp)) for a in argv], log=log, timeout=300, what=f"building {out.name}")
        os.replace(tmp, out)  # a QEMU running the old one keeps its mapping
    finally:
        tmp.unlink(missing_ok=True)
    stamp.write_text(want)
    return out


def build_window_tool() -> Path:
    """The guest's `kpgo-window` among kpgo's helper programs (tools_dir, stamped by source hash)."""
    tool = Build(
        output=WINDOW_TOOL,
        source=str(WINDOW_SOURCE),  # absolute: the helper builder joins it onto workloads/tools/ unchanged
        # static, no libc: exec is cheap under TCG and little besides the marker runs in the window
        argv=("gcc", "-O2", "-static", "-nostdlib", "-ffreestanding", "-fno-stack-protector", "-fno-pie", "-no-pie",
              "-Wall", "-Wextra", "-o", "{output}", "{source}"),
    )
    install.build_tool(tool, "sim")
    return install.tools_dir() / WINDOW_TOOL


def setup() -> tuple[Path, Path]:
    """Everything a simulated boot needs on the host: the plugin and the guest's window tool."""
    return build_plugin(), build_window_tool()
