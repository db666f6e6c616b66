"""The one place kpgo starts processes (on the host).

Commands are argv lists, never shell strings. Output goes to the step's log file; the caller
sees lines through a callback when it wants progress. A timeout kills the whole process group
(a guest's QEMU included), so nothing is left running."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kpgo.errors import InfraError, UserError

# tool -> Debian package that provides it (for the error message when it is missing)
PACKAGES: dict[str, str] = {
    "make": "make",
    "dpkg-buildpackage": "dpkg-dev",
    "dh_testdir": "debhelper",
    "gcc": "gcc",
    "gcov": "gcc",
    "gcov-tool": "gcc",
    "gcov-dump": "gcc",
    "flex": "flex",
    "bison": "bison",
    "bc": "bc",
    "qemu-system-x86_64": "qemu-system-x86",
    "vng": "virtme-ng (pip)",
    "virtme-prep-kdir-mods": "virtme-ng (pip)",
    "depmod": "kmod",
    "redis-server": "redis-server",
    "redis-benchmark": "redis-tools",
    "objdump": "binutils",
    "size": "binutils",
    "tar": "tar",
    "passt": "passt",
}


_verbose = False  # `kpgo -v`, which cli.main passes on through set_verbose


def set_verbose(on: bool) -> None:
    """Print every command before it runs (on stderr)."""
    global _verbose
    _verbose = on


def _show(cmd: list[str]) -> None:
    if _verbose:
        print(f"+ {' '.join(cmd)}", file=sys.stderr)


def search_path() -> str:
    """The PATH kpgo looks tools up on and gives each child in its env: the environment's, with the directory
    of kpgo's Python in front unless it is on it already, so tools installed beside kpgo count as on PATH
    (virtme-ng's vng in the same venv, which finds its own virtme-run there in turn). Passed to each child
    rather than written into os.environ, so importing kpgo changes nothing in the process."""
    path = os.environ.get("PATH", "")
    here = os.path.dirname(sys.executable)
    return path if here in path.split(os.pathsep) else here + os.pathsep + path


def which(tool: str) -> str | None:
    """Absolute path of `tool` on search_path(), or None."""
    return shutil.which(tool, path=search_path())


def need(tool: str) -> str:
    """Absolute path of `tool`, or a UserError naming the package to install."""
    path = which(tool)
    if path is None:
        pkg = PACKAGES.get(tool, tool)
        raise UserError(f"required tool '{tool}' not found", f"install {pkg} (`make setup` installs everything)")
    return path


def _need_program(program: str) -> None:
    if os.sep not in program:  # a bare name is looked up on PATH; a path is the caller's to get right
        need(program)


def pinned(argv: Sequence[object], cores: Sequence[int] | None) -> list:
    """argv run on these host cores only (taskset), or as it is without cores. The wrapped program is checked here,
    as run() checks only taskset: a missing one is the usual one-line error, not taskset's "failed to execute"."""
    if not cores:
        return list(argv)
    _need_program(str(argv[0]))
    return ["taskset", "-c", ",".join(map(str, cores)), *argv]


@dataclass
class Result:
    argv: list[str]
    returncode: int
    output: str  # combined stdout+stderr (also in the log, when one was given)
    seconds: float
    timed_out: bool
    stalled: bool = False  # killed because `expect`'s line did not come in time


def run(
    argv: Sequence[object],  # each item goes through str() (paths, numbers)
    *,
    log: Path | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    on_line: Callable[[str], None] | None = None,
    check: bool = True,
    what: str | None = None,
    keep_output: bool = True,
    expect: tuple[str, float] | None = None,
) -> Result:
    """Run argv; stream its combined output to `log` and `on_line`; return its Result.

    expect=(text, seconds): a line containing `text` must come within `seconds` of the start, or the process is
    killed as stalled (timed_out and stalled set): a hang found early costs minutes, not the whole timeout.
    check=True turns a non-zero exit or a timeout into an InfraError naming `what` and the log."""
    cmd = [str(a) for a in argv]
    _need_program(cmd[0])
    full_env = {**os.environ, "PATH": search_path(), **(env or {})}
    _show(cmd)
    logf = None
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        logf = open(log, "a", buffering=1, errors="replace")
        logf.write(f"\n$ {' '.join(cmd)}\n")
    start = time.monotonic()
    chunks: list[str] = []
    timed_out = stalled = False
    p = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=full_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,  # own process group: a timeout kills children too
    )
    reaper = _Reaper(p.pid)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:  # a thread, so a partial line without newline never blocks the timeout
        assert p.stdout is not None
        for line in p.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        deadline = None if timeout is None else start + timeout
        marker, by = (expect[0], start + expect[1]) if expect else (None, None)
        while True:
            ends = [d for d in (deadline, by if marker else None) if d is not None]
            wait = min(ends) - time.monotonic() if ends else None
            if wait is not None and wait <= 0:
                timed_out = True
                stalled = marker is not None and by is not None and time.monotonic() >= by
                break
            try:
                line = lines.get(timeout=wait)
            except queue.Empty:
                continue
            if line is None:
                break
            if marker and marker in line:
                marker = None
            if keep_output:
                chunks.append(line)
            if logf:
                logf.write(line)
            if on_line:
                on_line(line.rstrip("\n"))
        if timed_out:
            _kill_group(p)
        p.wait(timeout=30)
        reader.join(timeout=5)
    except BaseException:
        _kill_group(p)
        raise
    finally:
        reaper.release()
        if logf:
            logf.close()
    res = Result(cmd, p.returncode if not timed_out else -1, "".join(chunks), time.monotonic() - start, timed_out, stalled)
    if check and (timed_out or res.returncode != 0):
        name = what or Path(cmd[0]).name
        where = f"; log: {log}" if log else ""
        if stalled and expect:
            raise InfraError(f"{name} printed no '{expect[0]}' within {expect[1]:.0f} s and was killed{where}")
        if timed_out:
            raise InfraError(f"{name} did not finish within {timeout:.0f} s and was killed{where}")
        raise InfraError(f"{name} failed with exit status {res.returncode}{where}")
    return res


class _Reaper:
    """Ties a child's process group to this process's life. The group has its own session (so a timeout
    can kill it whole), which also means nothing kills it when kpgo itself is killed (SIGKILL, OOM): a
    QEMU or make would run on alone. A tiny shell in a session of its own holds the read end of a pipe
    only this process can write; when this process dies the kernel closes the pipe, the shell reads EOF
    and kills the group. A normal end writes "done" first, and the shell leaves the group alone."""

    def __init__(self, pgid: int) -> None:
        r, self._w = os.pipe()  # not inherited by other children (Python's pipes are close-on-exec)
        try:
            self._dog = subprocess.Popen(
                ["sh", "-c", 'read -r x; [ "$x" = done ] || kill -KILL "-$1" 2>/dev/null', "kpgo-reaper", str(pgid)],
                stdin=r, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )
        finally:
            os.close(r)

    def release(self) -> None:
        try:
            os.write(self._w, b"done\n")
        finally:
            os.close(self._w)
        self._dog.wait()


def _kill_group(p: subprocess.Popen[Any]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


class Service:
    """A helper that runs beside a step (passt beside a guest): started by `start`, ended by `stop`, its
    output in `log`. Own process group, tied to this process's life like `run`'s children."""

    def __init__(self, argv: Sequence[object], *, log: Path, ready: tuple[Callable[[], bool], float], what: str) -> None:
        cmd = [str(a) for a in argv]
        _need_program(cmd[0])
        _show(cmd)
        self.what = what
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as logf:
            logf.write(f"\n$ {' '.join(cmd)}\n")
            self._p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                       env={**os.environ, "PATH": search_path()}, start_new_session=True)
        self._reaper = _Reaper(self._p.pid)
        self._stopped = False
        is_ready, seconds = ready
        deadline = time.monotonic() + seconds
        while not is_ready():
            if self._p.poll() is not None or time.monotonic() > deadline:
                status = f"ended with status {self._p.returncode}" if self._p.poll() is not None else f"was not ready within {seconds:.0f} s"
                self.stop()
                raise InfraError(f"{what} {status}", f"log: {log}")
            time.sleep(0.05)

    def alive(self) -> bool:
        return self._p.poll() is None

    def stop(self) -> None:
        """End it (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        _kill_group(self._p)
        self._reaper.release()


def capture(argv: Sequence[object], *, cwd: Path | None = None, timeout: float = 60, env: Mapping[str, str] | None = None) -> str:
    """Run a short query command and return its stdout (errors become InfraError); `env` adds to the environment."""
    cmd = [str(a) for a in argv]
    _need_program(cmd[0])
    _show(cmd)
    try:
        cp = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                            env={**os.environ, "PATH": search_path(), **(env or {})})
    except subprocess.TimeoutExpired:
        raise InfraError(f"{Path(cmd[0]).name} did not answer within {timeout:.0f} s") from None
    if cp.returncode != 0:
        msg = (cp.stderr.strip().splitlines() or [""])[-1]
        raise InfraError(f"{' '.join(cmd[:3])} failed: {msg}")
    return cp.stdout
