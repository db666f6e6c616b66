"""SIGKILL of `kpgo run` in a kernel build, in a guest and in a bench boot, and of `kpgo collect` in the guest's
snapshot and while it writes the profile directory, then the same command again: it completes, redoes only the
interrupted step (and what depends on its output), and nothing kpgo started (make, the compilers, QEMU, passt)
outlives the killed kpgo by more than a few seconds.

Each case works on a copy of the session's tiny run with one step's output removed, so the rerun has that step
(and only it) to do. A rebuilt kernel or a new profile changes what depends on it (the optimized kernel of a new
profile, the bench boots of a rebuilt kernel), so those may be redone too; everything else must be reused.

All marked slow, run with `make test PYTEST_ARGS='-m slow'`: the kill in a bench boot (~2 min: one boot again) and
both kills of `kpgo collect` (~3 min: a redis collection each, killed and run again) use the session's kernels as
they are and are meant for CI once they have passed a run here (not yet: 2026-11-27); the kills in a kernel build
and in a guest rebuild a tiny kernel (~10 and ~20 min on 2 cores; docs/RELIABILITY.md)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
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


# (case, what to remove, the stderr line that says the step is under way, seconds to let it run, phases it may redo);
# the cases whose rerun builds a kernel again are slow
CASES = [
    pytest.param("build", _rm("builds/vanilla"), r"build vanilla: objects: \d+", 20, {"build vanilla", "bench"},
                 id="build", marks=pytest.mark.slow),
    pytest.param("guest", _rm("profiles/micro", "profiles/micro.raw"), r"collect micro: booting", 15,
                 {"collect micro", "profile fix micro", "build optimized-micro", "bench"}, id="guest", marks=pytest.mark.slow),
    pytest.param("bench-boot", _rm("bench/boots/00-micro-vanilla"), r"bench: boot 1/1: vanilla on micro", 10, {"bench"}, id="bench-boot"),
]


def _leftovers(run: Path) -> list[str]:
    out = subprocess.run(["pgrep", "-af", str(run)], capture_output=True, text=True).stdout.splitlines()
    return [ln for ln in out if "pgrep" not in ln]


@pytest.mark.parametrize("case, remove, started, wait, may_redo", CASES)
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


# The moments of a collect to kill at: files that exist only then (in the profile's temporary directory).
MOMENTS = {
    "snapshot": ("*.partial/guest/gcda.tar.partial", "*.partial/guest/gcda.tar"),  # the guest copying its tar out
    "results": ("*.partial/log/guest-result.json",),  # kpgo writing the profile directory
}


@pytest.mark.parametrize("moment", sorted(MOMENTS))
def test_killed_collect_then_rerun(tiny_run: Path, tmp_path: Path, moment: str) -> None:
    """A host-client collect, so that passt and the host's load generator are among what must not outlive kpgo;
    no profile appears under its final name, and the rerun leaves nothing of the killed one behind."""
    out = tmp_path / "profile"
    args = ["collect", tiny_run / "builds" / "instrumented", "--workload", "redis", "--client", "host",
            "--set", "redis.requests=4000", "-o", out]
    with open(tmp_path / "killed.log", "w") as log:
        p = subprocess.Popen([sys.executable, "-m", "kpgo", *map(str, args)], stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 900
    hit: list[Path] = []
    while not hit and p.poll() is None and time.monotonic() < deadline:
        hit = [h for pattern in MOMENTS[moment] for h in tmp_path.glob(pattern)]
        time.sleep(0.02)
    assert hit, f"kpgo ended (status {p.poll()}) before the {moment}: {(tmp_path / 'killed.log').read_text()[-2000:]}"
    p.send_signal(signal.SIGKILL)
    p.wait()
    passt = f"passt --foreground .*{tempfile.gettempdir()}/.kpgo-net.{p.pid}."
    deadline = time.monotonic() + 10
    while (_leftovers(tmp_path) or _leftovers_matching(passt)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _leftovers(tmp_path), f"processes outlived the killed kpgo: {_leftovers(tmp_path)}"
    assert not _leftovers_matching(passt), "passt outlived the killed kpgo"
    assert not out.exists(), "a profile appeared under its final name"
    res = kpgo(*args)
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(list(out.rglob("*.gcda"))) > 100 and (out / "profile.json").is_file()
    assert not list(tmp_path.glob("*.partial")), "the killed writer's temporary profile directory is still there"
    assert not list(Path(tempfile.gettempdir()).glob(f".kpgo-net.{p.pid}.*")), "the killed kpgo's passt directory is still there"


def _leftovers_matching(pattern: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
