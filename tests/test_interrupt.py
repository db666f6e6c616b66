"""Interruption: nothing kpgo starts outlives it, and one run or bench directory has one writer."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import assert_one_line_error, kpgo
from gcov_fixtures import Profiles, gcc_build, profiles  # noqa: F401


def _pids(pattern: str, parent: int | None = None) -> list[str]:
    """Processes whose command line matches; with parent, only that process's children (another kpgo may
    be running on the machine, with reapers of its own)."""
    argv = ["pgrep", "-f", pattern] + (["-P", str(parent)] if parent else [])
    return subprocess.run(argv, capture_output=True, text=True).stdout.split()


def _gone(pid: str) -> bool:
    """Exited (a zombie waiting for its new parent to reap it counts as exited)."""
    try:
        return "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True


def test_children_die_with_a_killed_kpgo() -> None:
    """SIGKILL of the process that called proc.run (no handler can run) still ends the child's whole group,
    grandchildren included (a QEMU under vng, the compilers under make)."""
    # The sleeps' own duration (171 s and this test's pid as its fraction) tells them apart from any other on the
    # machine, another session's run of this test included.
    mine = f"171.{os.getpid()}"
    code = f"from kpgo import proc; proc.run(['sh', '-c', 'sleep {mine} & sleep {mine}'], check=False)"
    parent = subprocess.Popen([sys.executable, "-c", code])
    sleeps = f"^sleep {re.escape(mine)}$"
    deadline = time.monotonic() + 20
    while len(_pids(sleeps)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(_pids(sleeps)) == 2
    [reaper] = _pids("kpgo-reaper", parent=parent.pid)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 5
    while _pids(sleeps) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _pids(sleeps), "a child outlived kpgo"
    assert _gone(reaper), "the reaper outlived its work"


def test_a_normal_end_leaves_no_reaper() -> None:
    from kpgo import proc

    assert proc.run(["true"]).returncode == 0
    assert not _pids("kpgo-reaper", parent=os.getpid())


def test_a_process_that_never_prints_the_expected_line_is_killed_early() -> None:
    """The guest's start deadline (vm.Guest.start_timeout) works through proc.run's `expect`: a hung boot is killed
    when its line is late, long before the whole timeout, and a process that prints it in time runs to its end."""
    import pytest

    from kpgo import proc
    from kpgo.errors import InfraError

    t0 = time.monotonic()
    hung = proc.run(["sh", "-c", "echo booting; sleep 60"], timeout=120, expect=("agent: started", 1.0), check=False)
    assert hung.stalled and hung.timed_out and time.monotonic() - t0 < 10
    assert "booting" in hung.output
    fine = proc.run(["sh", "-c", "sleep 0.2; echo agent: started; sleep 1.5; echo done"], timeout=120, expect=("agent: started", 1.0))
    assert not fine.stalled and not fine.timed_out and fine.output.endswith("done\n")
    with pytest.raises(InfraError, match="printed no 'agent: started' within 1 s"):
        proc.run(["sh", "-c", "sleep 60"], timeout=120, expect=("agent: started", 1.0), what="the guest")


@pytest.mark.parametrize("command, what", [
    (("run", "--base", "tiny", "--workload", "redis", "--dir"), "run directory"),
    (("bench", "--kernel", "vanilla=/nonexistent", "--workload", "redis", "-o"), "bench directory"),
])
def test_second_run_on_the_same_directory_is_refused(tmp_path: Path, command: tuple[str, ...], what: str) -> None:
    """The first holds the run (bench) directory's lock (here a stand-in holder, so no kernel is built or booted); the
    second kpgo run (bench) is refused at once, before it unpacks a kernel source or compiles a helper, naming the
    holder, and writes nothing."""
    run_dir = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; from kpgo import atomic\n"
                               f"with atomic.exclusive(Path({str(run_dir)!r}), 'run directory'):\n    print('held', flush=True); time.sleep(3600)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        before = sorted(p.name for p in run_dir.iterdir())
        t = time.monotonic()
        res = kpgo(*command, run_dir)
        assert_one_line_error(res, 1, f"another kpgo (pid {holder.pid}) is using the {what}", "wait for it")
        assert time.monotonic() - t < 30  # measured: 2-3 s (48 s when the run took its lock after preparing)
        assert sorted(p.name for p in run_dir.iterdir()) == before
    finally:
        holder.kill()
        holder.wait()


def _many(src: Path, dst: Path, copies: int) -> Path:
    for i in range(copies):
        (dst / f"d{i:04d}").mkdir(parents=True)
        (dst / f"d{i:04d}" / "main.gcda").write_bytes((src / "main.gcda").read_bytes())
    return dst


def _digest(root: Path) -> list[tuple[str, bytes]]:
    return sorted((str(p.relative_to(root)), p.read_bytes()) for p in root.rglob("*") if p.is_file())


def test_killed_merge_leaves_nothing_half_written(profiles: Profiles, tmp_path: Path) -> None:  # noqa: F811
    """SIGKILL of `kpgo profile merge` at moments spread over its run (start-up, reading, writing, renaming): the
    output is either absent or whole (equal to an undisturbed merge), and the same command again completes and
    removes what the killed one left (its temporary directory, named with its pid). Half the kills at fractions of
    an undisturbed merge's time, half once its temporary output has appeared (0-20 ms after), so that some land while
    it writes however fast this machine is at the moment."""
    a, b = _many(profiles.k0, tmp_path / "a", 1500), _many(profiles.k1, tmp_path / "b", 1500)
    argv = [sys.executable, "-m", "kpgo", "profile", "merge", str(a), str(b), "-o"]
    env = dict(os.environ)  # the kpgo the other tests run (sys.executable -m kpgo: the installed package)
    t = time.monotonic()
    subprocess.run([*argv, str(tmp_path / "ref")], check=True, env=env, capture_output=True)
    whole = time.monotonic() - t
    ref = _digest(tmp_path / "ref")
    killed_while_writing = 0
    for i in range(10):
        out = tmp_path / f"out{i}"
        p = subprocess.Popen([*argv, str(out)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if i % 2 == 0:
            time.sleep(whole * (0.3 + 0.16 * (i // 2)))  # from start-up to near the end
        else:
            while p.poll() is None and not any(q.name.startswith(f".{out.name}.") for q in tmp_path.iterdir()):
                time.sleep(0.001)
            time.sleep((0, 0.002, 0.005, 0.01, 0.02)[i // 2])
        p.send_signal(signal.SIGKILL)
        p.wait()
        left = [q.name for q in tmp_path.iterdir() if q.name.startswith(f".{out.name}.")]
        killed_while_writing += bool(left)
        if out.exists():
            assert _digest(out) == ref, "a killed merge left an incomplete output under its final name"
            continue
        subprocess.run([*argv, str(out)], check=True, env=env, capture_output=True)
        assert _digest(out) == ref
        assert not [q for q in tmp_path.iterdir() if q.name.startswith(f".{out.name}.")], "the killed merge's leftovers stayed"
    print(f"kills while writing: {killed_while_writing} of 10")
    assert killed_while_writing, "no kill landed while the output was being written: the test did not test"
