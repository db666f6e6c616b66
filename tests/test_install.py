"""kpgo as a user gets it from a plain (non-editable) `pip install .`: every file the package reads
at run time is installed, and the commands that read them work from the installed copy. Also:
every --help renders (no doubled percent signs from argparse escaping in descriptions)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

PACKAGE = REPO / "src" / "kpgo"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip install --no-deps --target DIR .` from a copy of the tree (the build writes into the
    source tree: build/, *.egg-info), so the checkout stays as it is."""
    target = tmp_path_factory.mktemp("site")
    src = tmp_path_factory.mktemp("src") / "kpgo"
    # A copy of what git tracks plus the working tree's changes: what `pip install .` of a clone sees.
    files = subprocess.run(["git", "-C", REPO, "ls-files", "-co", "--exclude-standard"], check=True, capture_output=True, text=True).stdout.split()
    for rel in files:
        if (REPO / rel).is_file():
            dst = src / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes((REPO / rel).read_bytes())
    cp = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", target, src],
                        capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr[-3000:]
    return target


def _run_installed(target: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(target)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=target, timeout=120)


def test_installed_package_is_the_one_imported(installed: Path) -> None:
    cp = _run_installed(installed, "-c", "import kpgo; print(kpgo.__file__)")
    assert cp.returncode == 0, cp.stderr
    assert Path(cp.stdout.strip()).resolve().is_relative_to(installed.resolve())


def test_every_runtime_file_is_installed(installed: Path) -> None:
    """Each non-Python file in the source package (configs, workload specs, their data files, the
    helper and simulator sources, the guest agent) is in the installed package."""
    wanted = [p.relative_to(PACKAGE) for p in PACKAGE.rglob("*") if p.is_file() and p.suffix != ".pyc" and "__pycache__" not in p.parts]
    missing = [str(rel) for rel in wanted if not (installed / "kpgo" / rel).is_file()]
    assert not missing, f"not installed by `pip install .`: {missing}"
    assert (installed / "kpgo" / "workloads" / "tools" / "leveldb_bench.cc").is_file()
    assert (installed / "kpgo" / "workloads" / "data" / "index.html").is_file()


def test_installed_commands_read_their_data(installed: Path) -> None:
    cp = _run_installed(installed, "-m", "kpgo", "workloads", "list")
    assert cp.returncode == 0, cp.stderr
    for name in ("nginx", "redis", "memcached", "leveldb", "micro"):
        assert name in cp.stdout
    # The helper program's source resolves inside the installed package.
    cp = _run_installed(installed, "-c", "from kpgo import workloads; from kpgo.workloads import install; "
                        "spec = workloads.load('leveldb'); print(*[install._tool_source(b) for b in spec.build], sep='\\n')")
    assert cp.returncode == 0, cp.stderr
    for line in cp.stdout.split():
        assert Path(line).is_file() and Path(line).resolve().is_relative_to(installed.resolve()), line


def _subcommands() -> list[list[str]]:
    from kpgo import cli

    cmds = [[name] for name in cli.COMMANDS]
    parser = cli.make_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, p in sub.choices.items():  # type: ignore[union-attr]
        for a in p._actions:
            if a.choices and isinstance(a.choices, dict):
                cmds += [[name, s] for s in a.choices]
    return cmds


@pytest.mark.parametrize("cmd", [[]] + _subcommands(), ids=lambda c: " ".join(c) or "kpgo")
def test_help_renders(cmd: list[str]) -> None:
    cp = subprocess.run([sys.executable, "-m", "kpgo", *cmd, "--help"], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert "%%" not in cp.stdout, f"`kpgo {' '.join(cmd)} --help` prints a doubled percent sign"
    assert "Traceback" not in cp.stderr
