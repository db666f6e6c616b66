"""SIGKILL of `kpgo run` in a kernel build, in a guest and in a bench boot, then the same command again: it
completes, redoes only the interrupted step (and what depends on its output), and nothing kpgo started (make,
the compilers, QEMU) outlives the killed kpgo by more than a few seconds.

Each case works on a copy of the session's tiny run with one step's output removed, so the rerun has that step
(and only it) to do. A rebuilt kernel or a new profile changes what depends on it (the optimized kernel of a new
profile, the bench boots of a rebuilt kernel), so those may be redone too; everything else must be reused.
~10 min on 2 cores (kernel objects come back from ccache): marked slow, run with `make test PYTEST_ARGS='-m slow'`."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import TINY_RUN_ARGS, kpgo

pytestmark = [pytest.mark.vm, pytest.mark.slow]


def _rm(*rels: str) -> Callable[[Path], None]:
    def remove(run: Path) -> None:
        for rel in rels:
            for p in run.glob(rel):
                shutil.rmtree(p)
    return remove


# (case, what to remove, the stderr line that says the step is under way, seconds to let it run, phases it may redo)
CASES = [
    ("build", _rm("builds/vanilla"), r"build vanilla: objects: \d+", 20, {"build vanilla", "bench"}),
    ("guest", _rm("profiles/micro", "profiles/micro.raw"), r"collect micro: booting", 15,
     {"collect micro", "profile fix micro", "build optimized-micro", "bench"}),
    ("bench-boot", _rm("bench/boots/00-micro-vanilla"), r"bench: boot 1/1: vanilla on micro", 10, {"bench"}),
]


def _leftovers(run: Path) -> list[str]:
    out = subprocess.run(["pgrep", "-af", str(run)], capture_output=True, text=True).stdout.splitlines()
    return [ln for ln in out if "pgrep" not in ln]


@pytest.mark.parametrize("case, remove, started, wait, may_redo", CASES, ids=[c[0] for c in CASES])
def test_killed_run_resumes(case: str, remove: Callable[[Path], None], started: str, wait: float, may_redo: set[str],
                            tiny_run: Path, test_dir: Path) -> None:
    run = test_dir / f"run-interrupt-{case}"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(tiny_run, run, symlinks=True)
    remove(run)
    p = subprocess.Popen([sys.executable, "-m", "kpgo", *TINY_RUN_ARGS, "--dir", str(run)], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert p.stderr is not None
    seen = []
    for line in p.stderr:
        seen.append(line)
        if re.search(started, line):
            break
    else:
        pytest.fail(f"the step never started:\n{''.join(seen[-20:])}")
    time.sleep(wait)
    assert p.poll() is None, "kpgo ended before it could be killed"
    p.send_signal(signal.SIGKILL)
    p.wait()
    deadline = time.monotonic() + 10
    while _leftovers(run) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _leftovers(run), f"processes outlived the killed kpgo: {_leftovers(run)}"

    res = kpgo(*TINY_RUN_ARGS, "--dir", run)
    assert res.returncode == 0, res.stderr[-3000:]
    phases = json.loads((run / "run.json").read_text())["phases_seconds"]
    redone = {name for name, secs in phases.items() if secs >= 2}
    assert redone and redone <= may_redo, f"redone: {redone}; allowed: {may_redo}"
    if case == "bench-boot":
        assert "11 of 12 boots kept" in res.stderr
