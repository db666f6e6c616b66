"""Facts about the host that results are reported with."""

from __future__ import annotations

import functools
import socket
from pathlib import Path

from kpgo import proc
from kpgo.errors import KpgoError


def cpu_model() -> str:
    """The first 'model name' of /proc/cpuinfo, or "unknown"."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


@functools.cache  # asked once per boot; QEMU is not upgraded under a running bench
def qemu_version() -> str:
    """The first line of `qemu-system-x86_64 --version` (an InfraError/UserError when QEMU is missing)."""
    return proc.capture(["qemu-system-x86_64", "--version"]).splitlines()[0]


def identity() -> dict[str, str]:
    """What a sample (or a failed boot) records of the machine that booted it; on a cluster, kpgo.cluster adds the
    Ray node id."""
    try:
        qemu = qemu_version()
    except KpgoError:  # a failed boot on a machine without QEMU still says where it failed
        qemu = "unknown"
    return {"hostname": socket.gethostname(), "cpu_model": cpu_model(), "qemu": qemu}
