"""Lint and type checks: ruff over src, tests and benchmarks, mypy over src/kpgo (both configured in pyproject.toml)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from conftest import REPO


def _run_tool(module: str, *args: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{module} is not installed in {sys.executable}; run `make setup` (it installs the test extra)")
    res = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, f"{module} {' '.join(args)} exited {res.returncode}:\n{res.stdout}{res.stderr}"


def test_ruff_clean() -> None:
    _run_tool("ruff", "check", "src", "tests", "benchmarks")


def test_mypy_clean() -> None:
    _run_tool("mypy")
