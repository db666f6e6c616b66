"""Shared fixtures. The end-to-end fixture runs the real `kpgo run` on the tiny config once per
test session (builds, boots, redis, collect, fix, optimized build, bench); other VM tests reuse
its kernels. Builds live in KPGO_TEST_DIR (default .kpgo-test/ in the repo) and are cached by
their inputs, so a second local session reuses them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kpgo.guest.contract import Workload

REPO = Path(__file__).resolve().parent.parent

# Every test runs with an empty HOME (and no XDG directories), so nothing a developer's machine
# holds in its home (a ~/.memslap.cnf left by a host-side run, tool configs) can make a test pass
# that fails for a new user. kpgo's own cache, which `make setup` filled (QEMU plugin, helper
# programs, kernel source), stays where it was, named explicitly.
os.environ.setdefault("KPGO_CACHE", os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kpgo"))
for _key in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
    os.environ.pop(_key, None)
os.environ["HOME"] = tempfile.mkdtemp(prefix="kpgo-test-home.")


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def kpgo(*args: str | Path, timeout: float = 3000, env: dict[str, str] | None = None) -> CliResult:
    """Run the real command line in a child process, as a user would."""
    t = time.monotonic()
    cp = subprocess.run(
        [sys.executable, "-m", "kpgo", *map(str, args)],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
    )
    res = CliResult(cp.returncode, cp.stdout, cp.stderr, time.monotonic() - t)
    print(f"\n$ kpgo {' '.join(map(str, args))}  [{res.seconds:.0f} s, exit {res.returncode}]\n{cp.stderr[-3000:]}")
    return res


def workload(name: str, **fields: Any) -> Workload:
    """A workload made by hand for a test: the fields it gives (as in a workload file), placeholders for the other required ones."""
    return Workload.from_json({"name": name, "description": f"{name}, a test's", "unit": "ops/s", "higher_is_better": True,
                               "aggregate": "mean", "params": {}, "load": [], **fields})


def assert_one_line_error(res: CliResult, code: int, *needles: str) -> None:
    assert res.returncode == code, res.stderr
    assert "Traceback" not in res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("kpgo: error:")]
    assert len(errors) == 1, res.stderr
    for n in needles:
        assert n in errors[0], errors[0]


@pytest.fixture(scope="session")
def test_dir() -> Path:
    d = Path(os.environ.get("KPGO_TEST_DIR") or REPO / ".kpgo-test").resolve()
    d.mkdir(parents=True, exist_ok=True)
    return d


# The session's run: two workloads (redis, and stress-ng micro kept short), each its own optimized
# kernel, the cross-application study (each optimized kernel on both workloads) and simulated counters
# (no --sim: under TCG they are the default, which test_e2e_tiny checks). With --values: its instrumented
# kernel is also the value-profiling kernel of test_values_vm, and its collections of redis and micro are
# those of test_workloads_vm, so CI builds four tiny kernels in all (docs/MEASUREMENTS.md: CI on a cold cache).
REDIS_REQUESTS = 20000
# micro's steps at about half their operation counts (~1 s each under TCG), as plain KEY=VALUE
MICRO_OPS = ["syscall_ops=160", "pipe_ops=112000", "switch_ops=11200", "fork_ops=240", "open_ops=10400", "file_ops=5600",
             "exec_ops=16", "tcp_ops=64", "unix_ops=20000", "udp_ops=48000"]
# Short measured windows: CI proves each workload works; docs/WORKLOADS.md has the default-size figures. The tiny
# run uses those of its workloads, and its collections stand for theirs.
SHORT = ["nginx.duration=5", "apache.duration=5", "memcached.duration=5", "mysql.duration=5",
         "postgresql.select_transactions=60", "postgresql.tpcb_transactions=8", "rocksdb.num=30000", "leveldb.num=30000",
         f"redis.requests={REDIS_REQUESTS}", *(f"micro.{s}" for s in MICRO_OPS), "micro.procs=1"]
IN_TINY_RUN = ("redis", "micro")
WORKLOADS = ("apache", "leveldb", "memcached", "micro", "mysql", "nginx", "postgresql", "redis", "rocksdb")


def short_sets(names: tuple[str, ...] | list[str]) -> list[str]:
    """--set options of SHORT for these workloads."""
    return [a for s in SHORT if s.partition(".")[0] in names for a in ("--set", s)]


TINY_RUN_ARGS = ("run", "--base", "tiny", "--workload", ",".join(IN_TINY_RUN), "--study", "cross", "--boots", "2", "--values",
                 *short_sets(IN_TINY_RUN))


@pytest.fixture(scope="session")
def tiny_run(test_dir: Path) -> Path:
    """The whole loop on the tiny config, for real."""
    run_dir = test_dir / "run-tiny"
    # Four tiny kernels from scratch, two collections and twelve boots: 44 min on a quiet machine with an empty
    # cache (2,666 s in the session-15 rehearsal).
    res = kpgo(*TINY_RUN_ARGS, "--dir", run_dir, timeout=4800)
    assert res.returncode == 0, f"kpgo run failed:\n{res.stderr[-4000:]}"
    return run_dir


def copy_of_run(run: Path, dst: Path) -> Path:
    """A copy of a finished run (builds and profiles reused, cached by their inputs; no bench or studies) for a test
    to add a study to, made once: a copy that already has its run.json is kept."""
    if not (dst / "run.json").exists():
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(run, dst, symlinks=True, ignore=shutil.ignore_patterns("bench", "studies"))
    return dst


@pytest.fixture(scope="session")
def tiny_summary(tiny_run: Path) -> dict:
    return json.loads((tiny_run / "run.json").read_text())


@pytest.fixture(scope="session")
def all_profiles(tiny_run: Path, test_dir: Path) -> dict[str, Path]:
    """A profile of every workload (short windows, default placement: network servers driven from the host) from the tiny instrumented kernel: the tiny run's of
    redis and micro, and one `kpgo collect` of the others, once."""
    out = test_dir / "collect-all"
    key = json.loads((tiny_run / "builds" / "instrumented" / "build.json").read_text())["key"]
    others = [n for n in WORKLOADS if n not in IN_TINY_RUN]

    def current(n: str) -> bool:  # collected, and from today's instrumented kernel
        try:
            return json.loads((out / n / "profile.json").read_text())["build_key"] == key
        except (OSError, ValueError, KeyError):
            return False

    if not all(current(n) for n in others):
        import shutil

        shutil.rmtree(out, ignore_errors=True)
        res = kpgo("collect", tiny_run / "builds" / "instrumented", "--workload", ",".join(others), "-o", out, *short_sets(others))
        assert res.returncode == 0, res.stderr[-3000:]
    return {n: tiny_run / "profiles" / f"{n}.raw" if n in IN_TINY_RUN else out / n for n in WORKLOADS}
