"""Workloads as data: one TOML file per workload in this package (server, readiness probe,
warm-up, measured load, metric regex). `--set KEY=VALUE` overrides a parameter."""

from __future__ import annotations

import copy
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from kpgo.errors import UserError


def _dir() -> Path:
    return Path(str(resources.files("kpgo.workloads")))


def names() -> list[str]:
    return sorted(p.stem for p in _dir().glob("*.toml"))


def load(name: str, overrides: list[str] | None = None) -> dict[str, Any]:
    path = _dir() / f"{name}.toml"
    if not path.exists():
        raise UserError(f"unknown workload '{name}'", f"choose one of: {', '.join(names())}")
    spec = tomllib.loads(path.read_text())
    spec = copy.deepcopy(spec)
    for item in overrides or []:
        key, sep, value = item.partition("=")
        if not sep or key not in spec["params"]:
            known = ", ".join(sorted(spec["params"]))
            raise UserError(f"--set {item}: not a parameter of workload {name}", f"its parameters are: {known}")
        old = spec["params"][key]
        try:
            spec["params"][key] = type(old)(value) if not isinstance(old, bool) else value.lower() in ("1", "true", "yes")
        except ValueError:
            raise UserError(f"--set {item}: {key} takes a value of type {type(old).__name__}", f"default is {old}") from None
    return spec
