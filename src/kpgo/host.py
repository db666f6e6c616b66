"""Facts about the host that results are reported with."""

from __future__ import annotations

from pathlib import Path


def cpu_model() -> str:
    """The first 'model name' of /proc/cpuinfo, or "unknown"."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"
