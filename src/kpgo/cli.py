"""Command line: git-style subcommands. Each subcommand module registers its parser and
imports its heavy dependencies only when it runs, so `kpgo --help` stays fast."""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from typing import Sequence

from kpgo import __version__
from kpgo.errors import KpgoError

# name -> module under kpgo.commands exposing register(subparsers)
COMMANDS = ("build", "collect", "profile", "bench", "run", "study", "workloads", "report")


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
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
        os.environ["KPGO_VERBOSE"] = "1"
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
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
        return 3


def entry() -> None:
    sys.exit(main())
