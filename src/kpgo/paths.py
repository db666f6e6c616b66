"""Where kpgo keeps things it shares between runs."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Extracted kernel sources, tool probes, build statistics. KPGO_CACHE overrides."""
    base = os.environ.get("KPGO_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "kpgo")
    path = Path(base).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path
