"""Outputs appear only when complete: write into a temporary sibling, then rename."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn

from kpgo.errors import InfraError, UserError


def _temp_prefix(path: Path) -> str:
    """Temporary siblings carry their writer's pid, so that a later kpgo can tell a killed writer's leftovers
    from the work of one still running."""
    return f".{path.name}.{os.getpid()}."


def sweep(path: Path) -> None:
    """Remove the temporary siblings of `path` left by kpgo processes that were killed while writing it."""
    head = f".{path.name}."
    try:
        siblings = [p for p in path.parent.iterdir() if p.name.startswith(head) and p.suffix in (".partial", ".tmp")]
    except OSError:
        return
    for p in siblings:
        pid = p.name[len(head):].partition(".")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def scratch_dir(path: Path) -> Path:
    """A new private directory beside `path`, named with this process's pid like every temporary sibling, so the
    next kpgo removes it if this one is killed before it does (sweep)."""
    sweep(path)
    return Path(tempfile.mkdtemp(dir=path.parent, prefix=_temp_prefix(path), suffix=".partial"))


def write_bytes(path: Path, data: bytes) -> None:
    with full_disk_names(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        sweep(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_temp_prefix(path), suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644 & ~_umask())  # mkstemp makes 0600; outputs are ordinary files
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


FULL = 1 << 20  # bytes free under which a file system counts as full (a failed write leaves a little behind)


def full_disk(path: Path) -> str | None:
    """"the file system of PATH is full (N KiB free)" when it is, else None: what turns a failed write or a
    failed make into an error that says why."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        st = os.statvfs(probe)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    return f"the file system of {path} is full ({free // 1024} KiB free)" if free < FULL else None


@contextlib.contextmanager
def full_disk_names(path: Path) -> Iterator[None]:
    """A write under `path` that fails for lack of space raises an error naming `path` (the OS names neither the
    file nor the file system), with the next step. Temporary files are removed as for any other failure."""
    try:
        yield
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        raise InfraError(full_disk(path) or f"no space left on the file system of {path}",
                         f"free some space there (df -h {Path(path).parent}) and run the same command again") from None


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode())


def write_json(path: Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def check_writable(path: Path, what: str = "output directory", option: str = "-o") -> None:
    """`path` (a directory to create, or to write files in) can be written: it, or the nearest of its parents that
    exists, is a directory this process may create entries in. Checked before any work, so a read-only or
    mistyped destination fails in a second rather than after a long step, and with the path the user gave."""
    path = Path(path)
    probe = path.absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"{what} {path} cannot be created: {probe} is not a directory", f"choose another {option}")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"{what} {path} cannot be written: {probe} is read-only or not ours", f"choose a writable {option}")


def check_output(path: Path, *, inputs: Sequence[Path] = (), what: str = "output directory", replace: bool = False) -> None:
    """Refuse an output path before any work: one of the inputs (or inside one, or holding one: the input would
    change while it is read, and the next read would see the output as part of it), an existing path unless
    replace=True, or a place that cannot be written."""
    path = Path(path)
    target = path.resolve()
    for given in inputs:
        src = Path(given).resolve()
        if target == src:
            raise UserError(f"{what} {path} is the input {given}", "kpgo never writes over its input: choose another -o")
        if src in target.parents:
            raise UserError(f"{what} {path} is inside the input {given}", "choose an -o outside the input directory")
        if target in src.parents:
            raise UserError(f"{what} {path} holds the input {given}", "choose an -o that is not a parent of the input")
    if path.exists() and not replace:
        raise UserError(f"{what} {path} already exists", "choose another -o or remove it")
    if path.exists() and not path.is_dir():
        raise UserError(f"{what} {path} is a file", "choose another -o")
    check_writable(path.parent if replace and path.exists() else path, what)


@contextlib.contextmanager
def output_dir(path: Path, *, replace: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that becomes `path` only if the block completes.

    An existing `path` is an error unless replace=True (then it is swapped out at the end)."""
    path = Path(path)
    check_output(path, replace=replace)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep(path)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=_temp_prefix(path), suffix=".partial"))
    try:
        with full_disk_names(path):
            yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


LOCK = ".kpgo.lock"


def check_resumable(directory: Path, what: str, marks: Sequence[str], option: str) -> None:
    """A directory kpgo fills step by step and resumes (a run, a bench): refuse a file, or a directory that
    holds something else (no lock and none of its own files), before any work, instead of building into it."""
    if directory.exists() and not directory.is_dir():
        raise UserError(f"{what} {directory} is a file", f"choose another {option}")
    if directory.is_dir():
        entries = {e.name for e in directory.iterdir()}
        if entries and not entries & {LOCK, *marks}:
            raise UserError(f"{directory} is not a kpgo {what} (it holds other files: {', '.join(sorted(entries)[:3])})",
                            f"choose an empty or new {option}, or one kpgo wrote before")
    check_writable(directory, what, option)


def _held(f: IO[str], directory: Path, what: str) -> NoReturn:
    f.seek(0)
    holder = f.read().strip() or "?"
    raise UserError(f"another kpgo (pid {holder}) is using the {what} {directory}", "wait for it to finish, or choose another directory") from None


def refuse_if_held(directory: Path, what: str) -> None:
    """exclusive's refusal, early and creating nothing: for a command that prepares for minutes (a kernel source
    unpacked, helpers compiled) before it takes the lock."""
    try:
        f = open(directory / LOCK)
    except OSError:
        return  # no lock file: nobody has held it
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            _held(f, directory, what)


@contextlib.contextmanager
def exclusive(directory: Path, what: str) -> Iterator[None]:
    """One writer per directory: a second kpgo on the same run or bench directory is refused at once
    (naming the first one's pid) instead of both writing. The lock is the kernel's (flock), so it dies
    with its holder, however that ends; the file stays, and a later run takes it over."""
    directory.mkdir(parents=True, exist_ok=True)
    f = open(directory / LOCK, "a+")
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _held(f, directory, what)
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        yield
    finally:
        f.close()


@contextlib.contextmanager
def turn(lock: Path) -> Iterator[None]:
    """Wait for this lock file (flock, blocking): writers of one shared output take turns, the later one seeing what
    the earlier made (two cluster tasks on one machine fetching the same kernel, two packagings of one kernel)."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def tar_of(root: Path, only: Sequence[str] | None = None) -> bytes:
    """root's files (or only these, relative to it) as a gzipped tar: how a task on a cluster node hands back what it
    made (kpgo.cluster), for untar to write."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel in ["."] if only is None else only:
            tar.add(root / rel, arcname=rel)
    return buf.getvalue()


def untar(data: bytes, dest: Path) -> None:
    """What tar_of packed, written into dest (members outside it refused: tarfile's "data" filter)."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(dest, filter="data")
