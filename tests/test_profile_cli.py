"""`kpgo profile` through the real CLI error handling (one line, exit status, no traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gcov_fixtures import Profiles, gcc_build, profiles  # noqa: F401


def kpgo(argv: list[str]) -> int:
    """kpgo.cli.main in-process: the real parser and error handling."""
    from kpgo import cli

    return cli.main(argv)


def test_stats_json(profiles: Profiles, capsys: pytest.CaptureFixture[str]) -> None:
    assert kpgo(["profile", "stats", str(profiles.k0), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    for key in ("files", "functions", "arcs_sum", "arcs_max", "with_summary", "gcov_version"):
        assert key in st
    assert st["files"] == 3 and st["with_summary"] == 0 and st["gcov_version"].startswith("B2")


def test_stats_table(profiles: Profiles, capsys: pytest.CaptureFixture[str]) -> None:
    assert kpgo(["profile", "stats", str(profiles.mode0)]) == 0
    out = capsys.readouterr().out
    assert "with summary  3 of 3" in out


def test_fix_cli(profiles: Profiles, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "f"
    assert kpgo(["profile", "fix", str(profiles.k0), "-o", str(out), "--summary-runs", "2"]) == 0
    assert "runs=2" in capsys.readouterr().out
    assert kpgo(["profile", "fix", str(profiles.k0), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "already exists" in err and err.count("\n") == 1


def test_missing_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert kpgo(["profile", "stats", str(tmp_path / "nope")]) == 1
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert kpgo(["profile", "stats", str(tmp_path / "empty")]) == 1
    assert "no .gcda files" in capsys.readouterr().err
