"""The typed workload (kpgo.guest.contract.Workload) keeps every key derived from a workload: its to_json is, for every
shipped workload, the dict kpgo used before the workload was typed (the TOML file as read, each file's `source` replaced
by the text of workloads/data/SOURCE, --set values and a host client written into it), and bench cell keys hash it to the
same value. The expected dicts are computed here from the files, not by the code under test."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from kpgo import bench, vm, workloads
from kpgo.guest import contract

ALL = workloads.names()


def old_dict(name: str) -> dict[str, Any]:
    """The workload as the dict kpgo passed around before it was typed."""
    spec = tomllib.loads((workloads._dir() / f"{name}.toml").read_text())
    for f in spec.get("files", []):
        if "source" in f:
            f["text"] = (workloads._dir() / "data" / f.pop("source")).read_text()
    return spec


def old_has_client(spec: dict[str, Any]) -> bool:
    return "server" in spec and any(s.get("client") for kind in ("warmup", "load") for s in spec.get(kind, []))


def dumped(d: dict[str, Any]) -> str:
    return json.dumps(d, sort_keys=True)  # as bench._cell_key hashes it: True is not 1, 1 is not 1.0


def old_cell_key(build_key: str, spec: dict[str, Any], runs: int) -> str:
    """bench._cell_key as it was, for a bench without simulated counters."""
    text = json.dumps({"kernel": build_key, "workload": spec, "runs": runs, "sim": None}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def overrides(name: str) -> tuple[list[str], dict[str, Any]]:
    """A --set for every parameter of the workload, and the parameters it should give."""
    sets, want = [], {}
    for key, value in old_dict(name)["params"].items():
        if isinstance(value, bool):
            want[key] = not value
        elif isinstance(value, (int, float)):
            want[key] = value + 1
        else:
            want[key] = "7"
        sets.append(f"{name}.{key}={str(want[key]).lower()}")
    return sets, want


@pytest.mark.parametrize("name", ALL)
def test_to_json_is_the_old_dict(name: str) -> None:
    wl = workloads.load(name)
    assert dumped(wl.to_json()) == dumped(old_dict(name))
    assert contract.Workload.from_json(wl.to_json()) == wl
    assert old_cell_key("k", old_dict(name), 2) == bench._cell_key({"key": "k"}, wl, 2, None)


@pytest.mark.parametrize("name", ALL)
def test_to_json_with_overrides_is_the_old_dict(name: str) -> None:
    sets, want = overrides(name)
    wl = workloads.load(name, sets)
    old = old_dict(name)
    old["params"].update(want)
    assert dumped(wl.to_json()) == dumped(old)
    assert old_cell_key("k", old, 1) == bench._cell_key({"key": "k"}, wl, 1, None)


def test_sensitivity_variants_are_the_old_dicts() -> None:
    """`kpgo study sensitivity` renames each setting's workload; the name is part of the dict and of its keys."""
    from kpgo import study

    got = study.vary("micro", "procs", ["1", "4 8"], ["tcp_ops=64"])
    for wl, value, name in zip(got, ["1", "4 8"], ["micro+procs-1", "micro+procs-4_8"]):
        old = old_dict("micro")
        old["name"] = name
        old["params"].update(tcp_ops=64, procs=value)
        assert dumped(wl.to_json()) == dumped(old)


def test_to_json_with_a_host_client_is_the_old_dict() -> None:
    """"client" is in the dict only when the client is on the host, and only for workloads that have one."""
    hosted = 0
    for wl in workloads.load_many("all", ["port=7001"], client="host"):
        old = old_dict(wl.name)
        if "port" in old["params"]:
            old["params"]["port"] = 7001
        if old_has_client(old):
            old["client"] = "host"
            hosted += 1
        assert dumped(wl.to_json()) == dumped(old), wl.name
        assert old_cell_key("k", old, 1) == bench._cell_key({"key": "k"}, wl, 1, None)
    assert hosted == 6  # the network servers


def test_to_json_is_plain_json_data_of_its_own() -> None:
    wl = workloads.load("nginx")
    data = wl.to_json()
    assert json.loads(json.dumps(data)) == data  # lists, not tuples
    data["params"]["port"] = 1
    data["load"][0]["argv"].append("x")
    assert wl.params["port"] == 8080 and "x" not in wl.load[0].argv


def test_job_round_trip_with_a_shipped_workload() -> None:
    wl = workloads.load_many("redis", ["clients=4"], client="host")[0]
    host = contract.Client(where="host", rundir="/r/client", control_port=7399, guest_addr="10.0.2.15", gateway="10.0.2.2")
    job = contract.Job(mode="bench", workload=wl, runs=2, client=host, tools_dir="/t")
    data = json.loads(json.dumps(job.to_json()))
    again = contract.Job.from_json(data)
    assert again == job and again.workload.server == wl.server and again.workload.params["clients"] == 4
    # The guest agent reads the same job through its own copy of contract.py, loaded by path.
    spec = importlib.util.spec_from_file_location("kpgo_guest_contract_test", Path(vm.AGENT).parent / "contract.py")
    assert spec and spec.loader
    guest = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = guest  # dataclasses look their module up while they build a class
    spec.loader.exec_module(guest)
    assert guest.Job.from_json(data).workload.to_json() == wl.to_json()


def test_a_part_the_typed_workload_needs_is_checked_when_it_loads() -> None:
    spec = workloads.load("nginx").to_json()
    del spec["files"][2]["text"]
    del spec["paper"]["params"]
    problems = workloads.validate(spec)
    assert "files 3: needs path and text (or source)" in problems and "paper needs params" in problems
