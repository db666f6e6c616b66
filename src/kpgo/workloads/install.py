"""Workload prerequisites on the host (the guest runs over the host's root file system, so what
is installed here is what the guest has): Debian packages, and kpgo's own helper programs built
against them (the LevelDB benchmark). Installing is explicit (`kpgo workloads install`, or
`make setup`); collect/bench/run only check, and name the command that fixes what is missing."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from kpgo import proc
from kpgo.errors import UserError
from kpgo.guest.contract import Build, Workload
from kpgo.paths import cache_dir
from kpgo.progress import say


def tools_dir() -> Path:
    return cache_dir() / "tools"


def installed(packages: list[str]) -> set[str]:
    """Those of `packages` that dpkg reports as installed."""
    if not packages:
        return set()
    res = proc.run(["dpkg-query", "-W", "-f=${Package} ${db:Status-Abbrev}\n", *packages], check=False, keep_output=True)
    return {ln.split()[0] for ln in res.output.splitlines() if len(ln.split()) >= 2 and ln.split()[1] == "ii"}


def missing_packages(specs: list[Workload]) -> dict[str, list[str]]:
    """workload name -> its packages that are not installed (workloads with none missing left out)."""
    return _missing({s.name: s.packages for s in specs})


def _missing(needs: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """What needs packages (a workload, a compiler) -> those of its packages that are not installed."""
    have = installed(sorted({p for v in needs.values() for p in v}))
    gaps = {k: [p for p in v if p not in have] for k, v in needs.items()}
    return {k: v for k, v in gaps.items() if v}


def _tool_source(build: Build) -> Path:
    return Path(__file__).parent / "tools" / build.source


def _tool_stamp(build: Build) -> str:
    h = hashlib.sha256(_tool_source(build).read_bytes())
    h.update(repr(list(build.argv)).encode())  # a list's repr, as when argv was one: the tools built then stay up to date
    return h.hexdigest()[:16]


def build_tools(specs: list[Workload]) -> None:
    """Build the workloads' helper programs that are missing or older than their source (others are left as they are)."""
    for s in specs:
        for b in s.build:
            build_tool(b, s.name)


def build_tool(b: Build, owner: str) -> None:
    """One helper program of kpgo's (for `owner`: a workload, or the simulator's guest tool), unless it is up to date."""
    tools_dir().mkdir(parents=True, exist_ok=True)
    out = tools_dir() / b.output
    stamp = tools_dir() / f"{b.output}.stamp"
    want = _tool_stamp(b)
    if out.exists() and stamp.exists() and stamp.read_text() == want:
        return
    tmp = out.with_name(out.name + ".tmp")
    argv = [a.replace("{output}", str(tmp)).replace("{source}", str(_tool_source(b))) for a in b.argv]
    say(f"workloads: building {b.output} for {owner}")
    log = tools_dir() / f"{b.output}.log"
    log.unlink(missing_ok=True)
    proc.run(argv, log=log, what=f"building {b.output}", timeout=600)
    os.replace(tmp, out)  # atomic: a half-built program is never picked up
    stamp.write_text(want)


def install(specs: list[Workload]) -> None:
    """apt-get install what is missing (idempotent), then build kpgo's helper programs."""
    install_packages({s.name: s.packages for s in specs})
    build_tools(specs)


def install_packages(needs: Mapping[str, Sequence[str]]) -> None:
    """apt-get install those of the packages that are missing (idempotent); `needs`: what needs them (a workload,
    a compiler) -> its packages."""
    gaps = _missing(needs)
    pkgs = sorted({p for v in gaps.values() for p in v})
    if pkgs:
        sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
        if sudo and not shutil.which("sudo"):
            raise UserError(f"installing {' '.join(pkgs)} needs root", f"run as root: apt-get install {' '.join(pkgs)}")
        say(f"workloads: installing Debian packages: {' '.join(pkgs)}")
        log = cache_dir() / "apt.log"
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        apt_install = [*sudo, "apt-get", "install", "-y", "-q", "--no-install-recommends", *pkgs]
        if proc.run(apt_install, log=log, env=env, check=False).returncode != 0:
            # The package lists may be stale on a fresh machine: refresh once and retry.
            proc.run([*sudo, "apt-get", "update", "-q"], log=log, env=env, what="apt-get update", timeout=600)
            proc.run(apt_install, log=log, env=env, what=f"apt-get install {' '.join(pkgs)}", timeout=1800)
    else:
        say("workloads: all Debian packages present")


def require(specs: list[Workload]) -> None:
    """Fail early, before any boot, if a chosen workload cannot run here."""
    gaps = missing_packages(specs)
    if gaps:
        names = ",".join(gaps)
        what = "; ".join(f"{n} needs {', '.join(p)}" for n, p in gaps.items())
        raise UserError(f"workload packages not installed: {what}", f"run `kpgo workloads install {names}` (root or sudo)")
    build_tools(specs)
