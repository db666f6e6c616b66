"""Reading the files kpgo is given: the one home of "is this a file we can read, and does it hold what we expect".

Every input (profiles, build.json, profile.json, run.json, results.json, plan.json, variant and workload files,
config fragments, branch records, call graphs) is read here, so that whatever sits at the path — a FIFO, a device,
a socket, a directory, binary garbage, a cut file, JSON of another shape — ends in one UserError line naming the
file and what is wrong, never in a hang (a FIFO is opened non-blocking and refused before any read), an unbounded
read (each kind of file has a size cap) or a traceback from deep inside a reader.

API
    read_bytes(path, hint, limit=...) -> bytes       a regular file's bytes (at most `limit`)
    read_bytes_if_present(path, hint, ...)           the same, None when nothing is at the path
    read_prefix(path, hint, size) -> bytes           its first `size` bytes (a magic number)
    read_text(path, hint, limit=...) -> str          the same, as UTF-8 text
    read_json(path, hint, shape=object, ...) -> Any  JSON of `shape` (check); missing_ok: None when absent
    read_toml(path, hint, limit=...) -> dict         a TOML document
    check(value, shape, path, hint) -> value         value has `shape`, or a UserError naming where it differs
    kind(path) -> str | None                         what a non-regular path is ("a directory", "a FIFO", ...)
    is_regular(path) -> bool                         a regular file (after links), not a FIFO, device or directory

A shape is a type (int, float, str, bool, list, dict, object: anything; float takes ints; bool is not an int), None
(JSON null), a tuple of shapes (any of them), [shape] (a list of them), {str: shape} (an object of any keys, each
value of shape) or {"key": shape, "key?": shape} (an object with those keys, "?" marking optional ones; other keys
are let through, for files of newer kpgo versions).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tomllib
from typing import Any

from kpgo.errors import UserError

KiB, MiB = 1 << 10, 1 << 20
TEXT_LIMIT = 16 * MiB  # configs, fragments, TOML, call graphs: a server kernel's .config is ~250 KiB
JSON_LIMIT = 256 * MiB  # results.json of a long bench with the simulator's windows is tens of MiB
BINARY_LIMIT = 1024 * MiB  # one .gcda, .gcno or branch records file (and below what one read() returns)

Shape = Any  # see the module's docstring; recursive, so not spelled out as a type


def kind(path: str | os.PathLike[str]) -> str | None:
    """What `path` is when it is not a regular file ("a directory", "a FIFO (named pipe)", ...), None for a regular
    file or a path that does not exist. Follows symbolic links, as opening does."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return _kind(mode)


def _kind(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _open(path: str, hint: str) -> tuple[int, int]:
    """A read-only descriptor of the regular file at `path` and its size. O_NONBLOCK: opening a FIFO for reading would
    wait for a writer forever; the descriptor is refused right after, so no read ever sees the flag."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise _os_error(path, e, hint) from None
    try:
        st = os.fstat(fd)
    except OSError as e:
        os.close(fd)
        raise _os_error(path, e, hint) from None
    what = _kind(st.st_mode)
    if what is not None:
        os.close(fd)
        raise UserError(f"{path}: is {what}, not a regular file", hint)
    return fd, st.st_size


def _os_error(path: str, e: OSError, hint: str) -> UserError:
    if e.errno == errno.ENOENT:
        return UserError(f"{path}: does not exist" + (" (a broken symbolic link)" if os.path.islink(path) else ""), hint)
    if e.errno == errno.ENXIO:  # what opening a socket gives
        return UserError(f"{path}: is {kind(path) or 'no file that can be opened'}, not a regular file", hint)
    if e.errno == errno.ENOTDIR:
        return UserError(f"{path}: a part of the path is a file, not a directory", hint)
    return UserError(f"{path}: cannot read ({e.strerror or e})", "check the path and its permissions")


def read_bytes(path: str | os.PathLike[str], hint: str, limit: int = BINARY_LIMIT) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them (a larger file is a UserError, not read)."""
    p = os.fspath(path)
    fd, size = _open(p, hint)
    try:
        if size > limit:
            raise UserError(f"{p}: {size:,} bytes, more than the {limit:,} kpgo reads from such a file", hint)
        parts: list[bytes] = []
        got, want = 0, size + 1
        while True:
            chunk = os.read(fd, want)
            parts.append(chunk)
            got += len(chunk)
            if got > limit:  # the file grew past the cap since fstat
                raise UserError(f"{p}: more than the {limit:,} bytes kpgo reads from such a file", hint)
            if len(chunk) < want:  # a short read of a regular file is its end: one read() for most files
                break
            want = MiB
    except OSError as e:
        raise _os_error(p, e, hint) from None
    finally:
        os.close(fd)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read_prefix(path: str | os.PathLike[str], hint: str, size: int) -> bytes:
    """The first `size` bytes of the regular file at `path` (fewer when it is shorter): its magic, say."""
    p = os.fspath(path)
    fd, _ = _open(p, hint)
    try:
        return os.read(fd, size)
    except OSError as e:
        raise _os_error(p, e, hint) from None
    finally:
        os.close(fd)


def read_bytes_if_present(path: str | os.PathLike[str], hint: str, limit: int = BINARY_LIMIT) -> bytes | None:
    """read_bytes, or None when nothing is at the path (a broken symbolic link is something: an error)."""
    return read_bytes(path, hint, limit) if os.path.lexists(path) else None


def read_text(path: str | os.PathLike[str], hint: str, limit: int = TEXT_LIMIT) -> str:
    data = read_bytes(path, hint, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{os.fspath(path)}: not text (byte 0x{data[e.start]:02x} at offset {e.start} is not UTF-8; "
                        "binary data?)", hint) from None


def read_json(path: str | os.PathLike[str], hint: str, shape: Shape = object, *, missing_ok: bool = False,
              limit: int = JSON_LIMIT) -> Any:
    """The JSON document at `path`, checked against `shape`; with missing_ok, None when nothing is at the path."""
    p = os.fspath(path)
    if missing_ok and not os.path.lexists(p):
        return None
    text = read_text(p, hint, limit)
    try:
        value = json.loads(text)
    except ValueError as e:
        what = "empty" if not text.strip() else f"not valid JSON ({e})"
        raise UserError(f"{p}: {what}", hint) from None
    except RecursionError:  # "[[[[…" thousands deep
        raise UserError(f"{p}: not valid JSON (nested too deep)", hint) from None
    return check(value, shape, p, hint)


def read_toml(path: str | os.PathLike[str], hint: str, limit: int = TEXT_LIMIT) -> dict[str, Any]:
    p = os.fspath(path)
    text = read_text(p, hint, limit)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{p}: not valid TOML ({e})", hint) from None
    except RecursionError:
        raise UserError(f"{p}: not valid TOML (nested too deep)", hint) from None


# -- shapes ---------------------------------------------------------------------------------------------------------

_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list", dict: "an object",
          type(None): "null"}


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value[:40]!r}" + ("…" if len(value) > 40 else "")
    return _NAMES.get(type(value), type(value).__name__)


def _expected(shape: Shape) -> str:
    if shape is None:
        return "null"
    if isinstance(shape, tuple):
        return " or ".join(_expected(s) for s in shape)
    if isinstance(shape, list):
        return "a list"
    if isinstance(shape, dict):
        return "an object"
    return _NAMES.get(shape, "a value")


def _matches(value: Any, t: type) -> bool:
    if t is object:
        return True
    if t is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, t)


def _problem(value: Any, shape: Shape, where: str) -> str | None:
    """Where `value` first differs from `shape` and how, None when it does not."""
    if isinstance(shape, tuple):
        if any(_problem(value, s, where) is None for s in shape):
            return None
        # one alternative of the right kind (an object for a record) says more than "expected a or b"
        near = [s for s in shape if _problem_kind(value, s)]
        return _problem(value, near[0], where) if len(near) == 1 else f"{where} is {_describe(value)}, expected {_expected(shape)}"
    if shape is None:
        return None if value is None else f"{where} is {_describe(value)}, expected null"
    if isinstance(shape, list):
        if not isinstance(value, list):
            return f"{where} is {_describe(value)}, expected a list"
        for i, item in enumerate(value):
            p = _problem(item, shape[0], f"{where}[{i}]")
            if p:
                return p
        return None
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"{where} is {_describe(value)}, expected an object"
        if str in shape:  # a map: any key, every value of one shape
            for k, item in value.items():
                p = _problem(item, shape[str], f"{where}.{k}" if k.isidentifier() or k.replace("-", "").isalnum() else f"{where}[{k!r}]")
                if p:
                    return p
            return None
        for key, sub in shape.items():
            name = key.rstrip("?")
            if name not in value:
                if key.endswith("?"):
                    continue
                return f"{where} has no '{name}'"
            p = _problem(value[name], sub, f"{where}.{name}")
            if p:
                return p
        return None
    return None if _matches(value, shape) else f"{where} is {_describe(value)}, expected {_expected(shape)}"


def _problem_kind(value: Any, shape: Shape) -> bool:
    """Whether value is at least of the kind `shape` names at its top (an object for a record, a list for a list)."""
    if isinstance(shape, dict):
        return isinstance(value, dict)
    if isinstance(shape, list):
        return isinstance(value, list)
    return False


def check(value: Any, shape: Shape, path: str | os.PathLike[str], hint: str) -> Any:
    """`value` (read from `path`) when it has `shape`; else a UserError naming the first place it differs."""
    if (shape is dict or isinstance(shape, dict)) and not isinstance(value, dict):
        raise UserError(f"{os.fspath(path)}: does not hold a JSON object (it holds {_describe(value)})", hint)
    p = _problem(value, shape, "")
    if p:
        p = p.removeprefix(".") if not p.startswith(" ") else "the document" + p
        raise UserError(f"{os.fspath(path)}: {p}", hint)
    return value


def is_regular(path: str | os.PathLike[str]) -> bool:
    """A regular file (after symbolic links) — not a FIFO, device, socket or directory named like one."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False

