"""Command line: git-style subcommands. Each subcommand module registers its parser and
imports its heavy dependencies only when it runs, so `kpgo --help` stays fast."""

from __future__ import annotations

import argparse
import errno
import importlib
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from kpgo import __version__
from kpgo.errors import KpgoError, UserError

PATH_ERRNOS = frozenset({errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM, errno.EROFS,
                         errno.ENOENT, errno.ENAMETOOLONG, errno.ELOOP})

# name -> module under kpgo.commands exposing register(subparsers)
COMMANDS = ("build", "collect", "profile", "bench", "run", "study", "workloads", "variants", "report", "package", "verify")


class Parser(argparse.ArgumentParser):
    """argparse with kpgo's error format: one line naming the problem and the next step (argparse's own prints the
    usage block first). The exit status stays 2, as for any command line argparse cannot parse. Subcommand parsers
    are made of the same class (argparse's add_subparsers default)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"kpgo: error: {message} — see `{self.prog} --help`\n")


def _count(value: object) -> str | None:
    return None if isinstance(value, int) and value >= 1 else f"{value} is not a count (it must be at least 1)"


def _summary_runs(value: object) -> str | None:
    problem = _count(value)
    if problem is None and isinstance(value, int) and value > 0xFFFFFFFF:  # merge used to clamp it silently
        return f"{value} is out of range (the object summary holds 1 to 4294967295 runs)"
    return problem


def _seconds(value: object) -> str | None:
    ok = isinstance(value, (int, float)) and math.isfinite(value) and value > 0
    return None if ok else f"{value} is not a positive, finite number of seconds"


_SIZE = re.compile(r"[0-9]+(\.[0-9]+)?[KMGTkmgt]?")


def _memory(value: object) -> str | None:
    # QEMU's -m syntax (MiB without a suffix). virtme-ng pastes the value into a shell command line, so nothing
    # else may pass.
    text = str(value)
    if _SIZE.fullmatch(text) and float(text.rstrip("KMGTkmgt")) > 0:
        return None
    return f"'{text}' is not a memory size (e.g. 2G or 512M)"


def _share(value: object) -> str | None:
    ok = isinstance(value, float) and 0 < value < 1
    return None if ok else f"{value} is not a share between 0 and 1 (e.g. 0.99)"


def _half_width(value: object) -> str | None:
    ok = isinstance(value, float) and 0 < value < 1
    return None if ok else f"{value} is not a relative half-width between 0 and 1 (e.g. 0.015 for ±1.5%)"


# Options several commands share (most registered in kpgo.commands.common), by dest: (how the user writes it, the
# check). Checked before any command starts, so a bad value stops every command at once (a `kpgo run --boots 0`
# used to build and collect for an hour before its bench refused it).
CHECKED_OPTIONS: dict[str, tuple[str, Callable[[object], str | None]]] = {
    "jobs": ("-j/--jobs", _count), "boots": ("--boots", _count), "runs": ("--runs", _count), "cpus": ("--cpus", _count),
    "summary_runs": ("--summary-runs", _summary_runs),
    "guest_timeout": ("--guest-timeout", _seconds), "memory": ("--memory", _memory),
    "hot_share": ("--hot-share", _share), "precision": ("--precision", _half_width), "max_boots": ("--max-boots", _count),
    "max_time": ("--max-time", _seconds),
}


def check_option_values(args: argparse.Namespace) -> None:
    for dest, (flag, check) in CHECKED_OPTIONS.items():
        value = getattr(args, dest, None)
        problem = check(value) if value is not None else None
        if problem:
            where = " ".join(str(x) for x in (args.command, *(getattr(args, k, None) for k in ("profile_command", "study_name", "action"))) if x)
            raise UserError(f"{flag} {problem}", f"fix the option (see `kpgo {where} --help`)")


def make_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="kpgo",
        description="Build Linux kernels optimized for a workload by GCC profile-guided optimization, and prove the gain.",
    )
    p.add_argument("--version", action="version", version=f"kpgo {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="print every command kpgo runs")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"kpgo.commands.{name}").register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.verbose:
        from kpgo import proc  # here, not at the top: `kpgo --help` does not load it

        proc.set_verbose(True)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        check_option_values(args)
        if getattr(args, "json", False):
            from kpgo.progress import json_only

            with json_only():
                return int(args.func(args) or 0)
        return int(args.func(args) or 0)
    except KpgoError as e:
        print(f"kpgo: error: {e}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:
        # `kpgo workloads list | head`: the reader left; not an error worth a message.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("kpgo: interrupted — completed steps are kept; run the same command again to resume", file=sys.stderr)
        return 130
    except OSError as e:
        # Full disk, permissions, vanished files: one line, the path, the next step.
        what = e.strerror or str(e)
        where = f" ({e.filename})" if e.filename else ""
        hint = "free some disk space and run again" if e.errno == errno.ENOSPC else "check the path and permissions"
        print(f"kpgo: error: {what}{where} — {hint}", file=sys.stderr)
        # A path the user gave that cannot be used (a file where a directory goes, a read-only place) is bad input;
        # anything else (a full disk, an I/O error) is the machine's.
        return 1 if e.errno in PATH_ERRNOS else 3


def entry() -> None:
    sys.exit(main())
