"""Progress on long steps: one updating line on a terminal, a line every 30 s in a log/CI; and --json's stream."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

_json_out: TextIO | None = None  # the real stdout while json_only() holds it


def fmt_secs(s: float) -> str:
    s = int(s)
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class Progress:
    def __init__(self, label: str, total: int | None = None, every: float = 30.0) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.start = time.monotonic()
        self.tty = sys.stderr.isatty()
        self.every = every
        self.last = 0.0

    def step(self, n: int = 1, note: str = "") -> None:
        self.done += n
        now = time.monotonic()
        if self.tty or now - self.last >= self.every:
            self.last = now
            self._show(note)

    def _show(self, note: str = "") -> None:
        of = f"/{self.total}" if self.total else ""
        pct = f" ({100 * self.done // self.total}%)" if self.total and self.done <= self.total else ""
        text = f"{self.label}: {self.done}{of}{pct} {fmt_secs(time.monotonic() - self.start)}"
        if note:
            text += f"  {note[:60]}"
        if self.tty:
            sys.stderr.write("\r\033[K" + text)
            sys.stderr.flush()
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self, final: str) -> None:
        if self.tty:
            sys.stderr.write("\r\033[K")
        print(f"{self.label}: {final} in {fmt_secs(time.monotonic() - self.start)}", file=sys.stderr, flush=True)


def say(msg: str) -> None:
    print(f"kpgo: {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def json_only() -> Iterator[None]:
    """For --json: stdout carries the JSON alone. For the block, file descriptor 1 and sys.stdout go to stderr, so that
    nothing else (Ray prints its nodes' messages to stdout, a child process inherits it) mixes into it; print_json
    writes to the real stdout."""
    global _json_out
    saved = sys.stdout
    saved.flush()
    try:
        on_fd1 = saved.fileno() == 1
    except (AttributeError, OSError, ValueError):  # a stream in memory (a caller capturing it): it stays the JSON's
        on_fd1 = False
    keep = os.dup(1)
    real = os.fdopen(os.dup(keep), "w") if on_fd1 else saved
    os.dup2(2, 1)
    sys.stdout, _json_out = sys.stderr, real
    try:
        yield
    finally:
        sys.stdout.flush()
        real.flush()
        os.dup2(keep, 1)
        os.close(keep)
        sys.stdout, _json_out = saved, None
        if real is not saved:
            real.close()


def print_json(obj: Any, sort_keys: bool = True) -> None:
    """obj as JSON on stdout (the real one under json_only)."""
    out = _json_out or sys.stdout
    json.dump(obj, out, indent=2, sort_keys=sort_keys)
    out.write("\n")
    out.flush()
